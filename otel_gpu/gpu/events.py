# SPDX-License-Identifier: Apache-2.0
"""Watches NVML events for XID critical errors in a thread of its own: one log line per XID, counted per
GPU and code (a counter, unlike dcgm-exporter's last-value gauge, so repeated identical XIDs stay visible)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence

from otel_gpu import semconv
from otel_gpu.gpu import _nvml as nvml
from otel_gpu.gpu.model import GPUInfo, XIDErrors
from otel_gpu.gpu.reader import count_error

_logger = logging.getLogger(__name__)

WAIT_MS = 500  # how long one nvmlEventSetWait blocks; bounds how long close() waits for the thread
_ERROR_BACKOFF_S = 1.0


class XIDWatcher:
    """Registers every GPU for XID events and counts what arrives until :meth:`stop`."""

    def __init__(self, devices: Sequence[tuple[GPUInfo, nvml.Handle]]) -> None:
        self._devices = {nvml.handle_key(handle): info for info, handle in devices}
        self._handles = [(info, handle) for info, handle in devices]
        self._counts: dict[tuple[int, int], XIDErrors] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._event_set: nvml.EventSet | None = None

    def start(self) -> bool:
        """Create the event set and the thread; False (logged once) when no GPU can deliver XID events."""
        try:
            self._event_set = nvml.event_set_create()
        except nvml.NVMLCallError as exc:
            count_error(exc.reason)
            _logger.warning("XID events are off: cannot create an NVML event set (%s)", exc)
            return False
        registered = 0
        for info, handle in self._handles:
            try:
                nvml.register_xid_events(handle, self._event_set)
                registered += 1
            except nvml.NVMLCallError as exc:
                count_error(exc.reason)
                _logger.warning("GPU %d (%s): XID events are off for this GPU (%s)", info.index, info.uuid, exc)
        if not registered:
            self._free()
            return False
        self._thread = threading.Thread(target=self._run, name="otel-gpu-nvml-xid", daemon=True)
        self._thread.start()
        return True

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=WAIT_MS / 1000 * 4)
            self._thread = None
        self._free()

    def errors(self) -> tuple[XIDErrors, ...]:
        """Counts per (GPU, XID code) so far."""
        with self._lock:
            return tuple(self._counts.values())

    def _free(self) -> None:
        if self._event_set is None:
            return
        try:
            nvml.event_set_free(self._event_set)
        except nvml.NVMLCallError as exc:
            count_error(exc.reason)
        self._event_set = None

    def _run(self) -> None:
        failures_logged = False
        while not self._stop.is_set():
            try:
                event = nvml.wait_xid_event(self._event_set, WAIT_MS)
            except nvml.NVMLCallError as exc:
                count_error(exc.reason)
                if not failures_logged:
                    failures_logged = True
                    _logger.warning("waiting for NVML events failed: %s (retrying every %.0f s; further failures "
                                    "are only counted)", exc, _ERROR_BACKOFF_S)
                self._stop.wait(_ERROR_BACKOFF_S)
                continue
            if event is not None:
                self._record(event)

    def _record(self, event: nvml.XIDEvent) -> None:
        info = self._devices.get(event.device_key)
        if info is None:
            count_error(semconv.Reason.XID_UNKNOWN_DEVICE)
            return
        now_s = time.time()
        _logger.error("XID %d on GPU %d (%s, %s, %s); see NVIDIA's XID catalog for the action it calls for",
                      event.code, info.index, info.name, info.uuid, info.pci_bus_id)
        with self._lock:
            previous = self._counts.get((info.index, event.code))
            count = previous.count + 1 if previous else 1
            self._counts[(info.index, event.code)] = XIDErrors(info, event.code, count, now_s)
