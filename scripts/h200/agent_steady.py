# SPDX-License-Identifier: Apache-2.0
"""Run THERE (or here with --load): the agent's steady-state cost, per thread, after its warm-up, and where each
thread spends it.

The agent runs ``--duration SECONDS`` with every source on next to a load (default: an injected bf16 matmul loop on
the GPU). Every 5 s the agent's threads' CPU time and its RSS are read from /proc; from ``--warm`` seconds on, py-spy
(``--nonblocking``, so the agent is never paused) samples it. The report: CPU-s and % of one core by thread over the
steady window [warm, end - 5 s], the RSS over time, and each busy thread's top functions (own and inclusive samples).

Usage: agent_steady.py OUT.md [--seconds 100] [--warm 30] [--load "shell command"] [--agent-args "..."]
       agent_steady.py OUT.md --top RAW (each thread's top functions in a py-spy raw profile, e.g. of start-up)
"""

from __future__ import annotations

import argparse
import collections
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from otel_gpu.selfcost import thread_cpu_s  # noqa: E402

MATMUL = ("import torch,time; a=torch.randn(8192,8192,device='cuda',dtype=torch.bfloat16); t=time.time()\n"
          "while time.time()-t<{seconds}: (a@a); torch.cuda.synchronize()")


def rss_mb(pid: int) -> tuple[float, float]:
    """(VmRSS, VmHWM) in MB."""
    fields = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                fields[key] = int(value.split()[0]) / 1024
    return fields.get("VmRSS", 0.0), fields.get("VmHWM", 0.0)


def rss_by_mapping(pid: int, count: int = 12) -> list[str]:
    """The largest resident mappings of /proc/PID/smaps, summed by name (anonymous ones as "[anon]")."""
    sizes: collections.Counter[str] = collections.Counter()
    name = "[anon]"
    with open(f"/proc/{pid}/smaps") as f:
        for line in f:
            head = line.split()
            if not head:
                continue
            if "-" in head[0] and not head[0].endswith(":"):
                name = " ".join(head[5:]) or "[anon]"
            elif head[0] == "Rss:":
                sizes[name] += int(head[1])
    return [f"  {kb / 1024:7.1f} MB  {mapping}" for mapping, kb in sizes.most_common(count)]


def py_spy() -> str | None:
    for candidate in (shutil.which("py-spy"), "/tmp/site/bin/py-spy"):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    return None


