# SPDX-License-Identifier: Apache-2.0
"""The first seconds of each sampled process, watched for what its first look may have come too early for.

A process is looked at (its identity read, its mappings snapshotted, its CPython looked for) when the kernel first
samples it, and that can be too early: a shell's fork or a wrapper script is sampled as the shell before it execs
Python, and a dynamically linked python can be sampled while the loader is still mapping libpython. So after each
look the process is checked again at 10 ms, 20 ms, 40 ms, ... after it (:data:`CHECKS` checks, the last about 5 s
after the look); an exec is seen within as long again as the process ran before it. A check reads two small files:

- ``/proc/PID/exe``: a new executable is a new process image; it is looked at again whole, and watched anew.
- ``/proc/PID/statm``: while the last look found no interpreter, a new size means something was mapped (loading a
  library always changes it); only then are the maps read again. A process found to run CPython (or an unsupported
  one) has its maps read no more here.

Past its last check, a process is only checked when a drain samples it (:meth:`ProcessWatch.executable_changed`).
State only: the caller does the looking and tells :meth:`ProcessWatch.looked`.
"""

from __future__ import annotations

import enum
import heapq
import os
from dataclasses import dataclass

FIRST_CHECK_S = 0.01
CHECKS = 10  # at FIRST_CHECK_S * 2**k after the look: 10 ms ... 5.12 s


class Change(enum.Enum):
    """What a check found changed since the last look."""

    EXEC = "exec"  # a new executable: look at the whole process again
    MAPPINGS = "mappings"  # no interpreter found yet, and something was mapped since: look for it again


@dataclass(frozen=True, slots=True)
class ProcessState:
    """The two cheap readings of a process a check compares; exe "" when it is gone."""

    exe: str
    size_pages: int


@dataclass(slots=True)
class _Watched:
    state: ProcessState
    looked_s: float  # monotonic time of the look that started the schedule
    checks: int  # checks done since
    settled: bool  # the last look found the process's interpreter (or that it runs none worth looking for again)


class ProcessWatch:
    """Per process: its state at the last look and when to check it next."""

    def __init__(self, proc_root: str = "/proc") -> None:
        self._proc_root = proc_root
        self._watched: dict[int, _Watched] = {}  # every looked-at process until forgotten; scheduled or not
        self._due: list[tuple[float, int, int]] = []  # (when, pid, checks done then): a heap; stale rows are skipped

    def state(self, pid: int) -> ProcessState:
        """Read before a look, so that anything changed during the look shows at the next check."""
        exe = self._exe(pid)
        try:
            with open(f"{self._proc_root}/{pid}/statm", "rb") as file:
                size = int(file.read(64).split(maxsplit=1)[0])
        except (OSError, ValueError, IndexError):
            size = 0
        return ProcessState(exe, size)

    def looked(self, pid: int, state: ProcessState, now_s: float, settled: bool) -> None:
        """``pid`` was looked at, ``state`` read before. A process not watched yet, or with another executable than
        at its last look, starts a new schedule; another look keeps the schedule (it stays bounded)."""
        watched = self._watched.get(pid)
        if watched is None or watched.state.exe != state.exe:
            watched = self._watched[pid] = _Watched(state, now_s, 0, settled)
            heapq.heappush(self._due, (now_s + FIRST_CHECK_S, pid, 0))
        else:
            watched.state, watched.settled = state, settled

    def due(self, now_s: float) -> list[tuple[int, Change]]:
        """Checks the processes whose time has come; returns those to look at again and why."""
        out = []
        while self._due and self._due[0][0] <= now_s:
            _, pid, checks = heapq.heappop(self._due)
            watched = self._watched.get(pid)
            if watched is None or watched.checks != checks:
                continue  # forgotten, or rescheduled by a new look
            watched.checks += 1
            state = self.state(pid)
            if not state.exe:
                continue  # gone (or not ours to read): forget() drops it
            if watched.checks < CHECKS:
                heapq.heappush(self._due, (watched.looked_s + FIRST_CHECK_S * 2 ** watched.checks, pid,
                                           watched.checks))
            if state.exe != watched.state.exe:
                out.append((pid, Change.EXEC))
            elif not watched.settled and state.size_pages != watched.state.size_pages:
                out.append((pid, Change.MAPPINGS))
        return out

    def next_in_s(self, now_s: float) -> float | None:
        """Seconds until the next check (0 when overdue), None when none is scheduled."""
        return max(0.0, self._due[0][0] - now_s) if self._due else None

    def executable_changed(self, pid: int) -> bool:
        """Whether ``pid`` runs another executable than at its last look (False when it was never looked at)."""
        watched = self._watched.get(pid)
        if watched is None:
            return False
        exe = self._exe(pid)
        return exe != "" and exe != watched.state.exe

    def forget(self, pids: list[int]) -> None:
        """Drop processes that are gone (their heap rows are skipped when due)."""
        for pid in pids:
            self._watched.pop(pid, None)
        if not self._watched:
            self._due.clear()

    def _exe(self, pid: int) -> str:
        try:
            return os.readlink(f"{self._proc_root}/{pid}/exe")
        except OSError:
            return ""
