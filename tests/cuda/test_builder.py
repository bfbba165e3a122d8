# SPDX-License-Identifier: Apache-2.0
"""Pure profile pieces: leaf frames, attributes, Python-frame merge, demangling, accumulation."""

from __future__ import annotations

from otel_gpu import semconv
from otel_gpu.cuda import abi, builder
from otel_gpu.procfs import ProcessInfo
from otel_gpu.profiles.model import Frame, FrameKind, gpu_time_profile_type
from otel_gpu.symbolize.demangle import demangle
from tests.cuda.records import kernel, memcpy, sync


def test_demangle_kernel_names() -> None:
    assert demangle("_Z6matmulPfS_S_i") == "matmul(float*, float*, float*, int)"
    assert demangle("plain_c_kernel") == "plain_c_kernel"
    assert demangle("_Z_truncated_garbage") == "_Z_truncated_garbage"


def test_kernel_frame_keeps_the_mangled_name() -> None:
    frame = builder.work_frame(kernel(1, 1, 10))
    assert frame == Frame("matmul(float*, float*, float*, int)", FrameKind.CUDA, system_name="_Z6matmulPfS_S_i")
    assert builder.work_attributes(kernel(1, 1, 10, device=2, stream=5)) == (
        (semconv.CUDA_DEVICE, 2), (semconv.CUDA_STREAM, 5))
    assert (semconv.CUDA_GRAPH, 4) in builder.work_attributes(kernel(1, 1, 10, graph=4))


def test_memcpy_and_memset_frames() -> None:
    copy = memcpy(1, 1, 10, 4 << 20, copy_kind=2, src_kind=3, dst_kind=1)
    assert builder.work_frame(copy).function == "[memcpy DtoH 4.0 MiB pageable]"
    attrs = dict(builder.work_attributes(copy))
    assert (attrs[semconv.CUDA_MEMCPY_KIND], attrs[semconv.CUDA_HOST_MEMORY], attrs[semconv.CUDA_MEMORY_BYTES]) == (
        "DtoH", "pageable", 4 << 20)
    pinned = memcpy(1, 1, 10, 1536, copy_kind=1, src_kind=2, dst_kind=3)
    assert builder.work_frame(pinned).function == "[memcpy HtoD 1.5 KiB pinned]"
    dtod = memcpy(1, 1, 10, 100, copy_kind=8, src_kind=3, dst_kind=3)
    assert builder.work_frame(dtod).function == "[memcpy DtoD 100 B]"
    memset = abi.Activity(1, abi.ACTIVITY_MEMSET, 1, 0, 5, 0, 0, 0, "", 2 << 30, 0, 3, 0)
    assert builder.work_frame(memset).function == "[memset 2.0 GiB]"


def test_sync_frame_names_the_call() -> None:
    assert builder.sync_frame(sync(1, 10, cbid=126)).function == "[cuStreamSynchronize]"
    assert builder.sync_frame(sync(1, 10, cbid=17, kind=abi.SYNC_CONTEXT)).function == "[cuCtxSynchronize]"
    assert builder.sync_frame(sync(1, 10, cbid=-1, kind=abi.SYNC_EVENT)).function == "[cuEventSynchronize]"


def test_accumulator_sums_and_rounds() -> None:
    acc = builder.ProfileAccumulator(gpu_time_profile_type())
    stack = (Frame("k", FrameKind.CUDA), Frame("main"))
    acc.add(5, stack, 100.4, 7, "t", ((semconv.CUDA_DEVICE, 0),))
    acc.add(5, stack, 100.4, 7, "t", ((semconv.CUDA_DEVICE, 0),))
    acc.add(5, stack, 50, 7, "t", ((semconv.CUDA_DEVICE, 1),))
    acc.add(6, stack, 0.2, 1, "u")  # rounds to 0: left out
    batch = acc.build(1, 2, {5: ProcessInfo(5, "train")}, sampling_fraction=0.1)
    assert batch.type.sample_type == "gpu_time" and batch.type.period_type == "gpu"
    assert batch.sampling_fraction == 0.1
    assert [p.process.pid for p in batch.processes] == [5]
    assert [(s.value, s.attributes) for s in batch.processes[0].samples] == [
        (201, ((semconv.CUDA_DEVICE, 0),)), (50, ((semconv.CUDA_DEVICE, 1),))]
    assert acc.build(1, 2, {}).processes == ()
