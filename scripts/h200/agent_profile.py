# SPDX-License-Identifier: Apache-2.0
"""Run THERE: the agent in-process with cProfile on every thread (start-up in the main thread included), then the
top functions by cumulative and own time per thread. Usage: agent_profile.py OUT.txt [agent args...]"""

from __future__ import annotations

import cProfile
import io
import pstats
import sys
import threading

PROFILES: list[tuple[str, cProfile.Profile]] = []


def _start(frame, event, arg):  # type: ignore[no-untyped-def]
    profile = cProfile.Profile()
    PROFILES.append((threading.current_thread().name, profile))
    profile.enable()  # replaces this hook on the thread


def main() -> int:
    out, argv = sys.argv[1], sys.argv[2:]
    threading.setprofile(_start)
    main_profile = cProfile.Profile()
    PROFILES.append(("main", main_profile))
    from otel_gpu.cli import main as agent_main
    main_profile.enable()
    try:
        code = agent_main(["run", *argv])
    finally:
        main_profile.disable()
    text = io.StringIO()
    for name, profile in PROFILES:
        try:
            profile.disable()
        except Exception:  # noqa: BLE001 - another thread's profiler
            pass
        stats = pstats.Stats(profile, stream=text)
        if not stats.stats:  # type: ignore[attr-defined]
            continue
        text.write(f"\n===== thread {name}: total {stats.total_tt:.2f} s\n")  # type: ignore[attr-defined]
        stats.sort_stats("cumulative").print_stats(25)
        stats.sort_stats("tottime").print_stats(15)
    with open(out, "w") as f:
        f.write(text.getvalue())
    return int(code or 0)


if __name__ == "__main__":
    sys.exit(main())
