# SPDX-License-Identifier: Apache-2.0
"""Memory of the whole agent (issue 12): ``otel-gpu run`` with every source on, started as a user would, while a
Python busy loop and (here) the fake CUDA stack's Python workload run; where the resident memory goes.

Each tree given (``--tree``, default this one; give two for a before/after run, taken in turns) is measured twice:
  rss     the agent alone: /proc/PID/smaps every 0.5 s; the steady-state reading (the largest after the second
          profile report) split into anonymous memory (heap and anonymous mmaps: Python objects), BPF maps
          (anon_inode:bpf-map mmaps), file-backed (shared libraries, the interpreter) and the rest, plus the peak
          (VmHWM);
  traced  the same run under tracemalloc (which costs memory of its own: its RSS is not the agent's): the Python
          allocations alive at the steady-state instant, by what imported them (the top-level package whose import
          allocated) and, for what was allocated after the imports, by the agent's line that asked.
  census  (--census, instead of traced: seconds, not minutes, of CPU) the Python objects alive at the steady-state
          instant, by the part of the agent that holds them (objects reachable from each attribute of the Agent and
          of its sources, the first holder counted) and by type, with sys.getsizeof; plus glibc's malloc counters.

With the fakes (here): NVML is tests/native/nvml's libnvidia-ml.so.1 (2 GPUs) and the workload is
tests/native/cuda/workload.py on the fake libcuda, injected with the real library. On the H200 pass --real (the real
NVML and CUDA) and --workload torch (a bf16 8192x8192 matmul loop, as scripts/h200/run.sh agent runs; or any command,
injected with CUDA_INJECTION64_PATH), from the repository root after scripts/h200/setup.sh:
    sudo python3 bench/bench_agent_memory.py --real --workload torch --seconds 60 --rounds 2 --out /tmp/h200-memory.txt
(``--out`` writes the same table and the numbers as JSON to a file).

Run (as root, after make build): .venv/bin/python bench/bench_agent_memory.py [--seconds 40] [--tree PATH ...]
  [--rounds 1] [--top 15] [--out FILE] [--agent-arg=--flag ...] [--skip-traced]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import tracemalloc
from array import array as array_type
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
FAKE_NVML = REPO / "tests" / "native" / "nvml" / "build"
FAKES = REPO / "tests" / "native" / "cuda"
INJECT = REPO / "otel_gpu" / "cuda" / "native" / "libotel_gpu_inject.so"
INTERVAL_S = 5
STEADY_AFTER_S = 2 * INTERVAL_S + 1.0  # after the second report: what already ran has been read once
KB = 1024
TORCH_LOOP = ("import torch\na = torch.randn(8192, 8192, device='cuda', dtype=torch.bfloat16)\n"
              "while True:\n    a @ a\n    torch.cuda.synchronize()\n")
FRAMES = 16  # deep enough to see the import machinery under an allocation; deeper makes the traced agent crawl


# --- the agent as a user starts it -----------------------------------------------------------------------------------

def agent_command(tree: Path, seconds: float, out: str, extra: list[str], traced: str | None,
                  mode: str = "traced") -> list[str]:
    """``otel-gpu run`` from ``tree`` with every source on; under this file's ``--child`` when traced (or
    censused: mode ``census``)."""
    launcher = [str(Path(__file__).resolve()), "--child", traced, mode, str(STEADY_AFTER_S), "--"] \
        if traced else ["-m", "otel_gpu"]
    return [sys.executable, *launcher, "run", "--duration", f"{seconds:g}", "--profiling-interval", str(INTERVAL_S),
            "--output-dir", out, "--console", "off", "--log-level", "info", *extra]


def agent_env(real: bool) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "FAKE_NVML_"))}
    if not real:
        env["LD_LIBRARY_PATH"] = str(FAKE_NVML)
    return env


@contextlib.contextmanager
def workload(real: bool, command: str | None) -> Iterator[None]:
    """A Python busy loop, and the GPU workload injected with the library (the fake one unless --real)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_GPU_", "CUDA_INJECTION"))}
    env["CUDA_INJECTION64_PATH"] = str(INJECT)
    if command is None and not real:
        env["OTEL_GPU_CUPTI_PATH"] = str(FAKES / "libcupti.so")
        command = shlex.join([sys.executable, str(FAKES / "workload.py"), str(FAKES / "libcuda.so.1"),
                              "--steps", "1000000"])
    started = [subprocess.Popen([sys.executable, "-c", "while True: sum(range(1000))"])]
    if command:
        argv = [sys.executable, "-c", TORCH_LOOP] if command == "torch" else shlex.split(command)
        started.append(subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL,
                                        stderr=subprocess.DEVNULL))
    try:
        time.sleep(1.0)
        yield
    finally:
        for process in started:
            process.kill()
        for process in started:
            process.wait()


