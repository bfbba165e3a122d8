# SPDX-License-Identifier: Apache-2.0
"""The ctypes binding over the system's libbpf.so.1 (>= 1.1): the only module that touches the library directly.

Only the functions the loader needs are declared. libbpf runs in its 1.0 mode: calls return NULL or a negative
error and set errno. libbpf's own messages go to this module's logger at DEBUG and the last ones are kept, so that
errors can quote them (:func:`recent_log`).
"""

from __future__ import annotations

import collections
import ctypes
import ctypes.util
import logging
import threading
from typing import Any

_logger = logging.getLogger(__name__)

LIBRARY_NAMES = ("libbpf.so.1", "libbpf.so")

# enum bpf_map_type values used here (uapi/linux/bpf.h)
MAP_TYPE_PERCPU_HASH = 5
MAP_TYPE_PERCPU_ARRAY = 6
MAP_TYPE_LRU_PERCPU_HASH = 10
PERCPU_MAP_TYPES = frozenset({MAP_TYPE_PERCPU_HASH, MAP_TYPE_PERCPU_ARRAY, MAP_TYPE_LRU_PERCPU_HASH})

BTF_KIND_DATASEC = 15

# int (*)(enum libbpf_print_level level, const char *fmt, va_list args)
PRINT_FN = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p)
# int (*)(void *ctx, void *data, size_t size)
RING_BUFFER_SAMPLE_FN = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t)


class UprobeOpts(ctypes.Structure):
    """struct bpf_uprobe_opts (libbpf 1.1 layout)."""

    _fields_ = [
        ("sz", ctypes.c_size_t),
        ("ref_ctr_offset", ctypes.c_size_t),
        ("bpf_cookie", ctypes.c_uint64),
        ("retprobe", ctypes.c_bool),
        ("func_name", ctypes.c_char_p),
    ]


class UsdtOpts(ctypes.Structure):
    """struct bpf_usdt_opts."""

    _fields_ = [("sz", ctypes.c_size_t), ("usdt_cookie", ctypes.c_uint64)]


class MapBatchOpts(ctypes.Structure):
    """struct bpf_map_batch_opts."""

    _fields_ = [("sz", ctypes.c_size_t), ("elem_flags", ctypes.c_uint64), ("flags", ctypes.c_uint64)]


class ProgInfoHead(ctypes.Structure):
    """The head of struct bpf_prog_info, up to its name (the kernel fills as much as the size passed says)."""

    _fields_ = [("type", ctypes.c_uint32), ("id", ctypes.c_uint32), ("tag", ctypes.c_uint8 * 8),
                ("jited_prog_len", ctypes.c_uint32), ("xlated_prog_len", ctypes.c_uint32),
                ("jited_prog_insns", ctypes.c_uint64), ("xlated_prog_insns", ctypes.c_uint64),
                ("load_time", ctypes.c_uint64), ("created_by_uid", ctypes.c_uint32),
                ("nr_map_ids", ctypes.c_uint32), ("map_ids", ctypes.c_uint64), ("name", ctypes.c_char * 16)]


class BtfType(ctypes.Structure):
    """struct btf_type: name offset, info (kind in bits 24-28, vlen in bits 0-15), size/type."""

    _fields_ = [("name_off", ctypes.c_uint32), ("info", ctypes.c_uint32), ("size", ctypes.c_uint32)]


class BtfVarSecinfo(ctypes.Structure):
    """struct btf_var_secinfo: one variable of a DATASEC."""

    _fields_ = [("type", ctypes.c_uint32), ("offset", ctypes.c_uint32), ("size", ctypes.c_uint32)]


