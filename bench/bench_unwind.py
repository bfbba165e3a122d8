# SPDX-License-Identifier: Apache-2.0
"""Cost of native unwinding from .eh_frame tables (otel_gpu/unwind, programs/native_unwind.h), side by side with
today's frame-pointer path, on this machine (root, BTF, perf events).

Reports:
  1. table build per file: parse + merge time, FDEs, rows, table bytes (libc, libstdc++, a large Python extension
     and any --elf given), and the rows each holds in the BPF array (8 bytes a row);
  2. per sample, one workload sampled alone (pid filter) at --hz, first with frame pointers (bpf_get_stackid into
     the in-kernel counts), then with the table walker (the walked stack counted in the kernel too): the BPF
     program's run time per run (kernel.bpf_stats_enabled, run_time_ns / run_cnt from bpftool), bytes handed to
     user space per sample, and the agent's CPU time per sample (drain and ring-buffer handling, no symbolizing);
     for the workload with frame pointers (cpu_3to1) and without (cpu_3to1_nofp);
  3. the design not taken: copy the registers and a --window-byte window of the user stack per sample
     (bench/unwind_stack_copy.bpf.c, compiled here) and unwind it in the agent with the same tables (Python):
     BPF run time per run, bytes per sample, agent CPU per sample, mean depth reached;
  4. drain + unwind-resolve + symbolize + encode throughput of walked samples (the issue's target: >= 50,000/s);
  5. the unwinder thread's own CPU time (in process, so other load does not hide it) and the tables it keeps, for
     a Python process that maps libLLVM-15 and -14 (~225 MB of C++ without frame pointers) and runs libLLVM code:
     tables built for every mapped file when the process is registered, at a 1 MiB and at the default 8 MiB cap,
     against tables built only for the files samples hit (the default);
  6. (not in the default parts) a table's build CPU time and the peak RSS it adds, each file in a fresh process,
     the Python reference interpreter (cfi.py) against the native builder the agent uses, side by side;
  7. (not in the default parts) whether 8-byte rows' 32-bit rules hold every rule: over this machine's shared
     libraries and the large C++ and Rust ones (the set tests/unwind/test_native_table.py compares), the rows whose
     CFA or rbp offset is outside the packed fields (UNSUPPORTED for that reason alone), the widest offsets, the
     widest code span of a table, and rows per KiB of .eh_frame (to size unwind_rows for a library not here).

Run (as root, after make build): .venv/bin/python bench/bench_unwind.py [--seconds 5] [--hz 999] [--elf PATH ...]
                                 [--parts 12345] [--library PATH ...]
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import struct
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from otel_gpu.cpu.sampler import CPUSampler  # noqa: E402
from otel_gpu.ebpf import abi  # noqa: E402
from otel_gpu.unwind import cfi  # noqa: E402
from otel_gpu.ebpf.loader import BPFObject  # noqa: E402
from otel_gpu.unwind.processes import executable_mappings  # noqa: E402
from otel_gpu.unwind.table import (CFA_OFFSETS, KIND_NONE, KIND_RBP, KIND_RSP, RBP_OFFSETS,  # noqa: E402
                                   TableCache, UnwindTable, build_table, frame_sections)

NATIVE = REPO / "tests" / "native"
DEFAULT_FILES = ["/lib/x86_64-linux-gnu/libc.so.6", "/usr/lib/x86_64-linux-gnu/libstdc++.so.6",
                 str(next((REPO / ".venv").glob("lib/python3*/site-packages/grpc/_cython/cygrpc*.so"), ""))]
STATS_SYSCTL = Path("/proc/sys/kernel/bpf_stats_enabled")


def table_costs(paths: list[str]) -> None:
    """Per file: the reference interpreter's parse + merge (cfi.py) and the native build the agent does."""
    print(f"{'file':<48} {'.eh_frame':>10} {'FDEs':>7} {'rows':>8} {'table':>9} {'Python s':>9} {'native s':>9}")
    for path in paths:
        if not path or not Path(path).exists():
            continue
        found = frame_sections(path)
        size = len(found[2]) if found else 0
        start = time.perf_counter()
        fdes = list(cfi.parse_frames(found[2], found[1], found[0] == ".eh_frame")) if found else []
        cfi.table_from_fdes(fdes, "")
        reference = time.perf_counter() - start
        start = time.perf_counter()
        table = build_table(path)
        native = time.perf_counter() - start
        print(f"{Path(path).name[:48]:<48} {size:>10} {len(fdes):>7} {len(table.pcs):>8} {table.size_bytes:>9} "
              f"{reference:>9.3f} {native:>9.4f}")


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
        for _ in range(3):  # tables come for the files samples hit; a walk reaches the next file once it has one
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
            "bpf_ns_per_sample": (run_ns1 - run_ns0) / max(1, samples),
            "bytes_per_sample": raw_bytes * stats.get("raw_sent", 0) / max(1, samples),
            "agent_us_per_sample": agent_s * 1e6 / max(1, samples),
            "unwound": stats.get("unwind_samples", 0), "fp_frames": stats.get("unwind_fp_frames", 0),
            "stops": sum(stats.get(k, 0) for k in ("unwind_no_mapping", "unwind_unsupported", "unwind_read_failed",
                                                   "unwind_truncated", "unwind_bad_fp"))}


