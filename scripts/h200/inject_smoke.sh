#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Run THERE (a CUDA 13 GPU machine with torch), through scripts/h200/run.sh (step "inject"); builds nothing.
#   bash scripts/h200/inject_smoke.sh [OUT_DIR]
# 1. Runs a small torch program (matmul in matmul_block, relu in relu_block, .item() in read_loss, a CUDA graph replay)
#    with CUDA_INJECTION64_PATH=<the built libotel_gpu_inject.so> and OTEL_GPU_DEBUG_ALWAYS_ON=1 (the library acts as
#    if an agent were attached and writes every record it fires to a file), and prints what it recorded: windows and
#    the sampling fraction, kernel names with counts and GPU time, waits, Python frames, the library's own overhead.
# 2. Measures throughput side by side in one run, alternating modes, two rounds: a tiny-kernel launch-bound loop and a
#    large bf16 matmul loop, each (a) plain, (b) with the library injected but no agent (inert), (c) injected with the
#    debug mode on (windows, callbacks, stacks and activity processing all running; no uprobe traps, since no agent).
# Environment: OTEL_GPU_INJECT_LIB (default: otel_gpu/cuda/native/libotel_gpu_inject.so of this checkout),
# OTEL_GPU_CUPTI_PATH (default: the library finds CUPTI next to torch's libcudart or in the CUDA toolkit).
set -uo pipefail
top=$(cd "$(dirname "$0")/../.." && pwd)
out=${1:-${OUT:-/tmp/otel-gpu-out}}
mkdir -p "$out"
lib=${OTEL_GPU_INJECT_LIB:-$top/otel_gpu/cuda/native/libotel_gpu_inject.so}
if [ ! -f "$lib" ]; then
  echo "inject_smoke: $lib is missing (build it with make build, or set OTEL_GPU_INJECT_LIB)"; exit 1
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export INJECT_LIB="$lib" WORK="$work" REPORT="$out/h200-inject-smoke.md" PYTHONUNBUFFERED=1

cat > "$work/program.py" <<'PY'
# The program the library is injected into: known structure, prints how much work it did.
import sys
import time

import torch

def matmul_block(a, b):
    return a @ b

def relu_block(x):
    return torch.relu(x)

def read_loss(x):
    return x.sum().item()  # a device-to-host copy: the CPU waits for the GPU here

def main(seconds):
    a = torch.randn(2048, 2048, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(2048, 2048, device="cuda", dtype=torch.bfloat16)
    static_x = torch.randn(1024, device="cuda")
    graph = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            static_y = static_x * 2 + 1
    torch.cuda.current_stream().wait_stream(s)
    with torch.cuda.graph(graph):
        static_y = (static_x * 2 + 1).relu()
    torch.cuda.synchronize()
    steps = 0
    end = time.time() + seconds
    while time.time() < end:
        c = matmul_block(a, b)
        d = relu_block(c)
        graph.replay()
        if steps % 10 == 0:
            read_loss(d)
        steps += 1
    torch.cuda.synchronize()
    print(f"steps {steps} matmuls {steps} relus {steps} graph_replays {steps} item_calls {(steps + 9) // 10}")

main(float(sys.argv[1]))
PY

cat > "$work/throughput.py" <<'PY'
# One process, one mode: launches/s of a tiny-kernel loop and matmuls/s of a large matmul loop.
import sys
import time

import torch

def rate(step, seconds, warmup_s=1.0):
    end = time.time() + warmup_s
    while time.time() < end:
        step(100)
    torch.cuda.synchronize()
    count, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        step(100)
        count += 100
    torch.cuda.synchronize()
    return count / (time.perf_counter() - start)

x = torch.zeros(1, device="cuda")
a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
b = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)

def tiny(n):
    for _ in range(n):
        x.add_(1)

def matmul(n):
    for _ in range(n):
        torch.mm(a, b)

seconds = float(sys.argv[1])
print(f"tiny_kernels_per_s {rate(tiny, seconds):.1f}")
print(f"matmuls_per_s {rate(matmul, seconds):.1f}")
PY

cat > "$work/summarize.py" <<'PY'
# Reads the library's debug file (u32 type, u32 length, payload; structs of otel_gpu_probes.h) and prints a summary.
import ctypes
import os
import struct
import subprocess
import sys
from collections import Counter, defaultdict

class PyFrame(ctypes.Structure):
    _fields_ = [("line", ctypes.c_uint32), ("name_offset", ctypes.c_uint32), ("filename_offset", ctypes.c_uint32),
                ("first_line", ctypes.c_uint32)]

class Stack(ctypes.Structure):
    _fields_ = [("native_count", ctypes.c_uint32), ("python_count", ctypes.c_uint32),
                ("strings_len", ctypes.c_uint32), ("flags", ctypes.c_uint32), ("native", ctypes.c_uint64 * 96),
                ("python", PyFrame * 64), ("strings", ctypes.c_char * 6144)]

