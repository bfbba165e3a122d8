#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Do no harm: the injected library leaves PyTorch programs' results, CUDA graphs, torch.compile and torch.profiler
as they are, with and without the agent attached.

Run THERE (the H200 machine, as root; `bash scripts/h200/run.sh harm`, about 9 minutes). A matrix of cells, each
a fresh process running one workload of the CHILD program for HARM_SECONDS in a timed loop:

  workloads  eager, graphs (torch.cuda.graph + replay), compile_default, compile_reduce_overhead (beside the same
             model run eagerly: what crashed the GPU with XID 31), compile_max_autotune, profiler (torch.profiler
             blocks of a fixed number of iterations, kernels counted), streams (3 streams and events), async_alloc
             (cudaMallocAsync), dataloader (2 forked workers), fork_after_init (CPU-only children after CUDA init)
  modes      plain (no injection), inert (`otel-gpu inject`, no agent), agent (injected while the real agent runs
             for 4 s at a time, 1 s apart, from the workload's CUDA initialisation to its exit: it attaches and
             detaches throughout), agent_old (agent plus OTEL_GPU_DEBUG_FINALIZE_WITH_GRAPHS=1 in the workload:
             the old crash-prone behaviour: a control, to see the suite catch the crash)

A cell passes when the workload exits 0, its checksum (outputs of a fixed input after the loop) equals the plain
cell's, no XID was seen (the agent's metric files and log, and the kernel log where readable) and, for profiler,
every profiled block saw as many kernels as in the plain cell. Agent cells also need the agent to have attached and
every agent run to have exited 0. Loops per second are informational only.

Compiled code is cached in directories all cells of one run share, so the injected cells run the kernels the plain
cell compiled and chose (max-autotune's choices come from timings and could otherwise differ between processes);
HARM_COMPILE_CACHE=cell gives each cell its own, to compile and autotune under injection as well.

Usage: do_no_harm.py [REPORT.md]   (default $OUT/h200-do-no-harm.md; each cell's output in <report dir>/harm/,
results.json beside the report; exit 0 only when every cell passes)
Environment: HARM_SECONDS=4, HARM_WORKLOADS=<comma list> (default all), HARM_MODES=plain,inert,agent (plain
first; add agent_old for the control), HARM_COMPILE_CACHE=shared or cell.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]