def drain_rate(seconds: float, hz: int, native_unwind: bool = True) -> dict[str, float]:
    """Drain + unwind-resolve + symbolize + encode, in samples per second: the real source at ``hz`` on two workloads
    without frame pointers (a first round warms the tables, ELF and kernel symbol caches), then one drain and the
    pprof and OTLP encodings of its batch, timed."""
    from otel_gpu.config import ProfilingConfig
    from otel_gpu.cpu.source import CPUProfileSource
    from otel_gpu.procfs import ProcessResolver
    from otel_gpu.profiles.otlp import encode_otlp
    from otel_gpu.profiles.pprof import encode_pprof

    config = ProfilingConfig(frequency_hz=hz, process_name="^(cpu_3to1_nofp|clock_loop)$")
    sampler = CPUSampler(hz, native_unwind=native_unwind)
    source = CPUProfileSource(config, ProcessResolver(), sampler=sampler)
    source.open()
    try:
        time.sleep(0.3)
        sampler.settle_unwinder(60)
        for round_s in (1.0, seconds):
            workloads = [subprocess.Popen([str(NATIVE / "unwind" / name), str(round_s + 1)], stdout=subprocess.PIPE,
                                          text=True) for name in ("cpu_3to1_nofp", "clock_loop")]
            for workload in workloads:
                assert workload.stdout is not None
                workload.stdout.readline()
            time.sleep(0.5)
            sampler.settle_unwinder(60)  # registered: what follows is walked
            source.drain()
            for workload in workloads:
                workload.wait()
            # tables are built in this process (pure Python, holding the GIL): a drain beside a build waits for it
            building_s = time.perf_counter()
            sampler.settle_unwinder(60)
            building_s = time.perf_counter() - building_s
            started = time.perf_counter()
            (batch,) = source.drain()
            drained = time.perf_counter()
            pprof_bytes = len(encode_pprof(batch))
            otlp_bytes = len(encode_otlp(batch).SerializeToString())
            encoded = time.perf_counter()
        stats = sampler.stats()
    finally:
        source.close()
    samples = sum(s.value for p in batch.processes for s in p.samples)
    return {"samples": samples, "distinct": batch.sample_count, "drain_ms": 1000 * (drained - started),
            "encode_ms": 1000 * (encoded - drained), "samples_per_s": samples / (encoded - started),
            "unwound": stats.get("unwind_samples", 0), "raw_sent": stats.get("raw_sent", 0),
            "pprof_bytes": pprof_bytes, "otlp_bytes": otlp_bytes, "building_s": building_s}


