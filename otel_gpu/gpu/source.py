# SPDX-License-Identifier: Apache-2.0
"""The NVML GPU source: one collection thread per GPU storing that GPU's latest snapshot, plus an XID thread.

Readers of the data (the OTel instrument callbacks) only take the latest snapshots and never call NVML, so a
slow call (the PCIe throughput call blocks ~20 ms) or a lost GPU delays neither the export nor the other GPUs.
An export asks for readings taken within FRESH_WITHIN_S: a GPU's thread whose latest is older reads at once (the
export waits for it at most FRESH_WAIT_S), and its timer starts over from there, so a reading is taken once an
interval, just before the export that carries it (the exporters' timers and the collection's ran apart: every export
carried the reading of one interval before, stamped with the export's time).

    source = NVMLSource(config.gpu, resolver, interval_s=10)
    source.open()      # SourceUnavailable when there is no driver, no libnvidia-ml, or no GPU
    source.start()
    source.snapshots() # latest GPUSnapshot per GPU (snapshots(fresh_within_s=1.0): read again if older)
    source.close()
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

from otel_gpu import selfmetrics, semconv
from otel_gpu.config import GPUConfig
from otel_gpu.errors import SourceUnavailable
from otel_gpu.gpu import _nvml as nvml
from otel_gpu.gpu.events import XIDWatcher
from otel_gpu.gpu.model import GPUInfo, GPUSnapshot, XIDErrors
from otel_gpu.gpu.reader import SOURCE_NAME, GPUReader, count_error, read_info
from otel_gpu.procfs import ProcessResolver

_logger = logging.getLogger(__name__)

_JOIN_TIMEOUT_S = 2.0
FRESH_WAIT_S = 2.0  # an export waits at most this long (and at most --gpu-collection-timeout) for fresh readings


@dataclass
class _Slot:
    """One GPU's reader, its latest snapshot and its worker's state (guarded by the source's lock)."""

    reader: GPUReader
    read_lock: threading.Lock = field(default_factory=threading.Lock)
    latest: GPUSnapshot | None = None
    busy_since: float | None = None  # monotonic start of the cycle in progress
    read_at: float | None = None  # monotonic start of the cycle that read ``latest``
    stall_logged: bool = False
    thread: threading.Thread | None = None
    wake: threading.Event = field(default_factory=threading.Event)  # read now (a fresh reading is wanted, or stop)


class NVMLSource:
    """Per-GPU and per-process readings from NVML, collected every ``interval_s`` seconds."""

    name = SOURCE_NAME

    def __init__(self, config: GPUConfig, resolver: ProcessResolver, *, interval_s: float = 10.0) -> None:
        self.config = config
        self.interval_s = interval_s
        self._resolver = resolver
        self._slots: list[_Slot] = []
        self._lock = threading.Lock()
        self._read = threading.Condition(self._lock)  # notified after each cycle
        self._stop = threading.Event()
        self._xid: XIDWatcher | None = None
        self._last_xid_errors: tuple[XIDErrors, ...] = ()  # what the watcher counted, once it stopped
        self._opened = False
        self._driver_version = ""

    @property
    def driver_version(self) -> str:
        return self._driver_version

    def gpus(self) -> tuple[GPUInfo, ...]:
        return tuple(slot.reader.info for slot in self._slots)

    # --- lifecycle -------------------------------------------------------------------------------------------------

    def open(self) -> None:
        """Initialise NVML and read each GPU's identity; SourceUnavailable says why GPU metrics cannot run."""
        if self._opened:
            return
        try:
            nvml.init()
        except nvml.NVMLCallError as exc:
            count_error(exc.reason)
            raise SourceUnavailable(_init_failure(exc)) from None
        self._opened = True
        try:
            count = nvml.device_count()
        except nvml.NVMLCallError as exc:
            self.close()
            raise SourceUnavailable(f"NVML cannot count the GPUs ({exc})") from None
        if count == 0:
            self.close()
            raise SourceUnavailable("the NVIDIA driver is loaded but NVML sees no GPU (nvmlDeviceGetCount is 0)")
        try:
            self._driver_version = nvml.driver_version()
        except nvml.NVMLCallError:
            self._driver_version = ""
        for index in range(count):
            try:
                handle = nvml.device_handle(index)
                info = read_info(index, handle)
            except nvml.NVMLCallError as exc:
                count_error(exc.reason)
                _logger.error("GPU %d is left out: its identity cannot be read (%s)", index, exc)
                continue
            reader = GPUReader(info, handle, self._resolver, per_process=self.config.per_process)
            self._slots.append(_Slot(reader))
        if not self._slots:
            self.close()
            raise SourceUnavailable(f"NVML lists {count} GPU(s) but none answers")
        _logger.info("NVML %s: %d GPU(s): %s", self._driver_version or "(driver version unknown)", len(self._slots),
                     ", ".join(f"{s.reader.info.index}={s.reader.info.name} {s.reader.info.pci_bus_id}"
                               for s in self._slots))

    def start(self) -> None:
        """Start one collection thread per GPU (first cycle at once) and the XID event thread."""
        if not self._opened or self._stop.is_set():
            raise RuntimeError("NVMLSource.start() needs a successful open() and no close()")
        self._xid = XIDWatcher([(slot.reader.info, slot.reader.handle) for slot in self._slots])
        self._xid.start()
        for slot in self._slots:
            slot.thread = threading.Thread(target=self._run, args=(slot,), daemon=True,
                                           name=f"otel-gpu-nvml-{slot.reader.info.index}")
            slot.thread.start()

    def close(self) -> None:
        """Stop the threads, free NVML resources and shut NVML down. Safe to call more than once."""
        self._stop.set()
        if self._xid is not None:
            self._xid.stop()
            self._last_xid_errors = self._xid.errors()  # the last export after close still carries them
            self._xid = None
        for slot in self._slots:
            slot.wake.set()
        for slot in self._slots:
            if slot.thread is not None:
                slot.thread.join(timeout=max(_JOIN_TIMEOUT_S, self.config.collection_timeout_s))
                if slot.thread.is_alive():
                    _logger.warning("GPU %d collection thread did not stop in time", slot.reader.info.index)
                slot.thread = None
            if slot.read_lock.acquire(timeout=_JOIN_TIMEOUT_S):
                try:
                    slot.reader.close()
                finally:
                    slot.read_lock.release()
        if self._opened:
            self._opened = False
            try:
                nvml.shutdown()
            except nvml.NVMLCallError as exc:
                count_error(exc.reason)

    # --- collection ------------------------------------------------------------------------------------------------

    def collect(self) -> tuple[GPUSnapshot, ...]:
        """Run one cycle on every GPU now, in parallel, and return the latest snapshots (tests, benchmarks).

        Waits at most ``collection_timeout_s`` for the slowest GPU.
        """
        threads = [threading.Thread(target=self._cycle, args=(slot,), daemon=True) for slot in self._slots]
        for thread in threads:
            thread.start()
        deadline = time.monotonic() + self.config.collection_timeout_s
        for thread in threads:
            thread.join(timeout=max(0.0, deadline - time.monotonic()))
        return self.snapshots()

    def snapshots(self, fresh_within_s: float | None = None) -> tuple[GPUSnapshot, ...]:
        """The latest snapshot of each GPU. A GPU stuck in one cycle longer than ``collection_timeout_s``
        reports its status only, so nothing stale is exported for it.

        ``fresh_within_s``: a GPU whose latest reading began longer ago is read now by its thread, waited for at
        most FRESH_WAIT_S (and ``collection_timeout_s``); past that its latest is taken as it is."""
        if fresh_within_s is not None:
            self._refresh(fresh_within_s)
        now = time.monotonic()
        out = []
        with self._lock:
            for slot in self._slots:
                latest = slot.latest
                if latest is None:
                    continue
                if slot.busy_since is not None and now - slot.busy_since > self.config.collection_timeout_s:
                    if not slot.stall_logged:
                        slot.stall_logged = True
                        count_error(semconv.Reason.TIMEOUT)
                        _logger.warning("GPU %d (%s): NVML has not answered for %.1f s (limit "
                                        "--gpu-collection-timeout %.1f s); its readings are left out until it does",
                                        slot.reader.info.index, slot.reader.info.uuid, now - slot.busy_since,
                                        self.config.collection_timeout_s)
                    latest = GPUSnapshot(info=latest.info, time_s=latest.time_s, state=latest.state)
                out.append(latest)
        return tuple(out)

    def _refresh(self, fresh_within_s: float) -> None:
        asked = time.monotonic()
        deadline = asked + min(FRESH_WAIT_S, self.config.collection_timeout_s)

        def stale() -> list[_Slot]:
            return [slot for slot in self._slots if slot.thread is not None and
                    (slot.read_at is None or slot.read_at < asked - fresh_within_s)]

        with self._read:
            waiting = stale()
            if not waiting or self._stop.is_set():
                return
            for slot in waiting:
                slot.wake.set()
            while stale() and not self._stop.is_set():
                left = deadline - time.monotonic()
                if left <= 0:
                    return
                self._read.wait(left)

    def xid_errors(self) -> tuple[XIDErrors, ...]:
        """XID error counts per GPU and code since start() (until close(): their totals then)."""
        return self._xid.errors() if self._xid is not None else self._last_xid_errors

    @contextlib.contextmanager
    def exclusive_reader(self, position: int) -> Iterator[GPUReader]:
        """The reader of the ``position``-th GPU, held so no collection thread reads it meanwhile (benchmarks,
        verification)."""
        slot = self._slots[position]
        with slot.read_lock:
            yield slot.reader

    def disabled_readings(self) -> dict[int, frozenset[str]]:
        """Per GPU index, the readings turned off because the GPU does not support them."""
        return {slot.reader.info.index: slot.reader.disabled() for slot in self._slots}

    def _run(self, slot: _Slot) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            slot.wake.clear()
            self._cycle(slot)
            slot.wake.wait(max(0.0, self.interval_s - (time.monotonic() - started)))

    def _cycle(self, slot: _Slot) -> None:
        info = slot.reader.info
        with slot.read_lock:
            started = time.monotonic()
            with self._lock:
                slot.busy_since = started
            try:
                snapshot: GPUSnapshot | None = slot.reader.read()
            except Exception:  # loop boundary: one bad cycle must not end this GPU's collection
                count_error(semconv.Reason.UNEXPECTED)
                _logger.exception("GPU %d (%s): collection cycle failed", info.index, info.uuid)
                snapshot = None
            duration_s = time.monotonic() - started
            with self._lock:
                slot.busy_since = None
                if slot.stall_logged:
                    slot.stall_logged = False
                    _logger.info("GPU %d (%s) answers again after %.1f s", info.index, info.uuid, duration_s)
                if snapshot is not None:
                    slot.latest = snapshot
                slot.read_at = started  # a failed cycle too: a wait for fresh readings is not kept waiting
                self._read.notify_all()
        selfmetrics.set_gauge(semconv.SELF_COLLECTION_DURATION.name, duration_s, otel_gpu__source=SOURCE_NAME,
                              nvidia__gpu__index=str(info.index))


def _init_failure(exc: nvml.NVMLCallError) -> str:
    if exc.reason == "library_not_found":
        return ("libnvidia-ml.so.1 was not found: no NVIDIA driver on this machine, or the library is not on the "
                "library path (in a container, run with the NVIDIA container runtime and "
                "NVIDIA_DRIVER_CAPABILITIES=utility)")
    if exc.reason == "driver_not_loaded":
        return "the NVIDIA kernel driver is not loaded (nvmlInit: Driver Not Loaded)"
    if exc.reason == "no_permission":
        return "no permission to open the NVIDIA devices (/dev/nvidia*) (nvmlInit: Insufficient Permissions)"
    if exc.reason == "lib_rm_version_mismatch":
        return "libnvidia-ml.so.1 does not match the loaded NVIDIA kernel driver (reboot or reload the driver)"
    return f"nvmlInit failed: {exc}"
