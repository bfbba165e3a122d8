# SPDX-License-Identifier: Apache-2.0
"""Cost of eBPF CPU profiling, measured on this machine (root, BTF, perf events).

Reports, side by side in one run:
  1. overhead while every core is busy (one cpu_3to1 per online CPU): the real agent's own CPU time over wall time,
     at 19 Hz and at 99 Hz (target <= 1 % of one core at 19 Hz), plus the in-kernel cost of the BPF program
     (run time per sample, from kernel.bpf_stats_enabled) which is charged to the interrupted processes;
  2. drain + symbolize + encode throughput in samples per second (target >= 50,000):
     a. real: the sampler at a high frequency on busy workloads, then one drain, pprof and OTLP encoding;
     b. worst case: every sample a distinct, never-seen stack (random addresses in live processes' code and the
        kernel), fed through the same symbolizer and encoders;
  3. the agent's RSS with CPU profiling on (current and peak; target <= 100 MB);
  4. the design choice: in-kernel aggregation (the default) against a ring buffer of raw samples, at 99 Hz;
  5. symbol tables of huge binaries: a generated libtorch_cpu.so-sized table (530,000 functions, C++-like names) and
     any real file given with --elf, each loaded in a fresh process: load time, peak RSS added by the load, memory
     held, and lookups per second (each a never-seen function, its name read from the file).

Run (as root, after make build): .venv/bin/python bench/bench_cpu_profiler.py [--seconds 30] [--json out.json]
                                 [--elf /path/to/libtorch_cpu.so ...]
Only part 5 (no root needed): .venv/bin/python bench/bench_cpu_profiler.py --only-elf [--elf PATH ...]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
WORKLOADS = REPO / "tests" / "native" / "workloads"
sys.path.insert(0, str(REPO))

CLK_TCK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """utime + stime of ``pid`` (all its threads), in seconds."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rfind(")") + 2:].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def rss_mb(pid: int) -> tuple[float, float]:
    """(VmRSS, VmHWM) of ``pid`` in MB."""
    values = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(("VmRSS:", "VmHWM:")):
            key, value = line.split(":", 1)
            values[key] = int(value.split()[0]) / 1024
    return values.get("VmRSS", 0.0), values.get("VmHWM", 0.0)


def sampler_prog_stats() -> tuple[int, int]:
    """(run_time_ns, run_cnt) summed over loaded on_cpu_sample programs (needs kernel.bpf_stats_enabled=1)."""
    bpftool = shutil.which("bpftool") or "/usr/sbin/bpftool"
    out = subprocess.run([bpftool, "prog", "show", "-j"], capture_output=True, text=True, check=False).stdout
    run_ns = count = 0
    for prog in json.loads(out or "[]"):
        if prog.get("name") == "on_cpu_sample":
            run_ns += prog.get("run_time_ns", 0)
            count += prog.get("run_cnt", 0)
    return run_ns, count


def program_loaded() -> bool:
    return sampler_prog_stats() != (0, 0) or "on_cpu_sample" in subprocess.run(
        [shutil.which("bpftool") or "/usr/sbin/bpftool", "prog", "show"], capture_output=True, text=True,
        check=False).stdout


# Issue 14's mix: a pure-Python call chain (the agent reads its frames) and a C program built without frame pointers
# (walked from .eh_frame tables), taking turns over the online CPUs.
PYTHON_BURNER = """
import sys, time
def leaf(n):
    total = 0
    for i in range(n):
        total += i * i
    return total
def middle(n):
    return leaf(3 * n) + leaf(n)
def outer(deadline):
    while time.monotonic() < deadline:
        middle(2000)
outer(time.monotonic() + float(sys.argv[1]))
"""
NOFP_BURNER = REPO / "tests" / "native" / "unwind" / "cpu_3to1_nofp"