# --- reading /proc ---------------------------------------------------------------------------------------------------

def smaps_kinds(pid: int) -> dict[str, int]:
    """Resident bytes of ``pid`` by kind of mapping: anon (heap, anonymous mmaps, stacks), bpf (BPF-map mmaps),
    file (files mapped: libraries, the interpreter), other; and total."""
    kinds: dict[str, int] = defaultdict(int)
    kind = "anon"
    with open(f"/proc/{pid}/smaps") as smaps:
        for line in smaps:
            first = line.split(None, 1)[0]
            if "-" in first and not first.endswith(":"):  # a mapping's header: range perms offset dev inode [name]
                name = line.split(None, 5)[5].strip() if len(line.split(None, 5)) > 5 else ""
                kind = ("bpf" if "bpf" in name else "anon" if name in ("", "[heap]", "[stack]") or
                        name.startswith("[anon") else "file" if name.startswith("/") else "other")
            elif first == "Rss:":
                kinds[kind] += int(line.split()[1]) * KB
    kinds["total"] = sum(kinds.values())
    return dict(kinds)


def peak_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * KB
    return 0


def run_rss(tree: Path, seconds: float, extra: list[str], real: bool) -> dict[str, object]:
    """One agent run from ``tree``: the steady-state reading with the most resident memory, and the peak."""
    out = tempfile.mkdtemp(prefix="otel-gpu-bench-mem-")
    agent = subprocess.Popen(agent_command(tree, seconds, out, extra, None), cwd=tree, env=agent_env(real),
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    log: list[str] = []
    running_at: list[float] = []
    reader = threading.Thread(target=_read_log, args=(agent, log, running_at), daemon=True)
    reader.start()
    steady: dict[str, int] = {}  # the largest reading of the steady state
    last: dict[str, int] = {}  # its last reading, before the agent stops
    peak = 0
    while agent.poll() is None:
        with contextlib.suppress(OSError, ValueError, IndexError):
            kinds = smaps_kinds(agent.pid)
            peak = max(peak, peak_bytes(agent.pid))
            if running_at and time.monotonic() >= running_at[0] + STEADY_AFTER_S and len(running_at) == 1:
                last = kinds
                if kinds["total"] > steady.get("total", 0):
                    steady = kinds
        time.sleep(0.5)
    reader.join(timeout=5)
    shutil.rmtree(out, ignore_errors=True)
    if agent.returncode != 0 or not steady:
        return {"error": f"exit {agent.returncode}: {' | '.join(log[-3:])}"}
    return {**steady, "peak": peak, "last_anon": last.get("anon", 0), "last_total": last.get("total", 0),
            "running": next((line.split("otel-gpu running: ", 1)[1].split(";")[0]
                                                     for line in log if "otel-gpu running: " in line), "")}


def _read_log(agent: subprocess.Popen[str], log: list[str], running_at: list[float]) -> None:
    assert agent.stderr is not None
    for line in agent.stderr:
        log.append(line.rstrip())
        if "otel-gpu running" in line and not running_at:
            running_at.append(time.monotonic())
        elif "otel-gpu cost" in line:  # its loop has ended: what follows is stopping, not the steady state
            running_at.append(time.monotonic())


def run_traced(tree: Path, seconds: float, extra: list[str], real: bool, mode: str = "traced") -> dict[str, object]:
    out = tempfile.mkdtemp(prefix="otel-gpu-bench-mem-")
    result = os.path.join(out, "traced.json")
    # start-up under tracemalloc takes minutes of CPU here: the run stops itself once the snapshot is taken
    agent = subprocess.run(agent_command(tree, seconds + 600, out, extra, result, mode), cwd=tree, env=agent_env(real),
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, check=False)
    try:
        return json.loads(Path(result).read_text())
    except (OSError, ValueError):
        return {"error": f"exit {agent.returncode}: {agent.stderr[-300:]}"}
    finally:
        shutil.rmtree(out, ignore_errors=True)


# --- inside the traced agent -----------------------------------------------------------------------------------------

_IMPORTLIB = "<frozen importlib._bootstrap"


def _package(filename: str) -> str:
    """The top-level package (or stdlib module) a source file belongs to."""
    path = Path(filename)
    parts = path.parts
    for marker in ("site-packages", "dist-packages"):
        if marker in parts:
            return parts[parts.index(marker) + 1].removesuffix(".py")
    if "otel_gpu" in parts:
        at = len(parts) - 1 - parts[::-1].index("otel_gpu")
        return "/".join(parts[at:])
    if filename.startswith("<"):
        return filename
    return "stdlib:" + (parts[-2] if path.name == "__init__.py" else path.stem)


def summarize(snapshot: tracemalloc.Snapshot, top: int) -> dict[str, object]:
    """Live allocations by what imported them and, past the imports, by the agent's line that asked."""
    imports: dict[str, int] = defaultdict(int)
    runtime: dict[str, int] = defaultdict(int)
    for trace in snapshot.traces:
        frames = list(trace.traceback)  # oldest first
        files = [f.filename for f in frames]
        if any(f.startswith(_IMPORTLIB) for f in files):
            # the innermost frame not in importlib: the module whose import allocated (or imported what did)
            inner = next((f for f in reversed(files) if not f.startswith(_IMPORTLIB)), files[-1])
            imports[_package(inner)] += trace.size
            continue
        ours = next((f for f in reversed(frames) if "/otel_gpu/" in f.filename), frames[-1])
        runtime[f"{_package(ours.filename)}:{ours.lineno}"] += trace.size

    def ranked(sizes: dict[str, int]) -> list[tuple[str, int]]:
        return sorted(sizes.items(), key=lambda item: -item[1])[:top]

    return {"traced": sum(imports.values()) + sum(runtime.values()), "imports_total": sum(imports.values()),
            "runtime_total": sum(runtime.values()), "imports": ranked(imports), "runtime": ranked(runtime),
            "traced_peak": tracemalloc.get_traced_memory()[1],
            "modules": len(sys.modules)}


def _holders(agent: object) -> list[tuple[str, object]]:
    """The agent's parts: each attribute of every live source and pipeline (objects of otel_gpu's classes named
    ``...Source`` or ``...Pipeline``: the Agent holds them in locals of its run) and of the Agent, named
    ``Class.attribute``."""
    import gc

    found = [obj for obj in gc.get_objects() if type(obj).__module__.startswith("otel_gpu") and
             type(obj).__name__.endswith(("Source", "Pipeline")) and hasattr(obj, "__dict__")]
    # sources first: the Agent (its threads' targets) and the pipeline (its instruments' callbacks) reach them
    parts = [*sorted(found, key=lambda obj: type(obj).__name__.endswith("Pipeline")), agent]
    return [(f"{type(part).__name__}.{attr}", held) for part in parts for attr, held in vars(part).items()]


def census(agent: object, top: int) -> dict[str, object]:
    """Python objects reachable from each part of ``agent`` (each object counted once, for the first part that
    reaches it) and all objects by type, in bytes (sys.getsizeof: an array or bytes counts its buffer)."""
    import gc

    import types

    # what a function reaches through its globals is its module's, not the part's: modules are never entered
    seen: set[int] = {id(vars(module)) for module in list(sys.modules.values()) if module is not None}
    by_part: dict[str, int] = defaultdict(int)
    by_type: dict[str, int] = defaultdict(int)
    for part, root in _holders(agent):
        stack = [root]
        while stack:
            obj = stack.pop()
            if id(obj) in seen or isinstance(obj, type) or type(obj).__name__ == "module":
                continue
            seen.add(id(obj))
            size = sys.getsizeof(obj, 0)
            by_part[part] += size
            by_type[type(obj).__name__] += size
            if not isinstance(obj, types.FunctionType | types.BuiltinFunctionType | types.CodeType):
                stack.extend(gc.get_referents(obj))
    everything = 0
    for obj in gc.get_objects():
        everything += sys.getsizeof(obj, 0)
    ranked = sorted(by_part.items(), key=lambda item: -item[1])[:top]
    mappings = _anon_mappings(12)
    return {"reachable": sum(by_part.values()), "gc_tracked_all": everything, "parts": ranked,
            "types": sorted(by_type.items(), key=lambda item: -item[1])[:top], "malloc": _mallinfo(),
            "anon_mappings": mappings, "python_inside": _python_inside(mappings[:4])}


def _mallinfo() -> dict[str, int]:
    """glibc's heap counters: arena (the main heap, sbrk), hblkhd (mmapped blocks), uordblks (in use), fordblks
    (free but kept)."""
    import ctypes

    class Info(ctypes.Structure):
        _fields_ = [(name, ctypes.c_size_t) for name in
                    ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
                     "keepcost")]

    libc = ctypes.CDLL(None)
    libc.mallinfo2.restype = Info
    info = libc.mallinfo2()
    counters = {name: getattr(info, name) for name in ("arena", "hblkhd", "uordblks", "fordblks")}
    # per arena (malloc_info's XML: each <heap>'s free bytes and the memory it holds from the system)
    import re

    libc.fopen.restype = ctypes.c_void_p
    libc.fopen.argtypes = [ctypes.c_char_p, ctypes.c_char_p]
    libc.fclose.argtypes = [ctypes.c_void_p]
    libc.malloc_info.argtypes = [ctypes.c_int, ctypes.c_void_p]
    with tempfile.NamedTemporaryFile(suffix=".xml") as xml:
        stream = libc.fopen(xml.name.encode(), b"w")
        libc.malloc_info(0, stream)
        libc.fclose(stream)
        text = Path(xml.name).read_text()
    heaps = re.findall(r'<heap nr="\d+">.*?<total type="rest" count="\d+" size="(\d+)"/>.*?'
                       r'<system type="current" size="(\d+)"/>', text, re.S)
    counters["arenas"] = len(heaps)
    counters["arena_sizes"] = sorted(((int(current), int(free)) for free, current in heaps), reverse=True)[:8]
    return counters


