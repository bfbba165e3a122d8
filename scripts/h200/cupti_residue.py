#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Which CUPTI switch leaves launches slower after it is switched off again, and what takes the cost away.

Run THERE (the H200 machine; `bash scripts/h200/run.sh residue`). The library cannot finalize CUPTI in a process that
uses CUDA graphs (a graph instrumented under one CUPTI and replayed under the next faults), so what a window leaves
behind in such a process is paid by every launch until the process ends. Each variant runs in a fresh PyTorch
process, pinned to one CPU, and repeats CYCLES times:

  subscribe -> register buffers -> switch X on -> 0.2 s of launches -> switch X off -> flush
  -> measure: tiny-kernel launches/s (the residue)
  -> cleanup (unsubscribe, or finalize) -> measure again (the clean rate) -> ...

and reports the median of the paired ratios residue / clean (the two measurements are 0.3 s apart, so the machine's
drift cancels). Variants: X = nothing (subscribed only), each activity kind alone, the driver-API callbacks, the
library's set without and with the driver-API kind (library: CONCURRENT_KERNEL + MEMCPY + MEMSET; agent: + DRIVER,
the library's default), and agent_idle: the same switched on for 0.2 s while the process makes no CUDA call (does a
window in a server's idle time leave anything that the finalize after it must undo?); cleanup by finalize (what the
library does without graphs) or by unsubscribe only (what it could do with graphs).

Usage: cupti_residue.py REPORT.md   (env: RESIDUE_CYCLES=5, RESIDUE_VARIANTS=comma list)
"""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

CHILD = r'''
import ctypes, json, statistics, sys, time
import torch
variant, cleanup, cycles = sys.argv[1], sys.argv[2], int(sys.argv[3])
x = torch.zeros(1, device="cuda")
def rate(seconds):
    torch.cuda.synchronize()
    n, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        for _ in range(100):
            x.add_(1)
        n += 100
    torch.cuda.synchronize()
    return n / (time.perf_counter() - start)
for _ in range(3):
    rate(0.2)
cupti = ctypes.CDLL("libcupti.so.13")  # already loaded by libtorch_cuda (NEEDED)
CB = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32, ctypes.c_void_p)
REQ = ctypes.CFUNCTYPE(None, ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_size_t),
                       ctypes.POINTER(ctypes.c_size_t))
DONE = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_uint32, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t)
keep = {}
@CB
def on_api(userdata, domain, cbid, data):
    pass
@REQ
def requested(buf, size, max_records):
    raw = ctypes.create_string_buffer((1 << 20) + 8)
    addr = (ctypes.addressof(raw) + 7) & ~7
    keep[addr] = raw
    buf[0], size[0], max_records[0] = addr, 1 << 20, 0
@DONE
def completed(ctx, stream, buf, size, valid):
    keep.pop(buf, None)
KINDS = {"memcpy": [1], "memset": [2], "kernel": [3], "driver": [4], "runtime": [5], "concurrent_kernel": [10],
         "synchronization": [38], "library": [10, 1, 2], "agent": [10, 1, 2, 4], "nothing": []}
def check(rc, what):
    if rc != 0:
        print(json.dumps({"error": f"{what} returned {rc}"}), flush=True)
        sys.exit(1)
pairs, costs = [], []
for _ in range(cycles):
    sub = ctypes.c_void_p()
    t0 = time.perf_counter()
    check(cupti.cuptiSubscribe(ctypes.byref(sub), on_api, None), "cuptiSubscribe")
    check(cupti.cuptiActivityRegisterCallbacks(requested, completed), "cuptiActivityRegisterCallbacks")
    if variant == "callbacks":
        check(cupti.cuptiEnableDomain(1, sub, 1), "cuptiEnableDomain on")
        rate(0.2)
        check(cupti.cuptiEnableDomain(0, sub, 1), "cuptiEnableDomain off")
    else:
        kinds = KINDS[variant.removesuffix("_idle")]
        for kind in kinds:
            check(cupti.cuptiActivityEnable(kind), f"cuptiActivityEnable({kind})")
        if variant.endswith("_idle"):  # on while the process makes no CUDA call: a window in a server's idle time
            time.sleep(0.2)
        else:
            rate(0.2)
        for kind in kinds:
            check(cupti.cuptiActivityDisable(kind), f"cuptiActivityDisable({kind})")
    check(cupti.cuptiActivityFlushAll(1), "cuptiActivityFlushAll")
    if cleanup == "unsubscribe_first":
        check(cupti.cuptiUnsubscribe(sub), "cuptiUnsubscribe")
    residue = rate(0.3)
    t1 = time.perf_counter()
    if cleanup != "unsubscribe_first":
        check(cupti.cuptiUnsubscribe(sub), "cuptiUnsubscribe")
    check(cupti.cuptiFinalize(), "cuptiFinalize")
    costs.append(time.perf_counter() - t1)
    clean = rate(0.3)
    pairs.append(residue / clean)
print(json.dumps({"ratios": pairs, "finalize_s": statistics.median(costs)}), flush=True)
'''
VARIANTS = ("nothing", "callbacks", "concurrent_kernel", "kernel", "memcpy", "memset", "driver", "runtime",
            "synchronization", "library", "agent", "agent_idle")


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__)
        return 2
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from verify_gpu_time import pinned_to, write_report

    out, cycles = Path(argv[1]), int(os.environ.get("RESIDUE_CYCLES", "5"))
    variants = os.environ.get("RESIDUE_VARIANTS", ",".join(VARIANTS)).split(",")
    cpu = {sorted(os.sched_getaffinity(0))[2]}
    env = {k: v for k, v in os.environ.items() if k != "CUDA_INJECTION64_PATH"}
    lines = ["## What a CUPTI switch leaves behind once it is off again (scripts/h200/cupti_residue.py)", "",
             f"Tiny-kernel launches/s after the switch was on for 0.2 s and off again, over the rate after "
             f"cuptiFinalize, paired 0.3 s apart, {cycles} cycles per fresh process, pinned to CPU {min(cpu)}. "
             "Cleanup `finalize`: unsubscribe + finalize after the residue was measured (subscribed while measured); "
             "`unsubscribe_first`: unsubscribed before the residue was measured (no finalize in between).", "",
             "| switched on and off | cleanup | launch rate while left behind / after finalize (median, min-max) |",
             "|---|---|---|"]
    for variant in variants:
        for cleanup in ("finalize", "unsubscribe_first"):
            if cleanup == "unsubscribe_first" and variant not in ("nothing", "concurrent_kernel", "library"):
                continue
            p = subprocess.run([sys.executable, "-c", CHILD, variant, cleanup, str(cycles)], env=env,
                               capture_output=True, text=True, timeout=120, preexec_fn=pinned_to(cpu))
            try:
                result = json.loads(p.stdout.strip().splitlines()[-1])
            except (IndexError, json.JSONDecodeError):
                result = {"error": f"exit {p.returncode}: {p.stderr.strip()[-300:]}"}
            if "error" in result:
                lines.append(f"| {variant} | {cleanup} | {result['error']} |")
                continue
            r = result["ratios"]
            lines.append(f"| {variant} | {cleanup} | {statistics.median(r):.3f} ({min(r):.3f}-{max(r):.3f}) |")
            print(lines[-1], flush=True)
    write_report(out, lines)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
