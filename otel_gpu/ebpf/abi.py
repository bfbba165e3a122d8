# SPDX-License-Identifier: Apache-2.0
"""ctypes mirrors of what the eBPF programs share with user space: ``programs/common.h`` (every program) and
``programs/cpu_profiler.h`` (the CPU sampler), each in one place below; the GPU-time program's ``gpu_time.h`` is
mirrored in :mod:`otel_gpu.cuda.abi`. tests/ebpf/test_abi.py checks every mirror against its header.

The convention, for every header: a constant per ``#define`` named without the ``OTEL_GPU_`` prefix, an
``enum.IntEnum`` per C enum named after it, a ``ctypes.Structure`` per struct whose docstring names it (``FooC`` where
a decoded record already takes the name ``Foo``, as in :mod:`otel_gpu.cuda.abi`).
"""

from __future__ import annotations

import ctypes
import enum

# --- common.h ---------------------------------------------------------------------------------------------------------

COMM_LEN = 16

# --- cpu_profiler.h ---------------------------------------------------------------------------------------------------

MAX_STACK_DEPTH = 127


class CPUStat(enum.IntEnum):
    """enum otel_gpu_cpu_stat: indices of the CPU sampler's per-CPU statistics array."""

    SAMPLES = 0
    FILTERED = 1
    USER_COLLISION = 2
    KERNEL_COLLISION = 3
    STACK_ERROR = 4
    COUNTS_FULL = 5
    EVENTS_FULL = 6
    RAW_SENT = 7
    RAW_FULL = 8


STAT_COUNT = 9


class SampleKey(ctypes.Structure):
    """struct otel_gpu_sample_key."""

    _fields_ = [
        ("pid", ctypes.c_uint32),
        ("tid", ctypes.c_uint32),
        ("user_stack_id", ctypes.c_int32),
        ("kernel_stack_id", ctypes.c_int32),
        ("trace_id", ctypes.c_uint8 * 16),
        ("span_id", ctypes.c_uint8 * 8),
    ]


class SampleValue(ctypes.Structure):
    """struct otel_gpu_sample_value."""

    _fields_ = [("count", ctypes.c_uint64), ("comm", ctypes.c_char * COMM_LEN)]


class ProcessEvent(ctypes.Structure):
    """struct otel_gpu_process_event."""

    _fields_ = [
        ("pid", ctypes.c_uint32),
        ("tid", ctypes.c_uint32),
        ("time_ns", ctypes.c_uint64),
        ("comm", ctypes.c_char * COMM_LEN),
    ]


class RawSample(ctypes.Structure):
    """struct otel_gpu_raw_sample."""

    _fields_ = [
        ("pid", ctypes.c_uint32),
        ("tid", ctypes.c_uint32),
        ("user_bytes", ctypes.c_int32),
        ("kernel_bytes", ctypes.c_int32),
        ("comm", ctypes.c_char * COMM_LEN),
        ("user", ctypes.c_uint64 * MAX_STACK_DEPTH),
        ("kernel", ctypes.c_uint64 * MAX_STACK_DEPTH),
        ("trace_id", ctypes.c_uint8 * 16),
        ("span_id", ctypes.c_uint8 * 8),
    ]


class Control(ctypes.Structure):
    """struct otel_gpu_control."""

    _fields_ = [("generation", ctypes.c_uint32), ("reserved", ctypes.c_uint32)]


StackTrace = ctypes.c_uint64 * MAX_STACK_DEPTH