def _anon_mappings(top: int) -> list[tuple[int, int, int]]:
    """This process's largest anonymous mappings by resident size: (size, resident bytes, start address)."""
    regions: list[tuple[int, int, int]] = []
    size = start = 0
    anonymous = False
    with open("/proc/self/smaps") as smaps:
        for line in smaps:
            first = line.split(None, 1)[0]
            if "-" in first and not first.endswith(":"):
                fields = line.split(None, 5)
                anonymous = len(fields) < 6 or fields[5].strip() in ("", "[heap]")
                start = int(first.split("-")[0], 16)
            elif first == "Size:":
                size = int(line.split()[1]) * KB
            elif first == "Rss:" and anonymous:
                regions.append((size, int(line.split()[1]) * KB, start))
    return sorted(regions, key=lambda region: -region[1])[:top]


def _python_inside(regions: list[tuple[int, int, int]]) -> list[dict[str, int]]:
    """For each region, the bytes of Python objects whose memory lies in it, by type (an array by its buffer)."""
    import gc

    found: list[dict[str, int]] = [defaultdict(int) for _ in regions]
    objects = gc.get_objects()
    objects += [ref for obj in list(objects) for ref in gc.get_referents(obj) if not gc.is_tracked(ref)]
    seen: set[int] = set()
    for obj in objects:
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        address = obj.buffer_info()[0] if isinstance(obj, array_type) else id(obj)
        for n, (size, _, start) in enumerate(regions):
            if start <= address < start + size:
                found[n][type(obj).__name__] += sys.getsizeof(obj, 0)
    return [dict(sorted(kinds.items(), key=lambda item: -item[1])[:4]) for kinds in found]


