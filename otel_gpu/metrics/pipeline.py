# SPDX-License-Identifier: Apache-2.0
"""The metrics pipeline: one MeterProvider whose readers send the same instruments to every configured place.

    OTLP (gRPC or HTTP/protobuf)   PeriodicExportingMetricReader, every ``metrics.export_interval_s``
    Prometheus /metrics            PrometheusMetricReader behind prometheus_client's HTTP server (pull)
    metrics.jsonl                  OTLP/JSON lines under ``output.dir`` (the local default)
    terminal table                 printed each interval (the local default)

Every push exporter is wrapped in :class:`CountingExporter`, which sends on a thread of its own (collection never
waits on an export), turns results into self-metrics (``otel_gpu.export.failures``, ``otel_gpu.dropped``) and logs
one line when a destination starts failing, saying why (refused, unknown host, no answer, closed without an answer,
the backend's own error answer), one at once when the reason changes, the same reason at most every
``FAILURE_LOG_INTERVAL_S``, and one when it recovers. Temporality is cumulative for every instrument kind, so a
backend that comes back simply continues the series. Exporters are built from explicit arguments taken from the
config object.
"""

from __future__ import annotations

import dataclasses
import logging
import sys
import threading
import time
import urllib.parse
from collections.abc import Callable
from pathlib import Path
from typing import Any

from opentelemetry.metrics import Meter
from opentelemetry.sdk.metrics import AlwaysOffExemplarFilter, MeterProvider
from opentelemetry.sdk.metrics.export import (
    Gauge,
    MetricExporter,
    MetricExportResult,
    MetricReader,
    MetricsData,
    PeriodicExportingMetricReader,
)
from opentelemetry.sdk.resources import Resource

from otel_gpu import selfmetrics, semconv
from otel_gpu.config import AgentConfig, OTLPConfig
from otel_gpu.exporters.diagnosis import OutageProbe, address, describe_exception, escaped, probe
from otel_gpu.metrics import CUMULATIVE_EVERYWHERE, _stale
from otel_gpu.metrics.console import ConsoleTableExporter
from otel_gpu.metrics.files import JsonLinesMetricExporter
from otel_gpu.metrics.self_instruments import SELF_METER_NAME, register_self_instruments

_logger = logging.getLogger(__name__)

SIGNAL = semconv.Signal.METRICS
_SHUTDOWN_GRACE_S = 5.0
SUPERSEDED_LOG_INTERVAL_S = 300.0  # at most one line this often while collections are dropped for a slow backend
FAILURE_LOG_INTERVAL_S = 300.0  # at most one line this often while exports keep failing for the same reason


