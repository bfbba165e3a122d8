#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Verify the NVML source on a real GPU machine (H200) under a PyTorch load, against nvidia-smi.

Runs once, unattended, in about three minutes:
  1. starts a bf16 matmul loop on cuda:0 in a subprocess (holding ~8 GiB so its memory shows);
  2. opens otel_gpu.gpu.source.NVMLSource (threads and XID watcher running) and, at the same moments, takes
     `nvidia-smi --query-gpu=...` and a source.collect(); compares them per GPU and sample;
  3. prints GPM values, the per-process view (the torch process must appear with its memory), per-call NVML
     timings, per-cycle CPU and wall time, and, when the OpenTelemetry SDK is importable, the instruments;
  4. writes all of it as markdown to the path given as argument.

Needs: Python >= 3.10, nvidia-ml-py (pynvml), PyYAML, torch, nvidia-smi. The OpenTelemetry SDK is optional.
Usage (from the repository root): python3 scripts/h200/verify_nvml.py docs/h200-nvml.md [--load-seconds 100]
Exit code: 0 when every comparison is within tolerance and the torch process was seen, 1 otherwise, 2 when the
source could not run at all.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

SMI_FIELDS = ("utilization.gpu", "memory.used", "memory.total", "power.draw", "temperature.gpu", "clocks.sm",
              "clocks.mem", "pstate")
MIB = 1024 * 1024

# (label, agent value from a snapshot in nvidia-smi's unit, index of the nvidia-smi field, tolerance, kind)
# kind "abs": |a - s| <= tol; "rel": |a - s| <= tol * max(|s|, 1)
COMPARISONS: tuple[tuple[str, Callable[[Any], float | None], int, float, str], ...] = (
    ("utilization %", lambda s: None if s.utilization is None else s.utilization * 100, 0, 15, "abs"),
    ("memory used MiB", lambda s: None if s.memory_used_bytes is None else s.memory_used_bytes / MIB, 1, 0.03, "rel"),
    ("memory total MiB", lambda s: None if s.memory_total_bytes is None else s.memory_total_bytes / MIB, 2, 0.01,
     "rel"),
    ("power W", lambda s: s.power_w, 3, 0.15, "rel"),
    ("temperature C", lambda s: s.temperature_c, 4, 3, "abs"),
    ("SM clock MHz", lambda s: None if s.sm_clock_hz is None else s.sm_clock_hz / 1e6, 5, 0.05, "rel"),
    ("memory clock MHz", lambda s: None if s.memory_clock_hz is None else s.memory_clock_hz / 1e6, 6, 0.02, "rel"),
    ("performance state", lambda s: s.performance_state, 7, 0, "abs"),
)

LOAD = r"""
import sys, time, torch
seconds = float(sys.argv[1])
device = torch.device("cuda:0")
a = torch.randn(8192, 8192, device=device, dtype=torch.bfloat16)
b = torch.randn_like(a)
hold = torch.empty(8 * 2**30, dtype=torch.uint8, device=device)
torch.cuda.synchronize()
print("READY", flush=True)
end = time.time() + seconds
n = 0
while time.time() < end:
    for _ in range(20):
        c = a @ b
    torch.cuda.synchronize()
    n += 20
print("DONE", n, flush=True)
"""


def nvidia_smi() -> list[list[str]]:
    """One row per GPU of SMI_FIELDS, as strings."""
    out = subprocess.run(["nvidia-smi", f"--query-gpu={','.join(SMI_FIELDS)}", "--format=csv,noheader,nounits"],
                         capture_output=True, text=True, timeout=20, check=True).stdout
    return [[cell.strip() for cell in line.split(",")] for line in out.strip().splitlines()]


def smi_number(text: str) -> float | None:
    text = text.strip()
    if text.startswith("P") and text[1:].isdigit():
        return float(text[1:])
    try:
        return float(text)
    except ValueError:
        return None


def within(agent: float, smi: float, tolerance: float, kind: str) -> bool:
    limit = tolerance if kind == "abs" else tolerance * max(abs(smi), 1.0)
    return abs(agent - smi) <= limit


