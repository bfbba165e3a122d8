# SPDX-License-Identifier: Apache-2.0
"""The GPU machine's do-no-harm suite (scripts/h200/do_no_harm.py), checked before device time is spent on it: it
loads without torch, its child program compiles, bad settings exit 2, and its bookkeeping is right: each cell's
verdict, the XIDs read from a real agent's output folder and log, the library's lines, the report's table."""

from __future__ import annotations

import dataclasses
import io
import json
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any
from unittest import mock

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from otel_gpu.cuda import inject
from otel_gpu.gpu.model import GPUInfo, GPUSnapshot, XIDErrors
from otel_gpu.metrics.files import JsonLinesMetricExporter
from otel_gpu.metrics.gpu_instruments import register_gpu_instruments
from tests import h200_scripts
from tests.conftest import REPO
from tests.gpu.conftest import FAKE_NVML_DIR, UUIDS, build_fake_nvml

SCRIPT = h200_scripts.SCRIPTS / "do_no_harm.py"
GPU0 = GPUInfo(index=0, uuid="GPU-aaaa", name="NVIDIA H200", pci_bus_id="00000000:18:00.0")
GPU1 = GPUInfo(index=1, uuid="GPU-bbbb", name="NVIDIA H200", pci_bus_id="00000000:2A:00.0")


@pytest.fixture(scope="module")
def harm() -> ModuleType:
    return h200_scripts.load("do_no_harm")


def test_the_child_program_compiles_and_defines_every_workload(harm: ModuleType) -> None:
    code = compile(harm.CHILD, "child.py", "exec")
    assert "WORKLOADS" in code.co_names
    dispatch = harm.CHILD[harm.CHILD.index("WORKLOADS = {"):]
    for workload in harm.WORKLOADS:
        assert f'"{workload}":' in dispatch
    assert {"plain", "inert", "agent", "agent_old"} <= set(harm.MODE_SETUP)


@pytest.mark.parametrize(("env", "message"), [
    ({"HARM_WORKLOADS": "eager,conv"}, "HARM_WORKLOADS: unknown conv"),
    ({"HARM_MODES": "inert,plain"}, "HARM_MODES must start with plain"),
    ({"HARM_MODES": "plain,agnet"}, "HARM_MODES: unknown agnet"),
    ({"HARM_SECONDS": "soon"}, "HARM_SECONDS must be a positive number"),
    ({"HARM_COMPILE_CACHE": "none"}, "HARM_COMPILE_CACHE must be shared or cell"),
])
def test_bad_settings_exit_2_before_anything_runs(tmp_path: Path, env: dict[str, str], message: str) -> None:
    done = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path / "r.md")], capture_output=True, text=True,
                          timeout=60, check=False, env=dict(os.environ, **env))
    assert done.returncode == 2 and message in done.stdout
    assert not (tmp_path / "r.md").exists()


def test_the_agent_command_line_is_one_the_cli_accepts(harm: ModuleType, tmp_path: Path) -> None:
    argv = harm.agent_argv(tmp_path / "out")
    done = subprocess.run([*argv[:3], "config", *argv[4:]], capture_output=True, text=True, timeout=60, check=False,
                          cwd=REPO)
    assert done.returncode == 0, done.stderr


# --- verdicts ------------------------------------------------------------------------------------------------------


def _cell(harm: ModuleType, workload: str = "eager", mode: str = "agent", **changes: Any) -> Any:
    cell = harm.Cell(workload, mode, exit_code=0, loops=120, seconds=12.0, checksum="c0ffee",
                     kernel_counts=[800, 800] if workload == "profiler" else [],
                     agent_runs=3 if mode.startswith("agent") else 0,
                     agent_attached=3 if mode.startswith("agent") else 0, kernel_log_xids=0)
    return dataclasses.replace(cell, **changes)


def test_a_cell_like_plain_passes(harm: ModuleType) -> None:
    plain = _cell(harm, mode="plain")
    assert harm.verdict(plain, plain) == []
    assert harm.verdict(_cell(harm, mode="inert"), plain) == []
    assert harm.verdict(_cell(harm, mode="agent"), plain) == []
    profiled = _cell(harm, "profiler", "plain")
    assert harm.verdict(_cell(harm, "profiler", "agent", kernel_counts=[800, 800, 800]), profiled) == []
    assert harm.verdict(_cell(harm, mode="inert", kernel_log_xids=None), plain) == []  # no kernel log: no evidence