class CountingExporter(MetricExporter):
    """Wraps a push exporter: sends on a thread of its own, counts failures and dropped points, logs when an outage
    starts, when its reason changes and when it ends (the same reason again at most every
    ``FAILURE_LOG_INTERVAL_S``), never raises.

    ``export()`` only hands the collection over, so a backend that hangs or is down never delays the next
    collection. While one collection is being sent the next one waits; a newer one replaces a waiting one (the
    temporality is cumulative, so the newer holds everything the older did) and the replaced points are counted as
    dropped (``superseded``), with one log line at once and then at most one every
    ``SUPERSEDED_LOG_INTERVAL_S`` (the SDK's exporter may still be retrying and succeed later, so no failure is
    logged for it), and one when a send goes through again. The first such line says what is known of why the send
    has not finished (it comes before the failure, which the SDK's exporter reports only once its retries end).

    Why a send failed: the inner exporter's ``last_error`` (the backend's error answer or the connection error, in
    words) when it has one, else what ``probe`` finds at the address (refused, unknown host, closed at once:
    "" when nothing), else ``no_answer``. A ``last_error`` marked ``last_error_transport`` (a gRPC UNAVAILABLE)
    gives way to what the probe finds. A probe is one TCP connection (at most 2.2 s) on the sender's thread, or on a
    thread of its own for the superseded line; :class:`OutageProbe` makes it at most once per backoff period of an
    outage (10 s doubling to 300 s) and answers the failed exports in between with its verdict, so an outage costs
    a few probes, not one per failed export. A send that goes through ends the outage (and the kept verdict).
    """

    def __init__(self, inner: MetricExporter, name: str, destination: str, probe: OutageProbe | None = None,
                 no_answer: str = "the exporter reported a failure") -> None:
        super().__init__(preferred_temporality=CUMULATIVE_EVERYWHERE)
        self.inner = inner
        self.name = name
        self.destination = destination
        self.failures_in_outage = 0
        self._probe = probe
        self._no_answer = no_answer
        self._failure_kind = ""  # the kind of reason of the last failure line
        self._failure_logged_at = 0.0  # monotonic time of the last failure line
        self._failures_unlogged = 0  # failed exports since the last failure line
        self._cond = threading.Condition()
        self._waiting: tuple[MetricsData, float] | None = None  # (collection, export timeout in ms)
        self._sending = False
        self._closed = False
        self._superseded_points = 0  # dropped since the last line about it
        self._superseded_since_send = 0  # dropped since the last send that went through
        self._superseded_logged_at: float | None = None  # monotonic
        self._thread = threading.Thread(target=self._run, name=f"otel-gpu-metrics-{name}", daemon=True)
        self._thread.start()

    def export(self, metrics_data: MetricsData, timeout_millis: float = 10_000, **kwargs: Any) -> MetricExportResult:
        log: tuple[int, bool] | None = None
        with self._cond:
            if self._closed:
                return MetricExportResult.FAILURE
            if self._waiting is not None:
                dropped = _count_points(self._waiting[0])
                selfmetrics.count(semconv.SELF_DROPPED.name, dropped,
                                  otel_gpu__reason=semconv.Reason.SUPERSEDED, otel_gpu__signal=SIGNAL)
                log = self._superseded(dropped)
            self._waiting = (metrics_data, timeout_millis)
            self._cond.notify_all()
        if log is not None:
            points, first = log
            if first and self._probe is not None and not self._known_reason():
                # the probe takes up to 2.2 s: not on the collecting thread
                threading.Thread(target=self._log_superseded, args=(points, first), daemon=True,
                                 name=f"otel-gpu-metrics-{self.name}-probe").start()
            else:
                self._log_superseded(points, first)
        return MetricExportResult.SUCCESS

    def _superseded(self, dropped: int) -> tuple[int, bool] | None:
        """Count ``dropped`` superseded points (under the lock); (points to log, first line?) when a line is due:
        at once, then at most every ``SUPERSEDED_LOG_INTERVAL_S``."""
        now = time.monotonic()
        self._superseded_points += dropped
        self._superseded_since_send += dropped
        if self._superseded_logged_at is not None and now - self._superseded_logged_at < SUPERSEDED_LOG_INTERVAL_S:
            return None
        due = (self._superseded_points, self._superseded_logged_at is None)
        self._superseded_points, self._superseded_logged_at = 0, now
        return due

    def _log_superseded(self, points: int, first: bool) -> None:
        if first:
            cause = self._reason(finished=False) or "the backend is slow or unreachable, or the exporter is retrying"
            state = f"has not finished before the next collection ({cause})"
        else:
            state = "is still behind"
        _logger.warning("metrics export to %s (%s) %s: dropped %d points of older collections (%s in %s; the newest "
                        "collection holds their values); logging again at most every %.0f s", self.name,
                        self.destination, state, points, semconv.Reason.SUPERSEDED, semconv.SELF_DROPPED.name,
                        SUPERSEDED_LOG_INTERVAL_S)

    def _known_reason(self) -> str:
        """The inner exporter's words for its last failed attempt, unless they give way to a probe ("" then)."""
        if getattr(self.inner, "last_error_transport", False):
            return ""
        return str(getattr(self.inner, "last_error", "") or "")

    def _reason(self, finished: bool) -> str:
        """Why the send failed (``finished``) or has not finished yet: "" when nothing is known of the latter."""
        known = self._known_reason()
        if known:
            return known
        transport = str(getattr(self.inner, "last_error", "") or "")  # the probe may say more
        if finished and self._closed:
            return transport or "cancelled at shutdown"  # no probe: shutdown is waiting
        found = self._probe() if self._probe is not None else ""
        return found or transport or ("" if not finished else self._no_answer)

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        """Wait until every collection handed over has been sent (or ``timeout_millis`` passes)."""
        deadline = time.monotonic() + timeout_millis / 1000.0
        with self._cond:
            idle = self._cond.wait_for(lambda: self._waiting is None and not self._sending,
                                       max(0.0, deadline - time.monotonic()))
        return idle and self.inner.force_flush(max(0.0, deadline - time.monotonic()) * 1000.0)

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
        """Send what is waiting within the timeout, then stop the exporter, which cancels a send still running.

        The SDK's reader passes the time left as ``timeout`` (milliseconds)."""
        timeout_s = float(kwargs.get("timeout", timeout_millis)) / 1000.0
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._thread.join(max(0.0, timeout_s))
        with self._cond:
            if self._waiting is not None:
                selfmetrics.count(semconv.SELF_DROPPED.name, _count_points(self._waiting[0]),
                                  otel_gpu__reason=semconv.Reason.SHUTDOWN, otel_gpu__signal=SIGNAL)
                self._waiting = None
        try:
            self.inner.shutdown(timeout_millis=0)
        except Exception:  # shutdown boundary: the others must still stop
            _logger.exception("shutting down the %s metrics exporter failed", self.name)

    def _run(self) -> None:
        while True:
            with self._cond:
                while self._waiting is None and not self._closed:
                    self._cond.wait()
                if self._waiting is None:
                    return  # closed and everything sent
                (metrics_data, timeout_millis), self._waiting = self._waiting, None
                self._sending = True
            try:
                self._send(metrics_data, timeout_millis)
            finally:
                with self._cond:
                    self._sending = False
                    self._cond.notify_all()

    def _send(self, metrics_data: MetricsData, timeout_millis: float) -> None:
        reason = ""
        try:
            result = self.inner.export(metrics_data, timeout_millis=timeout_millis)
        except Exception as exc:  # noqa: BLE001 - export boundary: a raising exporter must not stop the thread
            result, reason = MetricExportResult.FAILURE, f"{type(exc).__name__}: {exc}"
        if result is MetricExportResult.SUCCESS:
            if self._probe is not None:
                self._probe.reset()
            with self._cond:
                caught_up, self._superseded_since_send = self._superseded_since_send, 0
                if caught_up:
                    self._superseded_points, self._superseded_logged_at = 0, None
            if caught_up:
                _logger.info("metrics export to %s (%s) went through again; %d points of older collections were "
                             "dropped meanwhile (%s)", self.name, self.destination, caught_up,
                             semconv.Reason.SUPERSEDED)
            if self.failures_in_outage:
                _logger.info("metrics export to %s (%s) recovered after %d failed exports", self.name,
                             self.destination, self.failures_in_outage)
                self.failures_in_outage = 0
                self._failure_kind, self._failures_unlogged = "", 0
            return
        self.failures_in_outage += 1
        self._failures_unlogged += 1
        selfmetrics.count(semconv.SELF_EXPORT_FAILURES.name, otel_gpu__exporter=self.name, otel_gpu__signal=SIGNAL)
        selfmetrics.count(semconv.SELF_DROPPED.name, _count_points(metrics_data),
                          otel_gpu__reason=semconv.Reason.EXPORT_FAILED,
                          otel_gpu__signal=SIGNAL)
        self._log_failure(reason or self._reason(finished=True))

    def _log_failure(self, reason: str) -> None:
        """The first failure of an outage and each new kind of reason at once, the same kind again at most every
        FAILURE_LOG_INTERVAL_S with the count."""
        kind = reason.split(": ", 1)[0]  # "HTTP 500 from URL", "connection refused by HOST:PORT": details differ
        now = time.monotonic()
        if self.failures_in_outage == 1:
            _logger.warning("metrics export to %s (%s) is failing (%s); counting failures in %s, logging a new reason "
                            "at once, the same one again at most every %.0f s, and when it recovers", self.name,
                            self.destination, reason, semconv.SELF_EXPORT_FAILURES.name, FAILURE_LOG_INTERVAL_S)
        elif kind != self._failure_kind:
            _logger.warning("metrics export to %s (%s) is failing for another reason now (%s); %d failed exports so "
                            "far", self.name, self.destination, reason, self.failures_in_outage)
        elif now - self._failure_logged_at >= FAILURE_LOG_INTERVAL_S:
            _logger.warning("metrics export to %s (%s) is still failing (%s): %d more failed exports in %.0f s",
                            self.name, self.destination, reason, self._failures_unlogged,
                            now - self._failure_logged_at)
        else:
            return
        self._failure_kind, self._failure_logged_at, self._failures_unlogged = kind, now, 0