def start_burners(seconds: float, mix: bool = False) -> list[subprocess.Popen[bytes]]:
    from otel_gpu.ebpf.loader import online_cpus

    def burner(index: int) -> list[str]:
        if not mix:
            return [str(WORKLOADS / "cpu_3to1"), str(seconds)]
        if index % 2 == 0:
            return [sys.executable, "-c", PYTHON_BURNER, str(seconds)]
        return [str(NOFP_BURNER), str(seconds)]

    return [subprocess.Popen(burner(index), stdout=subprocess.DEVNULL) for index, _ in enumerate(online_cpus())]


def agent_overhead(frequency_hz: int, seconds: float, process_name: str = "", mix: bool = False) -> dict[str, float]:
    """Run the real agent with every core busy; its CPU over wall time after it attached. ``process_name`` limits
    profiling to matching processes (to separate the cost of the workloads from other activity on the machine);
    ``mix``: the cores run Python and code without frame pointers (issue 14) instead of cpu_3to1."""
    out_dir = tempfile.mkdtemp(prefix="otel-gpu-bench-")
    burners = start_burners(seconds + 30, mix)
    agent = subprocess.Popen([sys.executable, "-m", "otel_gpu", "run", "--no-gpu-metrics", "--no-gpu-time-profiling", "--output-dir", out_dir,
                              "--console", "off", "--profiling-frequency-hz", str(frequency_hz),
                              "--profiling-interval", "10", "--log-level", "warning",
                              *(["--process-name", process_name] if process_name else [])],
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not program_loaded():
            if agent.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"agent did not attach: {agent.stderr.read() if agent.stderr else ''}")
            time.sleep(0.2)
        time.sleep(1.0)  # past start-up
        cpu0, wall0, (bpf_ns0, bpf_n0) = cpu_seconds(agent.pid), time.monotonic(), sampler_prog_stats()
        time.sleep(seconds)
        cpu1, wall1, (bpf_ns1, bpf_n1) = cpu_seconds(agent.pid), time.monotonic(), sampler_prog_stats()
        rss, hwm = rss_mb(agent.pid)
    finally:
        agent.send_signal(signal.SIGTERM)
        agent.wait(timeout=60)
        for burner in burners:
            burner.kill()
            burner.wait()
        shutil.rmtree(out_dir, ignore_errors=True)
    wall = wall1 - wall0
    samples = bpf_n1 - bpf_n0
    only = process_name or "every process"
    return {"frequency_hz": frequency_hz, "only": f"{only}, Python + no-frame-pointer C" if mix else only,
            "wall_s": round(wall, 2),
            "agent_cpu_percent_of_one_core": round(100 * (cpu1 - cpu0) / wall, 3),
            "bpf_runs": samples, "bpf_ns_per_run": round((bpf_ns1 - bpf_ns0) / samples) if samples else 0,
            "bpf_cpu_percent_of_one_core": round(100 * (bpf_ns1 - bpf_ns0) / 1e9 / wall, 3),
            "agent_rss_mb": round(rss, 1), "agent_peak_rss_mb": round(hwm, 1)}


def encode_all(batch) -> tuple[int, int]:  # type: ignore[no-untyped-def]
    from otel_gpu.profiles.otlp import encode_otlp
    from otel_gpu.profiles.pprof import encode_pprof

    return len(encode_pprof(batch)), len(encode_otlp(batch).SerializeToString())


def real_throughput(frequency_hz: int, seconds: float) -> dict[str, float]:
    """Sample two busy workloads at ``frequency_hz`` for ``seconds``, then time one drain + encode (steady state:
    a first round of the same workloads warmed the ELF and kernel symbol caches; other processes are filtered out
    by name before symbolization)."""
    from otel_gpu.config import ProfilingConfig
    from otel_gpu.cpu.source import CPUProfileSource
    from otel_gpu.procfs import ProcessResolver

    config = ProfilingConfig(frequency_hz=frequency_hz, process_name="^(cpu_3to1|syscall_heavy)$")
    source = CPUProfileSource(config, ProcessResolver())
    source.open()
    try:
        for round_s in (1.0, seconds):
            source.drain()
            workloads = [subprocess.Popen([str(WORKLOADS / name), str(round_s)], stdout=subprocess.DEVNULL)
                         for name in ("cpu_3to1", "syscall_heavy")]
            for workload in workloads:
                workload.wait()
            started = time.perf_counter()
            (batch,) = source.drain()
            drained = time.perf_counter()
            pprof_bytes, otlp_bytes = encode_all(batch)
            encoded = time.perf_counter()
    finally:
        source.close()
    samples = sum(s.value for p in batch.processes for s in p.samples)
    entries = batch.sample_count
    total = encoded - started
    return {"frequency_hz": frequency_hz, "samples": samples, "distinct_samples": entries,
            "drain_symbolize_ms": round(1000 * (drained - started), 1), "encode_ms": round(1000 * (encoded - drained), 1),
            "samples_per_s": round(samples / total), "drain_symbolize_samples_per_s": round(samples / (drained - started)),
            "distinct_samples_per_s": round(entries / total), "pprof_bytes": pprof_bytes, "otlp_bytes": otlp_bytes}