CHILD = r'''
import hashlib, json, os, sys, time
import torch
import torch.utils.data

WORKLOAD, SECONDS, OUT = sys.argv[1], float(sys.argv[2]), sys.argv[3]
PROFILED_ITERATIONS = 50  # fixed, so that every profiled block launches the same kernels
EVERY_S = 2.0  # how often the periodic part (a profiled block, a fork) comes round in the timed loop
started = time.perf_counter()
torch.use_deterministic_algorithms(True)


def make_model():
    torch.manual_seed(0)
    layers = []
    for _ in range(8):
        layers += [torch.nn.Linear(1024, 1024), torch.nn.GELU()]
    return torch.nn.Sequential(*layers).to("cuda", torch.float16).eval()


def fixed_input(batch=64):
    generator = torch.Generator().manual_seed(1)
    return torch.randn(batch, 1024, generator=generator).to("cuda", torch.float16)


def digest(tensors, extra=b""):
    h = hashlib.sha256(extra)
    for t in tensors:
        t = t.detach().to("cpu").contiguous().reshape(-1)
        h.update(f"{t.dtype}{t.numel()}".encode())
        h.update(bytes(t.view(torch.uint8).tolist()))
    return h.hexdigest()


def synced(f):
    def step():
        f()
        torch.cuda.synchronize()
        return 1
    return step


# Each workload returns (step: one loop -> iterations, periodic: every EVERY_S -> iterations or None,
# check: () -> (tensors, extra bytes) computed from the fixed input after the loop).
def eager(result):
    model, x = make_model(), fixed_input()
    return synced(lambda: model(x)), None, lambda: ([model(fixed_input())], b"")


def graphs(result):
    model, static_x = make_model(), fixed_input()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up on a side stream before capture, as torch's CUDA graph docs do
        for _ in range(3):
            model(static_x)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_y = model(static_x)

    def check():
        static_x.copy_(fixed_input())
        graph.replay()
        return [static_y.clone()], b""
    return synced(graph.replay), None, check


def compiled(mode):
    def workload(result):
        model, x = make_model(), fixed_input()
        fast = torch.compile(model, mode=mode)
        return synced(lambda: fast(x)), None, lambda: ([fast(fixed_input()).clone()], b"")
    return workload


def compile_reduce_overhead(result):
    model, x = make_model(), fixed_input()
    fast = torch.compile(model, mode="reduce-overhead")

    def both():  # the compiled model (CUDA graph trees) and the same model eagerly, in turn
        fast(x)
        model(x)

    def check():
        graphed = fast(fixed_input()).clone()  # the graph's output buffer is reused by its next replay
        return [graphed, model(fixed_input())], b""
    return synced(both), None, check


def profiler(result):
    from torch.profiler import ProfilerActivity, profile
    model, x = make_model(), fixed_input()
    result["kernel_counts"] = []

    def block():
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(PROFILED_ITERATIONS):
                model(x)
            torch.cuda.synchronize()
        # kernels (and copies, sets) are the events whose device type is CUDA
        result["kernel_counts"].append(sum(1 for e in prof.events() if str(e.device_type).endswith("CUDA")))
        return PROFILED_ITERATIONS
    return synced(lambda: model(x)), block, lambda: ([model(fixed_input())], b"")


def streams(result):
    generator = torch.Generator().manual_seed(2)
    w = (torch.randn(1024, 1024, generator=generator) / 32).to("cuda", torch.float16)
    x = fixed_input()
    s0, s1, s2 = (torch.cuda.Stream() for _ in range(3))

    def run(inp):  # s0 -> s1 -> s2 -> the current stream, ordered by events only
        main = torch.cuda.current_stream()
        begin = torch.cuda.Event()
        begin.record(main)
        s0.wait_event(begin)
        with torch.cuda.stream(s0):
            a = torch.mm(inp, w)
            a_done = torch.cuda.Event()
            a_done.record(s0)
        s1.wait_event(a_done)
        with torch.cuda.stream(s1):
            b = torch.nn.functional.gelu(torch.mm(a, w))
            b_done = torch.cuda.Event()
            b_done.record(s1)
        s2.wait_event(a_done)
        s2.wait_event(b_done)
        with torch.cuda.stream(s2):
            c = b * 0.5 + a.relu()
            c_done = torch.cuda.Event()
            c_done.record(s2)
        main.wait_event(c_done)
        out = torch.mm(c, w).sum(dim=0)
        for tensor, user in ((inp, s0), (a, s1), (a, s2), (b, s2), (c, main)):
            tensor.record_stream(user)  # memory used on another stream than the one that allocated it
        return out
    return synced(lambda: run(x)), None, lambda: ([run(fixed_input())], b"")


def async_alloc(result):
    result["allocator"] = torch.cuda.get_allocator_backend()
    model, x = make_model(), fixed_input()
    sizes = [(1 << 20) + k * 4096 for k in range(7)]
    loop = [0]

    def step():  # the model plus scratch buffers of changing sizes: the allocator's pool at work
        loop[0] += 1
        scratch = torch.empty(sizes[loop[0] % len(sizes)], device="cuda")
        model(x)
        del scratch
    return synced(step), None, lambda: ([model(fixed_input())], b"")


class Items(torch.utils.data.Dataset):
    def __len__(self):
        return 1 << 30

    def __getitem__(self, i):  # seeded by index: the same batches whichever worker makes them
        return torch.randn(1024, generator=torch.Generator().manual_seed(i))


def loader(pin):
    return torch.utils.data.DataLoader(Items(), batch_size=64, num_workers=2, multiprocessing_context="fork",
                                       pin_memory=pin)


def dataloader(result):
    model = make_model()
    batches = iter(loader(pin=True))  # workers forked after CUDA was initialised, as in a training script

    def step():
        model(next(batches).to("cuda", non_blocking=True).half())

    def check():
        nonlocal batches
        batches = None  # the iterator's last reference: its workers shut down
        first = next(iter(loader(pin=False)))
        return [model(first.to("cuda").half())], b""
    return synced(step), None, check


def fork_after_init(result):
    model, x = make_model(), fixed_input()
    model(x)
    torch.cuda.synchronize()
    result["child_exits"] = []

    def fork():  # a CPU-only child of a process with CUDA (and the library) initialised
        pid = os.fork()
        if pid == 0:
            code = 4
            try:
                code = 0 if torch.arange(10000, dtype=torch.float64).sum().item() == 49995000.0 else 3
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        result["child_exits"].append(os.waitstatus_to_exitcode(status))
        return 0

    fork()

    def check():
        statuses = json.dumps(sorted(set(result["child_exits"])))
        return [model(fixed_input())], statuses.encode()
    return synced(lambda: model(x)), fork, check


WORKLOADS = {
    "eager": eager, "graphs": graphs, "compile_default": compiled("default"),
    "compile_reduce_overhead": compile_reduce_overhead, "compile_max_autotune": compiled("max-autotune"),
    "profiler": profiler, "streams": streams, "async_alloc": async_alloc, "dataloader": dataloader,
    "fork_after_init": fork_after_init,
}

result = {"workload": WORKLOAD, "pid": os.getpid(), "torch": torch.__version__, "cuda": torch.version.cuda,
          "device": torch.cuda.get_device_name(0)}
open(OUT + ".cuda", "w").close()  # CUDA is initialised (the injected library loaded): the agent may start
with torch.no_grad():
    step, periodic, check = WORKLOADS[WORKLOAD](result)
    for _ in range(3):  # warm-up: compilation, autotuning, graph recording
        step()
    torch.cuda.synchronize()
    result["setup_s"] = time.perf_counter() - started
    loops, start = 0, time.perf_counter()
    due = start
    while time.perf_counter() - start < SECONDS:
        if periodic is not None and time.perf_counter() >= due:
            loops += periodic()
            due = time.perf_counter() + EVERY_S
        loops += step()
    torch.cuda.synchronize()
    result.update(loops=loops, seconds=time.perf_counter() - start)
    tensors, extra = check()
    result["checksum"] = digest(tensors, extra)
with open(OUT, "w") as out:
    json.dump(result, out)
print(json.dumps(result), flush=True)
'''