@pytest.mark.parametrize(("changes", "reason"), [
    ({"exit_code": 1}, "exit 1"),
    ({"exit_code": -11}, "exit -11"),
    ({"exit_code": None}, "timed out"),
    ({"checksum": "bad"}, "checksum differs from plain"),
    ({"checksum": None}, "no checksum"),
    ({"agent_xids": 1}, "1 XID"),
    ({"kernel_log_xids": 2}, "2 XID"),
    ({"agent_attached": 0}, "the agent never attached"),
    ({"agent_failures": ["run 1 exit 1"]}, "agent runs failed: run 1 exit 1"),
])
def test_each_failure_fails_the_cell(harm: ModuleType, changes: dict[str, object], reason: str) -> None:
    plain = _cell(harm, mode="plain")
    assert harm.verdict(_cell(harm, **changes), plain) == [reason]


def test_an_agent_run_stopped_before_its_handler_was_installed_is_no_failure(harm: ModuleType) -> None:
    assert harm.agent_run_failure(0, stopped=False) == "" and harm.agent_run_failure(0, stopped=True) == ""
    assert harm.agent_run_failure(-15, stopped=True) == ""  # SIGTERM while it was still importing
    assert harm.agent_run_failure(-15, stopped=False) == "exit -15"
    assert harm.agent_run_failure(1, stopped=True) == "exit 1"
    assert harm.agent_run_failure(None, stopped=False) == "killed"


def test_plain_cell_failures_fail_every_mode_of_its_workload(harm: ModuleType) -> None:
    plain = _cell(harm, mode="plain", exit_code=1, checksum=None)
    assert harm.verdict(plain, plain) == ["exit 1", "no plain checksum to compare with"]
    assert harm.verdict(_cell(harm), plain) == ["no plain checksum to compare with"]
    assert harm.verdict(_cell(harm), None) == ["no plain checksum to compare with"]


def test_profiler_kernel_counts_must_match_plain_in_every_block(harm: ModuleType) -> None:
    plain = _cell(harm, "profiler", "plain")
    # the reported bug: torch.profiler inside an injected program saw no kernels
    assert harm.verdict(_cell(harm, "profiler", kernel_counts=[800, 0, 800]), plain) == [
        "profiler kernel counts differ from plain (800)"]
    assert harm.verdict(_cell(harm, "profiler", kernel_counts=[]), plain) == ["no profiled block"]
    blind = _cell(harm, "profiler", "plain", kernel_counts=[0, 0])
    assert harm.verdict(_cell(harm, "profiler", kernel_counts=[0, 0]), blind) == [
        "the plain cell's profiler saw no kernels"]
    # the counts matter only for the profiler workload
    assert harm.verdict(_cell(harm, kernel_counts=[1]), _cell(harm, mode="plain")) == []


def test_overall_needs_every_planned_cell_to_pass(harm: ModuleType) -> None:
    cells = [_cell(harm, mode="plain"), _cell(harm, mode="inert"), _cell(harm)]
    assert harm.overall(cells, 3) == (True, "Overall: PASS (3 of 3 cells passed)")
    assert harm.overall(cells, 4) == (False, "Overall: FAIL (3 of 4 cells passed; 1 not run)")
    cells[2].checksum = "other"
    assert harm.overall(cells, 3) == (False, "Overall: FAIL (2 of 3 cells passed; failed: eager/agent)")


# --- XIDs and the library's lines ---------------------------------------------------------------------------------


@dataclasses.dataclass
class FakeGPUSource:
    """What register_gpu_instruments reads: one snapshot per GPU (with ECC errors, also under hw.errors) and the
    XID watcher's counts."""

    xids: tuple[XIDErrors, ...] = ()

    def snapshots(self, fresh_within_s: float | None = None) -> tuple[GPUSnapshot, ...]:
        return tuple(GPUSnapshot(info=info, time_s=1.0, ecc_corrected_errors=7, ecc_uncorrected_errors=1)
                     for info in (GPU0, GPU1))

    def xid_errors(self) -> tuple[XIDErrors, ...]:
        return self.xids


