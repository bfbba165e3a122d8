# SPDX-License-Identifier: Apache-2.0
"""Cost of the whole agent (issue 12): the real ``otel-gpu run`` per source and per scenario, side by side.

Sources: NVML only (the fake libnvidia-ml.so.1 of tests/native/nvml, 2 GPUs), CPU profiling only (19 Hz), GPU time
only (waiting for injected processes), all three. Scenarios:
  quiet  nothing else started;
  busy   one Python busy loop per online CPU;
  node   busy, plus a few hundred sleeping processes, about 20 short-lived processes per second of a dozen different
         executables (some running code of large libraries: rustc loads a 150 MB librustc_driver and a 200 MB
         libLLVM when present), and sleeping processes that keep large libraries mapped.

Measured from /proc/PID/stat and status of the agent: steady-state CPU (% of one core, from just after the first
two profile reports, which read the symbol tables of what already runs, to the last reading before it exits), peak
RSS (VmHWM), start-up CPU-s (at the start-up line), how long ``--duration`` really ran (from the exec to the exit)
and the longest profile interval written (pprof duration).

Run (as root, after make build): .venv/bin/python bench/bench_cost.py [--seconds 20] [--quick] [--json out.json]
  [--scenario node --source all] [--agent-arg=--flag ...] [--threads]
--threads runs the agent under bench/agent_threads.py and adds each thread's steady-state % of one core. Every row
also shows the agent's own "otel-gpu cost" line (CPU-s by thread from its start-up line to its stop).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
FAKE_NVML = REPO / "tests" / "native" / "nvml" / "build"
CLK_TCK = os.sysconf("SC_CLK_TCK")
INTERVAL_S = 5
TARGETS = {"quiet": (1.0, 100.0), "busy": (1.0, 100.0), "node": (2.0, 150.0)}  # % of one core, peak MB
SOURCES = {"nvml": ("--no-cpu-profiling", "--no-gpu-time-profiling"),
           "cpu": ("--no-gpu-metrics", "--no-gpu-time-profiling"),
           "gpu-time": ("--no-gpu-metrics", "--no-cpu-profiling"),
           "all": ()}
# short-lived processes of the busy node: a dozen executables, each run with arguments that end at once
CHURN = [["/bin/true"], ["/bin/ls", "/"], ["/bin/cat", "/proc/self/stat"], ["/bin/date"], ["/bin/uname", "-a"],
         ["/bin/sed", "-n", "1p", "/etc/passwd"], ["/usr/bin/id"], ["/usr/bin/env"],
         ["/bin/grep", "-c", "x", "/etc/passwd"],
         ["/usr/bin/sort", "/etc/passwd"], ["/usr/bin/awk", "BEGIN{for(i=0;i<20000;i++)s+=i}"],
         [sys.executable, "-c", "sum(range(200000))"]]
RUSTC = [p for p in (Path.home() / ".rustup/toolchains").glob("*/bin/rustc")] if (Path.home() / ".rustup").exists() \
    else []
LARGE_LIBS = sorted((str(p) for p in (Path.home() / ".rustup/toolchains").glob("*/lib/lib*.so*")
                     if p.stat().st_size > 50 << 20), key=str) if (Path.home() / ".rustup").exists() else []


# keeps a large library mapped executable, as a process that loaded it does (dlopen of some needs static TLS)
_MAP_EXECUTABLE = ("import mmap, sys, time; f = open(sys.argv[1], 'rb'); "
                   "m = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ | mmap.PROT_EXEC); time.sleep(3600)")


def cpu_seconds(pid: int) -> float:
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rfind(")") + 2:].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0


# --- scenarios -------------------------------------------------------------------------------------------------------

@contextlib.contextmanager
def scenario(name: str) -> Iterator[dict[str, float]]:
    """Start the scenario's load; yields counters (processes started by the churn) and stops everything after."""
    stats = {"churned": 0.0}
    started: list[subprocess.Popen[bytes]] = []
    stop = threading.Event()
    churner = None
    try:
        if name in ("busy", "node"):
            busy = [sys.executable, "-c", "while True: pass"]
            started += [subprocess.Popen(busy) for _ in range(os.cpu_count() or 1)]
        if name == "node":
            started += [subprocess.Popen(["/bin/sleep", "3600"]) for _ in range(300)]
            for lib in LARGE_LIBS:
                started += [subprocess.Popen([sys.executable, "-c", _MAP_EXECUTABLE, lib]) for _ in range(2)]
            churn = CHURN + [[str(rustc), "--version"] for rustc in RUSTC[:1]]
            churner = threading.Thread(target=_churn, args=(churn, stop, stats), daemon=True)
            churner.start()
        time.sleep(1.0)
        yield stats
    finally:
        stop.set()
        if churner is not None:
            churner.join()
        for process in started:
            process.kill()
        for process in started:
            process.wait()