WORKLOADS = ("eager", "graphs", "compile_default", "compile_reduce_overhead", "compile_max_autotune", "profiler",
             "streams", "async_alloc", "dataloader", "fork_after_init")
# mode -> (injected, agent cycling, extra environment of the workload)
MODE_SETUP: dict[str, tuple[bool, bool, dict[str, str]]] = {
    "plain": (False, False, {}),
    "inert": (True, False, {}),
    "agent": (True, True, {}),
    "agent_old": (True, True, {"OTEL_GPU_DEBUG_FINALIZE_WITH_GRAPHS": "1"}),
}
WORKLOAD_ENV = {"async_alloc": {"PYTORCH_CUDA_ALLOC_CONF": "backend:cudaMallocAsync"},
                # the library's exit lines: how often it stepped aside for torch.profiler, whether it saw graphs
                "profiler": {"OTEL_GPU_DEBUG_STATS": "1"}, "compile_reduce_overhead": {"OTEL_GPU_DEBUG_STATS": "1"}}
# deterministic cuBLAS (a fixed workspace per stream), so that equal inputs give equal bytes in every process
DETERMINISTIC_ENV = {"CUBLAS_WORKSPACE_CONFIG": ":4096:8"}
# Each cell also spends 8-20 s outside its timed loop (importing torch, compiling, warming up, exiting): with 4 s
# loops the 30 cells of the default matrix fit run.sh's 580 s, and one device command's 10 minutes.
DEFAULT_SECONDS = 4.0
CELL_TIMEOUT_S = 120.0  # on top of HARM_SECONDS: start-up, compilation and the checksum
EXTRA_TIMEOUT_S = {"compile_max_autotune": 240.0}  # autotuning benchmarks every GEMM candidate
AGENT_RUN_S = 4.0  # each agent run attaches, samples and detaches within this
AGENT_PAUSE_S = 1.0  # between agent runs: the workload runs on detached
AGENT_GRACE_S = 30.0  # for the running agent to stop after SIGTERM (it exports once more and detaches)
# lines the `otel-gpu inject` wrapper itself writes, not the library's
WRAPPER_LINES = ("otel-gpu: injecting ", "otel-gpu: overhead budget")
AGENT_XID = re.compile(r"\bXID (\d+) on GPU (\d+)")  # otel_gpu/gpu/events.py's log line for each XID
KERNEL_XID = re.compile(r"NVRM: Xid")  # the driver's own line in the kernel log
ATTACHED = "GPU-time profiling attached to"  # otel_gpu/cuda/source.py, once per agent run that attached
XID_WATCH_OFF = "XID events are off"