def _count_points(metrics_data: MetricsData) -> int:
    return sum(len(getattr(metric.data, "data_points", ()))
               for resource_metrics in metrics_data.resource_metrics
               for scope_metrics in resource_metrics.scope_metrics
               for metric in scope_metrics.metrics)


def no_answer(url: str, protocol: str, timeout_s: float) -> str:
    """The reason given for a failed export when the exporter has no words for it and a probe of ``url`` connects
    (:func:`otel_gpu.exporters.diagnosis.probe`): up, but no successful answer."""
    host, port = address(url)
    return f"{host}:{port} takes connections but gave no successful answer within {timeout_s:g} s; check that it " \
           f"takes OTLP {protocol}"


def build_otlp_exporter(otlp: OTLPConfig) -> tuple[MetricExporter, str, str] | None:
    """(exporter, exporter name, URL) for ``otlp.signal("metrics")``, or None when no OTLP backend is configured
    (or a TLS file cannot be read: logged and counted)."""
    settings = otlp.signal(SIGNAL)
    if not settings.url:
        return None
    url, headers = settings.url, dict(settings.headers)
    if settings.protocol == "grpc":
        import grpc

        scheme = urllib.parse.urlparse(url).scheme
        insecure = scheme == "http" or (settings.insecure and scheme != "https")
        credentials = None
        if not insecure:
            try:
                root, key, chain = (Path(name).read_bytes() if name else None for name in (
                    settings.certificate, settings.client_key, settings.client_certificate))
            except OSError as exc:
                _logger.error("OTLP metrics export is off: cannot read the TLS file %s (--otlp-certificate, "
                              "--otlp-client-key, --otlp-client-certificate): %s", exc.filename,
                              exc.strerror or exc)
                selfmetrics.count(semconv.SELF_ERRORS.name, otel_gpu__source=semconv.Source.OTLP_METRICS,
                                  otel_gpu__reason=semconv.Reason.CERTIFICATE)
                return None
            credentials = grpc.ssl_channel_credentials(root_certificates=root, private_key=key,
                                                       certificate_chain=chain)
        compression = grpc.Compression.Gzip if settings.compression == "gzip" else grpc.Compression.NoCompression
        exporter: MetricExporter = _grpc_exporter_class()(
            endpoint=url, insecure=insecure, credentials=credentials,
            headers={key.lower(): value for key, value in headers.items()},  # gRPC metadata keys are lowercase
            timeout=settings.timeout_s,
            compression=compression, preferred_temporality=CUMULATIVE_EVERYWHERE)
        return exporter, "otlp_grpc", url
    from opentelemetry.exporter.otlp.proto.http import Compression as HTTPCompression

    exporter = _http_exporter_class()(
        endpoint=url, certificate_file=settings.certificate or None, client_key_file=settings.client_key or None,
        client_certificate_file=settings.client_certificate or None, headers=headers, timeout=settings.timeout_s,
        compression=HTTPCompression.Gzip if settings.compression == "gzip" else HTTPCompression.NoCompression,
        preferred_temporality=CUMULATIVE_EVERYWHERE)
    return exporter, "otlp_http", url


