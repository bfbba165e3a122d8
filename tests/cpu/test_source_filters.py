# SPDX-License-Identifier: Apache-2.0
"""CPUProfileSource's user-space side with a fed sampler: container and name filters, identity of processes that
already exited, kernel frames before user frames, merging, lost stacks."""

from __future__ import annotations

from otel_gpu.config import ProfilingConfig
from otel_gpu.cpu.sampler import StackCount
from otel_gpu.cpu.source import CPUProfileSource
from otel_gpu.procfs import ProcessInfo, ProcessResolver
from otel_gpu.profiles.model import FrameKind
from otel_gpu.symbolize.symbolizer import Symbolizer

CONTAINER = "ab" * 32


class FedSampler:
    """Stands in for the eBPF sampler: returns the samples it was given."""

    frequency_hz = 19
    attached_ns = 0

    def __init__(self, samples: list[StackCount]) -> None:
        self.samples = samples
        self.opened = self.closed = 0

    def open(self) -> None:
        self.opened += 1

    def close(self) -> None:
        self.closed += 1

    def drain(self) -> list[StackCount]:
        out, self.samples = self.samples, []
        return out

    def forget(self, pids: object) -> None:
        pass


class KnownProcesses(ProcessResolver):
    """A resolver that knows two live processes (one in a container) and nothing else."""

    def info(self, pid: int) -> ProcessInfo | None:
        return {
            1001: ProcessInfo(1001, "trainer", "/usr/bin/trainer", container_id=CONTAINER, service_name="train"),
            1002: ProcessInfo(1002, "web", "/usr/bin/web", service_name="web"),
        }.get(pid)


def _source(config: ProfilingConfig, samples: list[StackCount], tmp_path) -> CPUProfileSource:  # type: ignore[no-untyped-def]
    kallsyms = tmp_path / "kallsyms"
    kallsyms.write_text("ffffffff81000000 T do_syscall_64\nffffffff81001000 T vfs_write\n")
    symbolizer = Symbolizer(proc_root=str(tmp_path / "proc"), kallsyms_path=str(kallsyms))
    return CPUProfileSource(config, KnownProcesses(), symbolizer=symbolizer,
                            sampler=FedSampler(samples))  # type: ignore[arg-type]


SAMPLES = [
    StackCount(1001, 1001, "trainer", 5, (0x1000, 0x2000), ()),
    StackCount(1001, 1003, "loader", 2, (0x1000,), (0xFFFFFFFF81001010, 0xFFFFFFFF81000010)),
    StackCount(1002, 1002, "web", 3, (), (), user_stack_lost=True),
    StackCount(4242, 4243, "gone-worker", 7, (0x5000,), ()),  # exited before the drain, never resolved
]


def test_all_processes_with_identity_and_fallback_to_the_kernel_thread_name(tmp_path) -> None:  # type: ignore[no-untyped-def]
    source = _source(ProfilingConfig(), list(SAMPLES), tmp_path)
    source.open()
    (batch,) = source.drain()
    by_pid = {p.process.pid: p for p in batch.processes}
    assert set(by_pid) == {1001, 1002, 4242}
    assert by_pid[1001].process.container_id == CONTAINER
    assert by_pid[4242].process.executable_name == "gone-worker"
    assert batch.type.period == round(1e9 / 19) and batch.type.sample_type == "samples"
    loader = next(s for s in by_pid[1001].samples if s.thread_id == 1003)
    assert loader.thread_name == "loader" and loader.value == 2
    assert [f.kind for f in loader.frames] == [FrameKind.KERNEL, FrameKind.KERNEL, FrameKind.NATIVE]
    assert [f.function for f in loader.frames[:2]] == ["vfs_write", "do_syscall_64"]
    (lost,) = by_pid[1002].samples
    assert lost.frames[0].function == "[unknown]" and lost.value == 3
    assert source.drain()[0].processes == ()  # drained once
    source.close()


def test_container_filter_keeps_only_that_container(tmp_path) -> None:  # type: ignore[no-untyped-def]
    (batch,) = _source(ProfilingConfig(container_id=CONTAINER[:12]), list(SAMPLES), tmp_path).drain()
    assert [p.process.pid for p in batch.processes] == [1001]


def test_name_filter_matches_executable_or_thread_names(tmp_path) -> None:  # type: ignore[no-untyped-def]
    (batch,) = _source(ProfilingConfig(process_name="^(web|gone-.*)$"), list(SAMPLES), tmp_path).drain()
    assert sorted(p.process.pid for p in batch.processes) == [1002, 4242]


def test_same_frames_of_one_thread_are_merged(tmp_path) -> None:  # type: ignore[no-untyped-def]
    samples = [StackCount(1002, 1002, "web", 2, (0x10,), ()), StackCount(1002, 1002, "web", 3, (0x10,), ())]
    (process,) = _source(ProfilingConfig(), samples, tmp_path).drain()[0].processes
    assert [s.value for s in process.samples] == [5]
