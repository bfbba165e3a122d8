# SPDX-License-Identifier: Apache-2.0
"""Wiring and lifecycle: builds the sources, the metrics pipeline and the profile exporters, runs until stopped.

Nothing here reads hardware or encodes data; each part does its own job and the agent only connects them.
A source that cannot start (no NVIDIA driver, no BTF, no privileges) is logged once and left out; the rest runs.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Collection
from types import FrameType
from typing import TYPE_CHECKING, Any

from otel_gpu import selfmetrics, semconv
from otel_gpu.config import EXIT_CONFIG_ERROR, AgentConfig
from otel_gpu.errors import SourceUnavailable
from otel_gpu.k8s import K8sNames
from otel_gpu.procfs import ProcessResolver
from otel_gpu.profiles.model import ProcessProfile, ProfileBatch
from otel_gpu.profiles.source import ProcessSelection, ProfileSource
from otel_gpu.resource import agent_resource, node_attributes
from otel_gpu.selfcost import CostMeter, name_native_threads, trim_heap
from otel_gpu.symbolize.allowance import READ_BURST_S, READ_SHARE, ReadAllowance
from otel_gpu.symbolize.symbolizer import Symbolizer

if TYPE_CHECKING:
    from otel_gpu.cpu.sampler import CPUSampler

_logger = logging.getLogger(__name__)

# What stopping may spend sending what is still queued to backends, all of them together. Local files are written
# at once; a backend that hangs gets this long, then what is left is dropped and counted. A second SIGINT or
# SIGTERM ends the agent at once.
SHUTDOWN_TIMEOUT_S = 5.0
_LAST_METRICS_S = 1.0


class Agent:
    """One agent process: ``run()`` blocks until SIGINT/SIGTERM or ``--duration`` elapses."""

    def __init__(self, config: AgentConfig, started_monotonic: float | None = None) -> None:
        """``started_monotonic``: when ``--duration`` starts counting (``time.monotonic()``); the CLI passes the
        process's start, so start-up (imports, loading eBPF programs, reading kallsyms) is part of the duration."""
        self.config = config
        self._started = time.monotonic() if started_monotonic is None else started_monotonic
        self._stop = threading.Event()
        self._k8s_names = K8sNames(config.k8s.api_url, config.node_name, config.k8s.service_account_dir,
                                   ttl_s=config.k8s.names_ttl_s) if config.k8s.names else None
        self._resolver = ProcessResolver(names=self._k8s_names, command_args=config.profiling.command_args)
        self._selection = ProcessSelection(config.profiling)  # one selection for every profile source
        self._symbolizer: Symbolizer | None = None
        # one ration of symbol-table reading for every source that symbolizes (symbolize/allowance.py)
        self._read_allowance = ReadAllowance(READ_SHARE, READ_BURST_S, time.monotonic())
        self._cpu_sampler: CPUSampler | None = None  # its unwind tables serve the GPU-time source too
        self._shutdown_deadline = 0.0  # monotonic; set when the loop ends
        self._signals = 0  # SIGINT and SIGTERM received: the first stops, the second ends the process at once
        self._node = node_attributes(config)  # host.name, k8s.node.name, ... on every profile's resource
        self._cost = CostMeter(self._started)  # logged at stop: CPU by thread, start-up, peak memory
        self._profiling_since: float | None = None  # monotonic: when the first profile source opened

    def _shared_symbolizer(self) -> Symbolizer:
        """One symbolizer (and one symbol cache) for the CPU and GPU-time sources; it is thread-safe."""
        if self._symbolizer is None:
            self._symbolizer = Symbolizer()
        return self._symbolizer

    def stop(self) -> None:
        self._stop.set()

    def run(self) -> int:
        config = self.config
        self._install_signal_handlers()
        profiling = config.profiling.enabled or config.profiling.gpu_time
        if config.writes_files("metrics") or (profiling and config.writes_files("profiles")):
            try:
                os.makedirs(config.output.dir, exist_ok=True)
            except OSError as exc:  # validation looked, but the folder can still be refused (a race, a quota)
                _logger.error("cannot create the output folder %s (--output-dir): %s", config.output.dir,
                              exc.strerror or exc)
                return EXIT_CONFIG_ERROR
        with contextlib.ExitStack() as cleanup:
            if self._k8s_names is not None:  # lists this node's pods in the background from now on; the sources'
                # first reports carry the names unless the first list takes longer than one request may
                self._k8s_names.start(wait_first_s=self._k8s_names.timeout_s + 0.5)
                cleanup.callback(self._k8s_names.stop)
            pipeline = self._start_metrics(cleanup)
            gpu = self._start_gpu(cleanup, pipeline)
            profilers = self._start_profilers(cleanup)
            profilers += self._start_gpu_time(cleanup, pipeline)
            exporters = self._start_profile_exporters(cleanup) if profilers else []
            if profilers and not exporters:
                _logger.warning("profiles have no destination (--local-files off, --console off, no profile backend):"
                                " they are dropped and counted in %s (reason %s)", semconv.SELF_DROPPED.name,
                                semconv.Reason.NO_DESTINATION)
            running = {source.name for source in profilers} | ({semconv.Source.NVML} if gpu is not None else set())
            for source_name in (semconv.Source.NVML, semconv.Source.CPU_PROFILER, semconv.Source.GPU_TIME):
                selfmetrics.set_gauge(semconv.SELF_SOURCE_UP.name, 1 if source_name in running else 0,
                                      otel_gpu__source=source_name)
            on = {source: "on" if source in running else "off" for source in semconv.Source}
            _logger.info("otel-gpu running: gpu metrics %s, cpu profiling %s, gpu-time profiling %s; %s",
                         on[semconv.Source.NVML], on[semconv.Source.CPU_PROFILER], on[semconv.Source.GPU_TIME],
                         self._destinations(pipeline.prometheus_address, {e.name for e in pipeline.exporters},
                                            profiling=bool(profilers)))
            self._cost.running()
            trim_heap()  # what start-up freed (the kernel's BTF, relocations, the first symbol reads)
            self._loop(profilers, exporters)
            self._shutdown_deadline = time.monotonic() + SHUTDOWN_TIMEOUT_S
        # after the last report and the flush, which are part of what the agent cost
        _logger.info("otel-gpu cost: %s", self._cost.summary())
        return 0

    def _shutdown_left_s(self) -> float:
        """Seconds left of the shutdown budget, shared by every exporter that still sends."""
        return max(0.0, self._shutdown_deadline - time.monotonic())

    # --- parts -----------------------------------------------------------------------------------------------------

    def _start_metrics(self, cleanup: contextlib.ExitStack):  # type: ignore[no-untyped-def]
        from otel_gpu.metrics.pipeline import MetricsPipeline

        pipeline = MetricsPipeline(self.config, agent_resource(self.config))
        # at least a moment, whatever the profile exporters left: the last line of metrics.jsonl is local and quick
        cleanup.callback(lambda: pipeline.shutdown(max(_LAST_METRICS_S, self._shutdown_left_s())))
        return pipeline

    def _start_gpu(self, cleanup: contextlib.ExitStack, pipeline) -> object | None:  # type: ignore[no-untyped-def]
        if not self.config.gpu.enabled:
            return None
        from otel_gpu.gpu.source import NVMLSource
        from otel_gpu.metrics.gpu_instruments import register_gpu_instruments

        source = NVMLSource(self.config.gpu, self._resolver, interval_s=self.config.metrics.export_interval_s)
        if not _opened(source, "GPU metrics are off", cleanup):
            return None
        source.start()
        register_gpu_instruments(pipeline.meter("otel_gpu.gpu"), source)
        return source

    def _start_profilers(self, cleanup: contextlib.ExitStack) -> list[ProfileSource]:
        if not self.config.profiling.enabled:
            return []
        from otel_gpu.cpu.source import CPUProfileSource

        source = CPUProfileSource(self.config.profiling, self._resolver, symbolizer=self._shared_symbolizer(),
                                  selection=self._selection, allowance=self._read_allowance)
        if not _opened(source, "CPU profiling is off", cleanup):
            return []
        self._profiling_since = self._profiling_since or time.monotonic()
        self._cpu_sampler = source.sampler
        return [source]

    def _start_gpu_time(self, cleanup: contextlib.ExitStack, pipeline) -> list[ProfileSource]:  # type: ignore[no-untyped-def]
        """The GPU-time source; when CPU profiling runs, its native unwind tables walk the GPU-time fallback stacks
        too (one unwinder per process, not two)."""
        if not self.config.profiling.gpu_time:
            return []
        from otel_gpu.cuda.inject import library_path
        from otel_gpu.cuda.instruments import register_gpu_time_instruments
        from otel_gpu.cuda.source import GPUTimeSource
        from otel_gpu.cuda.symbols import SharedSymbolizer

        packaged = library_path()
        libraries = [*([packaged] if packaged is not None else []), *self.config.profiling.gpu_time_libraries]
        unwind_maps = self._cpu_sampler.unwind_maps() if self._cpu_sampler is not None else None
        source = GPUTimeSource(self._resolver, selection=self._selection, library_paths=libraries,
                               unwind_maps=unwind_maps,
                               symbolizer=SharedSymbolizer(self._shared_symbolizer(), allowance=self._read_allowance))
        if not _opened(source, "GPU-time profiling is off", cleanup):
            return []
        self._profiling_since = self._profiling_since or time.monotonic()
        register_gpu_time_instruments(pipeline.meter("otel_gpu.cuda"), source, self._resolver.with_names)
        return [source]

    def _start_profile_exporters(self, cleanup: contextlib.ExitStack) -> list:  # type: ignore[type-arg]
        from otel_gpu.exporters import build_profile_exporters

        exporters = build_profile_exporters(self.config)
        for exporter in reversed(exporters):
            cleanup.callback(lambda exporter=exporter: exporter.shutdown(self._shutdown_left_s()))
        return exporters

    # --- loop ------------------------------------------------------------------------------------------------------

    def _loop(self, profilers: list[ProfileSource], exporters: list) -> None:  # type: ignore[type-arg]
        interval_s = self.config.profiling.interval_s
        deadline = self._started + self.config.duration_s if self.config.duration_s else None
        # the first profile starts when its source opened, not when start-up ended (seconds later on a loaded node)
        next_report = (self._profiling_since or time.monotonic()) + interval_s
        while not self._stop.is_set():
            now = time.monotonic()
            wake = next_report if deadline is None else min(next_report, deadline)
            if self._stop.wait(max(0.0, wake - now)):
                break
            now = time.monotonic()
            if deadline is not None and now >= deadline:
                break  # the last report below covers this interval: one report, not two back to back
            if now >= next_report:
                next_report = now + interval_s
                self._report(profilers, exporters)
                trim_heap()  # a report's encoding and symbol reads leave free heap pages behind
        _logger.info("otel-gpu stopping (a last report, then sending what is queued for at most %g s; a second "
                     "signal stops at once)", SHUTDOWN_TIMEOUT_S)
        self._cost.stopping()  # before anything stops: every thread is still there to be read and named
        if self._cpu_sampler is not None:  # the unwinder's table builds would slow the last drain and the close
            self._cpu_sampler.stop_unwinding()
        for source in profilers:  # the last report holds every record a counter has counted
            source.stop()
        self._report(profilers, exporters)  # what was sampled since the last report is not lost

    def _report(self, profilers: list[ProfileSource], exporters: list) -> None:  # type: ignore[type-arg]
        name_native_threads()  # threads started since the last report (exporters', resolvers')
        for source in profilers:
            started = time.monotonic()
            name = source.name
            try:
                batches = source.drain()
            except Exception:  # loop boundary: one bad drain must not stop the agent
                _logger.exception("draining %s failed", name)
                selfmetrics.count(semconv.SELF_ERRORS.name, otel_gpu__source=name,
                                  otel_gpu__reason=semconv.Reason.DRAIN)
                continue
            selfmetrics.set_gauge(semconv.SELF_COLLECTION_DURATION.name, time.monotonic() - started,
                                  otel_gpu__source=name)
            for batch in batches:
                if not batch.processes:  # an idle interval: only a summary says so (once, until samples come)
                    self._export(batch, [e for e in exporters if getattr(e, "shows_empty", False)])
                    continue
                if not exporters:
                    selfmetrics.count(semconv.SELF_DROPPED.name, otel_gpu__reason=semconv.Reason.NO_DESTINATION,
                                      otel_gpu__signal=semconv.Signal.PROFILES)
                    continue
                self._export(dataclasses.replace(batch, node=self._node, processes=self._named(batch.processes)),
                             exporters)

    @staticmethod
    def _export(batch: ProfileBatch, exporters: list) -> None:  # type: ignore[type-arg]
        for exporter in exporters:
            try:
                exporter.export(batch)
            except Exception:  # exporters should return False, never raise; guard anyway
                _logger.exception("profile exporter %s failed", getattr(exporter, "name", exporter))

    # --- helpers ---------------------------------------------------------------------------------------------------

    def _named(self, processes: tuple[ProcessProfile, ...]) -> tuple[ProcessProfile, ...]:
        """With --k8s-names, each process's pod names as known now (a source may hold an identity read before its
        pod was listed); the same tuple otherwise."""
        if self._k8s_names is None:
            return processes
        return tuple(p if (info := self._resolver.with_names(p.process)) is p.process
                     else dataclasses.replace(p, process=info) for p in processes)

    def _destinations(self, prometheus_address: tuple[str, int] | None,
                      metric_exporters: Collection[str] | None = None, *, profiling: bool = True) -> str:
        """Where each signal goes, for the start-up line; the Prometheus endpoint only when it really listens, and
        the metrics' local outputs as the pipeline has them (``metric_exporters``: its exporters' names; None: as
        configured). Without a profile source running (``profiling`` false) profiles go nowhere: they are off."""
        config = self.config
        metrics = []
        if (target := config.otlp.metrics_target()) is not None:
            metrics.append(f"OTLP {target[0]} {target[1]}")
        if prometheus_address is not None:
            host, port = prometheus_address
            metrics.append(f"Prometheus scrape on {f'[{host}]' if ':' in host else host}:{port}/metrics")
        profiles = []
        if (target := config.otlp.profiles_target()) is not None:
            profiles.append(f"OTLP {target[0]} {target[1]}")
        if config.pyroscope.url:
            profiles.append(f"Pyroscope {config.pyroscope.url} ({config.pyroscope.api})")
        for kind, parts in (("metrics", metrics), ("profiles", profiles)):
            local = metric_exporters if kind == "metrics" and metric_exporters is not None else None
            if config.writes_files(kind) if local is None else "files" in local:
                parts.append(f"files in {config.output.dir}")
            if config.shows_console(kind) if local is None else "console" in local:
                parts.append("terminal")
        if not profiling:
            return f"metrics -> {' + '.join(metrics) or 'nowhere'}; profiles -> off (no profile source runs)"
        line = f"metrics -> {' + '.join(metrics) or 'nowhere'}; profiles -> {' + '.join(profiles) or 'nowhere'}"
        if config.otlp.generic_endpoint_is_metrics_only() and not config.otlp.profiles_endpoint:
            line += (f" (the OTLP endpoint {config.otlp.endpoint} has a path, as a metrics backend's has, so it gets"
                     " no profiles: give profiles --otlp-profiles-endpoint or --pyroscope-url)")
        return line

    def _install_signal_handlers(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return

        def handler(signum: int, frame: FrameType | None) -> None:
            self._signals += 1
            if self._signals == 1:
                self._stop.set()
                return
            # whoever sends a second signal does not want to wait for the flush
            _logger.warning("second %s: stopping now; what is still queued is lost", signal.Signals(signum).name)
            logging.shutdown()
            os._exit(128 + signum)

        previous: dict[int, Callable[..., object] | int | None] = {}
        for sig in (signal.SIGTERM, signal.SIGINT):
            previous[sig] = signal.signal(sig, handler)


def _opened(source: Any, what: str, cleanup: contextlib.ExitStack) -> bool:
    """Open ``source``; on SourceUnavailable log one line, ``what`` ("GPU metrics are off") and why, and return False.
    An opened source is closed when ``cleanup`` unwinds."""
    try:
        source.open()
    except SourceUnavailable as exc:
        _logger.warning("%s: %s", what, exc)
        return False
    cleanup.callback(source.close)
    return True
