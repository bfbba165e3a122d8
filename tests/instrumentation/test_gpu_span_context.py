# SPDX-License-Identifier: Apache-2.0
"""The injected library (real, on the fake CUDA stack) puts the span a launch or wait happened in on its record."""

from __future__ import annotations

import sys
from pathlib import Path


from otel_gpu.cuda import abi
from tests.cuda.test_native_inject import (
    FAKES,
    NATIVE_LIB,
    PY_WORKLOAD,
    python_frames,
    read_debug_file,
    run_workload,
)

SPAN_WORKLOAD = Path(__file__).parent / "span_workload.py"
PLACES = {"outside": "", "in_outer": "outer", "in_inner": "inner"}
THREADS = {"worker_a": "a", "worker_b": "b"}


def _where(stack: abi.StackC) -> tuple[str, str]:
    """(place, thread) from the record's Python frames."""
    names = [name for name, _, _ in python_frames(stack)]
    place = next(PLACES[n] for n in names if n in PLACES)
    thread = next(THREADS[n] for n in names if n in THREADS)
    return place, thread


def _ids(span: abi.SpanC) -> tuple[str, str]:
    return bytes(span.trace_id).hex(), bytes(span.span_id).hex()


def test_launches_and_waits_carry_the_span_they_were_made_in(tmp_path: Path) -> None:
    lib = tmp_path / "inject-under-test.so"  # a private copy: no agent elsewhere on the machine attaches to it
    lib.write_bytes(NATIVE_LIB.read_bytes())
    run = run_workload(
        lib,
        tmp_path,
        [sys.executable, str(SPAN_WORKLOAD), str(FAKES / "libcuda.so.1"), str(PY_WORKLOAD), "--steps", "150"],
    )
    spans: dict[str, tuple[str, str]] = {}  # span id -> (name, trace id)
    for line in run.stdout.splitlines():
        _, name, trace_id, span_id, profile_id = line.split()
        spans[span_id] = (name, trace_id)
        assert (profile_id == span_id) == name.startswith("outer-")  # local roots carry pyroscope.profile.id
    records = read_debug_file(tmp_path / "records.bin")
    checked: dict[str, int] = {}
    for rec in [*records.launches, *records.syncs]:
        place, thread = _where(rec.stack)
        trace_id, span_id = _ids(rec.span)
        kind = "launch" if isinstance(rec, abi.LaunchC) else "sync"
        if not place:
            assert (trace_id, span_id) == ("0" * 32, "0" * 16)
        else:
            assert spans[span_id] == (f"{place}-{thread}", trace_id)
        checked[f"{kind} {place or 'outside'}"] = checked.get(f"{kind} {place or 'outside'}", 0) + 1
    for kind in ("launch", "sync"):
        for place in ("outside", "outer", "inner"):
            assert checked.get(f"{kind} {place}", 0) > 0, checked


def test_a_process_without_the_module_records_no_span(tmp_path: Path) -> None:
    lib = tmp_path / "inject-under-test.so"
    lib.write_bytes(NATIVE_LIB.read_bytes())
    run_workload(lib, tmp_path, [sys.executable, str(PY_WORKLOAD), str(FAKES / "libcuda.so.1"), "--steps", "50"])
    records = read_debug_file(tmp_path / "records.bin")
    assert records.launches and records.syncs
    assert all(not any(bytes(rec.span)) for rec in [*records.launches, *records.syncs])