class Launch(ctypes.Structure):
    _fields_ = [("abi_version", ctypes.c_uint32), ("kind", ctypes.c_uint32), ("correlation_id", ctypes.c_uint32),
                ("cbid", ctypes.c_int32), ("window_id", ctypes.c_uint64), ("timestamp_ns", ctypes.c_uint64),
                ("graph_exec", ctypes.c_uint64), ("stack", Stack)]

class Activity(ctypes.Structure):
    _fields_ = [("kind", ctypes.c_uint32), ("correlation_id", ctypes.c_uint32), ("start_ns", ctypes.c_uint64),
                ("end_ns", ctypes.c_uint64), ("device_id", ctypes.c_uint32), ("stream_id", ctypes.c_uint32),
                ("graph_id", ctypes.c_uint32), ("name_len", ctypes.c_uint32), ("bytes", ctypes.c_uint64),
                ("copy_kind", ctypes.c_uint8), ("src_kind", ctypes.c_uint8), ("dst_kind", ctypes.c_uint8),
                ("reserved", ctypes.c_uint8 * 5), ("name", ctypes.c_char * 512)]

class Sync(ctypes.Structure):
    _fields_ = [("abi_version", ctypes.c_uint32), ("kind", ctypes.c_uint32), ("cbid", ctypes.c_int32),
                ("reserved", ctypes.c_uint32), ("start_ns", ctypes.c_uint64), ("end_ns", ctypes.c_uint64),
                ("weight", ctypes.c_uint64), ("stack", Stack)]

class Window(ctypes.Structure):
    _fields_ = [("abi_version", ctypes.c_uint32), ("reserved", ctypes.c_uint32), ("window_id", ctypes.c_uint64),
                ("start_ns", ctypes.c_uint64), ("end_ns", ctypes.c_uint64), ("covered_ns", ctypes.c_uint64),
                ("elapsed_ns", ctypes.c_uint64), ("launches", ctypes.c_uint64), ("dropped", ctypes.c_uint64),
                ("overhead_ns", ctypes.c_uint64)]

def padded(cls, payload):
    return cls.from_buffer_copy(payload + bytes(ctypes.sizeof(cls) - len(payload)))

def python_frames(stack):
    raw = ctypes.string_at(ctypes.addressof(stack) + Stack.strings.offset, stack.strings_len)
    text = lambda o: raw[o:raw.index(b"\0", o)].decode(errors="replace")
    return [f"{text(f.name_offset)} ({os.path.basename(text(f.filename_offset))}:{f.line})"
            for f in stack.python[:stack.python_count]]

def demangle(names):
    try:
        out = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True, timeout=20).stdout
        return out.splitlines() if len(out.splitlines()) == len(names) else names
    except OSError:
        return names

data = open(sys.argv[1], "rb").read()
launches, activities, syncs, windows = [], [], [], []
at = 0
while at + 8 <= len(data):
    kind, length = struct.unpack_from("<II", data, at)
    payload = data[at + 8:at + 8 + length]
    at += 8 + length
    if kind == 1:
        launches.append(padded(Launch, payload))
    elif kind == 2:
        size = ctypes.sizeof(Activity)
        activities += [Activity.from_buffer_copy(payload[i:i + size]) for i in range(0, length, size)]
    elif kind == 3:
        syncs.append(padded(Sync, payload))
    elif kind == 4:
        windows.append(Window.from_buffer_copy(payload))

print(f"records: {len(windows)} windows, {len(launches)} launches, {len(activities)} activity records, "
      f"{len(syncs)} waits")
if windows:
    last = windows[-1]
    lengths = [(w.end_ns - w.start_ns) / 1e6 for w in windows]
    f = last.covered_ns / last.elapsed_ns
    print(f"sampling fraction f = covered/elapsed = {last.covered_ns / 1e6:.1f} ms / {last.elapsed_ns / 1e6:.1f} ms "
          f"= {f:.4f}; window length {min(lengths):.1f}..{max(lengths):.1f} ms")
    in_window = sum(w.end_ns - w.start_ns for w in windows)
    own = sum(w.overhead_ns for w in windows)
    print(f"library's own time in windows: {own / 1e6:.2f} ms over {in_window / 1e6:.1f} ms of windows "
          f"({100 * own / max(in_window, 1):.2f} % in-window, about {100 * own * f / max(in_window, 1):.3f} % overall); "
          f"{sum(w.launches for w in windows)} launches, {sum(w.dropped for w in windows)} dropped; "
          f"{own / max(sum(w.launches for w in windows), 1) / 1e3:.1f} us per recorded launch")
kinds = Counter(l.kind for l in launches)
print("launch kinds:", dict((({1: "kernel", 2: "graph", 3: "memcpy", 4: "memset"}).get(k, k), n)
                             for k, n in kinds.items()), "cbids:", dict(Counter(l.cbid for l in launches)))
with_work = {a.correlation_id for a in activities}
print(f"sampled launches whose GPU work arrived: {sum(l.correlation_id in with_work for l in launches)} "
      f"of {len(launches)}")