def child(out: str, steady_at_s: float, argv: list[str], mode: str = "traced") -> int:
    """Runs the agent in this process under tracemalloc (or, with mode ``census``, without it); at ``steady_at_s``
    after its start-up line, writes the live allocations (or the census) to ``out``."""
    if mode == "traced":
        tracemalloc.start(FRAMES)
    import logging

    from otel_gpu.cli import main as agent_main

    running = threading.Event()

    class Running(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if "otel-gpu running" in record.getMessage():
                running.set()

    logging.getLogger("otel_gpu.agent").addHandler(Running())

    def take() -> None:
        running.wait()
        time.sleep(steady_at_s)
        if mode == "census":
            import gc

            from otel_gpu.agent import Agent
            agent = next(obj for obj in gc.get_objects() if type(obj) is Agent)
            Path(out).write_text(json.dumps(census(agent, 40)))
        else:
            snapshot = tracemalloc.take_snapshot()
            Path(out).write_text(json.dumps(summarize(snapshot, 40)))
        os.kill(os.getpid(), signal.SIGINT)  # stops the agent as Ctrl-C does

    threading.Thread(target=take, name="bench-snapshot", daemon=True).start()
    return agent_main(argv)


# --- main ------------------------------------------------------------------------------------------------------------

def mb(value: object) -> str:
    return f"{int(value) / (1 << 20):7.1f}" if isinstance(value, int) else f"{'-':>7}"  # type: ignore[arg-type]


def report(trees: list[Path], rss: dict[str, list[dict[str, object]]], traced: dict[str, dict[str, object]],
           top: int) -> str:
    lines = [f"RSS of the agent, MB (steady state: the largest reading from {STEADY_AFTER_S:g} s after start-up; "
             "peak: VmHWM; last: the last reading before it stops)",
             f"{'tree':<28} {'round':>5} | {'anon':>7} {'bpf':>7} {'file':>7} {'other':>7} {'total':>7} | "
             f"{'peak':>7} | {'last: anon':>10} {'total':>7} | sources"]
    for tree in trees:
        for n, row in enumerate(rss[str(tree)]):
            if "error" in row:
                lines.append(f"{str(tree):<28} {n:>5} | {row['error']}")
                continue
            lines.append(f"{str(tree):<28} {n:>5} | {mb(row.get('anon'))} {mb(row.get('bpf'))} {mb(row.get('file'))} "
                         f"{mb(row.get('other'))} {mb(row.get('total'))} | {mb(row.get('peak'))} | "
                         f"   {mb(row.get('last_anon'))} {mb(row.get('last_total'))} | {row['running']}")
    if not any(traced.values()):
        return "\n".join(lines)
    if any("parts" in column for column in traced.values()):
        return "\n".join(lines + census_report(trees, traced, top))
    for key, title in (("imports", "live Python allocations by the import that made them"),
                       ("runtime", "live Python allocations past the imports, by the agent's line that asked")):
        lines.append(f"\n{title} (tracemalloc, MB), side by side")
        columns = [traced[str(tree)] for tree in trees]
        totals = " | ".join(f"{str(tree)[-24:]:>24} {mb(col.get(f'{key}_total'))}"
                            for tree, col in zip(trees, columns, strict=True))
        lines.append(f"  total: {totals}")
        for rank in range(top):
            cells = []
            for col in columns:
                entries = col.get(key) or []
                cells.append(f"{entries[rank][0][-32:]:>32} {mb(entries[rank][1])}" if rank < len(entries)
                             else f"{'':>40}")
            lines.append("  " + " | ".join(cells))
    lines.append("\nmodules loaded: " + ", ".join(f"{tree}: {traced[str(tree)].get('modules', '-')}" for tree in trees))
    return "\n".join(lines)


def census_report(trees: list[Path], censuses: dict[str, dict[str, object]], top: int) -> list[str]:
    lines = []
    for tree in trees:
        column = censuses[str(tree)]
        if "parts" not in column:
            lines.append(f"\n{tree}: census {column.get('error', 'missing')}")
            continue
        malloc = column["malloc"]
        lines.append(f"\n{tree}: Python objects reachable from the agent {mb(column['reachable'])} MB (every "
                     f"GC-tracked object {mb(column['gc_tracked_all'])} MB); malloc: main heap {mb(malloc['arena'])}, "
                     f"mmapped blocks {mb(malloc['hblkhd'])}, in use {mb(malloc['uordblks'])}, free kept "
                     f"{mb(malloc['fordblks'])} MB; {malloc['arenas']} arenas, the largest (held / free MB): "
                     + ", ".join(f"{mb(held).strip()}/{mb(free).strip()}" for held, free in malloc["arena_sizes"]))
        lines.append("  largest anonymous mappings (size / resident MB): " + ", ".join(
            f"{mb(size).strip()}/{mb(resident).strip()}" for size, resident, _ in column["anon_mappings"]))
        lines.append("  Python objects in the four largest (MB by type): " + "; ".join(
            ", ".join(f"{kind} {mb(size).strip()}" for kind, size in inside.items()) or "none"
            for inside in column["python_inside"]))
        parts, types = column["parts"], column["types"]
        for rank in range(min(top, max(len(parts), len(types)))):
            part = f"{parts[rank][0][-44:]:>44} {mb(parts[rank][1])}" if rank < len(parts) else " " * 52
            kind = f"{types[rank][0][-24:]:>24} {mb(types[rank][1])}" if rank < len(types) else ""
            lines.append(f"  {part} | {kind}")
    return lines


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        out, mode, steady_at, separator, *argv = sys.argv[2:]
        assert separator == "--"
        sys.path.insert(0, os.getcwd())  # the tree measured, not this file's
        return child(out, float(steady_at), argv, mode)
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=40.0, help="--duration of each agent run (default 40)")
    parser.add_argument("--tree", action="append", type=Path,
                        help="a checkout to run the agent from (repeatable: before/after in one run; default this)")
    parser.add_argument("--rounds", type=int, default=1, help="RSS runs per tree, taken in turns (default 1)")
    parser.add_argument("--top", type=int, default=15, help="allocation sites shown (default 15)")
    parser.add_argument("--agent-arg", action="append", default=[], help="an extra flag for otel-gpu run")
    parser.add_argument("--real", action="store_true", help="the real NVML and CUDA (the H200), not the fakes")
    parser.add_argument("--workload", help="the GPU program to run meanwhile (default: the fake CUDA workload)")
    parser.add_argument("--skip-traced", action="store_true", help="RSS only (no tracemalloc run)")
    parser.add_argument("--census", action="store_true",
                        help="instead of the tracemalloc run: the objects alive by the agent's part that holds them")
    parser.add_argument("--out", help="also write the table and the numbers (JSON) to this file")
    args = parser.parse_args()
    if os.geteuid() != 0:
        print("bench_agent_memory: needs root (the agent loads eBPF programs)", file=sys.stderr)
        return 1
    trees = [tree.resolve() for tree in (args.tree or [REPO])]
    rss: dict[str, list[dict[str, object]]] = {str(tree): [] for tree in trees}
    traced: dict[str, dict[str, object]] = {str(tree): {} for tree in trees}
    with workload(args.real, args.workload):
        for _ in range(args.rounds):
            for tree in trees:
                rss[str(tree)].append(run_rss(tree, args.seconds, args.agent_arg, args.real))
                print(f"  rss {tree}: {rss[str(tree)][-1]}", file=sys.stderr, flush=True)
        if not args.skip_traced:
            for tree in trees:
                traced[str(tree)] = run_traced(tree, args.seconds, args.agent_arg, args.real,
                                               "census" if args.census else "traced")
                print(f"  traced {tree}: {traced[str(tree)].get('traced', traced[str(tree)].get('error'))}",
                      file=sys.stderr, flush=True)
    table = report(trees, rss, traced, args.top)
    header = (f"Memory of the whole agent: --duration {args.seconds:g}, every source on "
              f"({'real NVML and CUDA' if args.real else 'fake NVML, fake CUDA workload'}), {os.cpu_count()} CPUs, "
              f"load {os.getloadavg()[0]:.1f}")
    print(header + "\n" + table)
    if args.out:
        Path(args.out).write_text(header + "\n" + table + "\n\n" + json.dumps({"rss": rss, "traced": traced},
                                                                                 indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
