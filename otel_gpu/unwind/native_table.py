# SPDX-License-Identifier: Apache-2.0
"""The agent's unwind-table builder: libotel_gpu_cfi.so (``unwind/native/cfi_table.c``), loaded with ctypes.

It turns a frame section into the same sorted ``pcs``/``rules`` arrays as ``cfi.parse_frames`` +
``cfi.table_from_fdes`` (the reference the tests compare it with), about a hundred times faster and without a
Python object per row (docs/benchmarks.md, "Native unwind-table builder")."""

from __future__ import annotations

import ctypes
from array import array
from pathlib import Path

from otel_gpu._native import NativeLibrary

LIBRARY_PATH = Path(__file__).parent / "native" / "libotel_gpu_cfi.so"
MAX_PC_SPAN = (1 << 32) - 1  # unwind_rows' pcs are 32-bit offsets from a table's first pc


class NativeBuilderMissing(OSError):
    """libotel_gpu_cfi.so is not there or does not load (the package was installed without ``make build``)."""


_HANDLE, _U64 = ctypes.c_void_p, ctypes.c_uint64
_SIGNATURES = {
    "otel_gpu_cfi_parse": ([ctypes.c_char_p, _U64, _U64, ctypes.c_int], _HANDLE),
    "otel_gpu_cfi_count": ([_HANDLE], _U64),
    "otel_gpu_cfi_base": ([_HANDLE], _U64),
    "otel_gpu_cfi_span": ([_HANDLE], _U64),
    "otel_gpu_cfi_arrays": ([_HANDLE, ctypes.c_void_p, ctypes.c_void_p], None),
    "otel_gpu_cfi_write": ([_HANDLE, ctypes.c_void_p], ctypes.c_int),
    "otel_gpu_cfi_release": ([_HANDLE], None),
}

LIBRARY = NativeLibrary(LIBRARY_PATH, _SIGNATURES)


def _library() -> ctypes.CDLL:
    lib = LIBRARY.get()
    if lib is None:
        raise NativeBuilderMissing(LIBRARY.error)
    return lib


def available() -> bool:
    """Whether the library loads (loading it on the first call)."""
    return LIBRARY.get() is not None


class ParsedRows:
    """A parsed frame section held by the library: ``count`` rows from the link-time pc ``base`` to ``base + span``,
    written on demand into two arrays (:meth:`arrays`) or straight into an array of ``struct otel_gpu_unwind_row``
    (:meth:`write_rows`), so the agent never holds a copy of a large table. Release with :meth:`close` (or
    ``with``)."""

    def __init__(self, lib: ctypes.CDLL, handle: int, section: bytes) -> None:
        self._lib = lib
        self._handle: int | None = handle
        self._section: bytes | None = section  # the library makes the rows from it when they are written
        self.count: int = lib.otel_gpu_cfi_count(handle)
        self.base: int = lib.otel_gpu_cfi_base(handle)  # the first row's pc, which unwind_rows' pcs are offsets from
        self.span: int = lib.otel_gpu_cfi_span(handle)  # the last row's pc - base

    def arrays(self) -> tuple[array[int], array[int]]:
        """(pcs, rules) as two arrays: link-time pcs (8 bytes), packed rules (4 bytes)."""
        pcs, rules = array("Q", [0]) * self.count, array("I", [0]) * self.count
        if self.count:
            self._lib.otel_gpu_cfi_arrays(self._live(), pcs.buffer_info()[0], rules.buffer_info()[0])
        return pcs, rules

    def fits_rows(self) -> bool:
        """Whether the rows' pcs fit unwind_rows' 32-bit offsets from ``base`` (code spanning less than 4 GiB)."""
        return self.span <= MAX_PC_SPAN

    def write_rows(self, address: int) -> None:
        """Writes the ``count`` rows (8 bytes each: pc - base, packed rule) at ``address``, which must hold them.
        Raises ValueError when they do not fit (:meth:`fits_rows`)."""
        if self.count and self._lib.otel_gpu_cfi_write(self._live(), address):
            raise ValueError(f"unwind table spans {self.span} bytes of code, past 32-bit row offsets")

    def close(self) -> None:
        if self._handle is not None:
            self._lib.otel_gpu_cfi_release(self._handle)
            self._handle = self._section = None

    def _live(self) -> int:
        if self._handle is None:
            raise ValueError("rows already released")
        return self._handle

    def __enter__(self) -> ParsedRows:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def __del__(self) -> None:
        self.close()


def parse(section: bytes, section_vaddr: int, is_eh: bool) -> ParsedRows:
    """The table of the ``.eh_frame`` (``is_eh``) or ``.debug_frame`` bytes loaded at ``section_vaddr``.

    Raises NativeBuilderMissing without the library, MemoryError when it runs out of memory. The GIL is released
    while it parses (ctypes drops it for the call)."""
    lib = _library()
    handle = lib.otel_gpu_cfi_parse(section, len(section), section_vaddr & 0xFFFFFFFFFFFFFFFF, int(is_eh))
    if not handle:
        raise MemoryError("unwind table builder: out of memory")
    return ParsedRows(lib, handle, section)


def build_rows(section: bytes, section_vaddr: int, is_eh: bool) -> tuple[array[int], array[int]]:
    """(pcs, rules) of the frame section (see :func:`parse`)."""
    with parse(section, section_vaddr, is_eh) as rows:
        return rows.arrays()