def start_load(seconds: float, lines: list[str]) -> subprocess.Popen[str] | None:
    try:
        proc = subprocess.Popen([sys.executable, "-c", LOAD, str(seconds)], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
    except OSError as exc:
        lines.append(f"- torch load could not start: {exc}")
        return None
    answered = threading.Event()
    seen_ready: list[bool] = []

    def watch() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.startswith("READY"):
                seen_ready.append(True)
                answered.set()
        answered.set()  # the load exited before it was ready

    threading.Thread(target=watch, daemon=True).start()
    if not answered.wait(90) or not seen_ready:
        stderr = ""
        if proc.poll() is not None and proc.stderr is not None:
            stderr = proc.stderr.read()[-2000:]
        lines.append(f"- torch load did not become ready within 90 s (exit {proc.poll()}): `{stderr.strip()}`")
        proc.kill()
        return None
    lines.append(f"- torch load: pid {proc.pid}, bf16 8192x8192 matmul loop on cuda:0, 8 GiB held")
    return proc


def time_calls(nvml: Any, handle: Any, repeats: int = 5) -> list[tuple[str, str]]:
    """Median microseconds of each NVML wrapper the reader uses, on one GPU."""
    sample = None
    try:
        sample = nvml.gpm_sample_alloc()
    except nvml.NVMLCallError:
        pass
    calls: list[tuple[str, Callable[[], object]]] = [
        ("utilization rates", lambda: nvml.utilization_percent(handle)),
        ("memory info", lambda: nvml.memory_bytes(handle)),
        ("encoder utilization", lambda: nvml.encoder_utilization_percent(handle)),
        ("decoder utilization", lambda: nvml.decoder_utilization_percent(handle)),
        ("power usage", lambda: nvml.power_mw(handle)),
        ("enforced power limit", lambda: nvml.enforced_power_limit_mw(handle)),
        ("total energy", lambda: nvml.total_energy_mj(handle)),
        ("temperature", lambda: nvml.temperature_c(handle)),
        ("slowdown threshold", lambda: nvml.slowdown_temperature_c(handle)),
        ("SM clock", lambda: nvml.sm_clock_mhz(handle)),
        ("memory clock", lambda: nvml.memory_clock_mhz(handle)),
        ("clocks event reasons", lambda: nvml.clocks_event_reasons(handle)),
        ("performance state", lambda: nvml.performance_state(handle)),
        ("ECC corrected (volatile)", lambda: nvml.ecc_errors(handle, corrected=True)),
        ("PCIe replay counter", lambda: nvml.pcie_replay_count(handle)),
        ("PCIe byte counters (field values 197/198)", lambda: nvml.pcie_byte_counters(handle)),
        ("PCIe throughput TX (blocks ~20 ms)", lambda: nvml.pcie_throughput_kib_s(handle, transmit=True)),
        ("compute processes", lambda: nvml.running_processes(handle, graphics=False)),
        ("graphics processes", lambda: nvml.running_processes(handle, graphics=True)),
        ("process utilization", lambda: nvml.process_sm_utilization(handle, 0)),
        ("GPM sample", lambda: nvml.gpm_sample_get(handle, sample)),
    ]
    rows = []
    for label, call in calls:
        durations = []
        error = ""
        for _ in range(repeats):
            started = time.perf_counter()
            try:
                call()
            except nvml.NVMLCallError as exc:
                error = str(exc)
                break
            durations.append((time.perf_counter() - started) * 1e6)
        rows.append((label, f"{statistics.median(durations):.0f}" if durations else f"error: {error}"))
    if sample is not None:
        nvml.gpm_sample_free(sample)
    return rows


def instruments_section(source: Any) -> list[str]:
    try:
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import InMemoryMetricReader

        from otel_gpu.metrics.gpu_instruments import register_gpu_instruments
    except ImportError as exc:
        return [f"OpenTelemetry SDK not importable ({exc}): instrument check skipped."]
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    register_gpu_instruments(provider.get_meter("verify"), source)
    data = reader.get_metrics_data()
    lines = ["| metric | unit | points | first point (attributes beyond the GPU's) |", "|---|---|---|---|"]
    gpu_keys = {"hw.id", "hw.name", "hw.model", "nvidia.gpu.index", "nvidia.gpu.pci.bus_id"}
    for rm in data.resource_metrics if data else ():
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                points = list(metric.data.data_points)
                first = points[0] if points else None
                extra = {k: v for k, v in dict(first.attributes).items() if k not in gpu_keys} if first else {}
                shown = f"{first.value:.6g} {extra}" if first else ""
                lines.append(f"| {metric.name} | {metric.unit} | {len(points)} | {shown} |")
    provider.shutdown()
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("output", help="markdown file to write")
    parser.add_argument("--load-seconds", type=float, default=100.0, help="length of the torch load")
    parser.add_argument("--samples", type=int, default=8, help="comparison samples")
    parser.add_argument("--gap-seconds", type=float, default=3.0, help="seconds between samples")
    args = parser.parse_args()

    from otel_gpu.config import GPUConfig
    from otel_gpu.errors import SourceUnavailable
    from otel_gpu.gpu import _nvml as nvml
    from otel_gpu.gpu.source import NVMLSource
    from otel_gpu.procfs import ProcessResolver

    started_at = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    lines = [f"# NVML source on a real GPU vs nvidia-smi ({started_at})", ""]
    source = NVMLSource(GPUConfig(), ProcessResolver(), interval_s=1.0)
    try:
        source.open()
    except SourceUnavailable as exc:
        lines.append(f"NVML source unavailable: {exc}")
        Path(args.output).write_text("\n".join(lines) + "\n")
        print("\n".join(lines))
        return 2
    lines.append(f"- driver {source.driver_version}; GPUs: " + ", ".join(
        f"{g.index} {g.name} {g.uuid} {g.pci_bus_id}" for g in source.gpus()))
    lines.append(f"- Python {sys.version.split()[0]}, pid {os.getpid()}")
    load = start_load(args.load_seconds, lines)
    ok = True
    try:
        source.start()
        time.sleep(2.0)
        table = ["| sample | GPU | reading | agent | nvidia-smi | ok |", "|---|---|---|---|---|---|"]
        snapshots_over_time = []
        smi_errors: list[str] = []
        compared = 0
        for sample in range(args.samples):
            smi_rows: list[list[str]] = []

            def query(rows: list[list[str]] = smi_rows) -> None:
                try:
                    rows.extend(nvidia_smi())
                except (OSError, subprocess.SubprocessError) as exc:
                    smi_errors.append(str(exc))

            smi_thread = threading.Thread(target=query)
            smi_thread.start()
            snapshots = source.collect()
            smi_thread.join(30)
            snapshots_over_time.append((time.monotonic(), snapshots))
            for snap in snapshots:
                if snap.info.index >= len(smi_rows):
                    continue
                row = smi_rows[snap.info.index]
                for label, agent_value, column, tolerance, kind in COMPARISONS:
                    agent = agent_value(snap)
                    smi = smi_number(row[column])
                    good = agent is not None and smi is not None and within(agent, smi, tolerance, kind)
                    ok = ok and good
                    compared += 1
                    table.append(f"| {sample} | {snap.info.index} | {label} | "
                                 f"{'n/a' if agent is None else f'{agent:.1f}'} | {row[column]} | "
                                 f"{'yes' if good else 'NO'} |")
            time.sleep(args.gap_seconds)
        if not compared:
            ok = False
            table.append(f"| - | - | nothing compared: nvidia-smi gave no rows ({'; '.join(smi_errors[:2])}) | | | NO |")
        lines += ["", "## Agent vs nvidia-smi (taken at the same moments)",
                  ("Tolerances: utilization ±15 points (different averaging windows), memory used ±3 %, power ±15 %, "
                   "temperature ±3 C, SM clock ±5 %, memory clock ±2 %, P-state exact."), ""] + table

        last = snapshots_over_time[-1][1]
        lines += ["", "## Other readings (last sample)", "",
                  ("| GPU | state | enc/dec util | mem BW util | PCIe TX/RX B/s | power limit W | energy rate W | "
                   "temp limits C | max SM/mem MHz | throttle mask | ECC corr/uncorr | PCIe replays |"),
                  "|---|---|---|---|---|---|---|---|---|---|---|---|"]
        first = snapshots_over_time[0][1]
        for snap in last:
            before = next(s for s in first if s.info.index == snap.info.index)
            dt = max(1e-9, snap.time_s - before.time_s)
            tx = rx = energy_w = None
            if snap.pcie_transmit_bytes is not None and before.pcie_transmit_bytes is not None:
                tx = (snap.pcie_transmit_bytes - before.pcie_transmit_bytes) / dt
                rx = (snap.pcie_receive_bytes - before.pcie_receive_bytes) / dt  # type: ignore[operator]
            if snap.energy_j is not None and before.energy_j is not None:
                energy_w = (snap.energy_j - before.energy_j) / dt
            lines.append(
                f"| {snap.info.index} | {snap.state} | {snap.encoder_utilization}/{snap.decoder_utilization} | "
                f"{snap.memory_bandwidth_utilization} | {tx and f'{tx:.3g}'}/{rx and f'{rx:.3g}'} | "
                f"{snap.power_limit_w} | {energy_w and f'{energy_w:.1f}'} | "
                f"{snap.temperature_slowdown_c}/{snap.temperature_shutdown_c} | "
                f"{snap.sm_clock_max_hz and snap.sm_clock_max_hz / 1e6}/"
                f"{snap.memory_clock_max_hz and snap.memory_clock_max_hz / 1e6} | "
                f"{snap.throttle_reasons if snap.throttle_reasons is None else hex(snap.throttle_reasons)} | "
                f"{snap.ecc_corrected_errors}/{snap.ecc_uncorrected_errors} | {snap.pcie_replay_errors} |")
        lines += ["", "Energy rate = energy counter delta / time; it should be close to the power readings.",
                  "", "## GPM (ratios 0..1)", "", "| GPU | SM activity | SM occupancy | tensor activity | DRAM activity |",
                  "|---|---|---|---|---|"]
        for snap in last:
            lines.append(f"| {snap.info.index} | {snap.sm_activity} | {snap.sm_occupancy} | {snap.tensor_activity} | "
                         f"{snap.dram_activity} |")

        lines += ["", "## Processes (last sample)", "", "| GPU | pid | executable | memory MiB | SM util | container |",
                  "|---|---|---|---|---|---|"]
        torch_seen = False
        for snap in last:
            for proc in snap.processes:
                memory_mib = None if proc.memory_bytes is None else proc.memory_bytes / MIB
                lines.append(f"| {snap.info.index} | {proc.pid} | {proc.executable_name} | "
                             f"{memory_mib and f'{memory_mib:.0f}'} | {proc.sm_utilization} | {proc.container_id} |")
                if load is not None and proc.pid == load.pid and (proc.memory_bytes or 0) > 4 * 1024 * MIB:
                    torch_seen = True
        lines.append("")
        lines.append(f"torch process {load.pid if load else '-'} seen with > 4 GiB: {'yes' if torch_seen else 'NO'}")
        ok = ok and torch_seen

        lines += ["", "## Turned off (not supported) per GPU", ""]
        for index, readings in source.disabled_readings().items():
            position = [g.index for g in source.gpus()].index(index)
            with source.exclusive_reader(position) as reader:
                pcie_mode = reader.pcie_counter_source
            lines.append(f"- GPU {index}: {', '.join(sorted(readings)) or 'nothing'}; PCIe bytes from {pcie_mode}")
        lines.append(f"- XID errors seen: {[(e.info.index, e.code, e.count) for e in source.xid_errors()] or 'none'}")

        lines += ["", "## Cost", ""]
        with source.exclusive_reader(0) as reader:
            rows = time_calls(nvml, reader.handle)
            cpu_ms, wall_ms = [], []
            for _ in range(10):
                wall0, cpu0 = time.perf_counter(), time.thread_time()
                reader.read()
                cpu_ms.append((time.thread_time() - cpu0) * 1000)
                wall_ms.append((time.perf_counter() - wall0) * 1000)
        lines += ["| NVML call (GPU 0) | median µs |", "|---|---|"] + [f"| {a} | {b} |" for a, b in rows]
        collect_ms = []
        for _ in range(5):
            wall0 = time.perf_counter()
            source.collect()
            collect_ms.append((time.perf_counter() - wall0) * 1000)
        lines += ["", (f"- one GPU cycle (reader.read()): CPU median {statistics.median(cpu_ms):.2f} ms, "
                       f"wall median {statistics.median(wall_ms):.1f} ms (10 cycles)"),
                  f"- source.collect() over all GPUs in parallel: wall median {statistics.median(collect_ms):.1f} ms"]

        lines += ["", "## OpenTelemetry instruments", ""] + instruments_section(source)
    finally:
        source.close()
        if load is not None and load.poll() is None:
            load.kill()
            load.wait()
    lines += ["", f"Result: {'PASS' if ok else 'FAIL (see rows marked NO)'}"]
    text = "\n".join(lines) + "\n"
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    Path(args.output).write_text(text)
    print(text)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