def _churn(commands: list[list[str]], stop: threading.Event, stats: dict[str, float]) -> None:
    """About 20 short-lived processes a second, picked in turn from ``commands``."""
    rng = random.Random(3)
    running: list[subprocess.Popen[bytes]] = []
    next_at = time.monotonic()
    while not stop.is_set():
        running = [p for p in running if p.poll() is None]
        if len(running) < 40:
            running.append(subprocess.Popen(rng.choice(commands), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
            stats["churned"] += 1
        next_at += 0.05
        stop.wait(max(0.0, next_at - time.monotonic()))
    for process in running:
        process.wait()


# --- one run ---------------------------------------------------------------------------------------------------------

def run_agent(source: str, seconds: float, extra: list[str], threads: bool = False) -> dict[str, object]:
    from tests.profiles.pprof_proto import decode

    out = tempfile.mkdtemp(prefix="otel-gpu-bench-cost-")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "FAKE_NVML_"))}
    env["LD_LIBRARY_PATH"] = str(FAKE_NVML)
    threads_file = os.path.join(out, "threads.json")
    launcher = [str(REPO / "bench" / "agent_threads.py"), threads_file, "--"] if threads else ["-m", "otel_gpu"]
    command = [sys.executable, *launcher, "run", *SOURCES[source], "--duration", f"{seconds:g}",
               "--profiling-interval", str(INTERVAL_S),
               "--output-dir", out, "--console", "off", "--log-level", "info", *extra]
    began = time.monotonic()
    agent = subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    log: list[str] = []
    running_at: list[float] = []
    startup_cpu: list[float] = []  # CPU-s at the start-up line

    def read() -> None:
        assert agent.stderr is not None
        for line in agent.stderr:
            log.append(line.rstrip())
            if "otel-gpu running" in line and not running_at:
                running_at.append(time.monotonic())
                with contextlib.suppress(OSError, ValueError, IndexError):
                    startup_cpu.append(cpu_seconds(agent.pid))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    readings: list[tuple[float, float, float]] = []  # (monotonic, cpu s, peak MB)
    while agent.poll() is None:
        with contextlib.suppress(OSError, ValueError, IndexError):
            readings.append((time.monotonic(), cpu_seconds(agent.pid), peak_rss_mb(agent.pid)))
        time.sleep(0.25)
    ended = time.monotonic()
    reader.join(timeout=5)
    intervals = []
    for path in Path(out).glob("profile-*.pb.gz"):
        profile = decode(path.read_bytes())
        intervals.append(profile.duration_nanos / 1e9)
    per_thread = json.loads(Path(threads_file).read_text()) if threads and os.path.exists(threads_file) else []
    shutil.rmtree(out, ignore_errors=True)
    if agent.returncode != 0 or not running_at or not readings:
        return {"error": f"exit {agent.returncode}: {' | '.join(log[-3:])}"}
    ready = running_at[0]
    # steady state: after the second report (the first reports read the symbol tables of what already runs)
    steady_from = next((r for r in readings if r[0] >= ready + 2 * INTERVAL_S + 0.5), readings[0])
    last = readings[-1]
    steady_s = last[0] - steady_from[0]
    thread_percent = _thread_percent(per_thread, steady_from[0], last[0])
    return {"startup_cpu_s": round(startup_cpu[0], 2) if startup_cpu else 0.0,
            "startup_wall_s": round(ready - began, 2),
            "steady_cpu_percent": round(100 * (last[1] - steady_from[1]) / steady_s, 2) if steady_s > 0 else 0.0,
            "steady_s": round(steady_s, 1),
            "peak_rss_mb": round(max(r[2] for r in readings), 1),
            "duration_s": round(ended - began, 2),
            "longest_interval_s": round(max(intervals), 2) if intervals else None,
            "profiles": len(intervals),
            "agent_cost": next((line.split("otel-gpu cost: ", 1)[1] for line in log if "otel-gpu cost: " in line), ""),
            **({"threads": thread_percent} if threads else {})}


