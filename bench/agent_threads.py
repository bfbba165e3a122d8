# SPDX-License-Identifier: Apache-2.0
"""Runs ``otel-gpu`` (the arguments after ``--``) in this process and records each thread's CPU time, by name.

Used by bench_cost.py ``--threads``: every 0.25 s it reads /proc/self/task/*/stat and names each task from
``threading.enumerate()`` (Python threads) or its comm; at exit it writes ``[[monotonic s, {name: cpu s}], ...]``
to the file named first. Threads of the same name are summed; a thread that ended keeps its last reading. The
reader's own cost shows as ``bench-thread-reader`` (it is part of the process's total, not of the agent's).

Run: .venv/bin/python bench/agent_threads.py OUT.json -- run --duration 20 ...
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def _task_seconds(tid: int) -> float | None:
    from otel_gpu.selfcost import task_cpu_s

    try:
        return task_cpu_s(Path(f"/proc/self/task/{tid}/stat").read_text())
    except OSError:
        return None


def _comm(tid: int) -> str:
    try:
        return Path(f"/proc/self/task/{tid}/comm").read_text().strip()
    except OSError:
        return "?"


def _reader(readings: list[tuple[float, dict[str, float]]], stop: threading.Event) -> None:
    names: dict[int, str] = {}
    last: dict[int, float] = {}  # tid -> its last reading, so a thread that ended still counts
    while not stop.wait(0.25):
        for thread in threading.enumerate():
            if thread.native_id is not None:
                names[thread.native_id] = thread.name
        for entry in os.listdir("/proc/self/task"):
            tid = int(entry)
            seconds = _task_seconds(tid)
            if seconds is not None:
                last[tid] = seconds
                names.setdefault(tid, _comm(tid))
        by_name: dict[str, float] = {}
        for tid, seconds in last.items():
            name = "main" if tid == os.getpid() else names.get(tid, "?")
            by_name[name] = by_name.get(name, 0.0) + seconds
        readings.append((time.monotonic(), by_name))


def main() -> int:
    out, separator, *argv = sys.argv[1:]
    assert separator == "--", "usage: agent_threads.py OUT.json -- otel-gpu arguments"
    from otel_gpu.cli import main as agent_main

    readings: list[tuple[float, dict[str, float]]] = []
    stop = threading.Event()
    reader = threading.Thread(target=_reader, args=(readings, stop), name="bench-thread-reader", daemon=True)
    reader.start()
    try:
        return agent_main(argv)
    finally:
        stop.set()
        reader.join()
        Path(out).write_text(json.dumps(readings))


if __name__ == "__main__":
    sys.exit(main())
