# SPDX-License-Identifier: Apache-2.0
"""CPUProfileSource: the eBPF CPU sampler turned into symbolized, per-process profile batches.

A :class:`~otel_gpu.profiles.source.ProfileSource`: the agent calls ``open()`` once, ``drain()`` every reporting
interval and ``close()`` on exit (also on errors and SIGTERM). The :class:`ProcessSelection` is applied as early as
it can be: pids in the kernel (``--pid``, and the agent's own tgid unless ``--profile-self``), name pattern and
container id before a process is snapshotted or its stacks symbolized. Identity comes from the shared
:class:`ProcessResolver`, captured when a process is first sampled, so processes that already exited still carry
their executable and container; when even that is missing, the thread name recorded by the kernel names the process.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import defaultdict

from otel_gpu import selfmetrics, semconv
from otel_gpu.config import ProfilingConfig
from otel_gpu.cpu.sampler import SOURCE, CPUSampler, StackCount
from otel_gpu.procfs import ProcessInfo, ProcessResolver
from otel_gpu.profiles.model import Frame, ProcessProfile, ProfileBatch, Sample, cpu_profile_type
from otel_gpu.profiles.source import ProcessSelection
from otel_gpu.symbolize.symbolizer import Symbolizer

_logger = logging.getLogger(__name__)

_UNKNOWN = Frame("[unknown]")


class CPUProfileSource:
    """Samples every CPU's stacks at ``config.frequency_hz``; ``drain() -> [samples batch]``."""

    name = SOURCE

    def __init__(self, config: ProfilingConfig, resolver: ProcessResolver, symbolizer: Symbolizer | None = None,
                 sampler: CPUSampler | None = None, selection: ProcessSelection | None = None) -> None:
        self.config = config
        self._selection = selection or ProcessSelection(config)
        self._resolver = resolver
        self._symbolizer = symbolizer or Symbolizer()
        self._comms: dict[int, str] = {}  # pid -> name when first sampled; written by the sampler's event thread
        self._comms_lock = threading.Lock()
        self._sampler = sampler or CPUSampler(config.frequency_hz, pids=self._selection.pids,
                                              exclude_tgid=0 if config.include_self else os.getpid(),
                                              on_new_process=self._on_new_process)
        self._started_ns = 0

    @property
    def sampler(self) -> CPUSampler:
        return self._sampler

    def open(self) -> None:
        """Load and attach the sampler; raises SourceUnavailable (nothing left attached) when it cannot run."""
        self._sampler.open()
        self._symbolizer.load_kernel_symbols()
        self._started_ns = time.time_ns()

    def stop(self) -> None:
        """Nothing runs in the background that the next drain would miss: the kernel keeps counting until close."""

    def close(self) -> None:
        """Detach and free everything. Idempotent."""
        self._sampler.close()

    def drain(self) -> list[ProfileBatch]:
        """Every sample since the last drain, symbolized, one :class:`ProcessProfile` per process (one batch)."""
        raw = self._sampler.drain()
        now_ns = time.time_ns()
        start_ns, self._started_ns = self._started_ns or now_ns, now_ns
        by_pid: dict[int, list[StackCount]] = defaultdict(list)
        for sample in raw:
            by_pid[sample.pid].append(sample)
        processes = []
        for pid, samples in sorted(by_pid.items()):
            info = self._identity(pid, samples)
            if not self._wanted(info, {s.comm for s in samples}):
                continue
            processes.append(ProcessProfile(info, self._samples(pid, samples)))
        self._symbolizer.prune(by_pid)
        with self._comms_lock:
            known = list(self._comms)
        gone = [p for p in known if p not in by_pid and not os.path.exists(f"/proc/{p}")]
        with self._comms_lock:
            for pid in gone:
                self._comms.pop(pid, None)
        self._sampler.forget(gone)  # a process that reuses the pid gets announced (and snapshotted) again
        return [ProfileBatch(type=cpu_profile_type(self.config.frequency_hz), start_unix_nano=start_ns,
                             duration_nano=max(0, now_ns - start_ns), processes=tuple(processes))]

    # --- internals -------------------------------------------------------------------------------------------------

    def _on_new_process(self, pid: int, comm: str) -> None:
        """Called from the sampler's event thread when a process is sampled for the first time."""
        with self._comms_lock:
            self._comms[pid] = comm
        info = self._resolver.info(pid)  # cache identity while the process exists
        if info is not None and not self._wanted(info, {comm}):
            return  # filtered out by name or container: no need to snapshot it
        if not self._symbolizer.remember(pid):
            selfmetrics.count(semconv.SELF_ERRORS.name, otel_gpu__source=SOURCE,
                              otel_gpu__reason=semconv.Reason.PROCESS_GONE)

    def _identity(self, pid: int, samples: list[StackCount]) -> ProcessInfo:
        info = self._resolver.info(pid) or self._resolver.cached(pid)
        if info is not None:
            return info
        comm = self._comms.get(pid) or next((s.comm for s in samples if s.tid == pid), samples[0].comm)
        return ProcessInfo(pid=pid, executable_name=comm, service_name=comm)

    def _wanted(self, info: ProcessInfo, thread_names: set[str]) -> bool:
        """The selection, with the name the process had when first sampled among its thread names."""
        return self._selection.selects(info, thread_names | {self._comms.get(info.pid, "")})

    def _samples(self, pid: int, samples: list[StackCount]) -> tuple[Sample, ...]:
        stacks = sorted({s.user_stack for s in samples if s.user_stack})
        user_frames = dict(zip(stacks, self._symbolizer.user_stacks(pid, stacks), strict=True))
        merged: dict[tuple[tuple[Frame, ...], int, str, str, str], int] = defaultdict(int)
        for sample in samples:
            frames = self._symbolizer.kernel_stack(sample.kernel_stack) if sample.kernel_stack else ()
            frames += user_frames.get(sample.user_stack, ())
            merged[(frames or (_UNKNOWN,), sample.tid, sample.comm, sample.trace_id, sample.span_id)] += sample.count
        return tuple(Sample(frames, count, thread_id=tid, thread_name=comm, trace_id=trace_id, span_id=span_id)
                     for (frames, tid, comm, trace_id, span_id), count in merged.items())
