# SPDX-License-Identifier: Apache-2.0
"""Process memory mappings from /proc/PID/maps."""

from __future__ import annotations

from dataclasses import dataclass

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
    """Every mapping in the text of /proc/PID/maps, in address order."""
    entries: list[MapEntry] = []
    for line in text.splitlines():
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
    try:
        with open(f"{proc_root}/{pid}/maps", encoding="utf-8", errors="surrogateescape") as handle:
            text = handle.read()
    except OSError:
        return None
    return parse_maps(text) if text else None
