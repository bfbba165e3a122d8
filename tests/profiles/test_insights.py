# SPDX-License-Identifier: Apache-2.0
"""The straggler insight over sync_wait batches built by hand: its rules at their edges, the line, and where the
terminal summary and the local summary file put it."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from otel_gpu import semconv
from otel_gpu.exporters.console import ConsoleProfileExporter
from otel_gpu.exporters.files import SUMMARY, FilesProfileExporter
from otel_gpu.procfs import ProcessInfo
from otel_gpu.profiles.insights import STRAGGLER_MAX_RATIO, find_straggler, straggler_line
from otel_gpu.profiles.model import (Frame, FrameKind, Mapping, ProcessProfile, ProfileBatch, Sample,
                                     gpu_time_profile_type, sync_wait_profile_type)

S = 1_000_000_000
INTERVAL_NS = 10 * S
LIBCUDA = Mapping(0x1000, 0x9000, 0, "/usr/lib/x86_64-linux-gnu/libcuda.so.1")
STACK = (Frame("[cuStreamSynchronize]", FrameKind.CUDA), Frame("cuStreamSynchronize", mapping=LIBCUDA),
         Frame("Driver.call", FrameKind.PYTHON, filename="/w/train.py", line=46),
         Frame("train_step", FrameKind.PYTHON, filename="/w/train.py", line=120),
         Frame("main", FrameKind.PYTHON, filename="/w/train.py", line=200),
         Frame("<module>", FrameKind.PYTHON, filename="/w/train.py", line=210))


def _rank(rank: int, in_collective_ns: float, other_ns: int = S, ranked: bool = True) -> ProcessProfile:
    info = ProcessInfo(pid=100 + rank, executable_name="python3",
                       ranks=((semconv.DISTRIBUTED_RANK, rank),) if ranked else ())
    api = (semconv.CUDA_SYNC_API, "cuStreamSynchronize")
    samples = [Sample(STACK, other_ns, attributes=(api,))]
    if in_collective_ns:
        samples.append(Sample(STACK, round(in_collective_ns), attributes=(api, (semconv.NCCL_COLLECTIVE,
                                                                                "all_reduce"))))
    return ProcessProfile(info, tuple(samples))


def _waits(*processes: ProcessProfile) -> ProfileBatch:
    return ProfileBatch(sync_wait_profile_type(), 0, INTERVAL_NS, processes)


def test_the_rank_the_others_wait_for_is_named_with_the_line_they_wait_at() -> None:
    batch = _waits(_rank(0, 4 * S), _rank(1, 0.1 * S), _rank(2, 5 * S), _rank(3, 4.5 * S))
    found = find_straggler(batch)
    assert found is not None and (found.rank, found.pid, found.others) == (1, 101, (0, 2, 3))
    assert found.others_median_ns == 4.5 * S and found.collective == "all_reduce"
    assert found.site == "Driver.call (train.py:46) <- train_step (train.py:120) <- main (train.py:200)"
    assert straggler_line(batch) == (
        "insight: straggler rank 1 (pid 101): ranks 0, 2, 3 waited a median 4.50 s in all_reduce at Driver.call "
        "(train.py:46) <- train_step (train.py:120) <- main (train.py:200), rank 1 0.10 s (named when at most 0.5x "
        "the others' median and 20% of the 10.0 s interval less)")


def test_native_stacks_name_the_callers_of_the_cuda_libraries() -> None:
    native = (STACK[0], STACK[1], Frame("sync_point"), Frame("train_step"), Frame("run_rank"), Frame("main"))
    info = ProcessInfo(pid=7, executable_name="ranks", ranks=((semconv.DISTRIBUTED_RANK, 0),))
    slow = ProcessInfo(pid=8, executable_name="ranks", ranks=((semconv.DISTRIBUTED_RANK, 1),))
    sample = Sample(native, 3 * S, attributes=((semconv.NCCL_COLLECTIVE, "all_gather"),))
    found = find_straggler(_waits(ProcessProfile(info, (sample,)), ProcessProfile(slow, (Sample(native, S),))))
    assert found is not None and found.rank == 1 and found.collective == "all_gather"
    assert found.site == "sync_point <- train_step <- run_rank"


@pytest.mark.parametrize("batch", [
    _waits(_rank(0, 4 * S), _rank(1, 4.2 * S), _rank(2, 3.9 * S)),  # balanced
    _waits(_rank(0, 4 * S), _rank(1, 4 * S * STRAGGLER_MAX_RATIO + S // 100)),  # just over the ratio
    _waits(_rank(0, 2 * S), _rank(1, 0.04 * S)),  # under a fifth of the interval apart
    _waits(_rank(0, 4 * S)),  # one rank
    _waits(_rank(0, 4 * S, ranked=False), _rank(1, 0, ranked=False)),  # not a distributed job
    _waits(_rank(0, 0), _rank(1, 0)),  # no collectives
    ProfileBatch(gpu_time_profile_type(), 0, INTERVAL_NS, (_rank(0, 4 * S), _rank(1, 0))),  # not waits
])
def test_no_straggler_is_named(batch: ProfileBatch) -> None:
    assert find_straggler(batch) is None and straggler_line(batch) == ""


def test_just_within_the_ratio_is_named() -> None:
    assert find_straggler(_waits(_rank(0, 4 * S), _rank(1, 4 * S * STRAGGLER_MAX_RATIO))) is not None


def test_the_terminal_and_the_summary_file_carry_the_line(tmp_path: Path) -> None:
    batch = _waits(_rank(0, 4 * S), _rank(1, 0))
    terminal = io.StringIO()
    assert ConsoleProfileExporter(terminal).export(batch)
    assert terminal.getvalue().splitlines()[-1] == straggler_line(batch)
    assert "python3 rank 1[101] [cuStreamSynchronize] <- cuStreamSynchronize <- Driver.call" in terminal.getvalue()
    files = FilesProfileExporter(str(tmp_path))
    assert files.export(batch) and files.export(_waits(_rank(0, 1), _rank(1, 1))) and files.export(batch)
    lines = (tmp_path / SUMMARY).read_text().splitlines()
    assert lines == [f"1970-01-01T00:00:00Z {straggler_line(batch)}"] * 2  # one per interval that has one


def test_the_summary_file_states_the_gpu_time_not_measured(tmp_path: Path) -> None:
    import dataclasses

    from otel_gpu.profiles.insights import unmeasured_line
    from tests.profiles import batches

    gpu = batches.gpu_batch()
    other = ProcessProfile(batches.OTHER, (), (("otel_gpu.gpu_time.yielded", 4.0),))
    batch = dataclasses.replace(gpu, processes=(*gpu.processes, other))
    assert unmeasured_line(gpu) == ""
    assert unmeasured_line(batch).startswith("GPU time not measured: 4.0 s in other[77] (another tool")
    FilesProfileExporter(str(tmp_path)).export(batch)
    assert (tmp_path / SUMMARY).read_text().splitlines()[0].endswith(unmeasured_line(batch))
