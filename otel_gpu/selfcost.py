# SPDX-License-Identifier: Apache-2.0
"""The agent's own cost, read from /proc/self: CPU seconds per thread (by thread name), in all and since start-up,
and the peak resident memory, for the one line the agent logs when it stops (issue 12: where the time goes, on any
machine, without a profiler)."""

from __future__ import annotations

import ctypes
import os
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass

_CLK_TCK = os.sysconf("SC_CLK_TCK")
_COMM_BYTES = 15  # the kernel keeps a thread's name in 16 bytes, the terminating NUL included
_named: dict[int, str] = {}  # native id -> the name given (an id may be reused by a later thread)


def task_cpu_s(stat: str) -> float:
    """utime + stime of one /proc/.../stat line, in seconds."""
    fields = stat[stat.rfind(")") + 2:].split()
    return (int(fields[11]) + int(fields[12])) / _CLK_TCK


def process_cpu_s(proc: str = "/proc/self") -> float:
    """CPU seconds of the whole process so far, ended threads included."""
    with open(f"{proc}/stat") as stat:
        return task_cpu_s(stat.read())


def thread_cpu_s(proc: str = "/proc/self") -> dict[str, float]:
    """CPU seconds of each live thread so far, by Python thread name (the comm for threads Python did not start);
    threads of the same name are summed."""
    names = {thread.native_id: thread.name for thread in threading.enumerate() if thread.native_id is not None}
    out: dict[str, float] = defaultdict(float)
    for entry in os.listdir(f"{proc}/task"):
        try:
            with open(f"{proc}/task/{entry}/stat") as stat:
                line = stat.read()
        except OSError:  # the thread ended meanwhile
            continue
        tid = int(entry)
        name = names.get(tid) or line[line.find("(") + 1:line.rfind(")")]
        out["main" if name == "MainThread" else name] += task_cpu_s(line)
    return dict(out)


def native_name(name: str) -> str:
    """What ``top -H``, ``ps -L``, py-spy and /proc show for a thread named ``name`` (the agent's threads drop their
    common ``otel-gpu-`` prefix: the process is already named; the kernel keeps 15 bytes)."""
    return name.removeprefix("otel-gpu-").encode()[:_COMM_BYTES].decode(errors="ignore")


def name_native_threads() -> None:
    """Give each live Python thread of this process its name in the kernel (/proc/self/task/TID/comm), once per
    thread, so that an operator's per-thread tools say which part of the agent runs; threads that are gone or
    refuse are left as they are."""
    for thread in threading.enumerate():
        tid = thread.native_id
        if tid is None or _named.get(tid) == thread.name or thread is threading.main_thread():
            continue
        _named[tid] = thread.name
        try:
            with open(f"/proc/self/task/{tid}/comm", "w") as comm:
                comm.write(native_name(thread.name))
        except OSError:  # the thread ended meanwhile
            pass


def trim_heap() -> None:
    """Give the C heap's free pages back to the kernel (glibc ``malloc_trim``): free() keeps what lies below the
    heap's top resident, and start-up frees a lot there (libbpf's kernel BTF, symbol tables read once); on a C
    library without it, nothing."""
    if _malloc_trim is not None:
        _malloc_trim(0)


# glibc raises its mmap threshold to the largest block freed (up to 32 MiB) and its trim threshold to twice that:
# after the agent frees one large buffer, later ones come from the arenas and their free pages stay resident.
# Measured on the H200 with every source on under a PyTorch load (bench/bench_agent_memory.py --census): 57-71 MB of
# free arena memory held, 68.5 MB anonymous; with both thresholds fixed at glibc's defaults, 3 MB held, 52.7 MB.
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
HEAP_THRESHOLD_BYTES = 128 * 1024  # glibc's default for both, made fixed


def tune_heap(environ: dict[str, str] | None = None) -> bool:
    """Fix glibc's mmap and trim thresholds at :data:`HEAP_THRESHOLD_BYTES` (disabling their growth), unless the
    environment already sets either (``MALLOC_MMAP_THRESHOLD_``, ``MALLOC_TRIM_THRESHOLD_``, ``GLIBC_TUNABLES``).
    Returns whether they were set; on a C library without ``mallopt``, nothing."""
    environ = os.environ if environ is None else environ  # type: ignore[assignment]
    if _mallopt is None or any(name in environ for name in ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_",
                                                             "GLIBC_TUNABLES")):
        return False
    return bool(_mallopt(_M_MMAP_THRESHOLD, HEAP_THRESHOLD_BYTES)) and \
        bool(_mallopt(_M_TRIM_THRESHOLD, HEAP_THRESHOLD_BYTES))


def _find_libc(name: str) -> Callable[[int], int] | Callable[[int, int], int] | None:
    try:
        return getattr(ctypes.CDLL(None), name)  # type: ignore[no-any-return]
    except (OSError, AttributeError):  # not glibc (musl has neither)
        return None


_malloc_trim = _find_libc("malloc_trim")
_mallopt = _find_libc("mallopt")


def peak_rss_mb(proc: str = "/proc/self") -> float:
    """VmHWM: the most resident memory the process has held, in MB (MiB)."""
    with open(f"{proc}/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return 0.0


@dataclass(slots=True)
class CostMeter:
    """Marks start-up's end, then describes the cost since in one line (:meth:`summary`)."""

    began_monotonic: float  # when the process started (the CLI's clock for --duration)
    running_monotonic: float = 0.0
    startup_cpu_s: float = 0.0
    running_threads: dict[str, float] | None = None
    stopping_threads: dict[str, float] | None = None  # read as stopping began, while every thread still ran

    def running(self) -> None:
        """Start-up is over: what the sources cost from here is the steady cost."""
        self.running_monotonic = time.monotonic()
        name_native_threads()
        self.startup_cpu_s = process_cpu_s()
        self.running_threads = thread_cpu_s()

    def stopping(self) -> None:
        """Stopping begins: read each thread's CPU now, so that threads the shutdown ends still show in
        :meth:`summary`, which is best called once everything is sent (the last report and flush cost CPU too)."""
        name_native_threads()
        self.stopping_threads = thread_cpu_s()

    def summary(self) -> str:
        """``CPU-s in all, start-up, % of one core since start-up, peak MB, and each thread's CPU-s since start-up``,
        largest first (threads under 5 ms left out)."""
        now = time.monotonic()
        total = process_cpu_s()
        since_s = max(now - self.running_monotonic, 1e-9)
        before = self.running_threads or {}
        now_threads = dict(self.stopping_threads or {})
        for name, cpu in thread_cpu_s().items():  # a thread still there has run since; one gone keeps its reading
            now_threads[name] = max(cpu, now_threads.get(name, 0.0))
        threads = sorted(((name, cpu - before.get(name, 0.0)) for name, cpu in now_threads.items()),
                         key=lambda item: -item[1])
        listed = ", ".join(f"{name} {cpu:.2f}" for name, cpu in threads if cpu >= 0.005) or "none"
        return (f"{total:.2f} CPU-s over {now - self.began_monotonic:.1f} s (start-up {self.startup_cpu_s:.2f} CPU-s; "
                f"since then {100 * (total - self.startup_cpu_s) / since_s:.2f} % of one core over {since_s:.1f} s), "
                f"peak RSS {peak_rss_mb():.1f} MB; CPU-s by thread since start-up: {listed}")
