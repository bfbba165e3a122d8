# SPDX-License-Identifier: Apache-2.0
"""ReadAllowance: how much time reading new symbol tables may take, as a share of one core on average.

Reading a binary's symbol table is the one cost of symbolizing on the node that grows with the node: 0.3 s of CPU
for a 200 MB library, paid once per file while it stays in the bounded cache. On a node that keeps starting new or
rebuilt binaries that cost never ends, so it is rationed like a token bucket: a burst at start (the running
workloads' binaries are named at once), then ``share`` of one core. A drain past its allowance sends frames of files
not yet read as file+offset with their mapping and build id (symbolizable off the node) and names them once the
allowance has refilled. The agent gives one allowance to every source that symbolizes (the CPU drains and the
GPU-time launches), so together they stay within ``share``. The caller passes the clock and the seconds it spent;
a lock makes it safe to share between threads.
"""

from __future__ import annotations

import threading

# On average, reading new symbol tables may take this share of one core, after a burst of this many seconds at start.
READ_SHARE = 0.005
READ_BURST_S = 5.0


class ReadAllowance:
    """Seconds of symbol-table reading allowed now: starts at ``burst_s``, refills at ``share`` seconds per second
    up to ``burst_s``; spending more than is left borrows from what later refills."""

    def __init__(self, share: float, burst_s: float, now_s: float) -> None:
        self.share = share
        self.burst_s = burst_s
        self._left_s = burst_s
        self._at_s = now_s
        self._lock = threading.Lock()

    def available_s(self, now_s: float) -> float:
        """What may be spent now (0 while an overdraft is being repaid)."""
        with self._lock:
            self._left_s = min(self.burst_s, self._left_s + self.share * max(0.0, now_s - self._at_s))
            self._at_s = max(self._at_s, now_s)
            return max(0.0, self._left_s)

    def spend(self, seconds: float) -> None:
        with self._lock:
            self._left_s -= max(0.0, seconds)
