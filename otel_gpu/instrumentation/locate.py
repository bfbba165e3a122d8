# SPDX-License-Identifier: Apache-2.0
"""Where another process keeps its span context table: the agent's side of docs/span-context.md.

The table is the data symbol ``otel_gpu_span_context_table`` of libotel_gpu_context.so; its address is the start of
the library's offset-0 mapping in /proc/PID/maps plus the symbol's value (a shared object's first PT_LOAD is at 0).
"""

from __future__ import annotations

import struct
from pathlib import Path

from otel_gpu.instrumentation._table import MAGIC, SLOT_SIZE, SYMBOL, VERSION
from otel_gpu.procfs import read_capped
from otel_gpu.symbolize.elf import dynamic_symbol_value
from otel_gpu.symbolize.maps import MAX_MAPS_BYTES

LIBRARY_NAME = "libotel_gpu_context.so"
_HEADER = struct.Struct("<IHH")  # magic, version, slot size
_MAX_FILE_OFFSET = 1 << 63  # /proc/PID/mem is read at file offsets (off_t)
_symbol_values: dict[tuple[str, int, int], int | None] = {}  # (path, device, inode) -> st_value


def _symbol_value(path: Path, key: tuple[str, int, int]) -> int | None:
    if key not in _symbol_values:
        _symbol_values[key] = dynamic_symbol_value(str(path), SYMBOL)
    return _symbol_values[key]


def find_span_table(pid: int, proc: Path = Path("/proc")) -> int | None:
    """The table's address in process ``pid``, or None when it has not loaded the library (or it is not v1, or the
    process exited while being read).

    Raises OSError when the process's maps or files cannot be read (it exited, or the agent lacks the rights). The
    maps' paths are any bytes (kept as surrogates) and the symbol's value is the mapped file's claim, any 64 bits.
    """
    data, _ = read_capped(proc / str(pid) / "maps", MAX_MAPS_BYTES)  # the mappings past the cap stay unseen
    for line in data.decode("utf-8", "surrogateescape").split("\n"):
        parts = line.split(maxsplit=5)
        if len(parts) < 6 or not parts[5].endswith(LIBRARY_NAME) or int(parts[2], 16) != 0:
            continue
        start = int(parts[0].split("-")[0], 16)
        path = proc / str(pid) / "root" / parts[5].lstrip("/")
        major, minor = (int(x, 16) for x in parts[3].split(":"))
        value = _symbol_value(path, (parts[5], (major << 8) | minor, int(parts[4])))
        if value is None:
            return None
        address = start + value
        if address >= _MAX_FILE_OFFSET:
            return None  # no file offset reaches it: not where a loaded library's data is
        with (proc / str(pid) / "mem").open("rb") as mem:
            mem.seek(address)
            header = mem.read(_HEADER.size)
        if len(header) < _HEADER.size:
            return None  # end of file: the process exited after its memory file was opened
        if _HEADER.unpack(header) != (MAGIC, VERSION, SLOT_SIZE):
            return None
        return address
    return None
