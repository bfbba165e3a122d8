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
    PYTHON_SAMPLES = 9
    PYTHON_NO_THREAD = 10
    PYTHON_TRUNCATED = 11
    PYTHON_STACKS_FULL = 12
    UNWIND_SAMPLES = 13
    UNWIND_FP_FRAMES = 14
    UNWIND_NO_MAPPING = 15
    UNWIND_UNSUPPORTED = 16
    UNWIND_READ_FAILED = 17
    UNWIND_TRUNCATED = 18
    UNWIND_NO_REGS = 19
    UNWIND_BAD_FP = 20
    PYTHON_EVENTS_FULL = 21


STAT_COUNT = 22
PYTHON_NO_OFFSET = 0xFFFF
MAX_PYTHON_DEPTH = 128
PYTHON_ENTRY_WORDS = MAX_PYTHON_DEPTH // 64
PYTHON_TRUNCATED = 1
UNWIND_MAX_MAPPINGS = 256
UNWIND_MAX_FILES = 16384  # file ids, each a counter in unwind_file_hits
UNWOUND_ID_BASE = 0x40000000  # user_stack_id of a stack walked by native_unwind.h: in unwound_stacks{0,1}


class UnwindKind(enum.IntEnum):
    """enum otel_gpu_unwind_kind: how a row steps to the caller (same values as otel_gpu.unwind.table.KIND_*)."""

    NONE = 0
    RSP = 1
    RBP = 2
    END = 3
    UNSUPPORTED = 4


# A row's 32-bit rule, from the low bits up: kind, rbp_offset (signed), cfa_offset (signed); see cpu_profiler.h
UNWIND_KIND_BITS = 3
UNWIND_RBP_BITS = 8
UNWIND_CFA_BITS = 21


class UnwindRow(ctypes.Structure):
    """struct otel_gpu_unwind_row: pc is an offset from the table's base (the mapping's bias includes it)."""

    _fields_ = [
        ("pc", ctypes.c_uint32),
        ("rule", ctypes.c_uint32),
    ]


class UnwindMapping(ctypes.Structure):
    """struct otel_gpu_unwind_mapping."""

    _fields_ = [
        ("start", ctypes.c_uint64),
        ("end", ctypes.c_uint64),
        ("bias", ctypes.c_uint64),
        ("first_row", ctypes.c_uint32),
        ("row_count", ctypes.c_uint32),
        ("file_id", ctypes.c_uint32),
        ("reserved", ctypes.c_uint32),
    ]


class UnwindProcess(ctypes.Structure):
    """struct otel_gpu_unwind_process."""

    _fields_ = [
        ("count", ctypes.c_uint32),
        ("reserved", ctypes.c_uint32),
        ("mappings", UnwindMapping * UNWIND_MAX_MAPPINGS),
    ]


class UnwoundStack(ctypes.Structure):
    """struct otel_gpu_unwound_stack."""

    _fields_ = [
        ("hash", ctypes.c_uint64),
        ("depth", ctypes.c_uint32),
        ("reserved", ctypes.c_uint32),
        ("frames", ctypes.c_uint64 * MAX_STACK_DEPTH),
    ]


class SampleKey(ctypes.Structure):
    """struct otel_gpu_sample_key."""

    _fields_ = [
        ("pid", ctypes.c_uint32),
        ("tid", ctypes.c_uint32),
        ("user_stack_id", ctypes.c_int32),
        ("kernel_stack_id", ctypes.c_int32),
        ("python_stack_id", ctypes.c_uint64),
        ("trace_id", ctypes.c_uint8 * 16),
        ("span_id", ctypes.c_uint8 * 8),
        ("exec_id", ctypes.c_uint32),
        ("reserved", ctypes.c_uint32),
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
        ("exec_id", ctypes.c_uint32),
        ("reserved", ctypes.c_uint32),
        ("arg_start", ctypes.c_uint64),
    ]


class PythonStackEvent(ctypes.Structure):
    """struct otel_gpu_python_stack_event."""

    _fields_ = [
        ("pid", ctypes.c_uint32),
        ("reserved", ctypes.c_uint32),
        ("stack_id", ctypes.c_uint64),
    ]


class RawSample(ctypes.Structure):
    """struct otel_gpu_raw_sample."""

    _fields_ = [
        ("pid", ctypes.c_uint32),
        ("tid", ctypes.c_uint32),
        ("user_bytes", ctypes.c_int32),
        ("kernel_bytes", ctypes.c_int32),
        ("comm", ctypes.c_char * COMM_LEN),
        ("python_stack_id", ctypes.c_uint64),
        ("user", ctypes.c_uint64 * MAX_STACK_DEPTH),
        ("kernel", ctypes.c_uint64 * MAX_STACK_DEPTH),
        ("trace_id", ctypes.c_uint8 * 16),
        ("span_id", ctypes.c_uint8 * 8),
        ("exec_id", ctypes.c_uint32),
        ("reserved", ctypes.c_uint32),
    ]


class PythonProc(ctypes.Structure):
    """struct otel_gpu_python_proc."""

    _fields_ = [
        ("interpreters_head", ctypes.c_uint64),
        ("version", ctypes.c_uint32),
        ("interp_threads_head", ctypes.c_uint16),
        ("tstate_next", ctypes.c_uint16),
        ("tstate_thread_id", ctypes.c_uint16),
        ("tstate_frame", ctypes.c_uint16),
        ("cframe_current", ctypes.c_uint16),
        ("frame_code", ctypes.c_uint16),
        ("frame_previous", ctypes.c_uint16),
        ("frame_instr", ctypes.c_uint16),
        ("frame_owner", ctypes.c_uint16),
        ("code_adaptive", ctypes.c_uint16),
        ("frame_is_entry", ctypes.c_uint16),
        ("instr_is_lasti", ctypes.c_uint8),
        ("owner_cstack", ctypes.c_uint8),
        ("reserved", ctypes.c_uint8 * 4),
    ]


class PythonStack(ctypes.Structure):
    """struct otel_gpu_python_stack."""

    _fields_ = [
        ("depth", ctypes.c_uint32),
        ("flags", ctypes.c_uint32),
        ("entries", ctypes.c_uint64 * PYTHON_ENTRY_WORDS),  # bit i % 64 of word i // 64: frame i is the outermost
        # its evaluation loop runs
        ("code", ctypes.c_uint64 * MAX_PYTHON_DEPTH),
        ("offset", ctypes.c_uint32 * MAX_PYTHON_DEPTH),
    ]


class Control(ctypes.Structure):
    """struct otel_gpu_control."""

    _fields_ = [("generation", ctypes.c_uint32), ("reserved", ctypes.c_uint32)]


StackTrace = ctypes.c_uint64 * MAX_STACK_DEPTH