def _http_exporter_class() -> type[MetricExporter]:
    """The SDK's OTLP/HTTP metric exporter, which also keeps the backend's last error answer in words
    (``last_error``: a ``google.rpc.Status`` decoded, see ``describe_error_body``, or why the connection gave no
    answer, see ``describe_exception``); the SDK logs only the HTTP reason phrase and reports only "failure". The
    answer is read by a response hook of the exporter's own ``requests`` session, which also sees what a request
    raises."""
    import requests
    from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter

    from otel_gpu.exporters.otlp_profiles import describe_error_body

    class OwnTrustSession(requests.Session):
        """requests replaces a session's CA file with REQUESTS_CA_BUNDLE or CURL_CA_BUNDLE when either is set (as
        in many images), which would ignore --otlp-certificate; the session's own setting wins here."""

        def __init__(self, on_error: Callable[[Exception, str, float], None]) -> None:
            super().__init__()
            self._on_error = on_error

        def merge_environment_settings(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
            settings: dict[str, Any] = super().merge_environment_settings(*args, **kwargs)
            settings["verify"] = self.verify
            return settings

        def request(self, method: str, url: str, *args: Any, **kwargs: Any) -> requests.Response:  # type: ignore[override]
            try:
                return super().request(method, url, *args, **kwargs)
            except Exception as exc:  # recorded and raised on: the SDK's transport turns it into a failed result
                timeout = kwargs.get("timeout")
                self._on_error(exc, url, float(timeout) if isinstance(timeout, (int, float)) else 0.0)
                raise

    class ExplainingHTTPMetricExporter(OTLPMetricExporter):
        def __init__(self, **kwargs: Any) -> None:
            self.last_error = ""
            self._timeout_s = float(kwargs.get("timeout") or 10.0)
            session = OwnTrustSession(self._record_error)
            session.hooks["response"].append(self._record)
            super().__init__(session=session, **kwargs)

        def _record_error(self, exc: Exception, url: str, timeout_s: float) -> None:
            self.last_error = describe_exception(exc, url, expects="OTLP HTTP/protobuf",
                                                 timeout_s=timeout_s or self._timeout_s)

        def _record(self, response: requests.Response, *args: Any, **kwargs: Any) -> None:
            if response.status_code >= 400:
                self.last_error = (f"HTTP {response.status_code} from {response.url}: "
                                   f"{describe_error_body(response.content, response.headers.get('Content-Type', ''))}")

        def export(self, metrics_data: MetricsData, timeout_millis: float = 10_000,
                   **kwargs: Any) -> MetricExportResult:
            self.last_error = ""
            return super().export(metrics_data, timeout_millis=timeout_millis, **kwargs)

    return ExplainingHTTPMetricExporter


def _grpc_exporter_class() -> type[MetricExporter]:
    """The SDK's OTLP/gRPC metric exporter, which also keeps the backend's last error status in words
    (``last_error``: ``gRPC CODE from URL: details``; ``last_error_transport`` when it is UNAVAILABLE or
    DEADLINE_EXCEEDED, where a probe of the address says more); the SDK reports only "failure". The status is read
    by a wrapper of the exporter's stub, made again whenever the SDK makes a new channel."""
    import grpc
    from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter

    transport_codes = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)

    class ExplainingGRPCMetricExporter(OTLPMetricExporter):
        def __init__(self, **kwargs: Any) -> None:
            self.last_error = ""
            self.last_error_transport = False
            self._url = str(kwargs.get("endpoint", ""))
            super().__init__(**kwargs)

        def _initialize_channel_and_stub(self) -> None:
            super()._initialize_channel_and_stub()
            stub, exporter = self._client, self

            class RecordingStub:
                def Export(self, *args: Any, **kwargs: Any) -> Any:  # noqa: N802 - the gRPC method's name
                    try:
                        return stub.Export(*args, **kwargs)
                    except grpc.RpcError as exc:
                        code = exc.code() if hasattr(exc, "code") else grpc.StatusCode.UNKNOWN
                        details = exc.details() if hasattr(exc, "details") else str(exc)
                        exporter.last_error = f"gRPC {code.name} from {exporter._url}: {escaped(details or '')}"
                        exporter.last_error_transport = code in transport_codes
                        raise

            self._client = RecordingStub()

        def export(self, metrics_data: MetricsData, timeout_millis: float = 10_000,
                   **kwargs: Any) -> MetricExportResult:
            self.last_error, self.last_error_transport = "", False
            return super().export(metrics_data, timeout_millis=timeout_millis, **kwargs)

    return ExplainingGRPCMetricExporter


