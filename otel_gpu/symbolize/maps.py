# SPDX-License-Identifier: Apache-2.0
"""Process memory mappings from /proc/PID/maps.

A process chooses how many mappings it has (up to vm.max_map_count, 65,530 by default) and the paths they show
(up to PATH_MAX each), so the file is read up to :data:`MAX_MAPS_BYTES`: the mappings past the cap stay unknown
(their frames unnamed) and the reader's memory stays bounded."""

from __future__ import annotations

from dataclasses import dataclass

from otel_gpu.procfs import read_capped

MAX_MAPS_BYTES = 16 << 20  # 65,530 mappings of 250 bytes each; a big process (libtorch and CUDA) shows ~300 KiB
_DELETED = " (deleted)"


@dataclass(frozen=True, slots=True)
class MapEntry:
    """One line of /proc/PID/maps. ``path`` has any `` (deleted)`` suffix removed (then ``deleted`` is True)."""

    start: int
    end: int
    offset: int
    perms: str
    inode: int
    path: str
    deleted: bool = False

    @property
    def executable(self) -> bool:
        return "x" in self.perms

    @property
    def file_backed(self) -> bool:
        """True for mappings of a file (not [heap], [stack], [vdso], anonymous or memfd JIT memory)."""
        return self.inode != 0 and self.path.startswith("/")


def parse_maps(text: str) -> list[MapEntry]:
    """Every mapping in the text of /proc/PID/maps, in the file's order (the kernel's is by address).

    Lines end at "\\n" only (the kernel escapes it in paths; other line breaks such as "\\f" may be in a path)."""
    entries: list[MapEntry] = []
    for line in text.split("\n"):
        parts = line.split(None, 5)
        if len(parts) < 5:
            continue
        low, _, high = parts[0].partition("-")
        path = parts[5].strip() if len(parts) > 5 else ""
        deleted = path.endswith(_DELETED)
        if deleted:
            path = path[: -len(_DELETED)]
        try:
            entries.append(MapEntry(int(low, 16), int(high, 16), int(parts[2], 16), parts[1], int(parts[4]), path,
                                    deleted))
        except ValueError:
            continue
    return entries


def read_maps(pid: int, proc_root: str = "/proc") -> list[MapEntry] | None:
    """The mappings of ``pid``; None when the process is gone or unreadable."""
    found = read_maps_capped(pid, proc_root)
    return found[0] if found is not None else None


def read_maps_capped(pid: int, proc_root: str = "/proc",
                     max_bytes: int = MAX_MAPS_BYTES) -> tuple[list[MapEntry], bool] | None:
    """(the mappings of ``pid`` in the first ``max_bytes`` of its maps file, whether the file holds more); None when
    the process is gone or unreadable."""
    try:
        data, more = read_capped(f"{proc_root}/{pid}/maps", max_bytes)
    except OSError:
        return None
    if more:
        data = data[:data.rfind(b"\n") + 1]  # whole lines only: a cut one could show a wrong end address
    text = data.decode("utf-8", errors="surrogateescape")
    return (parse_maps(text), more) if text else None