# --- pure bookkeeping (tests/test_h200_do_no_harm_script.py) ---------------------------------------------------------


@dataclasses.dataclass
class Cell:
    """One workload in one mode: what its process did and what was seen around it."""

    workload: str
    mode: str
    exit_code: int | None = None  # None: killed at the cell's timeout
    loops: int = 0
    seconds: float = 0.0  # of the timed loop
    setup_s: float = 0.0  # process start to the timed loop (imports, compilation, warm-up)
    wall_s: float = 0.0
    checksum: str | None = None
    kernel_counts: list[int] = dataclasses.field(default_factory=list)
    agent_xids: int = 0  # from the agent's metric files and log
    kernel_log_xids: int | None = None  # new "NVRM: Xid" lines; None when the kernel log is not readable
    agent_runs: int = 0
    agent_attached: int = 0  # agent runs that logged attaching to the library
    agent_failures: list[str] = dataclasses.field(default_factory=list)  # agent runs that did not exit 0
    xid_watch_off: bool = False  # an agent run could not watch XID events
    messages: list[str] = dataclasses.field(default_factory=list)  # the library's stderr lines, counted
    info: dict[str, Any] = dataclasses.field(default_factory=dict)  # the child's own report

    @property
    def loops_per_s(self) -> float | None:
        return self.loops / self.seconds if self.seconds > 0 else None


def verdict(cell: Cell, plain: Cell | None) -> list[str]:
    """Why ``cell`` fails (empty: it passes), against ``plain``, the same workload's plain cell."""
    reasons = []
    if cell.exit_code is None:
        reasons.append("timed out")
    elif cell.exit_code != 0:
        reasons.append(f"exit {cell.exit_code}")
    if plain is None or plain.checksum is None:
        reasons.append("no plain checksum to compare with")
    elif cell.checksum is None:
        reasons.append("no checksum")
    elif cell.checksum != plain.checksum:
        reasons.append("checksum differs from plain")
    xids = max(cell.agent_xids, cell.kernel_log_xids or 0)
    if xids:
        reasons.append(f"{xids} XID")
    if cell.workload == "profiler":
        expected = set(plain.kernel_counts) if plain is not None else set()
        if not cell.kernel_counts:
            reasons.append("no profiled block")
        elif not expected or 0 in expected:
            reasons.append("the plain cell's profiler saw no kernels")
        elif any(count not in expected for count in cell.kernel_counts):
            reasons.append(f"profiler kernel counts differ from plain ({', '.join(map(str, sorted(expected)))})")
    if MODE_SETUP.get(cell.mode, (False, False, {}))[1]:
        if not cell.agent_attached:
            reasons.append("the agent never attached")
        if cell.agent_failures:
            reasons.append(f"agent runs failed: {', '.join(cell.agent_failures)}")
    return reasons


def library_messages(text: str) -> list[str]:
    """The library's own ``otel-gpu:`` lines in a workload's stderr, each once with how often it came."""
    counts: dict[str, int] = {}
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("otel-gpu:") and not line.startswith(WRAPPER_LINES):
            counts[line] = counts.get(line, 0) + 1
    return [line if n == 1 else f"{line} (x{n})" for line, n in counts.items()]


def xids_in_output_dir(directory: Path) -> dict[tuple[str, int], int]:
    """XIDs per (GPU, code) in one agent run's metric files: the last value of each ``hw.errors`` series with
    ``error.type=xid`` (a cumulative counter since that agent started). Reads the rotated file as well."""
    counts: dict[tuple[str, int], int] = {}
    for path in (directory / "metrics.jsonl.1", directory / "metrics.jsonl"):  # oldest first
        if not path.exists():
            continue
        for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
            if not line.strip():
                continue
            try:
                export = json.loads(line)
            except json.JSONDecodeError:  # a line cut short by a killed agent
                continue
            for resource_metrics in export.get("resourceMetrics", []):
                for scope_metrics in resource_metrics.get("scopeMetrics", []):
                    for metric in scope_metrics.get("metrics", []):
                        if metric.get("name") != "hw.errors":
                            continue
                        for point in metric.get("sum", {}).get("dataPoints", []):
                            attributes = {a["key"]: next(iter(a.get("value", {}).values()), None)
                                          for a in point.get("attributes", [])}
                            if attributes.get("error.type") != "xid":
                                continue
                            key = (str(attributes.get("hw.id", "")), int(attributes.get("nvidia.gpu.xid.code", -1)))
                            value = point.get("asInt", point.get("asDouble", 0))
                            counts[key] = int(float(value))
    return counts


