# SPDX-License-Identifier: Apache-2.0
"""An instrumented program on the fake CUDA stack with two devices: each step runs a root span "both" that launches
on device 0 itself and on device 1 in its child "both-child", a root "only-1" that launches on device 1, a root "idle"
that launches nothing, and launches on device 0 outside any span. The function that launches names the device
(on_device_0, on_device_1). Prints every finished span as
`span <name> <span hex> <local root hex or -> <cuda.sampled_devices as d,d or ->`.

usage: device_span_workload.py LIBCUDA WORKLOAD_PY [--steps N]
"""

from __future__ import annotations

import argparse
from typing import Any

from span_workload import instrumented_provider, load_workload  # the script's folder is first on sys.path


def launch_and_wait(driver: Any, device: int) -> None:
    driver.use_device(device)
    driver.launch(driver.relu)
    driver.call("cuStreamSynchronize", driver.stream)


def on_device_0(driver: Any) -> None:
    launch_and_wait(driver, 0)


def on_device_1(driver: Any) -> None:
    launch_and_wait(driver, 1)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("libcuda")
    parser.add_argument("workload_py")
    parser.add_argument("--steps", type=int, default=100)
    args = parser.parse_args()
    module = load_workload(args.workload_py)
    provider, exporter = instrumented_provider()
    tracer = provider.get_tracer("device_span_workload")
    driver = module.Driver(args.libcuda, False)
    driver.setup()
    for _ in range(args.steps):
        with tracer.start_as_current_span("both"):
            on_device_0(driver)
            with tracer.start_as_current_span("both-child"):
                on_device_1(driver)
        with tracer.start_as_current_span("only-1"):
            on_device_1(driver)
        with tracer.start_as_current_span("idle"):
            pass
        on_device_0(driver)
    for span in exporter.get_finished_spans():
        devices = (span.attributes or {}).get("cuda.sampled_devices")
        root = "-" if span.parent else f"{span.context.span_id:016x}"
        print(f"span {span.name} {span.context.span_id:016x} {root} {','.join(map(str, devices)) if devices else '-'}")
    provider.shutdown()


if __name__ == "__main__":
    main()
