# SPDX-License-Identifier: Apache-2.0
"""CPUProfileSource: the eBPF CPU sampler turned into symbolized, per-process profile batches.

A :class:`~otel_gpu.profiles.source.ProfileSource`: the agent calls ``open()`` once, ``drain()`` every reporting
interval and ``close()`` on exit (also on errors and SIGTERM). The :class:`ProcessSelection` is applied as early as
it can be: pids in the kernel (``--pid``, and the agent's own tgid unless ``--profile-self``), name pattern and
container id before a process is snapshotted or its stacks symbolized. Identity comes from the shared
:class:`ProcessResolver`, captured when a process is first sampled, so processes that already exited still carry
their executable and container; when even that is missing, the thread name recorded by the kernel names the process.
A first sample can come before the process execs (a shell's fork, a wrapper script) or before the loader has mapped
libpython: the :class:`ProcessWatch` checks each process again over its first seconds, and an exec makes it looked at
again (selection, native unwinding, Python), as does an exec a drain notices later.
The programs one pid runs are told apart: the kernel announces the first sample after each exec too, and every
sample carries the exec id it was taken under. Each program's identity and mappings are read at its announcement
while /proc still shows that program (its ``arg_start`` in /proc/PID/stat is the one the kernel announced), and its
samples are reported under that identity and symbolized with those mappings, also when they are drained after the
process exec'd into another program. A program /proc no longer showed by then is reported under its thread's name,
its user frames unnamed (counted as ``replaced_by_exec``): never under the next program's name or mappings.
The code objects of each Python stack are read when the walker first stores it (on the same thread, within a share of
one core), so a short job that exits before the drain keeps its Python frames.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import defaultdict
from dataclasses import dataclass

from otel_gpu import selfmetrics, semconv
from otel_gpu._log import once
from otel_gpu.config import ProfilingConfig
from otel_gpu.cpu.python import PythonFrames
from otel_gpu.cpu.sampler import SOURCE, CPUSampler, StackCount
from otel_gpu.cpu.watch import Change, ProcessWatch
from otel_gpu.procfs import ProcessInfo, ProcessResolver
from otel_gpu.profiles.model import Frame, ProcessProfile, ProfileBatch, Sample, cpu_profile_type
from otel_gpu.profiles.source import ProcessSelection
from otel_gpu.symbolize.allowance import READ_BURST_S, READ_SHARE, ReadAllowance
from otel_gpu.symbolize.symbolizer import Symbolizer

_logger = logging.getLogger(__name__)

_UNKNOWN = Frame("[unknown]")
# Reading a new binary's symbol table is the one slow step of a drain (0.3 s for a 150 MB library, minutes for a
# node's worth of them at once); it may use this share of the profiling interval, so a drain never pushes the next
# report late. Frames in files it had no time for are sent as file+offset (with their mapping) and named by a later
# drain.
SYMBOLIZE_SHARE_OF_INTERVAL = 0.25
# What the last drain, after stop(), may spend reading new symbol tables: stopping must not wait on slow work.
SYMBOLIZE_WHEN_STOPPING_S = 0.5
# On average, reading new symbol tables may take this share of one core (after a burst at start): on a node that
# keeps starting new binaries, that reading is what would otherwise grow without bound (symbolize/allowance.py).
SYMBOL_READ_SHARE = READ_SHARE
SYMBOL_READ_BURST_S = READ_BURST_S
# Reading new Python stacks' code objects while their processes run may take this share of one core on average, after
# a burst at start; past it they are read at the drain as before (counted as python_read_late), which costs a process
# that exits before the drain those frames. A stack costs ~10-20 us when its code objects are cached already (a map
# lookup and the walk of its addresses), ~30 us more for each code object read.
PYTHON_EARLY_SHARE = 0.002
PYTHON_EARLY_BURST_S = 0.5


@dataclass(slots=True)
class _Image:
    """One program a sampled pid ran, as the kernel announced it (one per exec id)."""

    arg_start: int  # where its arguments begin: /proc/PID/stat shows this while the program runs (0: unknown)
    info: ProcessInfo | None = None  # read while it ran (None: not read, or /proc showed a later program by then)
    replaced_at: int = -1  # the drain count when a later program of the pid was announced; -1: the latest


class CPUProfileSource:
    """Samples every CPU's stacks at ``config.frequency_hz``; ``drain() -> [samples batch]``."""

    name = SOURCE

    def __init__(self, config: ProfilingConfig, resolver: ProcessResolver, symbolizer: Symbolizer | None = None,
                 sampler: CPUSampler | None = None, selection: ProcessSelection | None = None,
                 allowance: ReadAllowance | None = None) -> None:
        """``allowance``: shared with the other sources that read symbol tables (default: one of its own)."""
        self.config = config
        self._selection = selection or ProcessSelection(config)
        self._resolver = resolver
        self._symbolizer = symbolizer or Symbolizer()
        self._comms: dict[int, str] = {}  # pid -> name when first sampled; written by the sampler's event thread
        self._comms_lock = threading.Lock()
        self._sampler = sampler or CPUSampler(config.frequency_hz, pids=self._selection.pids,
                                              exclude_tgid=0 if config.include_self else os.getpid(),
                                              on_new_process=self._on_new_process, on_tick=self._on_tick,
                                              on_new_python_stacks=self._on_new_python_stacks)
        self._python = PythonFrames()
        self._watch = ProcessWatch()
        self._images: dict[int, dict[int, _Image]] = {}  # pid -> exec id -> the program; under _looks_lock
        self._drains = 0
        # one look at a time: the event thread looks at new and watched processes, a drain at those that exec'd
        self._looks_lock = threading.RLock()
        self._started_ns = 0
        self._stopping = False
        self._allowance = allowance or ReadAllowance(SYMBOL_READ_SHARE, SYMBOL_READ_BURST_S, time.monotonic())
        self._python_early = ReadAllowance(PYTHON_EARLY_SHARE, PYTHON_EARLY_BURST_S, time.monotonic())

    @property
    def sampler(self) -> CPUSampler:
        return self._sampler

    def open(self) -> None:
        """Load and attach the sampler; raises SourceUnavailable (nothing left attached) when it cannot run."""
        self._sampler.open()
        self._started_ns = self._sampler.attached_ns  # not after the kernel's symbols: it samples while they load
        self._symbolizer.load_kernel_symbols()

    def stop(self) -> None:
        """The next drain is the last: it gives reading new symbol tables only SYMBOLIZE_WHEN_STOPPING_S (the kernel
        keeps counting until close, so nothing is missed)."""
        self._stopping = True

    def symbolize_budget_s(self) -> float:
        """Seconds this drain may spend reading new symbol tables: the allowance left (SYMBOL_READ_SHARE), at most
        SYMBOLIZE_SHARE_OF_INTERVAL of the interval, SYMBOLIZE_WHEN_STOPPING_S for the last drain."""
        most = SYMBOLIZE_WHEN_STOPPING_S if self._stopping else \
            max(SYMBOLIZE_WHEN_STOPPING_S, SYMBOLIZE_SHARE_OF_INTERVAL * self.config.interval_s)
        return min(most, self._allowance.available_s(time.monotonic()))

    def close(self) -> None:
        """Detach and free everything. Idempotent."""
        self._sampler.close()

    def drain(self) -> list[ProfileBatch]:
        """Every sample since the last drain, symbolized, one :class:`ProcessProfile` per process (one batch)."""
        raw = self._sampler.drain()
        now_ns = time.time_ns()
        deadline = time.monotonic() + self.symbolize_budget_s()
        read_before_s = self._symbolizer.read_seconds
        start_ns, self._started_ns = self._started_ns or now_ns, now_ns
        by_image: dict[tuple[int, int], list[StackCount]] = defaultdict(list)
        for sample in raw:
            by_image[(sample.pid, sample.exec_id)].append(sample)
        by_pid = {pid for pid, _ in by_image}
        self._python.new_drain()
        with self._looks_lock:
            self._drains += 1
            for pid in by_pid:
                if self._watch.executable_changed(pid):  # exec'd after its watch ended
                    self._look_after_exec(pid)
        processes = []
        for (pid, exec_id), samples in sorted(by_image.items()):
            info, replaced = self._identity(pid, exec_id, samples)
            if not self._wanted(info, {s.comm for s in samples}):
                continue
            processes.append(ProcessProfile(info, self._samples(pid, samples, deadline, exec_id, replaced)))
        self._allowance.spend(self._symbolizer.read_seconds - read_before_s)
        self._symbolizer.prune(by_pid)
        with self._comms_lock:
            known = list(self._comms)
        gone = [p for p in known if p not in by_pid and not os.path.exists(f"/proc/{p}")]
        with self._comms_lock:
            for pid in gone:
                self._comms.pop(pid, None)
        with self._looks_lock:
            self._python.forget(gone)
            self._watch.forget(gone)
            self._forget_images(gone)
        self._sampler.forget(gone)  # a process that reuses the pid gets announced (and snapshotted) again
        return [ProfileBatch(type=cpu_profile_type(self.config.frequency_hz), start_unix_nano=start_ns,
                             duration_nano=max(0, now_ns - start_ns), processes=tuple(processes))]

    # --- internals -------------------------------------------------------------------------------------------------

    def _on_new_process(self, pid: int, comm: str, exec_id: int, arg_start: int) -> None:
        """Called from the sampler's event thread when a process is sampled for the first time, and again at its
        first sample after each exec."""
        with self._looks_lock:
            images = self._images.setdefault(pid, {})
            if any(other > exec_id for other in images):
                images.setdefault(exec_id, _Image(arg_start, replaced_at=self._drains))  # a late announcement
                return
            for other_id, other in images.items():
                if other_id != exec_id and other.replaced_at < 0:
                    other.replaced_at = self._drains
            image = images.setdefault(exec_id, _Image(arg_start))
            self._look(pid, comm, (exec_id, image))

    def _look(self, pid: int, comm: str, image: tuple[int, _Image] | None = None) -> None:
        """Read what the process is: identity (kept while it exists), mappings, its Python; then watch it. Again after
        an exec (``comm`` then is its new name, "" when it could not be read). ``image``: the program the kernel
        announced (exec id, what the kernel said of it), whose identity and mappings are kept for its samples when
        /proc shows that program throughout the reads; None (a look after an exec seen in /proc, before the kernel
        announced the new program): the Python walker and the selection only."""
        state = self._watch.state(pid)  # before the reads it guards: a change during them shows at the next check
        if image is not None and not self._shows(pid, image[1]):
            return  # exec'd again already: that program is announced at its own first sample
        info = self._resolver.info(pid)  # cache identity while the process exists
        if info is not None and not self._wanted(info, {comm}):
            # the name the kernel sampled may be from before an exec that has happened since (and renamed it)
            comm = self._resolver.thread_name(pid, pid) or comm
        with self._comms_lock:
            if comm or pid not in self._comms:
                self._comms[pid] = comm
        if info is not None and not self._wanted(info, {comm}):
            self._watch.looked(pid, state, time.monotonic(), settled=True)  # only its exec matters now
            if image is not None and self._shows(pid, image[1]):
                image[1].info = info
            return  # filtered out by name or container: no need to snapshot it
        if image is not None and not self._symbolizer.remember(pid, image=image[0]):
            selfmetrics.count(semconv.SELF_ERRORS.name, otel_gpu__source=SOURCE,
                              otel_gpu__reason=semconv.Reason.PROCESS_GONE)
        self._register_python(pid, image[0] if image is not None else None)
        self._watch.looked(pid, state, time.monotonic(), settled=self._python.runs_python(pid))
        if image is None:
            return
        if self._shows(pid, image[1]):
            image[1].info = info
        else:  # the reads may be of the next program: its announcement reads them again
            self._symbolizer.forget_image(pid, image[0])

    def _shows(self, pid: int, image: _Image) -> bool:
        """Whether /proc/PID shows the program the kernel announced (True when either side cannot tell)."""
        shown = self._resolver.arg_start(pid)
        return shown is not None and (shown == 0 or image.arg_start == 0 or shown == image.arg_start)

    def _on_tick(self) -> float | None:
        """From the sampler's event thread: checks the watched processes that are due; seconds until the next."""
        with self._looks_lock:
            try:
                for pid, change in self._watch.due(time.monotonic()):
                    if change is Change.EXEC:
                        self._look_after_exec(pid)
                    else:  # something was mapped since a look that found no interpreter: libpython, maybe
                        state = self._watch.state(pid)
                        self._register_python(pid, self._latest_image(pid))
                        self._watch.looked(pid, state, time.monotonic(), settled=self._python.runs_python(pid))
            except Exception as exc:  # noqa: BLE001 - the event thread's loop boundary: new processes must still come
                once(_logger, logging.WARNING, f"process-watch-{type(exc).__name__}",
                     "checking new processes again failed (%s: %s); their first look stands",
                     type(exc).__name__, exc)
            return self._watch.next_in_s(time.monotonic())

    def _on_new_python_stacks(self, ids_by_pid: dict[int, list[int]]) -> None:
        """From the sampler's event thread: reads the code objects of stacks the walker just stored, while their
        processes still run; within PYTHON_EARLY_SHARE of one core (CPU time of this thread), the rest at the drain."""
        available_s = self._python_early.available_s(time.monotonic())
        started_s = time.thread_time()
        late = 0
        try:
            for pid, ids in ids_by_pid.items():
                if time.thread_time() - started_s >= available_s:
                    late += len(ids)
                    continue
                self._python.read_new_stacks(pid, self._sampler.python_stacks(ids).values())
        except Exception as exc:  # noqa: BLE001 - the event thread's loop boundary: the drain reads them instead
            once(_logger, logging.WARNING, f"python-early-{type(exc).__name__}",
                 "reading new Python stacks' code objects failed (%s: %s); the drain reads them",
                 type(exc).__name__, exc)
        finally:
            self._python_early.spend(time.thread_time() - started_s)
        if late:
            selfmetrics.count(semconv.SELF_ERRORS.name, late, otel_gpu__source=SOURCE,
                              otel_gpu__reason=semconv.Reason.PYTHON_READ_LATE)

    def _look_after_exec(self, pid: int) -> None:
        self._sampler.register_unwinding(pid)  # the tables of the new image's files
        self._look(pid, self._resolver.thread_name(pid, pid))

    def _latest_image(self, pid: int) -> int | None:
        """The exec id of the last program of ``pid`` the kernel announced (None: none yet)."""
        return max(self._images.get(pid, {}), default=None)

    def _register_python(self, pid: int, image: int | None) -> None:
        """Have the walker walk the Python ``pid`` runs, the program ``image`` (None: a new one not announced yet)."""
        python = self._python.discover(pid, image)
        if python is not None:
            self._sampler.register_python(pid, python.proc)
        else:
            self._sampler.unregister_python(pid)

    def _identity(self, pid: int, exec_id: int, samples: list[StackCount]) -> tuple[ProcessInfo, bool]:
        """Who ran the program ``exec_id`` of ``pid``, and whether an exec replaced it before its mappings were read
        (its user frames are then left unnamed)."""
        with self._looks_lock:
            images = self._images.get(pid, {})
            image = images.get(exec_id)
            latest = exec_id >= max(images, default=exec_id)
        if image is not None and image.info is not None:
            return self._resolver.with_names(image.info), False
        comm = next((s.comm for s in samples if s.tid == pid), samples[0].comm)
        if not latest:  # an older program, whose /proc was never read while it ran
            selfmetrics.count(semconv.SELF_ERRORS.name, sum(s.count for s in samples), otel_gpu__source=SOURCE,
                              otel_gpu__reason=semconv.Reason.REPLACED_BY_EXEC)
            return ProcessInfo(pid=pid, executable_name=comm, service_name=comm), True
        # the latest program (its announcement not handled yet, lost, or its look found it gone): what /proc shows
        if not self._symbolizer.knows(pid, exec_id):
            self._symbolizer.remember(pid, image=exec_id)
        info = self._resolver.info(pid) or self._resolver.cached(pid)
        if info is not None:
            return info, False
        comm = self._comms.get(pid) or comm
        return ProcessInfo(pid=pid, executable_name=comm, service_name=comm), False

    def _wanted(self, info: ProcessInfo, thread_names: set[str]) -> bool:
        """The selection, with the name the process had when first sampled among its thread names."""
        return self._selection.selects(info, thread_names | {self._comms.get(info.pid, "")})

    def _samples(self, pid: int, samples: list[StackCount], deadline: float, exec_id: int,
                 replaced: bool) -> tuple[Sample, ...]:
        """The samples of one program of the process (``exec_id``), each distinct (user, kernel, Python) stack
        symbolized and merged once; samples whose frames come out equal are summed (equal frame tuples are made one
        object, so that sum is by identity rather than by hashing every frame of every sample). ``replaced``: an
        exec replaced the program before it was read: its user frames stay unnamed, without Python frames (the
        process's memory is another program's)."""
        stacks = sorted({s.user_stack for s in samples if s.user_stack})
        user_frames = dict(zip(stacks, self._symbolizer.user_stacks(pid, stacks, deadline, image=exec_id),
                               strict=True))
        python_ids = {s.python_stack_id for s in samples if s.python_stack_id} if not replaced else set()
        python = self._sampler.python_stacks(python_ids) if python_ids else {}
        try:
            python_runs = self._python.runs_of(pid, python, image=exec_id)
        except Exception as exc:  # noqa: BLE001 - a boundary: one process's memory must not cost the whole report
            once(_logger, logging.WARNING, f"python-frames-{type(exc).__name__}",
                 "reading Python frames of process %d failed (%s: %s); its samples keep their native frames",
                 pid, type(exc).__name__, exc)
            selfmetrics.count(semconv.SELF_ERRORS.name, otel_gpu__source=SOURCE,
                              otel_gpu__reason=semconv.Reason.PYTHON_CODE_UNREADABLE)
            python_runs = {}
        built: dict[tuple[tuple[int, ...], tuple[int, ...], int], tuple[Frame, ...]] = {}
        interned: dict[tuple[Frame, ...], tuple[Frame, ...]] = {}
        merged: dict[tuple[int, int, str, str, str], int] = defaultdict(int)
        by_id: dict[int, tuple[Frame, ...]] = {}
        for sample in samples:
            raw = (sample.user_stack, sample.kernel_stack, sample.python_stack_id)
            frames = built.get(raw)
            if frames is None:
                frames = self._symbolizer.kernel_stack(sample.kernel_stack) if sample.kernel_stack else ()
                native = user_frames.get(sample.user_stack, ())
                frames += native if replaced else self._python.merged_runs(
                    pid, native, python_runs.get(sample.python_stack_id), image=exec_id)
                frames = interned.setdefault(frames or (_UNKNOWN,), frames or (_UNKNOWN,))
                built[raw] = frames
                by_id[id(frames)] = frames
            merged[(id(frames), sample.tid, sample.comm, sample.trace_id, sample.span_id)] += sample.count
        return tuple(Sample(by_id[frames_id], count, thread_id=tid, thread_name=comm, trace_id=trace_id,
                            span_id=span_id)
                     for (frames_id, tid, comm, trace_id, span_id), count in merged.items())

    def _forget_images(self, gone: list[int]) -> None:
        """Drop the programs of exited processes, and those an exec replaced before the last drain began (every
        sample taken before the exec has been drained since); with them their mappings' snapshots."""
        for pid in gone:
            self._images.pop(pid, None)
        for pid, images in self._images.items():
            for exec_id in [e for e, image in images.items() if 0 <= image.replaced_at < self._drains - 1]:
                del images[exec_id]
                self._symbolizer.forget_image(pid, exec_id)
                self._python.forget_image(pid, exec_id)
