# SPDX-License-Identifier: Apache-2.0
"""The agent's ELF symbol-table reader: libotel_gpu_symtab.so (``symbolize/native/symtab.c``), loaded with ctypes.

It reads the function symbols of a file's .symtab and .dynsym into the same sorted arrays as
``ElfSymbols._read_symbols`` + ``ElfSymbols._store`` (the Python reference the tests compare it with), without a
Python object per symbol and with the GIL released (docs/benchmarks.md, "s13-symtab")."""

from __future__ import annotations

import ctypes
import errno
import logging
import os
from array import array
from pathlib import Path

from otel_gpu._native import NativeLibrary

LIBRARY_PATH = Path(__file__).parent / "native" / "libotel_gpu_symtab.so"

_log = logging.getLogger(__name__)


class _TableSpec(ctypes.Structure):
    _fields_ = [("offset", ctypes.c_uint64), ("size", ctypes.c_uint64), ("str_offset", ctypes.c_uint64),
                ("str_size", ctypes.c_uint64)]


_HANDLE, _U64 = ctypes.c_void_p, ctypes.c_uint64
_SIGNATURES = {
    "otel_gpu_symtab_read": ([ctypes.c_int, ctypes.c_char_p, _U64, ctypes.POINTER(_TableSpec), ctypes.c_int, _U64],
                             _HANDLE),
    "otel_gpu_symtab_error": ([_HANDLE], ctypes.c_int),
    "otel_gpu_symtab_count": ([_HANDLE], _U64),
    "otel_gpu_symtab_last_start": ([_HANDLE], _U64),
    "otel_gpu_symtab_write": ([_HANDLE, ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int],
                              None),
    "otel_gpu_symtab_release": ([_HANDLE], None),
}


def _warn_missing(error: str) -> None:
    _log.warning("%s: ELF symbol tables are read in Python (slower)", error)


LIBRARY = NativeLibrary(LIBRARY_PATH, _SIGNATURES, on_missing=_warn_missing)


def available() -> bool:
    """Whether the library loads (loading it on the first call; a library that does not load is logged once)."""
    return LIBRARY.get() is not None


def read_functions(fd: int, image: bytes | None, file_size: int, tables: list[tuple[int, int, int, int]],
                   max_bytes: int, name_typecode: str) -> tuple[array[int], array[int], array[int]]:
    """(starts, sizes, name offsets) of the function symbols of ``tables`` (up to two: .symtab then .dynsym, each
    (offset, size, string table offset, string table size) in bytes), read from the open file ``fd`` or from
    ``image`` when it is not None, at most ``max_bytes`` of table in all. Starts are 4-byte ("I") when every one
    fits, else 8-byte; name offsets have ``name_typecode``.

    Raises OSError when the library does not load or a read fails, MemoryError when memory runs out."""
    lib = LIBRARY.get()
    if lib is None:
        raise OSError(errno.ENOENT, LIBRARY.error)
    specs = (_TableSpec * 2)(*(_TableSpec(*table) for table in tables))
    handle = lib.otel_gpu_symtab_read(-1 if image is not None else fd, image, file_size, specs, len(tables),
                                      max(0, max_bytes))
    if not handle:
        raise MemoryError("ELF symbol-table reader: out of memory")
    try:
        failed = lib.otel_gpu_symtab_error(handle)
        if failed:
            raise OSError(failed, os.strerror(failed))
        count = lib.otel_gpu_symtab_count(handle)
        narrow = count and lib.otel_gpu_symtab_last_start(handle) < 1 << 32  # sorted: every start fits in 4 bytes
        starts = array("I" if narrow else "Q", [0]) * count
        sizes = array("I", [0]) * count
        name_at = array(name_typecode, [0]) * count
        if count:
            lib.otel_gpu_symtab_write(handle, starts.buffer_info()[0], starts.itemsize, sizes.buffer_info()[0],
                                      name_at.buffer_info()[0], name_at.itemsize)
        return starts, sizes, name_at
    finally:
        lib.otel_gpu_symtab_release(handle)
