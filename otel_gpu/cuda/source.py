# SPDX-License-Identifier: Apache-2.0
"""GPUTimeSource: GPU time by launching stack, and CPU time blocked on the GPU, for every injected process.

Two parts under one lock: :class:`~otel_gpu.cuda.probes.GPUTimeProbes` loads the eBPF program, attaches to each
injected process and decodes the ring buffer's records on its thread; :class:`~otel_gpu.cuda.accounting.
GPUTimeAccounting` joins, weights and accumulates them. ``drain()`` returns the gpu_time and sync_wait batches of the
interval (only the selected processes); :meth:`process_counters` feeds the per-process metrics (every process).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterable, Mapping

from otel_gpu.cuda import abi
from otel_gpu.cuda.accounting import SOURCE, GPUTimeAccounting, ProcessCounters
from otel_gpu.cuda.discovery import LIBRARY_NAME, InjectedLibrary
from otel_gpu.cuda.probes import PROGRAM_PATH, GPUTimeProbes
from otel_gpu.cuda.stacks import StackFrames
from otel_gpu.cuda.symbols import NativeSymbolizer, SharedSymbolizer
from otel_gpu.procfs import ProcessResolver
from otel_gpu.profiles.model import ProfileBatch
from otel_gpu.profiles.source import ProcessSelection

__all__ = ["GPUTimeSource", "ProcessCounters"]


class GPUTimeSource:
    """A :class:`~otel_gpu.profiles.source.ProfileSource`: ``drain() -> [gpu_time batch, sync_wait batch]``."""

    name = SOURCE

    def __init__(self, resolver: ProcessResolver | None = None, *, proc_root: str = "/proc",
                 program_path: str | os.PathLike[str] = PROGRAM_PATH, ringbuf_bytes: int = 4 << 20,
                 poll_interval_s: float = 1.0, rescan_interval_s: float = 2.0, full_rescan_s: float = 10.0,
                 library_name: str = LIBRARY_NAME, symbolizer: NativeSymbolizer | None = None,
                 max_pending_per_process: int = 65536, selection: ProcessSelection | None = None,
                 unwind_maps: Mapping[str, int] | None = None,
                 library_paths: Iterable[str | os.PathLike[str]] | None = None) -> None:
        """``library_paths``: the library files attached at open (default: the packaged one)."""
        self._proc_root = proc_root
        self._selection = selection or ProcessSelection()
        self._lock = threading.RLock()  # the accounting is single-threaded: the poll thread and drain share it
        self._stopped = False
        stacks = StackFrames(symbolizer or SharedSymbolizer(proc_root=proc_root))
        self.accounting = GPUTimeAccounting(resolver or ProcessResolver(proc_root), stacks, self._alive,
                                            max_pending_per_process=max_pending_per_process,
                                            started_ns=time.time_ns())
        self._probes = GPUTimeProbes(self.handle, self._on_processes, proc_root=proc_root,
                                     program_path=program_path, ringbuf_bytes=ringbuf_bytes,
                                     poll_interval_s=poll_interval_s, rescan_interval_s=rescan_interval_s,
                                     full_rescan_s=full_rescan_s, library_name=library_name,
                                     unwind_maps=unwind_maps, library_paths=library_paths)

    # --- ProfileSource -----------------------------------------------------------------------------------------------

    def open(self) -> None:
        """Load the eBPF program and start watching for injected processes.

        Raises SourceUnavailable when the program cannot load (not root, no BTF, not built, no libbpf).
        """
        self._probes.open()

    def drain(self) -> list[ProfileBatch]:
        """The gpu_time and sync_wait batches since the last drain (each may have no processes)."""
        self._probes.poll_now()
        drops = self._probes.drop_totals()
        self._probes.report_unwind()
        with self._lock:
            batches = self.accounting.drain(time.time_ns(), drops, final=self._stopped)
        return [self._selection.keep(batch) for batch in batches]

    def stop(self) -> None:
        """Stop reading records in the background (the agent's last report comes next): records then reach the
        per-process counters only through drain, so the last profiles hold everything the counters counted (the
        waits held for their collectives too)."""
        self._stopped = True
        self._probes.stop()

    def close(self) -> None:
        """Stop polling, detach every probe and free the program (idempotent)."""
        self._probes.close()

    # --- records ---------------------------------------------------------------------------------------------------

    def handle(self, record: abi.Record) -> None:
        """Feed one decoded record (the ring-buffer callback; tests may call it directly)."""
        with self._lock:
            self.accounting.handle(record)

    def poll_now(self) -> int:
        """Consume every record available now (tests, and drain)."""
        return self._probes.poll_now()

    def rescan(self) -> list[InjectedLibrary]:
        """Attach to library files not seen before; returns the newly attached ones."""
        return self._probes.rescan()

    @property
    def attached_libraries(self) -> list[InjectedLibrary]:
        return self._probes.attached_libraries

    # --- counts ----------------------------------------------------------------------------------------------------

    @property
    def records(self) -> int:
        return self.accounting.records

    @property
    def decode_errors(self) -> int:
        return self._probes.decode_errors

    def process_counters(self) -> list[ProcessCounters]:
        """Cumulative totals of every process seen (copies)."""
        with self._lock:
            return self.accounting.process_counters()

    def dropped(self) -> dict[str, int]:
        """Records the eBPF program could not deliver since open, by reason (as of the last drain)."""
        with self._lock:
            return self.accounting.dropped()

    def join_stats(self) -> tuple[int, int, int]:
        """(joined, launches unmatched, activities unmatched) since open."""
        stats = self.accounting.join_stats
        return stats.joined, stats.launches_unmatched, stats.activities_unmatched

    def _on_processes(self, pids: Iterable[int]) -> None:
        with self._lock:
            for pid in pids:
                self.accounting.remember_process(pid)

    def _alive(self, pid: int) -> bool:
        return os.path.exists(f"{self._proc_root}/{pid}")