def _export(source: FakeGPUSource, exporter: JsonLinesMetricExporter) -> None:
    """One collection of the agent's real GPU instruments written by the agent's real files exporter."""
    reader = InMemoryMetricReader()
    register_gpu_instruments(MeterProvider(metric_readers=[reader]).get_meter("otel_gpu.gpu"), source)
    exporter.export(reader.get_metrics_data())


def test_xids_are_the_last_values_of_the_xid_series_in_the_metric_files(harm: ModuleType, tmp_path: Path) -> None:
    exporter = JsonLinesMetricExporter(tmp_path)
    source = FakeGPUSource()
    _export(source, exporter)
    assert harm.xids_in_output_dir(tmp_path) == {}  # ECC errors are hw.errors too, but not XIDs
    source.xids = (XIDErrors(GPU0, 31, 1, 1.0),)
    _export(source, exporter)
    source.xids = (XIDErrors(GPU0, 31, 2, 2.0), XIDErrors(GPU1, 79, 1, 2.0))
    _export(source, exporter)
    _export(source, exporter)  # a cumulative counter: the same total again is no new XID
    assert harm.xids_in_output_dir(tmp_path) == {("GPU-aaaa", 31): 2, ("GPU-bbbb", 79): 1}
    assert harm.agent_run_xids(tmp_path, "") == 3
    assert harm.xids_in_output_dir(tmp_path / "missing") == {}


def test_xids_are_also_read_from_the_rotated_metric_file(harm: ModuleType, tmp_path: Path) -> None:
    exporter = JsonLinesMetricExporter(tmp_path, max_file_bytes=1)  # every export rotates
    _export(FakeGPUSource((XIDErrors(GPU1, 43, 1, 1.0),)), exporter)
    assert not exporter.path.exists() and exporter.rotated_path.exists()
    assert harm.xids_in_output_dir(tmp_path) == {("GPU-bbbb", 43): 1}