_P = ctypes.c_void_p
_I = ctypes.c_int
_U32 = ctypes.c_uint32
_S = ctypes.c_char_p
_SIGNATURES: dict[str, tuple[Any, list[Any]]] = {
    "libbpf_set_print": (_P, [PRINT_FN]),
    "libbpf_num_possible_cpus": (_I, []),
    "bpf_object__open_file": (_P, [_S, _P]),
    "bpf_object__load": (_I, [_P]),
    "bpf_object__close": (None, [_P]),
    "bpf_object__btf": (_P, [_P]),
    "bpf_object__find_map_by_name": (_P, [_P, _S]),
    "bpf_object__find_program_by_name": (_P, [_P, _S]),
    "bpf_map__fd": (_I, [_P]),
    "bpf_map__name": (_S, [_P]),
    "bpf_map__type": (_I, [_P]),
    "bpf_map__key_size": (_U32, [_P]),
    "bpf_map__value_size": (_U32, [_P]),
    "bpf_map__max_entries": (_U32, [_P]),
    "bpf_map__set_max_entries": (_I, [_P, _U32]),
    "bpf_map__reuse_fd": (_I, [_P, _I]),
    "bpf_map__initial_value": (_P, [_P, ctypes.POINTER(ctypes.c_size_t)]),
    "bpf_object__next_program": (_P, [_P, _P]),
    "bpf_program__name": (_S, [_P]),
    "bpf_program__fd": (_I, [_P]),
    "bpf_obj_get_info_by_fd": (_I, [_I, _P, ctypes.POINTER(_U32)]),
    "bpf_program__attach_perf_event": (_P, [_P, _I]),
    "bpf_program__attach_uprobe_opts": (_P, [_P, _I, _S, ctypes.c_size_t, ctypes.POINTER(UprobeOpts)]),
    "bpf_program__attach_usdt": (_P, [_P, _I, _S, _S, _S, ctypes.POINTER(UsdtOpts)]),
    "bpf_link__destroy": (_I, [_P]),
    "bpf_map_lookup_elem": (_I, [_I, _P, _P]),
    "bpf_map_update_elem": (_I, [_I, _P, _P, ctypes.c_uint64]),
    "bpf_map_delete_elem": (_I, [_I, _P]),
    "bpf_map_get_next_key": (_I, [_I, _P, _P]),
    "bpf_map_lookup_and_delete_batch": (_I, [_I, _P, _P, _P, _P, ctypes.POINTER(_U32), ctypes.POINTER(MapBatchOpts)]),
    "ring_buffer__new": (_P, [_I, RING_BUFFER_SAMPLE_FN, _P, _P]),
    "ring_buffer__add": (_I, [_P, _I, RING_BUFFER_SAMPLE_FN, _P]),
    "ring_buffer__poll": (_I, [_P, _I]),
    "ring_buffer__consume": (_I, [_P]),
    "ring_buffer__epoll_fd": (_I, [_P]),
    "ring_buffer__free": (None, [_P]),
    "btf__find_by_name_kind": (ctypes.c_int32, [_P, _S, _U32]),
    "btf__type_by_id": (ctypes.POINTER(BtfType), [_P, _U32]),
    "btf__name_by_offset": (_S, [_P, _U32]),
}

_LOG_LINES = 32
_log: collections.deque[str] = collections.deque(maxlen=_LOG_LINES)
_lock = threading.Lock()
_lib: ctypes.CDLL | None = None
_libc = ctypes.CDLL(None, use_errno=True)
_libc.vsnprintf.argtypes = [ctypes.c_char_p, ctypes.c_size_t, ctypes.c_char_p, ctypes.c_void_p]
_libc.vsnprintf.restype = ctypes.c_int


def _print(level: int, fmt: bytes | None, args: int | None) -> int:
    """libbpf's print callback: format the message with vsnprintf, keep it, log it at DEBUG."""
    buffer = ctypes.create_string_buffer(1024)
    _libc.vsnprintf(buffer, len(buffer), fmt, args)
    text = buffer.value.decode(errors="replace").rstrip()
    if text:
        _log.append(text)
        _logger.debug("%s", text)
    return 0


_print_fn = PRINT_FN(_print)  # kept alive for the library's lifetime


def lib() -> ctypes.CDLL:
    """The loaded libbpf with prototypes declared. Raises OSError naming libbpf.so.1 when it cannot be loaded."""
    global _lib
    with _lock:
        if _lib is not None:
            return _lib
        errors = []
        for name in LIBRARY_NAMES + tuple(filter(None, [ctypes.util.find_library("bpf")])):
            try:
                candidate = ctypes.CDLL(name, use_errno=True)
            except OSError as exc:
                errors.append(str(exc))
                continue
            if not hasattr(candidate, "bpf_program__attach_usdt"):
                errors.append(f"{name} is older than libbpf 1.0")
                continue
            for function, (restype, argtypes) in _SIGNATURES.items():
                fn = getattr(candidate, function)
                fn.restype = restype
                fn.argtypes = argtypes
            candidate.libbpf_set_print(_print_fn)
            _lib = candidate
            return candidate
        raise OSError(f"libbpf.so.1 not found (install libbpf1 >= 1.1): {'; '.join(errors)}")


def recent_log() -> list[str]:
    """The last lines libbpf printed (newest last)."""
    return list(_log)


def clear_log() -> None:
    """Forget libbpf's recent lines (before an operation whose messages should be quoted on failure)."""
    _log.clear()


def errno() -> int:
    """errno as left by the last libbpf call on this thread."""
    return ctypes.get_errno()


def libc() -> ctypes.CDLL:
    """The C library (for syscall, ioctl, close)."""
    return _libc