def _unwind_window(ip: int, sp: int, bp: int, stack: bytes,
                   mappings: list[tuple[int, int, int, UnwindTable]]) -> list[int]:
    """Design (b)'s agent side: the same rules as native_unwind.h, over a copied window of the stack."""
    frames: list[int] = []
    pc, top = ip, sp
    for depth in range(abi.MAX_STACK_DEPTH):
        frames.append(pc)
        look = pc if depth == 0 else pc - 1
        found = next((m for m in mappings if m[0] <= look < m[1]), None)
        if found is None:
            break
        kind, cfa_offset, rbp_offset = found[3].lookup(look - found[2])
        if kind == KIND_RSP or kind == KIND_RBP:
            cfa = (sp if kind == KIND_RSP else bp) + cfa_offset
        elif kind == KIND_NONE and bp:
            cfa, rbp_offset = bp + 16, -16
        else:
            break
        at = cfa - 8 - top
        if not 0 <= at <= len(stack) - 8:
            break
        pc = int.from_bytes(stack[at:at + 8], "little")
        if rbp_offset:
            at = cfa + rbp_offset - top
            if not 0 <= at <= len(stack) - 8:
                break
            bp = int.from_bytes(stack[at:at + 8], "little")
        sp = cfa
        if pc == 0:
            break
    return frames