def test_xids_from_a_real_agent_run_on_the_fake_nvml(harm: ModuleType, tmp_path: Path) -> None:
    # the suite's own agent command line (GPU-time profiling off: it needs root and BPF), the fake NVML delivering
    # XID 31 on GPU 1 a second in: the output folder and the log are exactly what the GPU machine's agent writes
    build_fake_nvml()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "FAKE_NVML_"))}
    env.update(LD_LIBRARY_PATH=str(FAKE_NVML_DIR), FAKE_NVML_XID="1:31@1.0")
    output = tmp_path / "run0"
    argv = [*harm.agent_argv(output, run_s=3), "--no-gpu-time-profiling"]
    done = subprocess.run(argv, check=False, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert harm.xids_in_agent_log(done.stderr) == [31]
    assert harm.xids_in_output_dir(output) == {(UUIDS[1], 31): 1}
    assert harm.agent_run_xids(output, done.stderr) == 1
    assert harm.XID_WATCH_OFF not in done.stderr


def test_agent_run_xids_take_the_log_when_the_files_missed_them(harm: ModuleType, tmp_path: Path) -> None:
    log = ("2026-12-03 10:00:00,000 ERROR otel_gpu.gpu.events: XID 31 on GPU 0 (NVIDIA H200, GPU-aaaa, "
           "00000000:18:00.0); see NVIDIA's XID catalog for the action it calls for\n"
           "2026-12-03 10:00:00,000 WARNING otel_gpu.gpu.events: XID events are off: cannot create an NVML event set\n")
    assert harm.xids_in_agent_log(log) == [31]
    assert harm.agent_run_xids(tmp_path, log) == 1


def test_kernel_log_xid_lines(harm: ModuleType) -> None:
    before = harm.kernel_log_xid_lines("[ 10.0] eth0: link up\n[ 12.5] NVRM: Xid (PCI:0000:18:00): 79, GPU fell off\n")
    after = harm.kernel_log_xid_lines("[ 12.5] NVRM: Xid (PCI:0000:18:00): 79, GPU fell off\n"
                                      "[ 99.1] NVRM: Xid (PCI:0000:18:00): 31, pid=4242, Ch 00000008, "
                                      "MMU Fault\n")
    assert len(after - before) == 1


def _wrapper_stderr(library: Path) -> str:
    """What `otel-gpu inject --overhead-budget 2` writes itself before the workload's output."""
    err = io.StringIO()
    with mock.patch.object(inject, "library_path", return_value=library), \
            mock.patch.object(inject.subprocess, "Popen") as run:
        run.return_value.poll.return_value = run.return_value.returncode = 0  # the workload has exited with 0
        inject.run_injected(["true"], environ={"PATH": os.defpath}, stderr=err, overhead_budget=0.02)
    assert err.getvalue().count("\n") == 2
    return err.getvalue()


def test_library_messages_leave_out_the_inject_wrappers_lines(harm: ModuleType) -> None:
    stderr = (_wrapper_stderr(Path("/opt/otel-gpu/libotel_gpu_inject.so"))
              + "Traceback (most recent call last):\n"
              + "otel-gpu: CUPTI is in use by another tool; GPU-time profiling waits until it is free\n" * 2
              + "otel-gpu: cannot load CUPTI (x); GPU-time profiling is off for this process\n")
    assert harm.library_messages(stderr) == [
        "otel-gpu: CUPTI is in use by another tool; GPU-time profiling waits until it is free (x2)",
        "otel-gpu: cannot load CUPTI (x); GPU-time profiling is off for this process"]
    assert harm.library_messages(_wrapper_stderr(Path("/x.so"))) == []


# --- the report -----------------------------------------------------------------------------------------------------


def test_the_table_has_one_row_per_cell_with_its_verdict(harm: ModuleType) -> None:
    cells = [
        _cell(harm, "profiler", "plain", checksum="a" * 64, loops=6000, seconds=12.0, kernel_counts=[800] * 3),
        _cell(harm, "profiler", "inert", checksum="a" * 64, kernel_counts=[800, 800, 800]),
        _cell(harm, "profiler", "agent", checksum="b" * 64, kernel_counts=[800, 0], agent_xids=1,
              messages=["otel-gpu: CUPTI is in use by another tool | kineto (x2)"]),
        _cell(harm, "eager", "plain", exit_code=None, checksum=None, seconds=0.0, kernel_log_xids=None),
    ]
    lines = harm.render_table(cells)
    assert len(lines) == 2 + len(cells)
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    assert header[:6] == ["workload", "mode", "exit", "loops/s", "checksum match", "XIDs"]
    assert header[-3:] == ["profiler kernel counts", "library messages", "verdict"]
    rows = [[c.strip() for c in line.strip("|").split(" | ")] for line in lines[2:]]
    assert all(len(row) == len(header) for row in rows)  # the message's "|" is escaped
    plain, inert, agent, eager = (dict(zip(header, row)) for row in rows)
    assert plain["loops/s"] == "500.0" and plain["checksum match"] == "reference aaaaaaaaaaaa"
    assert plain["profiler kernel counts"] == "800 (x3)" and plain["verdict"] == "PASS"
    assert inert["checksum match"] == "yes aaaaaaaaaaaa" and inert["XIDs"] == "kernel log 0"
    assert inert["verdict"] == "PASS"
    assert agent["checksum match"] == "NO bbbbbbbbbbbb" and agent["XIDs"] == "agent 1, kernel log 0"
    assert agent["profiler kernel counts"] == "800, 0" and agent["agent attached / runs"] == "3 / 3"
    assert agent["library messages"] == "otel-gpu: CUPTI is in use by another tool \\| kineto (x2)"
    assert agent["verdict"] == ("FAIL: checksum differs from plain; 1 XID; "
                                "profiler kernel counts differ from plain (800)")
    assert eager["exit"] == "timeout" and eager["loops/s"] == "-" and eager["XIDs"] == "kernel log n/a"
    assert eager["verdict"] == "FAIL: timed out; no plain checksum to compare with"


def test_report_lines_name_torch_and_end_with_the_overall_line(harm: ModuleType) -> None:
    info = {"torch": "2.11.0+cu130", "cuda": "13.0", "device": "NVIDIA H200", "child_exits": [0, 0]}
    cells = [_cell(harm, "fork_after_init", "plain", info=info), _cell(harm, "fork_after_init", "inert")]
    passed, lines = harm.report_lines(cells, 2, ["## title"])
    assert passed and lines[0] == "## title"
    assert "torch 2.11.0+cu130, CUDA 13.0 (torch's), device NVIDIA H200." in lines
    assert '- fork_after_init/plain: {"child_exits": [0, 0]}' in lines
    assert lines[-1] == "Overall: PASS (2 of 2 cells passed)"
    json.dumps([dataclasses.asdict(c) for c in cells])  # results.json takes the cells as they are
