# SPDX-License-Identifier: Apache-2.0
"""The Python variant of workload.c: the same driver calls through ctypes, from Python functions with known names.

    main -> train_step -> forward -> launch_matmul (cuLaunchKernel "matmul_kernel", 2 ms)
                                  -> launch_relu   (cuLaunchKernel "relu_kernel", 0.5 ms)
                       -> sync_point (cuStreamSynchronize)

By default the driver is loaded with ctypes.PyDLL, which keeps the GIL during the calls, like PyTorch's launches;
--release-gil loads it with ctypes.CDLL, which releases the GIL around every call (no Python frames can be read then).
--variant picks where the launches come from: "plain" (above), "thread-generator" (a worker thread pulls steps from a
generator, which launches: the generator's frame is part of the stack), "deep" (train_step called 100 calls deep
through recurse(), beyond the 64 Python frames a record holds) or "unicode" (a launching function with a non-ASCII
name).
"ddp" is one rank of a data-parallel job on the fake driver's collectives (the launcher sets FAKE_CUDA_RANK,
FAKE_CUDA_RANKS, FAKE_CUDA_DEVICES and FAKE_CUDA_RENDEZVOUS, see fake_cuda.c): rank r drives device r, and each step
is load_batch (sleeps --slow-ms), forward, all_reduce (an NCCL-named all-reduce kernel, 0.3 ms once every rank has
launched it) and sync_point.
Driver.use_device(d) makes device d current and sends later launches to a stream of its own (FAKE_CUDA_DEVICES > d):
a program can launch on several devices.
usage: workload.py LIBCUDA [--steps N] [--release-gil] [--variant plain|thread-generator|deep|unicode|ddp]
       [--slow-ms MS]
"""

from __future__ import annotations

import argparse
import ctypes
import os
import threading
import time
from collections.abc import Iterator

MODULE_TEXT = b"matmul_kernel=2000000\nrelu_kernel=500000\n"
COLLECTIVES_TEXT = b"ncclDevKernel_AllReduce_Sum_f32_RING_LL=300000\n"


class Driver:
    """The few driver entry points the workload uses, with their exported (versioned) names."""

    def __init__(self, path: str, release_gil: bool) -> None:
        self.lib = (ctypes.CDLL if release_gil else ctypes.PyDLL)(path)
        self.stream = ctypes.c_void_p()
        self.matmul = ctypes.c_void_p()
        self.relu = ctypes.c_void_p()
        self.all_reduce = ctypes.c_void_p()
        self.device_streams: dict[int, tuple[ctypes.c_void_p, ctypes.c_void_p]] = {}  # device -> (context, stream)

    def call(self, name: str, *args: object) -> None:
        rc = getattr(self.lib, name)(*args)
        if rc != 0:
            raise RuntimeError(f"{name} failed: {rc}")

    def setup(self) -> None:
        device = ctypes.c_int()
        context = ctypes.c_void_p()
        module = ctypes.c_void_p()
        self.call("cuInit", 0)
        self.call("cuDeviceGet", ctypes.byref(device), int(os.environ.get("FAKE_CUDA_RANK", "0")))
        self.call("cuDevicePrimaryCtxRetain", ctypes.byref(context), device)
        self.call("cuCtxSetCurrent", context)
        self.call("cuModuleLoadData", ctypes.byref(module), ctypes.c_char_p(MODULE_TEXT))
        self.call("cuModuleGetFunction", ctypes.byref(self.matmul), module, b"matmul_kernel")
        self.call("cuModuleGetFunction", ctypes.byref(self.relu), module, b"relu_kernel")
        self.call("cuStreamCreate", ctypes.byref(self.stream), 0)

    def use_device(self, ordinal: int) -> None:
        """Makes device `ordinal`'s primary context current; launches and waits go to its stream from now on."""
        if ordinal not in self.device_streams:
            device = ctypes.c_int()
            context = ctypes.c_void_p()
            stream = ctypes.c_void_p()
            self.call("cuDeviceGet", ctypes.byref(device), ordinal)
            self.call("cuDevicePrimaryCtxRetain", ctypes.byref(context), device)
            self.call("cuCtxSetCurrent", context)
            self.call("cuStreamCreate", ctypes.byref(stream), 0)
            self.device_streams[ordinal] = (context, stream)
        context, self.stream = self.device_streams[ordinal]
        self.call("cuCtxSetCurrent", context)

    def setup_collectives(self) -> None:
        module = ctypes.c_void_p()
        self.call("cuModuleLoadData", ctypes.byref(module), ctypes.c_char_p(COLLECTIVES_TEXT))
        self.call("cuModuleGetFunction", ctypes.byref(self.all_reduce), module,
                  b"ncclDevKernel_AllReduce_Sum_f32_RING_LL")

    def launch(self, function: ctypes.c_void_p) -> None:
        one = ctypes.c_uint(1)
        self.call(
            "cuLaunchKernel",
            function,
            ctypes.c_uint(64),
            one,
            one,
            ctypes.c_uint(128),
            one,
            one,
            ctypes.c_uint(0),
            self.stream,
            None,
            None,
        )


def launch_matmul(driver: Driver) -> None:
    driver.launch(driver.matmul)


def launch_relu(driver: Driver) -> None:
    driver.launch(driver.relu)


def forward(driver: Driver) -> None:
    launch_matmul(driver)
    launch_relu(driver)


def sync_point(driver: Driver) -> None:
    driver.call("cuStreamSynchronize", driver.stream)


def train_step(driver: Driver) -> None:
    forward(driver)
    sync_point(driver)


def load_batch(slow_s: float) -> None:
    if slow_s > 0:
        time.sleep(slow_s)  # the straggler's slow data loader


def all_reduce(driver: Driver) -> None:
    driver.launch(driver.all_reduce)


def ddp_step(driver: Driver, slow_s: float) -> None:
    load_batch(slow_s)
    forward(driver)
    all_reduce(driver)
    sync_point(driver)


def steps_generator(driver: Driver, steps: int) -> Iterator[int]:
    for step in range(steps):
        train_step(driver)
        yield step


def worker(driver: Driver, steps: int) -> None:
    for _ in steps_generator(driver, steps):
        pass


def recurse(driver: Driver, depth: int) -> None:
    if depth == 0:
        train_step(driver)
    else:
        recurse(driver, depth - 1)


def schritt_über(driver: Driver) -> None:
    train_step(driver)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("libcuda")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--release-gil", action="store_true")
    parser.add_argument("--variant", choices=["plain", "thread-generator", "deep", "unicode", "ddp"], default="plain")
    parser.add_argument("--slow-ms", type=float, default=0.0)
    args = parser.parse_args()
    driver = Driver(args.libcuda, args.release_gil)
    driver.setup()
    if args.variant == "ddp":
        driver.setup_collectives()
        for _ in range(args.steps):
            ddp_step(driver, args.slow_ms / 1000)
        print(f"rank {os.environ.get('FAKE_CUDA_RANK', '0')} pid {os.getpid()}")
        return
    if args.variant == "thread-generator":
        thread = threading.Thread(target=worker, args=(driver, args.steps), name="launcher")
        thread.start()
        thread.join()
    for _ in range(args.steps if args.variant != "thread-generator" else 0):
        if args.variant == "deep":
            recurse(driver, 100)
        elif args.variant == "unicode":
            schritt_über(driver)
        else:
            train_step(driver)
    print(f"site launch_matmul matmul_kernel {args.steps} {args.steps * 2000000}")
    print(f"site launch_relu relu_kernel {args.steps} {args.steps * 500000}")


if __name__ == "__main__":
    main()
