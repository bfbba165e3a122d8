# SPDX-License-Identifier: Apache-2.0
"""JIT symbol maps (/tmp/perf-PID.map: ``START SIZE NAME`` per line, hex), written by Python 3.12+ ``-X perf``,
Node ``--perf-basic-prof`` and Java perf-map agents."""

from __future__ import annotations

import bisect
import os


class PerfMap:
    """The symbols of one perf map file, sorted by start address."""

    def __init__(self, path: str) -> None:
        self.path = path
        stat = os.stat(path)
        self.identity = (stat.st_mtime_ns, stat.st_size)
        entries: list[tuple[int, int, str]] = []
        with open(path, encoding="utf-8", errors="replace") as handle:
            for line in handle:
                parts = line.rstrip("\n").split(" ", 2)
                if len(parts) != 3:
                    continue
                try:
                    entries.append((int(parts[0], 16), int(parts[1], 16), parts[2]))
                except ValueError:
                    continue
        entries.sort()
        self._starts = [e[0] for e in entries]
        self._ends = [e[0] + max(e[1], 1) for e in entries]
        self._names = [e[2] for e in entries]

    def __len__(self) -> int:
        return len(self._starts)

    def lookup(self, address: int) -> str | None:
        """The name of the JIT symbol covering ``address``, or None."""
        index = bisect.bisect_right(self._starts, address) - 1
        if index < 0 or address >= self._ends[index]:
            return None
        return self._names[index]
