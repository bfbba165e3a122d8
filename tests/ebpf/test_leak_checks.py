# SPDX-License-Identifier: Apache-2.0
"""The no-leak checks of the BPF tests on a node where another otel-gpu instance holds the same programs: they pass
after a close, and still catch an object that was not closed."""

from __future__ import annotations

import os

import pytest

from otel_gpu.ebpf.loader import BPFObject, program_path
from tests.ebpf.helpers import BPFLoads, held_by, loaded_programs, still_loaded

pytestmark = pytest.mark.root

NAMES = {"on_cpu_sample", "count_uprobe", "count_usdt", "otel_gpu_launch", "otel_gpu_sync", "otel_gpu_window",
         "otel_gpu_activi"}


def test_another_instance_holds_programs_with_our_names(other_agent: dict[int, str]) -> None:
    """The condition under which the old check ("no program with our names loaded anywhere") failed."""
    assert set(other_agent.values()) == NAMES
    assert NAMES <= set(loaded_programs().values())
    assert not set(other_agent) & set(held_by(os.getpid()))


def test_close_passes_the_check_beside_another_instance(other_agent: dict[int, str], bpf_loads: BPFLoads) -> None:
    with BPFObject(program_path("cpu_profiler"), rodata={"self_tgid": os.getpid()}) as bpf:
        bpf.attach_perf_event("on_cpu_sample", frequency_hz=19)
        mine = bpf.program_ids()
        assert bpf_loads.names() == {"on_cpu_sample"}
        assert bpf_loads.leaked() == {mine["on_cpu_sample"]: "on_cpu_sample"}
        assert not set(mine.values()) & set(other_agent)
    assert bpf.program_ids() == {}
    assert bpf_loads.leaked() == {}
    assert still_loaded(other_agent) == other_agent


def test_an_object_not_closed_is_caught(other_agent: dict[int, str], bpf_loads: BPFLoads) -> None:
    leaked = BPFObject(program_path("probe_counter"))
    try:
        ids = {i: name[:15] for name, i in leaked.program_ids().items()}
        assert bpf_loads.leaked() == ids and set(ids.values()) == {"count_uprobe", "count_usdt"}
    finally:
        leaked.close()
    assert bpf_loads.leaked() == {}


def test_a_program_fd_kept_outside_any_recorded_object_is_caught(bpf_loads: BPFLoads) -> None:
    """A program whose fd is kept by this process but that no recorded object owns (e.g. a construction that
    failed half-way) is still found: the check also counts what this process newly holds."""
    from otel_gpu.ebpf import _libbpf

    lib = _libbpf.lib()
    bpf = BPFObject(program_path("probe_counter"))
    ids = bpf.program_ids()
    bpf_loads.programs.clear()  # as if the object had never been recorded
    kept = os.dup(lib.bpf_program__fd(lib.bpf_object__find_program_by_name(bpf._obj, b"count_uprobe")))
    bpf.close()
    try:
        assert bpf_loads.leaked() == {ids["count_uprobe"]: "count_uprobe"}
    finally:
        os.close(kept)
    assert bpf_loads.leaked() == {}