def _thread_percent(readings: list[tuple[float, dict[str, float]]], begin: float, end: float) -> dict[str, float]:
    """% of one core per thread name between the readings nearest ``begin`` and ``end`` (bench/agent_threads.py)."""
    inside = [r for r in readings if begin <= r[0] <= end + 0.5]
    if len(inside) < 2:
        return {}
    (t0, first), (t1, final) = inside[0], inside[-1]
    percent = {name: 100 * (cpu - first.get(name, 0.0)) / (t1 - t0) for name, cpu in final.items()}
    return dict(sorted(((n, round(p, 2)) for n, p in percent.items() if p >= 0.005), key=lambda item: -item[1]))


# --- main ------------------------------------------------------------------------------------------------------------

def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=20.0, help="--duration of each agent run (default 20)")
    parser.add_argument("--quick", action="store_true",
                        help="15 s runs (a steady window of about 4 s: noisy), every source only in the node scenario")
    parser.add_argument("--scenario", action="append", choices=list(TARGETS), help="only this scenario (repeatable)")
    parser.add_argument("--source", action="append", choices=list(SOURCES), help="only this source (repeatable)")
    parser.add_argument("--agent-arg", action="append", default=[], help="an extra flag for otel-gpu run")
    parser.add_argument("--json", help="also write the results to this file")
    parser.add_argument("--threads", action="store_true",
                        help="run the agent under bench/agent_threads.py and print each thread's steady %% of a core")
    args = parser.parse_args()
    if os.geteuid() != 0:
        print("bench_cost: needs root (the agent loads eBPF programs)", file=sys.stderr)
        return 1
    if not (FAKE_NVML / "libnvidia-ml.so.1").exists():
        print("bench_cost: build the fake NVML first (make -C tests/native)", file=sys.stderr)
        return 1
    seconds = 15.0 if args.quick else args.seconds
    plan = [(scene, source) for scene in (args.scenario or list(TARGETS)) for source in (args.source or list(SOURCES))
            if not args.quick or scene == "node" or source == "all"]
    results = []
    for scene, source in plan:
        with scenario(scene) as stats:
            row = {"scenario": scene, "source": source, **run_agent(source, seconds, args.agent_arg, args.threads)}
            row["churned_per_s"] = round(stats["churned"] / max(seconds, 1), 1)
            row["load_1m"] = round(os.getloadavg()[0], 1)  # the machine's own load besides the scenario's
        results.append(row)
        print(f"  {scene:>5} {source:>8}: {row}", file=sys.stderr, flush=True)
    print(f"\nCost of the whole agent: --duration {seconds:g}, --profiling-interval {INTERVAL_S} (metrics every 10 s), "
          f"{os.cpu_count()} CPUs, large libraries: {len(LARGE_LIBS)}")
    print(f"{'scenario':>8} {'source':>8} | {'steady %core':>12} {'target':>6} | {'peak MB':>7} {'target':>6} | "
          f"{'start CPU-s':>11} {'start s':>7} | {'ran s':>6} {'asked':>5} | {'longest profile s':>17} | load")
    for row in results:
        if "error" in row:
            print(f"{row['scenario']:>8} {row['source']:>8} | {row['error']}")
            continue
        cpu_target, mb_target = TARGETS[str(row["scenario"])]
        longest = row["longest_interval_s"]
        print(f"{row['scenario']:>8} {row['source']:>8} | {row['steady_cpu_percent']:>12.2f} {cpu_target:>6g} | "
              f"{row['peak_rss_mb']:>7.1f} {mb_target:>6g} | "
              f"{row['startup_cpu_s']:>11.2f} {row['startup_wall_s']:>7.2f} | "
              f"{row['duration_s']:>6.2f} {seconds:>5g} | {longest if longest is not None else '-':>17} | "
              f"{row['load_1m']:>4}")
        if row.get("threads"):
            print(f"{'':>17} threads: " + ", ".join(f"{name} {p:.2f}" for name, p in row["threads"].items()))
        if row.get("agent_cost"):  # the agent's own line at stop: steady window from its start-up line
            print(f"{'':>17} agent: {row['agent_cost']}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