per_name = defaultdict(lambda: [0, 0])
for a in activities:
    key = a.name.decode(errors="replace") if a.kind == 1 else {2: "[memcpy]", 3: "[memset]"}[a.kind]
    per_name[key][0] += 1
    per_name[key][1] += a.end_ns - a.start_ns
top = sorted(per_name.items(), key=lambda kv: -kv[1][1])[:12]
f = windows[-1].covered_ns / windows[-1].elapsed_ns if windows else 1.0
print("kernels (sampled count, sampled GPU ms, re-weighted GPU ms = sampled / f):")
for (name, (count, ns)), pretty in zip(top, demangle([n for n, _ in top])):
    print(f"  {count:6d} {ns / 1e6:9.2f} {ns / 1e6 / f:10.1f}  {pretty[:120]}")
graph_kernels = Counter(a.correlation_id for a in activities if a.graph_id)
print(f"graph launches with kernels: {len(graph_kernels)}, kernels per graph launch: "
      f"{sorted(set(graph_kernels.values()))}")
by_kind = defaultdict(lambda: [0, 0, set()])
for s in syncs:
    entry = by_kind[{1: "stream", 2: "context", 3: "event", 4: "memcpy"}.get(s.kind, s.kind)]
    entry[0] += 1
    entry[1] += (s.end_ns - s.start_ns) * s.weight
    entry[2].add(s.weight)
for kind, (count, ns, weights) in by_kind.items():
    print(f"waits {kind}: {count} recorded, {ns / 1e6:.1f} ms blocked (weighted), weights {sorted(weights)}")
with_py = [l for l in launches if l.stack.python_count]
print(f"launches with Python frames: {len(with_py)} of {len(launches)}; waits with Python frames: "
      f"{sum(1 for s in syncs if s.stack.python_count)} of {len(syncs)}; native frames per launch: "
      f"{sorted(Counter(l.stack.native_count for l in launches).items())[:8]}")
for rec in (with_py[:1] + [s for s in syncs if s.stack.python_count][:1]):
    print("  python stack:", " <- ".join(python_frames(rec.stack)[:8]))
PY

{
  echo "# inject smoke ($(date -u +%FT%TZ))"
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null
  python3 -c 'import torch, sys; print("torch", torch.__version__, "cuda", torch.version.cuda, "python", sys.version.split()[0])'
  echo
  echo "## 1. what the library records (debug mode, default budget and window)"
  CUDA_INJECTION64_PATH="$lib" OTEL_GPU_DEBUG_ALWAYS_ON=1 OTEL_GPU_DEBUG_FILE="$work/records.bin" \
    timeout 120 python3 "$work/program.py" 8 2>"$work/program.err"
  echo "program exit: $?"
  grep -h "otel-gpu" "$work/program.err" || echo "(no otel-gpu lines on stderr)"
  python3 "$work/summarize.py" "$work/records.bin"
  echo
  echo "## 2. throughput side by side (rounds alternate the modes; 3 s per loop)"
  for round in 1 2; do
    for mode in plain inert debug_on; do
      case $mode in
        plain)    env -u CUDA_INJECTION64_PATH timeout 90 python3 "$work/throughput.py" 3 >"$work/$mode.$round" 2>&1 ;;
        inert)    CUDA_INJECTION64_PATH="$lib" timeout 90 python3 "$work/throughput.py" 3 >"$work/$mode.$round" 2>&1 ;;
        debug_on) CUDA_INJECTION64_PATH="$lib" OTEL_GPU_DEBUG_ALWAYS_ON=1 \
                    timeout 90 python3 "$work/throughput.py" 3 >"$work/$mode.$round" 2>&1 ;;
      esac
    done
  done
  python3 - "$work" <<'PY'
import sys
from pathlib import Path
work = Path(sys.argv[1])
def read(mode, rnd):
    values = {}
    for line in (work / f"{mode}.{rnd}").read_text().splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0].endswith("_per_s"):
            values[parts[0]] = float(parts[1])
        elif "otel-gpu" in line or "Error" in line:
            print(f"  [{mode} round {rnd}] {line}")
    return values
print("| mode | round | tiny kernels/s | vs plain | matmuls/s | vs plain |")
print("|---|---|---|---|---|---|")
for rnd in (1, 2):
    plain = read("plain", rnd)
    for mode in ("plain", "inert", "debug_on"):
        v = read(mode, rnd)
        t, m = v.get("tiny_kernels_per_s", 0), v.get("matmuls_per_s", 0)
        rt = f"{100 * (t / plain['tiny_kernels_per_s'] - 1):+.1f} %" if plain.get("tiny_kernels_per_s") else "-"
        rm = f"{100 * (m / plain['matmuls_per_s'] - 1):+.1f} %" if plain.get("matmuls_per_s") else "-"
        print(f"| {mode} | {rnd} | {t:.0f} | {rt} | {m:.1f} | {rm} |")
print("inert = injected, no agent attached; debug_on = OTEL_GPU_DEBUG_ALWAYS_ON=1 (windows, callbacks, stacks and")
print("activity processing run as with an agent, but no uprobe fires: the agent's probe cost is not included)")
PY
} 2>&1 | tee "$REPORT"
