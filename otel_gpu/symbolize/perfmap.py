# SPDX-License-Identifier: Apache-2.0
"""JIT symbol maps (/tmp/perf-PID.map: ``START SIZE NAME`` per line, hex), written by Python 3.12+ ``-X perf``,
Node ``--perf-basic-prof`` and Java perf-map agents.

Any process chooses its perf map's size and growth, so a map is read incrementally (only what was appended since
the last look, whole lines) and only up to :data:`MAX_PERF_MAP_BYTES`: the symbols past the cap stay unnamed
(``truncated``), and the agent's memory and time stay bounded whatever the process writes."""

from __future__ import annotations

import bisect
import heapq
import os

MAX_PERF_MAP_BYTES = 8 << 20  # ~150,000 JIT symbols of typical length; a bigger map is read up to here
_MAX_LINE_BYTES = 1 << 16  # a "line" longer than this without a newline is garbage: skipped


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
        shrank), up to ``max_bytes`` in all; True when symbols were added. Raises OSError."""
        stat = os.stat(self.path)
        if self._file != (stat.st_dev, stat.st_ino) or stat.st_size < self._read_bytes:
            self._file, self._read_bytes = (stat.st_dev, stat.st_ino), 0
            self._starts, self._ends, self._names = [], [], []
        self.truncated = stat.st_size > self.max_bytes
        want = min(stat.st_size, self.max_bytes) - self._read_bytes
        if want <= 0:
            return False
        with open(self.path, "rb") as handle:
            handle.seek(self._read_bytes)
            data = handle.read(want)
        whole = data.rfind(b"\n") + 1
        if whole == 0 and len(data) >= _MAX_LINE_BYTES:
            whole = len(data)  # no line ends in it: skip it rather than read it again every time
        self._read_bytes += whole
        return self._add(_parse(data[:whole]))

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
        merged = list(heapq.merge(zip(self._starts, self._ends, self._names),
                                  ((start, start + max(size, 1), name) for start, size, name in entries)))
        self._starts = [e[0] for e in merged]
        self._ends = [e[1] for e in merged]
        self._names = [e[2] for e in merged]
        return True


def _parse(data: bytes) -> list[tuple[int, int, str]]:
    entries = []
    for line in data.decode("utf-8", errors="replace").splitlines():
        parts = line.split(" ", 2)
        if len(parts) != 3:
            continue
        try:
            entries.append((int(parts[0], 16), int(parts[1], 16), parts[2]))
        except ValueError:
            continue
    return entries