def top_functions(raw: Path, count: int = 12) -> list[str]:
    """Per thread: the functions with the most own and inclusive samples (py-spy's raw format, --threads)."""
    own: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    inclusive: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    totals: collections.Counter[str] = collections.Counter()
    for line in raw.read_text().splitlines():
        stack, _, weight = line.rpartition(" ")
        if not stack or not weight.isdigit():
            continue
        frames = stack.split(";")
        thread = next((f for f in frames if f.startswith("thread ")), "thread ?")
        functions = [f for f in frames if not f.startswith(("thread ", "process "))]
        totals[thread] += int(weight)
        if functions:
            own[thread][functions[-1]] += int(weight)
        for function in set(functions):
            inclusive[thread][function] += int(weight)
    lines = []
    for thread, total in totals.most_common():
        lines.append(f"\n### {thread}: {total} samples\n\nown:")
        lines += [f"  {n:6d} {100 * n / total:5.1f} %  {f}" for f, n in own[thread].most_common(count)]
        lines.append("inclusive:")
        lines += [f"  {n:6d} {100 * n / total:5.1f} %  {f}" for f, n in inclusive[thread].most_common(count)]
    return lines


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--seconds", type=int, default=100)
    parser.add_argument("--warm", type=int, default=30)
    parser.add_argument("--load", default=None, help="shell command of the load (default: injected matmul loop)")
    parser.add_argument("--agent-args", default="",
                        help="flags for otel-gpu run (default none: the default intervals, 10 s each; the sessions "
                             "before 2026-12-04's thirteenth measured with --metric-export-interval 5)")
    parser.add_argument("--top", default=None, help="only print the top functions of this py-spy raw file to OUT")
    args = parser.parse_args()
    out = Path(args.out)
    if args.top:
        out.write_text("\n".join(top_functions(Path(args.top), count=25)) + "\n")
        return 0
    work = Path(tempfile.mkdtemp(prefix="agent-steady-"))
    load_cmd = args.load or (f"{shlex.quote(sys.executable)} -m otel_gpu inject -- {shlex.quote(sys.executable)} -c "
                             + shlex.quote(MATMUL.format(seconds=args.seconds + 10)))
    load = subprocess.Popen(load_cmd, shell=True, start_new_session=True, stderr=open(work / "load-stderr.txt", "w"),
                            env=dict(os.environ, OTEL_GPU_DEBUG_STATS="1"))
    time.sleep(5)
    agent = subprocess.Popen([sys.executable, "-m", "otel_gpu", "run", "--duration", str(args.seconds),
                              "--output-dir", str(work / "out"), "--console", "off", *shlex.split(args.agent_args)],
                             stderr=open(work / "agent-stderr.txt", "w"))
    started = time.monotonic()
    samples: list[tuple[float, dict[str, float], float, float]] = []
    spy, spy_proc = py_spy(), None
    mappings: list[str] = []
    raw = work / "py-spy.txt"
    while agent.poll() is None:
        elapsed = time.monotonic() - started
        try:
            samples.append((elapsed, thread_cpu_s(f"/proc/{agent.pid}"), *rss_mb(agent.pid)))
        except OSError:
            break
        if not mappings and elapsed >= args.seconds - 8:
            try:
                mappings = rss_by_mapping(agent.pid)
            except OSError:
                pass
        if spy and spy_proc is None and elapsed >= args.warm:
            spy_proc = subprocess.Popen([spy, "record", "--nonblocking", "--threads", "--format", "raw", "--rate", "50",
                                         "--duration", str(max(5, args.seconds - args.warm - 5)), "--pid",
                                         str(agent.pid), "--output", str(raw)],
                                        stdout=subprocess.DEVNULL, stderr=open(work / "py-spy-stderr.txt", "w"))
        time.sleep(5)
    agent.wait()
    if spy_proc is not None:
        spy_proc.wait(timeout=30)
    try:  # the load ends by itself (its library's stats line, OTEL_GPU_DEBUG_STATS=1, comes at its exit)
        load.wait(timeout=40)
    except subprocess.TimeoutExpired:
        os.killpg(load.pid, 15)
        load.wait()
    stderr = (work / "agent-stderr.txt").read_text()
    # the loop ends at --duration: later readings may miss threads already joined
    steady = [s for s in samples if args.warm <= s[0] <= args.seconds - 2]
    lines = [f"# Agent steady state: {args.seconds} s, warm-up {args.warm} s", "",
             f"load: `{load_cmd[:200]}`", f"agent args: `{args.agent_args}`", ""]
    if len(steady) >= 2:
        (t0, cpu0, _, _), (t1, cpu1, _, _) = steady[0], steady[-1]
        span = t1 - t0
        total = sum(cpu1[k] - cpu0.get(k, 0.0) for k in cpu1)
        lines.append(f"steady window {t0:.0f}-{t1:.0f} s: {total:.2f} CPU-s, "
                     f"**{100 * total / span:.2f} % of one core**")
        for name in sorted(cpu1, key=lambda k: cpu0.get(k, 0.0) - cpu1[k]):
            delta = cpu1[name] - cpu0.get(name, 0.0)
            if delta > 0.005:
                lines.append(f"  {name:28s} {delta:7.2f} CPU-s {100 * delta / span:6.2f} %")
    lines.append("\nRSS over time (s: VmRSS / VmHWM MB): " + ", ".join(
        f"{t:.0f}: {r:.0f}/{h:.0f}" for t, _, r, h in samples))
    lines += ["", "resident memory by mapping near the end:", "```", *mappings, "```"]
    lines += ["", "the load's library stats (OTEL_GPU_DEBUG_STATS=1):", "```"]
    lines += [line for line in (work / "load-stderr.txt").read_text(errors="replace").splitlines()
              if "otel-gpu: stats" in line][-10:]
    lines += ["```", "", "agent log (cost, warnings):", "```"]
    lines += [line for line in stderr.splitlines() if "cost" in line or "WARNING" in line or "ERROR" in line][-20:]
    lines.append("```")
    if raw.exists():
        lines += top_functions(raw)
    else:
        lines.append(f"\n(no py-spy profile: {py_spy() or 'py-spy not found'}; "
                     f"{(work / 'py-spy-stderr.txt').read_text()[-300:] if spy else ''})")
    out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines[:40]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