def worst_case_throughput(count: int, depth: int) -> dict[str, float]:
    """``count`` samples, each a distinct stack of ``depth`` random never-seen code addresses (user + kernel)."""
    from otel_gpu.config import ProfilingConfig
    from otel_gpu.cpu.sampler import StackCount
    from otel_gpu.cpu.source import CPUProfileSource
    from otel_gpu.procfs import ProcessResolver
    from otel_gpu.symbolize.kallsyms import KernelSymbols
    from otel_gpu.symbolize.maps import read_maps
    from otel_gpu.symbolize.symbolizer import Symbolizer

    workloads = [subprocess.Popen([str(WORKLOADS / "cpu_3to1"), "60"], stdout=subprocess.DEVNULL),
                 subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])]
    time.sleep(0.5)
    rng = random.Random(7)
    kernel = KernelSymbols()
    kernel_range = (kernel._starts[0], kernel._starts[-1]) if kernel.available else (0, 0)
    raw: list[StackCount] = []
    for workload in workloads:
        code = [e for e in read_maps(workload.pid) or [] if e.executable and e.file_backed]
        for i in range(count // len(workloads)):
            user = tuple(rng.randrange(e.start, e.end) for e in rng.choices(code, k=depth))
            kstack = tuple(rng.randrange(*kernel_range) for _ in range(4)) if kernel.available and i % 3 == 0 else ()
            raw.append(StackCount(workload.pid, workload.pid, "bench", 1, user, kstack))

    class FeedSampler:
        frequency_hz = 19
        attached_ns = 0

        def open(self) -> None: ...

        def close(self) -> None: ...

        def drain(self) -> list[StackCount]:
            return raw

        def forget(self, pids: object) -> None: ...

    try:
        symbolizer = Symbolizer()
        symbolizer.load_kernel_symbols()  # as open() does
        source = CPUProfileSource(ProfilingConfig(), ProcessResolver(), symbolizer=symbolizer,
                                  sampler=FeedSampler())  # type: ignore[arg-type]
        started = time.perf_counter()
        (batch,) = source.drain()
        drained = time.perf_counter()
        pprof_bytes, otlp_bytes = encode_all(batch)
        encoded = time.perf_counter()
    finally:
        for workload in workloads:
            workload.kill()
            workload.wait()
    total = encoded - started
    return {"samples": len(raw), "stack_depth": depth, "drain_symbolize_ms": round(1000 * (drained - started), 1),
            "encode_ms": round(1000 * (encoded - drained), 1), "samples_per_s": round(len(raw) / total),
            "symbolize_only_samples_per_s": round(len(raw) / (drained - started)),
            "pprof_bytes": pprof_bytes, "otlp_bytes": otlp_bytes}


def design_comparison(frequency_hz: int, seconds: float) -> list[dict[str, float]]:
    """In-kernel aggregation (two map generations) against a ring buffer of raw samples, every core busy:
    the sampler's CPU in this process (event thread + drains every 2 s) and the BPF program's run time."""
    from otel_gpu.config import ProfilingConfig
    from otel_gpu.cpu.sampler import CPUSampler
    from otel_gpu.cpu.source import CPUProfileSource
    from otel_gpu.procfs import ProcessResolver

    rows = []
    for raw_only in (False, True):
        sampler = CPUSampler(frequency_hz, exclude_tgid=os.getpid(), raw_only=raw_only)
        source = CPUProfileSource(ProfilingConfig(frequency_hz=frequency_hz), ProcessResolver(), sampler=sampler)
        sampler._on_new_process = source._on_new_process  # same wiring as the default sampler
        sampler._on_tick = source._on_tick
        burners = start_burners(seconds + 30)
        source.open()
        try:
            time.sleep(1.0)
            source.drain()
            cpu0, wall0, (ns0, n0) = time.process_time(), time.monotonic(), sampler_prog_stats()
            samples = 0
            while time.monotonic() - wall0 < seconds:
                time.sleep(2.0)
                samples += sum(s.value for p in source.drain()[0].processes for s in p.samples)
            cpu1, wall1, (ns1, n1) = time.process_time(), time.monotonic(), sampler_prog_stats()
        finally:
            source.close()
            for burner in burners:
                burner.kill()
                burner.wait()
        rows.append({"design": "raw ring buffer" if raw_only else "in-kernel aggregation",
                     "frequency_hz": frequency_hz, "samples": samples,
                     "user_cpu_percent_of_one_core": round(100 * (cpu1 - cpu0) / (wall1 - wall0), 3),
                     "bpf_ns_per_run": round((ns1 - ns0) / (n1 - n0)) if n1 > n0 else 0})
    return rows


_ELF_COST_CHILD = """
import json, random, sys, time
from otel_gpu.symbolize.elf import ElfSymbols
def hwm_kb():
    return int(next(l for l in open("/proc/self/status") if l.startswith("VmHWM:")).split()[1])
before = hwm_kb()
started = time.perf_counter()
elf = ElfSymbols(sys.argv[1])
loaded = time.perf_counter()
peak_added = hwm_kb() - before
rng = random.Random(5)
starts = [elf._starts[i] for i in rng.sample(range(elf.symbol_count), min(20_000, elf.symbol_count))]
begun = time.perf_counter()
named = sum(1 for start in starts if elf.lookup(start))
looked = time.perf_counter()
print(json.dumps({"functions": elf.symbol_count, "load_s": round(loaded - started, 2),
                  "peak_rss_added_mb": round(peak_added / 1024, 1), "held_mb": round(elf.size_bytes / 2**20, 1),
                  "cold_lookups_per_s": round(named / (looked - begun))}))
"""


def huge_symbol_table_cost(paths: list[str], functions: int = 530_000) -> list[dict[str, object]]:
    """Part 5: each ELF file loaded in a fresh interpreter (so its peak RSS is the load's own)."""
    from tests.symbolize.elfgen import cxx_like_symbols, write_elf

    rows: list[dict[str, object]] = []
    with tempfile.TemporaryDirectory() as folder:
        generated = Path(folder) / "libgenerated.so"
        write_elf(generated, cxx_like_symbols(functions))
        for path in [str(generated), *paths]:
            done = subprocess.run([sys.executable, "-c", _ELF_COST_CHILD, path], capture_output=True, text=True,
                                  cwd=REPO, check=False)
            row: dict[str, object] = {"file": Path(path).name, "file_mb": round(os.path.getsize(path) / 2**20)}
            row.update(json.loads(done.stdout) if done.returncode == 0 else {"error": done.stderr.strip()[-200:]})
            rows.append(row)
    return rows


def print_symbol_table_cost(rows: list[dict[str, object]]) -> None:
    print("5. symbol tables of huge binaries (each loaded in a fresh process)")
    for row in rows:
        if "error" in row:
            print(f"   {row['file']}: {row['error']}")
            continue
        print(f"   {row['file']} ({row['file_mb']} MB, {row['functions']} functions): load {row['load_s']} s, "
              f"peak RSS +{row['peak_rss_added_mb']} MB, held {row['held_mb']} MB, "
              f"{row['cold_lookups_per_s']} never-seen lookups/s")


def print_overhead(rows: list[dict[str, float]]) -> None:
    print("1. overhead, every core busy (agent CPU over wall time; BPF cost is charged to the sampled processes)")
    for row in rows:
        print(f"   {row['frequency_hz']:>3} Hz, {row['only']}: "
              f"agent {row['agent_cpu_percent_of_one_core']:.3f} % of one core, "
              f"BPF {row['bpf_cpu_percent_of_one_core']:.3f} % ({row['bpf_ns_per_run']} ns x {row['bpf_runs']} runs), "
              f"RSS {row['agent_rss_mb']} MB (peak {row['agent_peak_rss_mb']} MB) over {row['wall_s']} s")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=30.0, help="measured seconds per overhead run")
    parser.add_argument("--json", help="also write the results to this file")
    parser.add_argument("--elf", action="append", default=[], help="also measure loading this ELF file (part 5)")
    parser.add_argument("--only-elf", action="store_true", help="run only part 5 (needs no root)")
    parser.add_argument("--only-overhead", action="store_true", help="run only part 1")
    args = parser.parse_args()
    if args.only_elf:
        rows = huge_symbol_table_cost(args.elf)
        print_symbol_table_cost(rows)
        if args.json:
            Path(args.json).write_text(json.dumps({"symbol_tables": rows}, indent=2))
        return 0
    if os.geteuid() != 0:
        print("bench_cpu_profiler: needs root (loads eBPF programs)", file=sys.stderr)
        return 1
    stats_path = Path("/proc/sys/kernel/bpf_stats_enabled")
    previous = stats_path.read_text().strip()
    stats_path.write_text("1")
    results: dict[str, object] = {}
    try:
        results["overhead"] = [agent_overhead(19, args.seconds), agent_overhead(99, args.seconds),
                               agent_overhead(19, args.seconds, "^cpu_3to1$"),
                               agent_overhead(19, args.seconds, mix=True)]
        if args.only_overhead:
            print_overhead(results["overhead"])  # type: ignore[arg-type]
            return 0
        results["throughput_real"] = real_throughput(999, 5.0)
        results["throughput_worst_case"] = worst_case_throughput(20_000, 16)
        results["design"] = design_comparison(99, min(args.seconds, 20.0))
        results["symbol_tables"] = huge_symbol_table_cost(args.elf)
    finally:
        stats_path.write_text(previous)
    print_overhead(results["overhead"])  # type: ignore[arg-type]
    real = results["throughput_real"]
    worst = results["throughput_worst_case"]
    print("2. drain + symbolize + encode (pprof + OTLP)")
    print(f"   real (steady state), {real['frequency_hz']} Hz x 5 s on 2 workloads: {real['samples']} samples in "  # type: ignore[index]
          f"{real['distinct_samples']} distinct: drain+symbolize {real['drain_symbolize_ms']} ms, "  # type: ignore[index]
          f"encode {real['encode_ms']} ms -> {real['samples_per_s']} samples/s "  # type: ignore[index]
          f"({real['distinct_samples_per_s']} distinct/s; drain+symbolize alone "  # type: ignore[index]
          f"{real['drain_symbolize_samples_per_s']} samples/s)")  # type: ignore[index]
    print(f"   worst case, {worst['samples']} distinct never-seen stacks of depth {worst['stack_depth']}: "  # type: ignore[index]
          f"drain+symbolize {worst['drain_symbolize_ms']} ms, encode {worst['encode_ms']} ms -> "  # type: ignore[index]
          f"{worst['samples_per_s']} samples/s (symbolize only {worst['symbolize_only_samples_per_s']}/s)")  # type: ignore[index]
    print("3. agent RSS with CPU profiling on: see 1 (target <= 100 MB)")
    print("4. design: in-kernel aggregation against a ring buffer of raw samples (in-process sampler, every core busy)")
    for row in results["design"]:  # type: ignore[union-attr]
        print(f"   {row['design']:>22} at {row['frequency_hz']} Hz: sampler {row['user_cpu_percent_of_one_core']:.3f} % "
              f"of one core, BPF {row['bpf_ns_per_run']} ns per sample, {row['samples']} samples")
    print_symbol_table_cost(results["symbol_tables"])  # type: ignore[arg-type]
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
