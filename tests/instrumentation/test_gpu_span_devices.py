# SPDX-License-Identifier: Apache-2.0
"""Local-root spans carry the devices of the launches the injected library (real, on the fake CUDA stack with two
devices) sampled inside them: `cuda.sampled_devices`, the same ordinals as `cuda.device` on their gpu_time samples."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.cuda.test_native_inject import FAKES, NATIVE_LIB, PY_WORKLOAD, python_frames, read_debug_file, run_workload

DEVICE_WORKLOAD = Path(__file__).parent / "device_span_workload.py"
LAUNCHERS = {"on_device_0": 0, "on_device_1": 1}


def _spans(stdout: str) -> list[tuple[str, str, str, tuple[int, ...]]]:
    """(name, span id, local root id or "-", devices) of every span the workload printed."""
    spans = []
    for line in stdout.splitlines():
        _, name, span_id, root, devices = line.split()
        spans.append((name, span_id, root, tuple(int(d) for d in devices.split(",")) if devices != "-" else ()))
    return spans


def _argv(steps: int) -> list[str]:
    return [sys.executable, str(DEVICE_WORKLOAD), str(FAKES / "libcuda.so.1"), str(PY_WORKLOAD), "--steps", str(steps)]


def test_a_root_carries_exactly_the_devices_of_its_sampled_launches(tmp_path: Path) -> None:
    lib = tmp_path / "inject-under-test.so"  # a private copy: no agent elsewhere on the machine attaches to it
    lib.write_bytes(NATIVE_LIB.read_bytes())
    run = run_workload(lib, tmp_path, _argv(150), extra_env={"FAKE_CUDA_DEVICES": "2"})
    sampled: dict[str, set[int]] = {}  # local root span id -> devices of the sampled launches made inside it
    for rec in read_debug_file(tmp_path / "records.bin").launches:
        root = bytes(rec.span.local_root_span_id).hex()
        device = next(LAUNCHERS[name] for name, _, _ in python_frames(rec.stack) if name in LAUNCHERS)
        sampled.setdefault(root, set()).add(device)
    spans = _spans(run.stdout)
    assert {name for name, *_ in spans} == {"both", "both-child", "only-1", "idle"}
    for name, span_id, root, devices in spans:
        if root == "-":  # a child: never carries devices (its root does)
            assert devices == (), name
        else:
            assert devices == tuple(sorted(sampled.get(span_id, ()))), (name, span_id)
    carried = {(name, devices) for name, _, root, devices in spans if root != "-"}
    assert ("both", (0, 1)) in carried  # a root that launched on both devices, both sampled
    assert {devices for name, devices in carried if name == "only-1"} <= {(), (1,)}
    assert {devices for name, devices in carried if name == "idle"} == {()}


def test_without_the_injected_library_spans_carry_no_devices_and_the_program_runs(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_GPU_", "CUDA_INJECTION"))}
    env["FAKE_CUDA_DEVICES"] = "2"
    proc = subprocess.run(_argv(20), env=env, capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    spans = _spans(proc.stdout)
    assert len(spans) == 4 * 20
    assert all(devices == () for *_, devices in spans)