class MetricsPipeline:
    """Owns the MeterProvider, its readers and the Prometheus HTTP server. ``shutdown()`` is idempotent."""

    def __init__(self, config: AgentConfig, resource: Resource, *,
                 extra_readers: tuple[MetricReader, ...] = ()) -> None:
        self.config = config
        self.exporters: list[CountingExporter] = []
        self.prometheus_address: tuple[str, int] | None = None
        self._prometheus_server: Any = None
        self._prometheus_thread: threading.Thread | None = None
        self._shutdown_lock = threading.Lock()
        self._closed = False
        interval_ms = config.metrics.export_interval_s * 1000.0
        self._timeout_s = config.otlp.signal(SIGNAL).timeout_s
        timeout_ms = self._timeout_s * 1000.0

        # Shutdown runs the readers in this order: local outputs and the scrape endpoint first, so a slow last
        # export to a backend that is down cannot hold them up.
        readers: list[MetricReader] = list(extra_readers)
        scrape_only_and_down = False  # the scrape endpoint was the metrics' one backend, and it cannot listen
        if config.metrics.prometheus_port:
            reader = self._start_prometheus(config.metrics.prometheus_host, config.metrics.prometheus_port)
            if reader is not None:
                readers.append(reader)
            else:
                scrape_only_and_down = config.otlp.metrics_target() is None
        files_on = config.writes_files("metrics") or (scrape_only_and_down and config.output.files == "auto")
        console_on = config.shows_console("metrics") or (scrape_only_and_down and config.output.console == "auto")
        if scrape_only_and_down:
            if files_on or console_on:
                _logger.warning("metrics go to the local default instead: %s",
                                " and ".join(([f"files in {config.output.dir}"] if files_on else [])
                                             + (["the terminal"] if console_on else [])))
            else:
                _logger.warning("metrics have no destination left (--local-files off, --console off, no OTLP "
                                "backend): they are not exported")
        if files_on:
            files = JsonLinesMetricExporter(config.output.dir)
            self.exporters.append(CountingExporter(files, "files", str(files.path)))
        if console_on:
            console = ConsoleTableExporter(sys.stdout, interval_s=config.metrics.export_interval_s)
            self.exporters.append(CountingExporter(console, "console", "stdout"))
        built = build_otlp_exporter(config.otlp)
        if built is not None:
            exporter, name, url = built
            protocol = "gRPC" if name == "otlp_grpc" else "HTTP/protobuf"
            self.exporters.append(CountingExporter(
                exporter, name, url,
                probe=OutageProbe(lambda: probe(url, f"OTLP {protocol}", grpc=name == "otlp_grpc",
                                                connect_s=min(self._timeout_s, 2.0))),
                no_answer=no_answer(url, protocol, self._timeout_s)))
        for counting in self.exporters:
            readers.append(PeriodicExportingMetricReader(counting, export_interval_millis=interval_ms,
                                                         export_timeout_millis=timeout_ms))

        _stale.install()
        self._provider = MeterProvider(metric_readers=readers, resource=resource,
                                       exemplar_filter=AlwaysOffExemplarFilter(), shutdown_on_exit=False)
        register_self_instruments(self._provider.get_meter(SELF_METER_NAME))

    def meter(self, name: str) -> Meter:
        """A Meter of the pipeline's MeterProvider (instrumentation scope ``name``)."""
        return self._provider.get_meter(name)

    def force_flush(self, timeout_s: float = 10.0) -> bool:
        """Collect and export now (tests, and a last export before exit)."""
        return self._provider.force_flush(timeout_millis=timeout_s * 1000.0)

    def shutdown(self, timeout_s: float | None = None) -> None:
        """Export once more, stop the readers and the Prometheus server. The exports get ``timeout_s`` in all
        (default: the OTLP timeout plus 5 s); a send still running then is cancelled and its points counted."""
        with self._shutdown_lock:
            if self._closed:
                return
            self._closed = True
        if timeout_s is None:
            timeout_s = self._timeout_s + _SHUTDOWN_GRACE_S
        try:
            self._provider.shutdown(timeout_millis=timeout_s * 1000.0)
        except Exception as exc:  # noqa: BLE001 - shutdown boundary: the HTTP server must still stop
            _logger.warning("stopping the metric readers: %s", exc)
        if self._prometheus_server is not None:
            self._prometheus_server.shutdown()
            self._prometheus_server.server_close()
            if self._prometheus_thread is not None:
                self._prometheus_thread.join(timeout=_SHUTDOWN_GRACE_S)
            self._prometheus_server = None

    def _start_prometheus(self, host: str, port: int) -> MetricReader | None:
        from prometheus_client import CollectorRegistry, ProcessCollector, start_http_server

        registry = CollectorRegistry()
        ProcessCollector(registry=registry)  # process_resident_memory_bytes etc. of the agent itself
        try:
            server, thread = start_http_server(port, addr=host, registry=registry)
        except OSError as exc:
            _logger.error("the Prometheus endpoint is off: cannot listen on %s:%d (%s); change --prometheus-port "
                          "or --prometheus-host", host, port, exc.strerror or exc)
            selfmetrics.count(semconv.SELF_ERRORS.name, otel_gpu__source=semconv.Source.PROMETHEUS,
                              otel_gpu__reason=semconv.Reason.LISTEN)
            return None
        self._prometheus_server, self._prometheus_thread = server, thread
        self.prometheus_address = (host, server.server_address[1])
        return _ratio_naming_reader(registry)


