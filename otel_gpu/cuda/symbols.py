# SPDX-License-Identifier: Apache-2.0
"""Native frames for the launching stacks: PCs of a live process to symbolized :class:`Frame` values.

A small, self-contained resolver (/proc/PID/maps + ELF .symtab/.dynsym through pyelftools, files opened through
/proc/PID/root so other mount namespaces work) used until the shared symbolizer (otel_gpu.symbolize) is wired in;
:class:`NativeSymbolizer` is the interface the GPU-time source needs from either. Caches: maps per pid (re-read on a
miss), symbols per file identity (device, inode). A PC outside every mapping, or in a file that cannot be read,
gives a frame named after its mapping and offset, never an exception.
"""

from __future__ import annotations

import bisect
import logging
import os
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from otel_gpu.cuda.demangle import demangle
from otel_gpu.profiles.model import Frame, FrameKind, Mapping

_logger = logging.getLogger(__name__)


class NativeSymbolizer(Protocol):
    def frames(self, pid: int, pcs: Sequence[int]) -> tuple[Frame, ...]:
        """Frames for leaf-first ``pcs`` of process ``pid`` (pcs after the first are return addresses)."""
        ...

    def forget(self, pid: int) -> None:
        ...


@dataclass(frozen=True, slots=True)
class _Region:
    start: int
    end: int
    offset: int
    path: str
    inode: int


@dataclass(slots=True)
class _ElfSymbols:
    addresses: list[int]
    ends: list[int]
    names: list[str]
    loads: list[tuple[int, int, int]]  # (p_offset, p_vaddr, p_filesz) of PT_LOAD segments
    build_id: str


class MapsSymbolizer:
    """Resolves PCs of live processes through their memory maps and ELF symbol tables."""

    def __init__(self, proc_root: str = "/proc", max_processes: int = 1024, max_files: int = 256) -> None:
        self._root = proc_root
        self._maps: OrderedDict[int, list[_Region]] = OrderedDict()
        self._files: OrderedDict[tuple[int, int], _ElfSymbols | None] = OrderedDict()
        self._max_processes = max_processes
        self._max_files = max_files

    def frames(self, pid: int, pcs: Sequence[int]) -> tuple[Frame, ...]:
        regions = self._regions(pid, refresh=False)
        out = []
        for index, pc in enumerate(pcs):
            lookup = pc if index == 0 else pc - 1  # a return address points after the call
            region = _find(regions, lookup)
            if region is None:
                regions = self._regions(pid, refresh=True)
                region = _find(regions, lookup)
            out.append(self._frame(pid, pc, lookup, region))
        return tuple(out)

    def forget(self, pid: int) -> None:
        self._maps.pop(pid, None)

    def _frame(self, pid: int, pc: int, lookup: int, region: _Region | None) -> Frame:
        if region is None:
            return Frame(f"0x{pc:x}", FrameKind.NATIVE, address=pc)
        symbols = self._symbols(pid, region)
        file_offset = lookup - region.start + region.offset
        mapping = Mapping(region.start, region.end, region.offset, region.path, symbols.build_id if symbols else "")
        name = ""
        if symbols is not None:
            vaddr = _to_vaddr(symbols.loads, file_offset)
            if vaddr is not None:
                i = bisect.bisect_right(symbols.addresses, vaddr) - 1
                if i >= 0 and (vaddr < symbols.ends[i] or symbols.ends[i] == symbols.addresses[i]):
                    name = symbols.names[i]
        if not name:
            return Frame(f"{os.path.basename(region.path)}+0x{file_offset:x}", FrameKind.NATIVE, address=pc,
                         mapping=mapping)
        return Frame(demangle(name), FrameKind.NATIVE, address=pc, mapping=mapping, system_name=name)

    def _regions(self, pid: int, refresh: bool) -> list[_Region]:
        if not refresh and pid in self._maps:
            self._maps.move_to_end(pid)
            return self._maps[pid]
        regions: list[_Region] = []
        try:
            with open(f"{self._root}/{pid}/maps", encoding="utf-8", errors="replace") as maps:
                for line in maps:
                    parts = line.split(None, 5)
                    if len(parts) < 6 or "x" not in parts[1] or not parts[5].startswith("/"):
                        continue
                    start, end = (int(x, 16) for x in parts[0].split("-"))
                    regions.append(_Region(start, end, int(parts[2], 16), parts[5].rstrip("\n"), int(parts[4])))
        except OSError:  # exited: keep what we had
            return self._maps.get(pid, [])
        self._maps[pid] = regions
        self._maps.move_to_end(pid)
        while len(self._maps) > self._max_processes:
            self._maps.popitem(last=False)
        return regions

    def _symbols(self, pid: int, region: _Region) -> _ElfSymbols | None:
        path = region.path.removesuffix(" (deleted)")
        host_path = f"{self._root}/{pid}/root{path}"
        try:
            st = os.stat(host_path)
            key = (st.st_dev, st.st_ino)
        except OSError:
            key = (0, region.inode)
        if key in self._files:
            self._files.move_to_end(key)
            return self._files[key]
        symbols = _read_elf(host_path)
        self._files[key] = symbols
        while len(self._files) > self._max_files:
            self._files.popitem(last=False)
        return symbols


def _find(regions: list[_Region], address: int) -> _Region | None:
    for region in regions:
        if region.start <= address < region.end:
            return region
    return None


def _to_vaddr(loads: list[tuple[int, int, int]], file_offset: int) -> int | None:
    for p_offset, p_vaddr, p_filesz in loads:
        if p_offset <= file_offset < p_offset + max(p_filesz, 1):
            return file_offset - p_offset + p_vaddr
    return None


def _read_elf(path: str) -> _ElfSymbols | None:
    from elftools.common.exceptions import ELFError
    from elftools.elf.elffile import ELFFile

    try:
        with open(path, "rb") as stream:
            elf = ELFFile(stream)
            loads = [(seg["p_offset"], seg["p_vaddr"], seg["p_filesz"]) for seg in elf.iter_segments()
                     if seg["p_type"] == "PT_LOAD"]
            entries: dict[int, tuple[int, str]] = {}
            for section_name in (".dynsym", ".symtab"):
                section = elf.get_section_by_name(section_name)
                if section is None or not hasattr(section, "iter_symbols"):
                    continue
                for sym in section.iter_symbols():
                    if sym["st_info"]["type"] in ("STT_FUNC", "STT_GNU_IFUNC") and sym["st_value"] and sym.name:
                        entries[sym["st_value"]] = (sym["st_size"], sym.name)
            build_id = ""
            note_section = elf.get_section_by_name(".note.gnu.build-id")
            if note_section is not None:
                for note in note_section.iter_notes():
                    if note["n_type"] == "NT_GNU_BUILD_ID":
                        build_id = str(note["n_desc"])
    except (OSError, ELFError, ValueError) as exc:
        _logger.debug("cannot read symbols of %s: %s", path, exc)
        return None
    ordered = sorted(entries.items())
    return _ElfSymbols([a for a, _ in ordered], [a + s for a, (s, _) in ordered], [n for _, (_, n) in ordered],
                       loads, build_id)
