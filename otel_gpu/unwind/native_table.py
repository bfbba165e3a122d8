# SPDX-License-Identifier: Apache-2.0
"""The agent's unwind-table builder: libotel_gpu_cfi.so (``unwind/native/cfi_table.c``), loaded with ctypes.

It turns a frame section into the same sorted ``pcs``/``rules`` arrays as ``cfi.parse_frames`` +
``cfi.table_from_fdes`` (the reference the tests compare it with), about a hundred times faster and without a
Python object per row (docs/benchmarks.md, "Native unwind-table builder")."""

from __future__ import annotations

import ctypes
import threading
from array import array
from pathlib import Path

LIBRARY_PATH = Path(__file__).parent / "native" / "libotel_gpu_cfi.so"


class NativeBuilderMissing(OSError):
    """libotel_gpu_cfi.so is not there or does not load (the package was installed without ``make build``)."""


class _Table(ctypes.Structure):
    _fields_ = [("pcs", ctypes.POINTER(ctypes.c_uint64)), ("rules", ctypes.POINTER(ctypes.c_uint64)),
                ("count", ctypes.c_uint64)]


_lock = threading.Lock()
_lib: ctypes.CDLL | None = None
_load_error: str | None = None


def _library() -> ctypes.CDLL:
    global _lib, _load_error
    with _lock:
        if _lib is None and _load_error is None:
            try:
                lib = ctypes.CDLL(str(LIBRARY_PATH))
            except OSError as exc:
                _load_error = f"{LIBRARY_PATH} does not load ({exc}); run `make build`"
            else:
                lib.otel_gpu_cfi_build.argtypes = [ctypes.c_char_p, ctypes.c_uint64, ctypes.c_uint64, ctypes.c_int,
                                                   ctypes.POINTER(_Table)]
                lib.otel_gpu_cfi_build.restype = ctypes.c_int
                lib.otel_gpu_cfi_free.argtypes = [ctypes.POINTER(_Table)]
                lib.otel_gpu_cfi_free.restype = None
                _lib = lib
        if _lib is None:
            raise NativeBuilderMissing(_load_error)
        return _lib


def available() -> bool:
    """Whether the library loads (loading it on the first call)."""
    try:
        _library()
    except NativeBuilderMissing:
        return False
    return True


def build_rows(section: bytes, section_vaddr: int, is_eh: bool) -> tuple[array[int], array[int]]:
    """(pcs, rules) of the ``.eh_frame`` (``is_eh``) or ``.debug_frame`` bytes loaded at ``section_vaddr``.

    Raises NativeBuilderMissing without the library, MemoryError when it runs out of memory. The GIL is released
    while it builds (ctypes drops it for the call)."""
    lib = _library()
    table = _Table()
    if lib.otel_gpu_cfi_build(section, len(section), section_vaddr & 0xFFFFFFFFFFFFFFFF, int(is_eh),
                              ctypes.byref(table)) != 0:
        raise MemoryError("unwind table builder: out of memory")
    try:
        pcs, rules = array("Q"), array("Q")
        for out, pointer in ((pcs, table.pcs), (rules, table.rules)):
            if table.count:  # one copy, from the library's buffer into the array
                out.frombytes(memoryview((ctypes.c_uint64 * table.count).from_address(
                    ctypes.addressof(pointer.contents))).cast("B"))
        return pcs, rules
    finally:
        lib.otel_gpu_cfi_free(ctypes.byref(table))
