# SPDX-License-Identifier: Apache-2.0
"""JIT symbol maps (/tmp/perf-PID.map: ``START SIZE NAME`` per line, hex), written by Python 3.12+ ``-X perf``,
Node ``--perf-basic-prof`` and Java perf-map agents.

Any process chooses its perf map's size and growth, so a map is read incrementally (only what was appended since
the last look, whole lines) and only up to :data:`MAX_PERF_MAP_BYTES`: the symbols past the cap stay unnamed
(``truncated``), and the agent's memory and time stay bounded whatever the process writes."""

from __future__ import annotations

import bisect
import errno
import heapq
import os
import stat as stat_module

MAX_PERF_MAP_BYTES = 8 << 20  # ~150,000 JIT symbols of typical length; a bigger map is read up to here
_MAX_LINE_BYTES = 1 << 16  # a "line" longer than this without a newline is garbage: skipped
_MAX_NAME_CHARS = 4096  # a longer name is cut (a Python frame is "py::function:/path", PATH_MAX at most)


class PerfMap:
    """The symbols of one perf map file, sorted by start address, kept up to date by :meth:`refresh`."""

    def __init__(self, path: str, max_bytes: int = MAX_PERF_MAP_BYTES) -> None:
        self.path = path
        self.max_bytes = max_bytes
        self.truncated = False  # the file holds more than max_bytes: symbols past the cap stay unnamed
        self._file: tuple[int, int] | None = None  # (st_dev, st_ino) of what was read
        self._read_bytes = 0
        self._starts: list[int] = []
        self._ends: list[int] = []
        self._names: list[str] = []
        self.refresh()

    def __len__(self) -> int:
        return len(self._starts)

    def refresh(self) -> bool:
        """Read the whole lines appended since the last read (the file again from its start when it was replaced or
        shrank), up to ``max_bytes`` in all; True when symbols were added. Raises OSError.

        Only a regular file is read, never through a symbolic link (the process that owns the name could point it at
        any file the agent may read) and never blocking (a FIFO in its place would stall the drain)."""
        fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOFOLLOW)
        try:
            stat = os.fstat(fd)
            if not stat_module.S_ISREG(stat.st_mode):
                raise OSError(errno.EINVAL, "not a regular file", self.path)
            if self._file != (stat.st_dev, stat.st_ino) or stat.st_size < self._read_bytes:
                self._file, self._read_bytes = (stat.st_dev, stat.st_ino), 0
                self._starts, self._ends, self._names = [], [], []
            self.truncated = stat.st_size > self.max_bytes
            want = min(stat.st_size, self.max_bytes) - self._read_bytes
            if want <= 0:
                return False
            data = os.pread(fd, want, self._read_bytes)
        finally:
            os.close(fd)
        whole = data.rfind(b"\n") + 1
        if whole == 0 and len(data) >= _MAX_LINE_BYTES:
            whole = len(data)  # no line ends in it: skip it rather than read it again every time
        self._read_bytes += whole
        return self._add(parse_perf_map(data[:whole]))

    def lookup(self, address: int) -> str | None:
        """The name of the JIT symbol covering ``address``, or None."""
        index = bisect.bisect_right(self._starts, address) - 1
        if index < 0 or address >= self._ends[index]:
            return None
        return self._names[index]

    def _add(self, entries: list[tuple[int, int, str]]) -> bool:
        if not entries:
            return False
        entries.sort()
        merged = list(heapq.merge(zip(self._starts, self._ends, self._names, strict=True),
                                  ((start, start + max(size, 1), name) for start, size, name in entries)))
        self._starts = [e[0] for e in merged]
        self._ends = [e[1] for e in merged]
        self._names = [e[2] for e in merged]
        return True


def parse_perf_map(data: bytes) -> list[tuple[int, int, str]]:
    """(start, size, name) of each well-formed ``START SIZE NAME`` line (hex numbers of at most 64 bits)."""
    entries = []
    for line in data.split(b"\n"):
        parts = line.rstrip(b"\r").split(b" ", 2)
        if len(parts) != 3 or not _is_hex64(parts[0]) or not _is_hex64(parts[1]):
            continue
        entries.append((int(parts[0], 16), int(parts[1], 16), parts[2][:4 * _MAX_NAME_CHARS].decode(
            "utf-8", errors="replace")[:_MAX_NAME_CHARS]))
    return entries


def _is_hex64(field: bytes) -> bool:
    """True for 1 to 16 hex digits, with or without 0x (int() would also take signs, "_" and other forms)."""
    digits = field[2:] if field[:2] in (b"0x", b"0X") else field
    return 0 < len(digits) <= 16 and not digits.strip(b"0123456789abcdefABCDEF")