def xids_in_agent_log(text: str) -> list[int]:
    """The XID codes the agent logged, one entry per XID."""
    return [int(m.group(1)) for m in AGENT_XID.finditer(text)]


def agent_run_xids(directory: Path, log: str) -> int:
    """XIDs one agent run saw: its files and its log report the same events, and either may miss the last ones
    (the files when the agent stopped before exporting), so the larger of the two."""
    return max(sum(xids_in_output_dir(directory).values()), len(xids_in_agent_log(log)))


def kernel_log_xid_lines(text: str) -> set[str]:
    """The driver's XID lines in a ``dmesg`` output (timestamped, so a line seen again is the same event)."""
    return {line for line in text.splitlines() if KERNEL_XID.search(line)}


def _escape(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _counts(counts: Sequence[int]) -> str:
    if not counts:
        return "-"
    if len(set(counts)) == 1:
        return f"{counts[0]} (x{len(counts)})"
    return ", ".join(map(str, counts))


def render_table(cells: Sequence[Cell]) -> list[str]:
    """The markdown table of the cells, each with its verdict against its workload's plain cell."""
    plain = {c.workload: c for c in cells if c.mode == "plain"}
    lines = ["| workload | mode | exit | loops/s | checksum match | XIDs | agent attached / runs | "
             "profiler kernel counts | library messages | verdict |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for cell in cells:
        reference = plain.get(cell.workload)
        if cell.checksum is None:
            match = "-"
        elif cell.mode == "plain":
            match = f"reference {cell.checksum[:12]}"
        elif reference is not None and cell.checksum == reference.checksum:
            match = f"yes {cell.checksum[:12]}"
        else:
            match = f"NO {cell.checksum[:12]}"
        xids = [f"agent {cell.agent_xids}" + (" (XID watch off)" if cell.xid_watch_off else "")] \
            if MODE_SETUP.get(cell.mode, (False, False, {}))[1] else []
        xids.append(f"kernel log {'n/a' if cell.kernel_log_xids is None else cell.kernel_log_xids}")
        attached = f"{cell.agent_attached} / {cell.agent_runs}" if cell.agent_runs else "-"
        rate = cell.loops_per_s
        reasons = verdict(cell, reference)
        columns = [cell.workload, cell.mode, "timeout" if cell.exit_code is None else str(cell.exit_code),
                   "-" if rate is None else f"{rate:.1f}", match, ", ".join(xids), attached,
                   _counts(cell.kernel_counts), _escape("; ".join(cell.messages))[:400] or "-",
                   "PASS" if not reasons else "FAIL: " + _escape("; ".join(reasons))]
        lines.append("| " + " | ".join(columns) + " |")
    return lines


def overall(cells: Sequence[Cell], planned: int) -> tuple[bool, str]:
    """(passed, the report's last line): every planned cell ran and passed."""
    failed = [f"{c.workload}/{c.mode}" for c in cells if verdict(c, _plain_of(cells, c.workload))]
    missing = planned - len(cells)
    passed = not failed and missing == 0
    text = f"Overall: {'PASS' if passed else 'FAIL'} ({len(cells) - len(failed)} of {planned} cells passed"
    text += (f"; failed: {', '.join(failed)}" if failed else "") + (f"; {missing} not run" if missing else "") + ")"
    return passed, text


def _plain_of(cells: Iterable[Cell], workload: str) -> Cell | None:
    return next((c for c in cells if c.workload == workload and c.mode == "plain"), None)


def cell_timeout_s(workload: str, seconds: float) -> float:
    return seconds + CELL_TIMEOUT_S + EXTRA_TIMEOUT_S.get(workload, 0.0)


def agent_argv(output_dir: Path, run_s: float = AGENT_RUN_S) -> list[str]:
    """One run of the real agent: GPU metrics (and XID events) and GPU-time profiling, local files only."""
    return [sys.executable, "-m", "otel_gpu", "run", "--duration", f"{run_s:g}", "--no-cpu-profiling",
            "--metric-export-interval", "1", "--profiling-interval", "2", "--output-dir", str(output_dir),
            "--local-files", "on", "--console", "off"]


def parse_list(text: str, known: Sequence[str], what: str) -> tuple[list[str], str]:
    """A comma list checked against ``known``: (the names, "" or the problem)."""
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in known]
    if unknown or not names:
        return names, f"{what}: unknown {', '.join(unknown) or '(empty)'}; known: {', '.join(known)}"
    return names, ""


# --- running cells (the GPU machine only) -----------------------------------------------------------------------------


class Stopped(Exception):
    """SIGTERM (run.sh's timeout): stop the cell in flight and write what was done."""


@dataclasses.dataclass
class AgentRun:
    directory: Path
    log: Path
    exit_code: int | None  # None: it did not stop and was killed
    stopped: bool = False  # sent SIGTERM at the cell's end (before its handler is installed, SIGTERM ends it)


def agent_run_failure(exit_code: int | None, stopped: bool) -> str:
    """Empty when an agent run ended as it should (by itself, or by the SIGTERM that stops it), else how."""
    if exit_code == 0 or (stopped and exit_code == -signal.SIGTERM):
        return ""
    return "killed" if exit_code is None else f"exit {exit_code}"


class AgentCycler:
    """Runs the real agent again and again (AGENT_RUN_S each, AGENT_PAUSE_S apart) from when ``ready()`` holds until
    :meth:`stop`: the library sees an agent attach and detach many times while a cell runs."""

    def __init__(self, directory: Path, env: dict[str, str], preexec: Callable[[], None] | None,
                 ready: Callable[[], bool]) -> None:
        self.directory, self.env, self.preexec, self.ready = directory, env, preexec, ready
        self.runs: list[AgentRun] = []
        self._stop = threading.Event()
        self._current: subprocess.Popen[bytes] | None = None
        self._stopped = False
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._loop, name="agent-cycler", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _loop(self) -> None:
        while not self.ready() and not self._stop.wait(0.1):
            pass
        k = 0
        while not self._stop.is_set():
            run_dir, log = self.directory / f"run{k}", self.directory / f"run{k}.stderr"
            with open(log, "wb") as err:
                process = subprocess.Popen(agent_argv(run_dir), env=self.env, stdout=subprocess.DEVNULL, stderr=err,
                                           preexec_fn=self.preexec)
                with self._lock:
                    self._current, self._stopped = process, False
                try:
                    code: int | None = process.wait(timeout=AGENT_RUN_S + 60)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()
                    code = None
            self.runs.append(AgentRun(run_dir, log, code, self._stopped))
            k += 1
            self._stop.wait(AGENT_PAUSE_S)

    def stop(self) -> list[AgentRun]:
        self._stop.set()
        with self._lock:
            process = self._current
            if process is not None and process.poll() is None:
                self._stopped = True
                process.terminate()  # the agent's SIGTERM handling: one more export, then it detaches
        self._thread.join(timeout=AGENT_GRACE_S + AGENT_RUN_S)
        if self._thread.is_alive() and process is not None:
            process.kill()
            self._thread.join(timeout=10)
        return list(self.runs)


def read_kernel_log() -> set[str] | None:
    """The kernel log's XID lines, or None where dmesg cannot be read (a container without the right)."""
    try:
        done = subprocess.run(["dmesg"], capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return kernel_log_xid_lines(done.stdout) if done.returncode == 0 else None


def run_cell(workload: str, mode: str, *, seconds: float, work: Path, harm_dir: Path, env: dict[str, str],
             workload_preexec: Callable[[], None] | None, agent_preexec: Callable[[], None] | None,
             cache: str) -> Cell:
    """One fresh process of ``workload`` in ``mode``; its stderr kept in ``harm_dir``."""
    injected, with_agent, extra = MODE_SETUP[mode]
    name = f"{workload}-{mode}"
    cell_env = dict(env, **DETERMINISTIC_ENV, **WORKLOAD_ENV.get(workload, {}), **extra)
    caches = work / ("compile-cache" if cache == "shared" else f"compile-cache-{name}")
    cell_env.update(TORCHINDUCTOR_CACHE_DIR=str(caches / "inductor"), TRITON_CACHE_DIR=str(caches / "triton"))
    result_path = work / f"{name}.json"
    command = [sys.executable, str(work / "child.py"), workload, f"{seconds:g}", str(result_path)]
    if injected:  # exactly what a user types
        command = [sys.executable, "-m", "otel_gpu", "inject", "--", *command]
    cell = Cell(workload, mode)
    cycler = None
    kernel_before = read_kernel_log()
    stderr_path = harm_dir / f"{name}.stderr"
    started = time.monotonic()
    process = None
    try:
        with open(stderr_path, "wb") as err:
            # a session of its own: a timeout kills the wrapper, the workload and its workers together
            process = child = subprocess.Popen(command, env=cell_env, stdout=err, stderr=err,
                                               start_new_session=True, preexec_fn=workload_preexec)
            if with_agent:
                # The agent from when the library is loaded (CUDA initialised): a run that scans before that does
                # not look at the process again within its AGENT_RUN_S, so it would never attach.
                (work / name).mkdir(parents=True, exist_ok=True)
                cuda_ready = Path(f"{result_path}.cuda")
                cycler = AgentCycler(work / name, env, agent_preexec,
                                     ready=lambda: cuda_ready.exists() or child.poll() is not None)
                cycler.start()
            try:
                cell.exit_code = process.wait(timeout=cell_timeout_s(workload, seconds))
            except subprocess.TimeoutExpired:
                cell.exit_code = None
    finally:
        if process is not None and process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        cell.wall_s = time.monotonic() - started
        runs = cycler.stop() if cycler is not None else []
    kernel_after = read_kernel_log()
    if kernel_before is not None and kernel_after is not None:
        cell.kernel_log_xids = len(kernel_after - kernel_before)
    cell.messages = library_messages(stderr_path.read_text(errors="replace"))
    if result_path.exists():
        info = json.loads(result_path.read_text())
        cell.info = info
        cell.checksum = info.get("checksum")
        cell.loops, cell.seconds = int(info.get("loops", 0)), float(info.get("seconds", 0.0))
        cell.setup_s = float(info.get("setup_s", 0.0))
        cell.kernel_counts = list(info.get("kernel_counts", []))
    logs = []
    for k, run in enumerate(runs):
        log = run.log.read_text(errors="replace") if run.log.exists() else ""
        logs.append(f"=== agent run {k}: exit {run.exit_code}\n{log}")
        cell.agent_xids += agent_run_xids(run.directory, log)
        cell.agent_attached += ATTACHED in log
        cell.xid_watch_off |= XID_WATCH_OFF in log
        if failure := agent_run_failure(run.exit_code, run.stopped):
            cell.agent_failures.append(f"run {k} {failure}")
    cell.agent_runs = len(runs)
    if runs:
        (harm_dir / f"{name}.agent.stderr").write_text("\n".join(logs))
    return cell


def progress(cell: Cell, reasons: Sequence[str]) -> str:
    """One line on how a cell went."""
    rate = cell.loops_per_s
    agent = f"agent attached in {cell.agent_attached} of {cell.agent_runs} runs, " if cell.agent_runs else ""
    return (f"{cell.workload} {cell.mode}: exit {'timeout' if cell.exit_code is None else cell.exit_code}, "
            f"{cell.wall_s:.0f} s (setup {cell.setup_s:.0f} s), {'-' if rate is None else f'{rate:.1f}'} loops/s, "
            f"{agent}{'PASS' if not reasons else 'FAIL: ' + '; '.join(reasons)}")


def report_lines(cells: Sequence[Cell], planned: int, header: list[str]) -> tuple[bool, list[str]]:
    """(passed, the whole report): the header, torch's versions as the first cell reported them, the table."""
    passed, last = overall(cells, planned)
    info = next((c.info for c in cells if c.info), {})
    torch_line = (f"torch {info.get('torch')}, CUDA {info.get('cuda')} (torch's), device {info.get('device')}."
                  if info else "torch: no cell reported its versions.")
    lines = [*header, torch_line, "", *render_table(cells), ""]
    for cell in cells:
        extra = {k: cell.info[k] for k in ("allocator", "child_exits") if k in cell.info}
        if extra:
            lines.append(f"- {cell.workload}/{cell.mode}: {json.dumps(extra)}")
    lines += ["", last]
    return passed, lines


def versions() -> str:
    try:
        driver = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                                capture_output=True, text=True, timeout=30, check=False).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        driver = "nvidia-smi not available"
    return driver or "nvidia-smi printed nothing"


def main(argv: list[str]) -> int:
    if len(argv) > 2 or (len(argv) == 2 and argv[1] in ("-h", "--help")):
        print(__doc__)
        return 2
    out = Path(argv[1]) if len(argv) == 2 else Path(os.environ.get("OUT", "/tmp/otel-gpu-out")) / "h200-do-no-harm.md"
    workloads, problem = parse_list(os.environ.get("HARM_WORKLOADS", ",".join(WORKLOADS)), WORKLOADS,
                                    "HARM_WORKLOADS")
    modes, mode_problem = parse_list(os.environ.get("HARM_MODES", "plain,inert,agent"), tuple(MODE_SETUP),
                                     "HARM_MODES")
    cache = os.environ.get("HARM_COMPILE_CACHE", "shared")
    problems = [p for p in (problem, mode_problem) if p]
    if modes and modes[0] != "plain":
        problems.append("HARM_MODES must start with plain (the reference of every other mode)")
    if cache not in ("shared", "cell"):
        problems.append(f"HARM_COMPILE_CACHE must be shared or cell, not {cache!r}")
    try:
        seconds = float(os.environ.get("HARM_SECONDS", f"{DEFAULT_SECONDS:g}"))
    except ValueError:
        seconds = -1.0
    if seconds <= 0:
        problems.append("HARM_SECONDS must be a positive number of seconds")
    if problems:
        print("\n".join(problems))
        return 2
    sys.path.insert(0, str(REPO))
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from verify_gpu_time import pinned_to, write_report

    cpus = sorted(os.sched_getaffinity(0))
    # the agent on two CPUs of its own, the workload (and its compile and loader workers) on the rest
    agent_cpus, workload_cpus = (set(cpus[:2]), set(cpus[2:])) if len(cpus) >= 6 else (None, None)
    work = Path(tempfile.mkdtemp(prefix="otel-gpu-harm-"))
    (work / "child.py").write_text(CHILD)
    harm_dir = out.parent / "harm"
    harm_dir.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p))
    env.pop("CUDA_INJECTION64_PATH", None)

    def on_sigterm(signum: int, frame: object) -> None:
        raise Stopped()

    signal.signal(signal.SIGTERM, on_sigterm)
    planned = [(w, m) for w in workloads for m in modes]  # a workload's cells back to back, plain first
    settings = (f"HARM_SECONDS={seconds:g}, HARM_WORKLOADS={','.join(workloads)}, HARM_MODES={','.join(modes)}, "
                f"HARM_COMPILE_CACHE={cache}")
    pinning = (f"Workloads pinned to CPUs {sorted(workload_cpus) if workload_cpus else 'all'}, the agent to "
               f"{sorted(agent_cpus) if agent_cpus else 'all'}")
    header = ["## Do no harm: PyTorch workloads plain, injected, and with the agent attaching "
              "(scripts/h200/do_no_harm.py)", "",
              f"Command: `{' '.join(shlex.quote(a) for a in argv)}` with {settings}; "
              f"{time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}.",
              f"{pinning}; agent mode: `otel-gpu run` for {AGENT_RUN_S:g} s, {AGENT_PAUSE_S:g} s apart, from the "
              "workload's CUDA initialisation to its exit. XIDs: the agent's hw.errors{error.type=xid} files and its "
              "log, and new `NVRM: Xid` lines "
              "in the kernel log. loops/s is informational (not judged).", "",
              f"GPU and driver: {versions()}."]
    cells: list[Cell] = []
    started = time.monotonic()
    try:
        for k, (workload, mode) in enumerate(planned):
            cell = run_cell(workload, mode, seconds=seconds, work=work, harm_dir=harm_dir, env=env,
                            workload_preexec=pinned_to(workload_cpus), agent_preexec=pinned_to(agent_cpus),
                            cache=cache)
            cells.append(cell)
            reasons = verdict(cell, _plain_of(cells, workload))
            print(f"[{k + 1}/{len(planned)} {time.monotonic() - started:.0f} s] {progress(cell, reasons)}",
                  flush=True)
            _, lines = report_lines(cells, len(planned), header)
            out.write_text("\n".join(lines) + "\n")  # a partial report survives a kill
    except Stopped:
        print("stopped by SIGTERM; the report covers the cells that finished", flush=True)
    passed, lines = report_lines(cells, len(planned), header)
    write_report(out, lines)
    (out.parent / "results.json").write_text(json.dumps(
        {"passed": passed, "planned": [f"{w}/{m}" for w, m in planned], "seconds": seconds,
         "cells": [dict(dataclasses.asdict(c), verdict=verdict(c, _plain_of(cells, c.workload)),
                        loops_per_s=c.loops_per_s) for c in cells]}, indent=1, default=str))
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
