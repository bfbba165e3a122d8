# SPDX-License-Identifier: Apache-2.0
"""Known profile batches for encoder and exporter tests: values chosen so every total can be checked exactly."""

from __future__ import annotations

from otel_gpu.procfs import ProcessInfo
from otel_gpu.profiles.model import (
    Frame,
    FrameKind,
    Mapping,
    ProcessProfile,
    ProfileBatch,
    Sample,
    cpu_profile_type,
    gpu_time_profile_type,
    sync_wait_profile_type,
)

START_NS = 1_764_000_000_000_000_000
DURATION_NS = 10_000_000_000

EXE = Mapping(0x400000, 0x500000, 0, "/usr/bin/worker", "abcdef0123456789")
LIBC = Mapping(0x7F0000000000, 0x7F0000200000, 0x28000, "/usr/lib/x86_64-linux-gnu/libc.so.6", "0011223344")

MAIN = Frame("main", FrameKind.NATIVE, 0x401000, EXE, filename="worker.c", line=40)
HOT = Frame("hot_loop", FrameKind.NATIVE, 0x401100, EXE, system_name="hot_loop", filename="worker.c", line=12)
COLD = Frame("cold_loop", FrameKind.NATIVE, 0x401200, EXE, filename="worker.c", line=20)
WRITE = Frame("__GI___libc_write", FrameKind.NATIVE, 0x7F0000031000, LIBC)
KSYS = Frame("ksys_write", FrameKind.KERNEL, 0xFFFFFFFF81000000)

WORKER = ProcessInfo(pid=4242, executable_name="worker", executable_path="/usr/bin/worker",
                     container_id="c" * 64, pod_uid="11111111-2222-3333-4444-555555555555", service_name="checkout")
OTHER = ProcessInfo(pid=77, executable_name="other", executable_path="/opt/other")

TRACE_ID = "0af7651916cd43dd8448eb211c80319c"
SPAN_ID = "b7ad6b7169203331"


def cpu_batch(frequency_hz: int = 100) -> ProfileBatch:
    """hot_loop 30 samples, cold_loop 10, a kernel write 5 (worker); other: main 7 with a trace link."""
    worker = ProcessProfile(WORKER, (
        Sample((HOT, MAIN), 30, thread_id=4242, thread_name="worker"),
        Sample((COLD, MAIN), 10, thread_id=4243, thread_name="helper"),
        Sample((KSYS, WRITE, MAIN), 5, thread_id=4242, thread_name="worker"),
    ))
    other = ProcessProfile(OTHER, (
        Sample((MAIN,), 7, thread_id=77, thread_name="other", trace_id=TRACE_ID, span_id=SPAN_ID),
    ))
    return ProfileBatch(cpu_profile_type(frequency_hz), START_NS, DURATION_NS, (worker, other))


def gpu_batch() -> ProfileBatch:
    """GPU time (ns) of two kernels launched from hot_loop/cold_loop, sampled at 25 %."""
    kernel_a = Frame("gemm_kernel(float*, int)", FrameKind.CUDA, system_name="_Z11gemm_kernelPfi")
    kernel_b = Frame("add_kernel", FrameKind.CUDA, system_name="_Z10add_kernelv")
    kind = gpu_time_profile_type()
    worker = ProcessProfile(WORKER, (
        Sample((kernel_a, HOT, MAIN), 3_000_000, thread_id=4242, thread_name="worker",
               attributes=(("cuda.device", 0), ("cuda.stream", 7), ("cuda.graph", 0))),
        Sample((kernel_b, COLD, MAIN), 1_000_000, thread_id=4242, thread_name="worker",
               attributes=(("cuda.device", 0), ("cuda.stream", 7), ("cuda.graph", 0))),
    ))
    return ProfileBatch(kind, START_NS, DURATION_NS, (worker,), sampling_fraction=0.25,
                        attributes=(("otel_gpu.profile.kind", "gpu_time"),))


def sync_wait_batch() -> ProfileBatch:
    """Blocked time (ns) of one thread in cudaStreamSynchronize under cold_loop."""
    wait = Frame("[cudaStreamSynchronize]", FrameKind.CUDA)
    worker = ProcessProfile(WORKER, (Sample((wait, COLD, MAIN), 2_500_000, thread_id=4242, thread_name="worker"),))
    return ProfileBatch(sync_wait_profile_type(), START_NS, DURATION_NS, (worker,))