def stack_copy(binary: Path, seconds: float, hz: int, window: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as folder:
        obj = Path(folder) / "unwind_stack_copy.bpf.o"
        programs = REPO / "otel_gpu" / "ebpf" / "programs"
        subprocess.run(["clang", "-O2", "-g", "-target", "bpf", "-D__TARGET_ARCH_x86", f"-DSTACK_WINDOW={window}",
                        f"-I{programs}", "-I/usr/include/x86_64-linux-gnu", "-c",
                        str(REPO / "bench" / "unwind_stack_copy.bpf.c"), "-o", str(obj)], check=True)
        workload = subprocess.Popen([str(binary), str(seconds + 3)], stdout=subprocess.PIPE, text=True)
        assert workload.stdout is not None
        pid = int(workload.stdout.readline().split()[1])
        cache = TableCache(max_frame_bytes=1 << 30)  # every file: this design unwinds in the agent, tables for all
        mappings = [(m.start, m.end, cache.get(m.path).bias(m.start, m.offset) or 0, cache.get(m.path))
                    for m in executable_mappings(pid) if m.path.startswith("/")]
        depths: list[int] = []
        header = struct.Struct("<QQQII")

        def handle(data: bytes) -> None:
            ip, sp, bp, _pid, size = header.unpack_from(data)
            depths.append(len(_unwind_window(ip, sp, bp, data[header.size:header.size + size], mappings)))

        try:
            with BPFObject(obj, rodata={"target_tgid": pid}) as bpf:
                ring = bpf.ring_buffer("windows", handle)
                bpf.attach_perf_event("copy_stack", hz)
                time.sleep(0.3)
                ring.consume()
                depths.clear()
                prog_id = bpf.program_ids()["copy_stack"]
                run_ns0, runs0 = _prog_stats(prog_id)
                cpu0 = os.times()
                end = time.monotonic() + seconds
                while time.monotonic() < end:
                    ring.poll(100)
                run_ns1, runs1 = _prog_stats(prog_id)
                cpu1 = os.times()
                ring.consume()
        finally:
            workload.kill()
            workload.wait()
    samples = max(1, len(depths))
    return {"samples": len(depths), "bpf_ns_per_run": (run_ns1 - run_ns0) / max(1, runs1 - runs0),
            "bpf_ns_per_sample": (run_ns1 - run_ns0) / samples,
            "bytes_per_sample": header.size + window,
            "agent_us_per_sample": ((cpu1.user + cpu1.system) - (cpu0.user + cpu0.system)) * 1e6 / samples,
            "mean_depth": sum(depths) / samples}


BUILD_ONE = """
import resource, sys, time
sys.path.insert(0, sys.argv[1])
from otel_gpu.unwind import cfi
from otel_gpu.unwind.table import build_table, frame_section_size, frame_sections
size = frame_section_size(sys.argv[2])
section, vaddr, data = frame_sections(sys.argv[2])
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
start = time.thread_time()
if sys.argv[3] == "native":
    table = build_table(sys.argv[2], max_frame_bytes=1 << 40)
elif sys.argv[3] == "agent":  # what NativeUnwinder does: parse, write the rows into the (mmap-ed) rows array
    import ctypes, mmap
    from otel_gpu.ebpf.abi import UnwindRow
    from otel_gpu.unwind.table import parse_table
    table, rows = parse_table(sys.argv[2], max_frame_bytes=1 << 40)
    memory = mmap.mmap(-1, max(ctypes.sizeof(UnwindRow) * rows.count, 1))
    target = (ctypes.c_char * (ctypes.sizeof(UnwindRow) * rows.count)).from_buffer(memory)
    rows.write_rows(ctypes.addressof(target))
    table = type("Rows", (), {"pcs": range(rows.count)})
    rows.close()
else:
    table = cfi.table_from_fdes(cfi.parse_frames(data, vaddr, section == ".eh_frame"), section)
cpu = time.thread_time() - start
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(cpu, (after - before) / 1024, len(table.pcs), size)
"""


def _build_once(path: str, builder: str) -> tuple[float, float, int, int]:
    out = subprocess.run([sys.executable, "-c", BUILD_ONE, str(REPO), path, builder], check=True,
                         capture_output=True, text=True).stdout.split()
    return float(out[0]), float(out[1]), int(out[2]), int(out[3])


def build_costs(paths: list[str], repeats: int = 3) -> None:
    """Each file's table built by the reference interpreter (Python, cfi.py) and by the native builder (build_table:
    two arrays; "agent": parse_table and the rows written straight into an mmap-ed array, as NativeUnwinder writes
    unwind_rows), each build in a fresh interpreter, alternating, ``repeats`` times: the median CPU time and the peak
    RSS the build adds (the section's bytes, read before, not counted; the destination rows counted)."""
    print(f"{'file':<40} {'frame MiB':>9} {'rows':>9} {'Python CPU-s':>12} {'native CPU-s':>12} {'ratio':>6} "
          f"{'Python +MiB':>11} {'native +MiB':>11} {'agent +MiB':>10}")
    for path in paths:
        if not path or not Path(path).exists():
            continue
        runs: dict[str, list[tuple[float, float, int, int]]] = {"python": [], "native": [], "agent": []}
        for _ in range(repeats):
            for builder, found in runs.items():
                found.append(_build_once(path, builder))
        python = sorted(runs["python"])[repeats // 2]
        native = sorted(runs["native"])[repeats // 2]
        agent = sorted(runs["agent"], key=lambda run: run[1])[repeats // 2]
        assert python[2] == native[2] == agent[2], (path, python, native, agent)
        print(f"{Path(path).name[:40]:<40} {python[3] / 2**20:>9.2f} {python[2]:>9} {python[0]:>12.3f} "
              f"{native[0]:>12.4f} {python[0] / max(native[0], 1e-6):>6.0f} {python[1]:>11.0f} {native[1]:>11.0f} "
              f"{agent[1]:>10.0f}")


BUILD_FILES = ["/usr/lib/x86_64-linux-gnu/libLLVM-15.so.1", "/usr/lib/llvm-14/lib/libclang-cpp.so.14",
               str(next(Path("/root/.rustup/toolchains").glob("stable-*/lib/librustc_driver-*.so"), "")),
               "/usr/lib/x86_64-linux-gnu/libstdc++.so.6", "/lib/x86_64-linux-gnu/libc.so.6"]


LLVM_WORKLOAD = """
import ctypes, os, sys, time
libs = [ctypes.CDLL(path) for path in sys.argv[2:]]
llvm = libs[0]
llvm.LLVMContextCreate.restype = ctypes.c_void_p
llvm.LLVMContextDispose.argtypes = [ctypes.c_void_p]
print("ready", os.getpid(), flush=True)
end = time.monotonic() + float(sys.argv[1])
while time.monotonic() < end:
    for _ in range(200):
        llvm.LLVMContextDispose(llvm.LLVMContextCreate())
    sum(i * i for i in range(2000))
"""


def _thread_cpu_s(name: str) -> float:
    """CPU seconds of this process's thread called ``name`` (0 if it has not started)."""
    for thread in threading.enumerate():
        if thread.name == name and thread.ident is not None:
            return time.clock_gettime(time.pthread_getcpuclockid(thread.ident))
    return 0.0


def unwinder_cost(seconds: float, hz: int, eager_frame_bytes: int, max_frame_bytes: int,
                  libraries: list[str]) -> dict[str, float]:
    """One Python process that maps large C++ libraries (``libraries``) and spends its time in the first one's code
    (LLVMContextCreate/Dispose: libLLVM has no frame pointers) and in the interpreter, sampled alone for
    ``seconds``: the unwinder thread's CPU time, its tables, the agent's RSS, and over the second half the samples,
    the share with 8 frames or more and how the walks ended."""
    workload = subprocess.Popen(["/usr/bin/python3", "-c", LLVM_WORKLOAD, str(seconds + 30), *libraries],
                                stdout=subprocess.PIPE, text=True)
    assert workload.stdout is not None
    pid = int(workload.stdout.readline().split()[1])
    sampler = CPUSampler(hz, pids=[pid], unwind_eager_frame_bytes=eager_frame_bytes,
                         unwind_max_frame_bytes=max_frame_bytes)
    sampler.open()
    try:
        start = time.monotonic()
        samples, deep = 0, 0
        before: dict[str, int] = {}
        while time.monotonic() < start + seconds:
            time.sleep(0.5)
            counts = sampler.drain()
            if not before and time.monotonic() >= start + seconds / 2:
                before = sampler.stats()  # how walks end: over the second half, once hit files have tables
            elif before:
                samples += sum(count.count for count in counts)
                deep += sum(count.count for count in counts if len(count.user_stack) >= 8)
        unwinder_s = _thread_cpu_s("otel-gpu-unwind")
        stats = sampler.stats()
        stops = {key: stats[key] - before.get(key, 0) for key in stats if key.startswith("unwind_")}
        rss_kib = next(int(line.split()[1]) for line in Path("/proc/self/status").read_text().splitlines()
                       if line.startswith("VmRSS:"))
    finally:
        sampler.close()
        workload.kill()
        workload.wait()
    walked = max(1, stops["unwind_samples"])
    return {"samples": samples, "unwinder_s": unwinder_s, "files_known": stats["unwind_files_known"],
            "files": stats["unwind_files"], "rows": stats["unwind_rows"], "rss_mib": rss_kib / 1024,
            "deep": deep / max(1, samples),
            **{reason: stops[f"unwind_{reason}"] / walked
               for reason in ("no_mapping", "read_failed", "bad_fp", "unsupported", "truncated")}}


RULE_FIT_LARGE = ["/usr/lib/x86_64-linux-gnu/libLLVM-15.so.1", "/usr/lib/llvm-14/lib/libclang-cpp.so.14",
                  *map(str, sorted(Path("/root/.rustup/toolchains").glob("*/lib/librustc_driver-*.so")))]


def rule_fit() -> None:
    """Every CFI row the reference interpreter reads that would be a plain RSP or RBP rule but for its offsets'
    width, counted against the packed rule's fields (table.CFA_OFFSETS, table.RBP_OFFSETS); then per large file its
    rows per KiB of .eh_frame and the span of its table's pcs (unwind_rows holds 32-bit offsets)."""
    seen: set[tuple[int, int]] = set()
    files, rows, plain, too_wide, widest_cfa, lowest_rbp, widest_span = 0, 0, 0, 0, 0, 0, 0
    per_file: list[tuple[int, int, str]] = []
    for path in [*sorted(Path("/usr/lib/x86_64-linux-gnu").glob("*.so*")), *map(Path, RULE_FIT_LARGE)]:
        try:
            found = path.stat()
            sections = frame_sections(str(path)) if path.is_file() else None
        except (OSError, ValueError):
            continue
        if sections is None or (found.st_dev, found.st_ino) in seen:
            continue
        seen.add((found.st_dev, found.st_ino))
        section, vaddr, data = sections
        files += 1
        for fde in cfi.parse_frames(data, vaddr, section == ".eh_frame"):
            for row in fde.rows:
                rows += 1
                if (row.cfa_kind != cfi.CFA_REG or row.cfa_reg not in (cfi.RSP, cfi.RBP) or row.ra_kind != cfi.OFFSET
                        or row.ra_offset != -8 or row.rbp_kind == cfi.OTHER):
                    continue
                rbp = row.rbp_offset if row.rbp_kind == cfi.OFFSET else 0
                plain += 1
                widest_cfa, lowest_rbp = max(widest_cfa, abs(row.cfa_offset)), min(lowest_rbp, rbp)
                too_wide += row.cfa_offset not in CFA_OFFSETS or rbp not in RBP_OFFSETS
        table = build_table(str(path), max_frame_bytes=1 << 40)
        if table.pcs:
            widest_span = max(widest_span, table.pcs[-1] - table.pcs[0])
        per_file.append((len(data), len(table.pcs), path.name))
    print(f"{files} files, {rows} CFI rows, {plain} plain RSP/RBP rules; {too_wide} of them do not fit the packed "
          f"fields (CFA {CFA_OFFSETS.start}..{CFA_OFFSETS.stop - 1}, rbp {RBP_OFFSETS.start}..{RBP_OFFSETS.stop - 1}): "
          f"{too_wide / max(plain, 1):.2e}; widest |CFA offset| {widest_cfa}, lowest rbp offset {lowest_rbp}; "
          f"widest table span {widest_span:#x} bytes")
    print(f"{'file':<48} {'.eh_frame KiB':>13} {'rows':>9} {'rows/KiB':>9}")
    for size, count, name in sorted(per_file)[-6:]:
        print(f"{name[:48]:<48} {size / 1024:>13.0f} {count:>9} {count / (size / 1024):>9.1f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--hz", type=int, default=999)
    parser.add_argument("--elf", action="append", default=[])
    parser.add_argument("--window", type=int, default=16384, help="bytes of user stack copied per sample in part 3")
    parser.add_argument("--parts", default="12345", help="which parts to run, e.g. 24")
    parser.add_argument("--library", action="append", default=[],
                        help="part 5: large libraries the workload maps; the first must be libLLVM (its C API is run)")
    args = parser.parse_args()
    if "1" in args.parts:
        print("1. unwind tables per file")
        table_costs(DEFAULT_FILES + args.elf)
    if "6" in args.parts:
        print("6. table build in a fresh process per file, Python reference vs native builder: CPU time (median of 3) "
              "and peak RSS added")
        build_costs(BUILD_FILES + args.elf)
    if "7" in args.parts:
        print("7. 8-byte rows: rules that do not fit the packed fields, over this machine's libraries")
        rule_fit()
    if os.geteuid() != 0:
        print("2. skipped: needs root")
        return
    previous = STATS_SYSCTL.read_text().strip()
    STATS_SYSCTL.write_text("1")
    try:
        if "2" in args.parts:
            print(f"\n2. per sample at {args.hz} Hz, {args.seconds:.0f} s each, the workload alone (pid filter)")
            print("BPF ns/run: every run of the program on any CPU (other processes' runs end at the pid filter); "
                  "BPF ns/sample: all of it over the workload's samples")
            print(f"{'workload':<16} {'path':<14} {'samples':>8} {'BPF ns/run':>11} {'ns/sample':>10} "
                  f"{'bytes/sample':>13} {'agent us/sample':>16} {'unwound':>8} {'fp frames':>10} {'stops':>6}")
            results = {}
            for binary in (NATIVE / "workloads" / "cpu_3to1", NATIVE / "unwind" / "cpu_3to1_nofp"):
                for native in (False, True):
                    row = per_sample(binary, native, args.seconds, args.hz)
                    results[(binary.name, native)] = row
                    print(f"{binary.name:<16} {'eh_frame walk' if native else 'frame pointer':<14} {row['samples']:>8} "
                          f"{row['bpf_ns_per_run']:>11.0f} {row['bpf_ns_per_sample']:>10.0f} "
                          f"{row['bytes_per_sample']:>13.0f} "
                          f"{row['agent_us_per_sample']:>16.1f} {row['unwound']:>8} {row['fp_frames']:>10} "
                          f"{row['stops']:>6}")
            for name in ("cpu_3to1", "cpu_3to1_nofp"):
                fp, walk = results[(name, False)], results[(name, True)]
                ratio = walk["bpf_ns_per_sample"] / max(1.0, fp["bpf_ns_per_sample"])
                print(f"{name}: BPF time ratio walk/fp {ratio:.2f}, "
                      f"extra {walk['bpf_ns_per_sample'] - fp['bpf_ns_per_sample']:.0f} ns/sample; agent ratio "
                      f"{walk['agent_us_per_sample'] / max(0.001, fp['agent_us_per_sample']):.2f}")
        if "3" in args.parts:
            print(f"\n3. the other design: copy {args.window} bytes of stack + registers, unwind in the agent (Python)")
            for binary in (NATIVE / "workloads" / "cpu_3to1", NATIVE / "unwind" / "cpu_3to1_nofp"):
                row = stack_copy(binary, args.seconds, args.hz, args.window)
                print(f"{binary.name:<16} samples {row['samples']}, BPF {row['bpf_ns_per_run']:.0f} ns/run, "
                      f"{row['bpf_ns_per_sample']:.0f} ns/sample, "
                      f"{row['bytes_per_sample']:.0f} bytes/sample, agent {row['agent_us_per_sample']:.1f} us/sample, "
                      f"mean depth {row['mean_depth']:.1f}")
        if "4" in args.parts:
            print(f"\n4. drain + unwind-resolve + symbolize + encode at {args.hz} Hz, {args.seconds:.0f} s of "
                  "cpu_3to1_nofp and clock_loop (target >= 50,000 samples/s)")
            for native in (False, True):
                rate = drain_rate(args.seconds, args.hz, native)
                print(f"{'eh_frame walk' if native else 'frame pointer':<14} samples {rate['samples']} "
                      f"({rate['distinct']} distinct), drain+symbolize {rate['drain_ms']:.1f} ms, encode "
                      f"{rate['encode_ms']:.1f} ms -> {rate['samples_per_s']:.0f} samples/s; unwound (machine-wide) "
                      f"{rate['unwound']}, sent whole {rate['raw_sent']}; waited {rate['building_s']:.2f} s for "
                      "table builds first")
        if "5" in args.parts:
            libraries = args.library or ["/usr/lib/x86_64-linux-gnu/libLLVM-15.so.1",
                                         "/usr/lib/x86_64-linux-gnu/libLLVM-14.so.1"]
            print(f"\n5. the unwinder thread's cost, one Python process mapping {', '.join(libraries)} and running "
                  f"libLLVM-15's C++ (no frame pointers), {args.seconds:.0f} s at {args.hz} Hz, sampled alone")
            print(f"{'tables':<38} {'samples':>8} {'unwinder CPU-s':>15} {'files':>11} {'rows':>9} {'RSS MiB':>8} "
                  f"{'depth>=8':>9} {'no_mapping':>10} {'read_failed':>11} {'bad_fp':>7}")
            for label, eager, cap in (("eager, cap 1 MiB", 1 << 20, 1 << 20),
                                      ("lazy over 64 KiB, cap 1 MiB", 64 << 10, 1 << 20),
                                      ("eager, cap 8 MiB", 8 << 20, 8 << 20),
                                      ("lazy over 64 KiB, cap 8 MiB (default)", 64 << 10, 8 << 20)):
                row = unwinder_cost(args.seconds, args.hz, eager, cap, libraries)
                print(f"{label:<38} {row['samples']:>8} {row['unwinder_s']:>15.2f} "
                      f"{row['files']:>5}/{row['files_known']:<5} {row['rows']:>9} {row['rss_mib']:>8.0f} "
                      f"{row['deep']:>9.2f} {row['no_mapping']:>10.3f} {row['read_failed']:>11.3f} "
                      f"{row['bad_fp']:>7.3f}")
            print("files: tables loaded / files mapped; samples, depth>=8 and the stop columns (per walked sample): "
                  "the second half")
    finally:
        STATS_SYSCTL.write_text(previous)


if __name__ == "__main__":
    main()
