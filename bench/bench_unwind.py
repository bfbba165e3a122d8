# SPDX-License-Identifier: Apache-2.0
"""Cost of native unwinding from .eh_frame tables (otel_gpu/unwind, programs/native_unwind.h), side by side with
today's frame-pointer path, on this machine (root, BTF, perf events).

Reports:
  1. table build per file: parse + merge time, FDEs, rows, table bytes (libc, libstdc++, a large Python extension
     and any --elf given), and the rows each holds in the BPF array (16 bytes a row);
  2. per sample, one workload sampled alone (pid filter) at --hz, first with frame pointers (bpf_get_stackid into
     the in-kernel counts), then with the table walker (the sample sent whole through the ring buffer): the BPF
     program's run time per run (kernel.bpf_stats_enabled, run_time_ns / run_cnt from bpftool), bytes handed to
     user space per sample, and the agent's CPU time per sample (drain and ring-buffer handling, no symbolizing);
     for the workload with frame pointers (cpu_3to1) and without (cpu_3to1_nofp).

Run (as root, after make build): .venv/bin/python bench/bench_unwind.py [--seconds 5] [--hz 999] [--elf PATH ...]
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from otel_gpu.cpu.sampler import CPUSampler  # noqa: E402
from otel_gpu.ebpf import abi  # noqa: E402
from otel_gpu.unwind import cfi  # noqa: E402
from otel_gpu.unwind.table import build_table, frame_sections  # noqa: E402

NATIVE = REPO / "tests" / "native"
DEFAULT_FILES = ["/lib/x86_64-linux-gnu/libc.so.6", "/usr/lib/x86_64-linux-gnu/libstdc++.so.6",
                 str(next((REPO / ".venv").glob("lib/python3*/site-packages/grpc/_cython/cygrpc*.so"), ""))]
STATS_SYSCTL = Path("/proc/sys/kernel/bpf_stats_enabled")


def table_costs(paths: list[str]) -> None:
    print(f"{'file':<48} {'.eh_frame':>10} {'FDEs':>7} {'rows':>8} {'table':>9} {'parse s':>8} {'total s':>8}")
    for path in paths:
        if not path or not Path(path).exists():
            continue
        found = frame_sections(path)
        size = len(found[2]) if found else 0
        start = time.perf_counter()
        fdes = list(cfi.parse_frames(found[2], found[1], found[0] == ".eh_frame")) if found else []
        parsed = time.perf_counter() - start
        start = time.perf_counter()
        table = build_table(path)
        total = time.perf_counter() - start
        print(f"{Path(path).name[:48]:<48} {size:>10} {len(fdes):>7} {len(table.pcs):>8} {table.size_bytes:>9} "
              f"{parsed:>8.3f} {total:>8.3f}")


def _prog_stats(prog_id: int) -> tuple[int, int]:
    out = json.loads(subprocess.run(["bpftool", "prog", "show", "id", str(prog_id), "--json"], check=True,
                                    capture_output=True, text=True).stdout)
    return int(out.get("run_time_ns", 0)), int(out.get("run_cnt", 0))


def per_sample(binary: Path, native_unwind: bool, seconds: float, hz: int) -> dict[str, float]:
    workload = subprocess.Popen([str(binary), str(seconds + 3)], stdout=subprocess.PIPE, text=True)
    assert workload.stdout is not None
    pid = int(workload.stdout.readline().split()[1])
    sampler = CPUSampler(hz, pids=[pid], native_unwind=native_unwind)
    sampler.open()
    try:
        time.sleep(0.5)
        sampler.settle_unwinder(30)
        sampler.drain()
        assert sampler._bpf is not None
        prog_id = sampler._bpf.program_ids()["on_cpu_sample"]
        run_ns0, runs0 = _prog_stats(prog_id)
        cpu0 = time.thread_time(), os.times()
        samples = 0
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            time.sleep(0.25)
            samples += sum(s.count for s in sampler.drain())
        run_ns1, runs1 = _prog_stats(prog_id)
        cpu1 = os.times()
        stats = sampler.stats()
    finally:
        sampler.close()
        workload.kill()
        workload.wait()
    agent_s = (cpu1.user + cpu1.system) - (cpu0[1].user + cpu0[1].system)
    runs = max(1, runs1 - runs0)
    raw_bytes = ctypes.sizeof(abi.RawSample)
    return {"samples": samples, "bpf_ns_per_run": (run_ns1 - run_ns0) / runs,
            "bytes_per_sample": raw_bytes if native_unwind else 0.0,
            "agent_us_per_sample": agent_s * 1e6 / max(1, samples),
            "unwound": stats.get("unwind_samples", 0), "fp_frames": stats.get("unwind_fp_frames", 0),
            "stops": sum(stats.get(k, 0) for k in ("unwind_no_mapping", "unwind_unsupported", "unwind_read_failed",
                                                   "unwind_truncated"))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--hz", type=int, default=999)
    parser.add_argument("--elf", action="append", default=[])
    args = parser.parse_args()
    print("1. unwind tables per file")
    table_costs(DEFAULT_FILES + args.elf)
    if os.geteuid() != 0:
        print("2. skipped: needs root")
        return
    previous = STATS_SYSCTL.read_text().strip()
    STATS_SYSCTL.write_text("1")
    try:
        print(f"\n2. per sample at {args.hz} Hz, {args.seconds:.0f} s each, the workload alone (pid filter)")
        print(f"{'workload':<16} {'path':<14} {'samples':>8} {'BPF ns/run':>11} {'bytes/sample':>13} "
              f"{'agent us/sample':>16} {'unwound':>8} {'fp frames':>10} {'stops':>6}")
        results = {}
        for binary in (NATIVE / "workloads" / "cpu_3to1", NATIVE / "unwind" / "cpu_3to1_nofp"):
            for native in (False, True):
                row = per_sample(binary, native, args.seconds, args.hz)
                results[(binary.name, native)] = row
                print(f"{binary.name:<16} {'eh_frame walk' if native else 'frame pointer':<14} {row['samples']:>8} "
                      f"{row['bpf_ns_per_run']:>11.0f} {row['bytes_per_sample']:>13.0f} "
                      f"{row['agent_us_per_sample']:>16.1f} {row['unwound']:>8} {row['fp_frames']:>10} "
                      f"{row['stops']:>6}")
        for name in ("cpu_3to1", "cpu_3to1_nofp"):
            fp, walk = results[(name, False)], results[(name, True)]
            print(f"{name}: BPF time ratio walk/fp {walk['bpf_ns_per_run'] / max(1.0, fp['bpf_ns_per_run']):.2f}, "
                  f"extra {walk['bpf_ns_per_run'] - fp['bpf_ns_per_run']:.0f} ns/sample; agent ratio "
                  f"{walk['agent_us_per_sample'] / max(0.001, fp['agent_us_per_sample']):.2f}")
    finally:
        STATS_SYSCTL.write_text(previous)


if __name__ == "__main__":
    main()