def _ratio_naming_reader(registry: Any) -> MetricReader:
    """The SDK's PrometheusMetricReader with the OTel-Prometheus rule it lacks: gauges of unit ``1`` get the
    ``_ratio`` suffix, so the scrape names match ``semconv.prometheus_name`` and OTLP-translating backends.
    """
    from opentelemetry.exporter.prometheus import PrometheusMetricReader

    class RatioNamingPrometheusReader(PrometheusMetricReader):
        def _receive_metrics(self, metrics_data: MetricsData, timeout_millis: float = 10_000,
                             **kwargs: Any) -> None:
            super()._receive_metrics(_with_ratio_units(metrics_data), timeout_millis, **kwargs)  # type: ignore[arg-type]

    return RatioNamingPrometheusReader(registry=registry)


def _with_ratio_units(metrics_data: MetricsData | None) -> MetricsData | None:
    if metrics_data is None:
        return None
    return dataclasses.replace(metrics_data, resource_metrics=[
        dataclasses.replace(resource_metrics, scope_metrics=[
            dataclasses.replace(scope_metrics, metrics=[
                dataclasses.replace(metric, unit="ratio")
                if metric.unit == "1" and isinstance(metric.data, Gauge) else metric
                for metric in scope_metrics.metrics])
            for scope_metrics in resource_metrics.scope_metrics])
        for resource_metrics in metrics_data.resource_metrics])
