# SPDX-License-Identifier: Apache-2.0
"""Cost of NVML collection, measured on the fake libnvidia-ml.so.1 (tests/native/nvml).

Reports, side by side:
  1. CPU time of one collection cycle per GPU (target <= 2 ms), for 2 and 8 GPUs with processes listed;
  2. wall time of an 8-GPU cycle against the slowest GPU alone and against reading the GPUs one after another,
     with an artificial per-call delay in the fake (target: 8-GPU cycle ~ slowest GPU);
  3. peak RSS of the real agent with GPU metrics only (target <= 80 MB).

Run: .venv/bin/python bench/bench_nvml.py [--cycles 200] [--json out.json]
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
FAKE_DIR = REPO / "tests" / "native" / "nvml"
FAKE_LIB = FAKE_DIR / "build" / "libnvidia-ml.so.1"
SCENARIO = Path(tempfile.gettempdir()) / f"otel-gpu-bench-nvml-{os.getpid()}.scenario"


def write_scenario(**knobs: object) -> None:
    tmp = SCENARIO.with_suffix(".tmp")
    tmp.write_text("".join(f"{k.upper()}={v}\n" for k, v in knobs.items()))
    os.replace(tmp, SCENARIO)


def processes_knob(pids: list[int], gpus: int) -> str:
    return ",".join(f"{pid}@{i % gpus}:{(i + 1) << 28}:{10 + i}" for i, pid in enumerate(pids))


def open_source(interval_s: float = 10.0):  # type: ignore[no-untyped-def]
    from otel_gpu.config import GPUConfig
    from otel_gpu.gpu.source import NVMLSource
    from otel_gpu.procfs import ProcessResolver

    source = NVMLSource(GPUConfig(collection_timeout_s=30), ProcessResolver(), interval_s=interval_s)
    source.open()
    return source


def cpu_per_gpu(gpus: int, cycles: int, pids: list[int]) -> dict[str, float]:
    """CPU ms per GPU per cycle: reader.read() alone (thread CPU) and the whole parallel collect() (process CPU)."""
    write_scenario(gpus=gpus, processes=processes_knob(pids, gpus))
    source = open_source()
    try:
        source.collect()  # warm: static limits, GPM allocation, /proc identities cached
        per_read_ms = []
        for position in range(gpus):
            with source.exclusive_reader(position) as reader:
                for _ in range(cycles):
                    started = time.thread_time()
                    reader.read()
                    per_read_ms.append((time.thread_time() - started) * 1000)
        started = time.process_time()
        for _ in range(cycles):
            source.collect()
        collect_ms = (time.process_time() - started) * 1000 / cycles / gpus
    finally:
        source.close()
    return {"gpus": gpus, "read_cpu_ms_per_gpu_median": statistics.median(per_read_ms),
            "read_cpu_ms_per_gpu_p95": sorted(per_read_ms)[int(len(per_read_ms) * 0.95)],
            "collect_cpu_ms_per_gpu": collect_ms}


def parallel_wall(delay_us: int, slow_delay_us: int, rounds: int) -> dict[str, float]:
    """Wall ms: 8 GPUs in parallel vs the slowest GPU alone vs the 8 read one after another."""
    write_scenario(gpus=8, delay_us=delay_us, gpu_delay_us=f"7:{slow_delay_us}")
    source = open_source()
    try:
        source.collect()
        parallel, slowest, serial = [], [], []
        for _ in range(rounds):
            started = time.perf_counter()
            source.collect()
            parallel.append((time.perf_counter() - started) * 1000)
            with source.exclusive_reader(7) as reader:
                started = time.perf_counter()
                reader.read()
                slowest.append((time.perf_counter() - started) * 1000)
            started = time.perf_counter()
            for position in range(8):
                with source.exclusive_reader(position) as reader:
                    reader.read()
            serial.append((time.perf_counter() - started) * 1000)
    finally:
        source.close()
    p, s, q = statistics.median(parallel), statistics.median(slowest), statistics.median(serial)
    return {"delay_us_per_call": delay_us, "slow_gpu_extra_delay_us": slow_delay_us,
            "cycle_8_gpus_parallel_ms": p, "slowest_gpu_alone_ms": s, "cycle_8_gpus_serial_ms": q,
            "parallel_over_slowest": p / s, "serial_over_parallel": q / p}


def other_sources_off() -> list[str]:
    """Flags that turn every source but NVML off (those this agent version knows)."""
    help_text = subprocess.run([sys.executable, "-m", "otel_gpu", "run", "--help"], cwd=REPO, capture_output=True,
                               text=True, check=False).stdout
    return [flag for flag in ("--no-cpu-profiling", "--no-gpu-time-profiling") if flag in help_text]


def agent_rss(pids: list[int], duration_s: float, extra: tuple[str, ...] = ()) -> dict[str, float]:
    """Peak VmRSS of `otel-gpu run` with GPU metrics only (8 fake GPUs, processes listed, 1 s interval)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "FAKE_NVML_"))}
    env.update({"LD_LIBRARY_PATH": str(FAKE_LIB.parent), "FAKE_NVML_GPUS": "8",
                "FAKE_NVML_PROCESSES": processes_knob(pids, 8)})
    with tempfile.TemporaryDirectory() as out:
        agent = subprocess.Popen(
            [sys.executable, "-m", "otel_gpu", "run", "--duration", str(duration_s), *other_sources_off(),
             "--metric-export-interval", "1", "--output-dir", out, "--console", "off", *extra],
            cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        peak_kib = 0
        cpu_start = None
        while agent.poll() is None:
            try:
                status = Path(f"/proc/{agent.pid}/status").read_text()
                stat = Path(f"/proc/{agent.pid}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                break
            rss = next(int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS:"))
            peak_kib = max(peak_kib, rss)
            ticks = int(stat[11]) + int(stat[12])
            cpu_start = cpu_start if cpu_start is not None else (ticks, time.monotonic())
            cpu_end = (ticks, time.monotonic())
            time.sleep(0.1)
        stderr = agent.communicate()[1]
    if agent.returncode != 0:
        raise SystemExit(f"the agent failed ({agent.returncode}):\n{stderr}")
    hz = os.sysconf("SC_CLK_TCK")
    cpu_share = ((cpu_end[0] - cpu_start[0]) / hz) / max(1e-9, cpu_end[1] - cpu_start[1]) if cpu_start else 0.0
    return {"gpus": 8, "processes": len(pids), "peak_rss_mb": peak_kib / 1024,
            "steady_cpu_percent_of_one_core": 100 * cpu_share}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cycles", type=int, default=200, help="cycles per CPU measurement")
    parser.add_argument("--rounds", type=int, default=10, help="rounds of the parallel-wall measurement")
    parser.add_argument("--agent-seconds", type=float, default=10.0, help="duration of the RSS run")
    parser.add_argument("--json", help="also write the results to this file")
    args = parser.parse_args()

    subprocess.run(["make", "-s", "-C", str(FAKE_DIR)], check=True)
    write_scenario()
    os.environ["FAKE_NVML_SCENARIO"] = str(SCENARIO)
    ctypes.CDLL(str(FAKE_LIB))
    sleepers = [subprocess.Popen(["sleep", "600"]) for _ in range(8)]
    pids = [p.pid for p in sleepers]
    try:
        results = {
            "cpu": [cpu_per_gpu(2, args.cycles, pids[:4]), cpu_per_gpu(8, args.cycles, pids)],
            "parallel": parallel_wall(1000, 3000, args.rounds),
            "agent": agent_rss(pids, args.agent_seconds),
            "agent_without_gpu_metrics": agent_rss(pids, args.agent_seconds, ("--no-gpu-metrics",)),
        }
    finally:
        for proc in sleepers:
            proc.kill()
            proc.wait()
        SCENARIO.unlink(missing_ok=True)

    print("NVML collection on the fake libnvidia-ml.so.1")
    print(f"{'GPUs':>5} {'read() CPU ms/GPU (median, p95)':>34} {'collect() CPU ms/GPU':>22} {'target':>8}")
    for row in results["cpu"]:
        print(f"{row['gpus']:>5} {row['read_cpu_ms_per_gpu_median']:>22.3f}, {row['read_cpu_ms_per_gpu_p95']:>9.3f}"
              f" {row['collect_cpu_ms_per_gpu']:>22.3f} {'<= 2':>8}")
    par = results["parallel"]
    print(f"\n8 GPUs, {par['delay_us_per_call']} us per NVML call, GPU 7 +{par['slow_gpu_extra_delay_us']} us per call")
    print(f"  8-GPU cycle (parallel) {par['cycle_8_gpus_parallel_ms']:.1f} ms | slowest GPU alone "
          f"{par['slowest_gpu_alone_ms']:.1f} ms | 8 GPUs one after another {par['cycle_8_gpus_serial_ms']:.1f} ms")
    print(f"  parallel / slowest = {par['parallel_over_slowest']:.2f} (target ~1.0); "
          f"serial / parallel = {par['serial_over_parallel']:.1f}x")
    agent = results["agent"]
    print(f"\nagent, GPU metrics only, {agent['gpus']} GPUs, {agent['processes']} processes, 1 s interval: "
          f"peak RSS {agent['peak_rss_mb']:.1f} MB (target <= 80), CPU {agent['steady_cpu_percent_of_one_core']:.1f}%"
          " of one core")
    base = results["agent_without_gpu_metrics"]
    print(f"same agent with --no-gpu-metrics (nothing collected): peak RSS {base['peak_rss_mb']:.1f} MB; GPU metrics "
          f"add {agent['peak_rss_mb'] - base['peak_rss_mb']:.1f} MB")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
