# SPDX-License-Identifier: Apache-2.0
"""The agent's configuration: one frozen object, built from flag > environment > YAML file > default.

This module is the only reader of the environment. Every option is declared once in ``OPTIONS``; the command-line
flags, the ``OTEL_GPU_*`` variables, the YAML keys and the validation messages all come from that table.
Standard OpenTelemetry variables (``OTEL_EXPORTER_OTLP_*``, ``OTEL_RESOURCE_ATTRIBUTES``, ``OTEL_SERVICE_NAME``,
``OTEL_METRIC_EXPORT_INTERVAL``) mean what the OpenTelemetry specification says they mean.
"""

from __future__ import annotations

import argparse
import difflib
import logging
import os
import re
import urllib.parse
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


EXIT_CONFIG_ERROR = 2
MAX_CONFIG_FILE_BYTES = 1 << 20  # a configuration file is a page of YAML; /dev/zero or a log file is a mistake
PID_MAX = 1 << 22  # PID_MAX_LIMIT: no process id on Linux is larger
# the profile queue must hold at least one interval's payloads (KBs on a quiet node, far more on a busy one); a
# smaller one drops every payload as larger than the whole queue
QUEUE_MIN_BYTES = 1 << 20

_PROTOCOLS = ("grpc", "http/protobuf")
_UNSUPPORTED_PROTOCOLS = (("http/json", "the OpenTelemetry Python SDK the agent exports with has no OTLP/JSON "
                                        "exporter (http/protobuf goes to the same endpoint and port, 4318)"),)
_COMPRESSIONS = ("none", "gzip")
_LOG_LEVELS = ("debug", "info", "warning", "error")
_LOG_LEVEL_ALIASES = (("warn", "warning"),)  # what other OpenTelemetry SDKs and most tools call it
_TRISTATE = ("auto", "on", "off")
_PYROSCOPE_APIS = ("otlp", "ingest")


class ConfigError(Exception):
    """Bad configuration. ``problems`` lists every problem found, each naming its flag and allowed values."""

    def __init__(self, problems: Sequence[str]) -> None:
        super().__init__("\n".join(problems))
        self.problems = list(problems)


@dataclass(frozen=True, slots=True, kw_only=True)
class OTLPConfig:
    """Where OTLP data goes. Empty endpoints mean "no OTLP backend"."""

    endpoint: str = ""
    metrics_endpoint: str = ""
    profiles_endpoint: str = ""
    protocol: str = "grpc"
    metrics_protocol: str = ""
    profiles_protocol: str = ""
    # secrets: left out of repr(), so that no log line or error message that shows a config object shows them
    headers: tuple[tuple[str, str], ...] = field(default=(), repr=False)
    metrics_headers: tuple[tuple[str, str], ...] = field(default=(), repr=False)
    profiles_headers: tuple[tuple[str, str], ...] = field(default=(), repr=False)
    certificate: str = ""
    metrics_certificate: str = ""
    profiles_certificate: str = ""
    client_key: str = ""
    metrics_client_key: str = ""
    profiles_client_key: str = ""
    client_certificate: str = ""
    metrics_client_certificate: str = ""
    profiles_client_certificate: str = ""
    insecure: bool = False
    compression: str = "none"  # the specification's default; gzip only when asked
    metrics_compression: str = ""
    profiles_compression: str = ""
    timeout_s: float = 10.0
    metrics_timeout_s: float = 0.0  # 0: the generic timeout_s
    profiles_timeout_s: float = 0.0

    def signal(self, signal: str) -> OTLPSignal:
        """The settings one signal (``metrics`` or ``profiles``) uses: its own where set, else the generic ones,
        as the OTLP exporter specification orders them. ``url`` is empty when no endpoint is configured."""
        own = "metrics_" if signal == "metrics" else "profiles_"
        target = self.metrics_target() if signal == "metrics" else self.profiles_target()
        protocol, url = target or (getattr(self, own + "protocol") or self.protocol, "")
        return OTLPSignal(
            protocol=protocol, url=url, headers=tuple(self.headers_for(signal).items()),
            timeout_s=getattr(self, own + "timeout_s") or self.timeout_s,
            compression=getattr(self, own + "compression") or self.compression,
            certificate=getattr(self, own + "certificate") or self.certificate,
            client_key=getattr(self, own + "client_key") or self.client_key,
            client_certificate=getattr(self, own + "client_certificate") or self.client_certificate,
            insecure=self.insecure)

    def metrics_target(self) -> tuple[str, str] | None:
        """(protocol, URL) of the metrics backend, or None when none is configured.

        A signal-specific endpoint is used as-is; the generic endpoint gets ``/v1/metrics`` appended for HTTP.
        """
        protocol = self.metrics_protocol or self.protocol
        if self.metrics_endpoint:
            return protocol, self.metrics_endpoint
        if self.endpoint:
            return protocol, _signal_url(self.endpoint, protocol, "v1/metrics")
        return None

    def profiles_target(self) -> tuple[str, str] | None:
        """(protocol, URL) of the profiles backend, or None when none is configured.

        The generic endpoint feeds profiles only where it can be a Collector (or Pyroscope): gRPC, or HTTP at the
        root of its address. An HTTP endpoint with a path is a metrics backend's OTLP mount (Mimir ``/otlp``,
        Prometheus ``/api/v1/otlp``, VictoriaMetrics ``/opentelemetry``), which serves no profiles; profiles then
        need their own endpoint (``profiles_endpoint``) or Pyroscope.
        """
        protocol = self.profiles_protocol or self.protocol
        if self.profiles_endpoint:
            return protocol, self.profiles_endpoint
        if self.endpoint and not self.generic_endpoint_is_metrics_only():
            return protocol, _signal_url(self.endpoint, protocol, "v1development/profiles")
        return None

    def generic_endpoint_is_metrics_only(self) -> bool:
        """Whether the generic endpoint is an HTTP URL with a path: a metrics backend's mount, never given profiles."""
        if not self.endpoint or (self.profiles_protocol or self.protocol) == "grpc":
            return False
        return urllib.parse.urlsplit(self.endpoint).path.strip("/") != ""

    def headers_for(self, signal: str) -> dict[str, str]:
        """Generic headers overlaid with the signal's own (``metrics`` or ``profiles``)."""
        merged = dict(self.headers)
        merged.update(dict(self.metrics_headers if signal == "metrics" else self.profiles_headers))
        return merged


@dataclass(frozen=True, slots=True, kw_only=True)
class OTLPSignal:
    """One signal's resolved OTLP settings (see ``OTLPConfig.signal``); file settings are paths of PEM files."""

    protocol: str
    url: str
    headers: tuple[tuple[str, str], ...] = field(default=(), repr=False)
    timeout_s: float
    compression: str
    certificate: str
    client_key: str
    client_certificate: str
    insecure: bool


def _signal_url(endpoint: str, protocol: str, path: str) -> str:
    if protocol == "grpc":
        return endpoint
    parts = urllib.parse.urlsplit(endpoint)  # the path goes before a query string (?api_key=...), not after it
    return urllib.parse.urlunsplit(parts._replace(path=parts.path.rstrip("/") + "/" + path))


@dataclass(frozen=True, slots=True, kw_only=True)
class MetricsConfig:
    """Metric export cadence and the Prometheus scrape endpoint."""

    export_interval_s: float = 10.0
    prometheus_port: int = 0
    prometheus_host: str = "0.0.0.0"


@dataclass(frozen=True, slots=True, kw_only=True)
class GPUConfig:
    """NVML collection."""

    enabled: bool = True
    per_process: bool = True
    collection_timeout_s: float = 5.0


@dataclass(frozen=True, slots=True, kw_only=True)
class ProfilingConfig:
    """eBPF CPU profiling and which processes it covers."""

    enabled: bool = True
    frequency_hz: int = 19
    interval_s: float = 10.0
    pids: tuple[int, ...] = ()
    process_name: str = ""
    container_id: str = ""
    include_self: bool = False
    command_args: bool = False  # process.command_args on each process's profile resource (command lines hold secrets)
    gpu_time: bool = True
    gpu_time_libraries: tuple[str, ...] = ()  # copies of the injection library that workloads load (a hostPath)

    def selects(self, pid: int, container_id: str, names: Iterable[str]) -> bool:
        """Whether --pid, --container-id and --process-name (searched in any of ``names``) take in this process."""
        if self.pids and pid not in self.pids:
            return False
        if self.container_id and not container_id.startswith(self.container_id):
            return False
        return not self.process_name or any(re.search(self.process_name, name) for name in names)


@dataclass(frozen=True, slots=True, kw_only=True)
class PyroscopeConfig:
    """Grafana Pyroscope as a direct profiles backend."""

    url: str = ""
    api: str = "otlp"
    tenant_id: str = ""
    basic_auth_user: str = ""
    basic_auth_password: str = field(default="", repr=False)


@dataclass(frozen=True, slots=True, kw_only=True)
class OutputConfig:
    """Local output: files under ``dir`` and the terminal summary."""

    dir: str = "./otel-gpu-data"
    files: str = "auto"
    console: str = "auto"
    queue_max_bytes: int = 64 * 1024 * 1024
    max_profile_files: int = 1000
    max_profile_bytes: int = 1024 * 1024 * 1024


@dataclass(frozen=True, slots=True, kw_only=True)
class K8sConfig:
    """The optional lookup of k8s.pod.name, k8s.namespace.name and k8s.container.name from the API server (k8s.py)."""

    names: bool = False
    names_ttl_s: float = 60.0
    api_url: str = ""  # from KUBERNETES_SERVICE_HOST/PORT in a pod
    service_account_dir: str = "/var/run/secrets/kubernetes.io/serviceaccount"


@dataclass(frozen=True, slots=True, kw_only=True)
class AgentConfig:
    """The effective configuration of one agent process."""

    config_file: str = ""
    duration_s: float = 0.0
    log_level: str = "info"
    service_name: str = "otel-gpu"
    node_name: str = ""
    resource_attributes: tuple[tuple[str, str], ...] = ()
    otlp: OTLPConfig = field(default_factory=OTLPConfig)
    metrics: MetricsConfig = field(default_factory=MetricsConfig)
    gpu: GPUConfig = field(default_factory=GPUConfig)
    profiling: ProfilingConfig = field(default_factory=ProfilingConfig)
    pyroscope: PyroscopeConfig = field(default_factory=PyroscopeConfig)
    output: OutputConfig = field(default_factory=OutputConfig)
    k8s: K8sConfig = field(default_factory=K8sConfig)
    warnings: tuple[str, ...] = field(default=(), compare=False)  # things worth saying that do not stop the agent

    @property
    def has_backend(self) -> bool:
        """True when any remote backend (OTLP, Prometheus scrape, Pyroscope) is configured."""
        return bool(
            self.otlp.metrics_target() or self.otlp.profiles_target() or self.pyroscope.url
            or self.metrics.prometheus_port
        )

    def has_backend_for(self, signal: str) -> bool:
        """Whether ``signal`` ("metrics" or "profiles") has a remote destination of its own."""
        if signal == "metrics":
            return bool(self.otlp.metrics_target() or self.metrics.prometheus_port)
        return bool(self.otlp.profiles_target() or self.pyroscope.url)

    def writes_files(self, signal: str) -> bool:
        """Whether ``signal`` goes to files under ``output.dir``: --files on, or auto and the signal has no backend
        (a signal never goes nowhere because the other one has a backend)."""
        return self.output.files == "on" or (self.output.files == "auto" and not self.has_backend_for(signal))

    def shows_console(self, signal: str) -> bool:
        """Whether ``signal``'s terminal summary is printed each interval (the same rule as files)."""
        return self.output.console == "on" or (self.output.console == "auto" and not self.has_backend_for(signal))

    @property
    def write_files(self) -> bool:
        """Whether metrics or profiles go to files under ``output.dir``."""
        return self.writes_files("metrics") or self.writes_files("profiles")

    @property
    def show_console(self) -> bool:
        """Whether a terminal summary (of metrics or profiles) is printed each interval."""
        return self.shows_console("metrics") or self.shows_console("profiles")


# --- option table -------------------------------------------------------------------------------------------------

Parser = Callable[[str], Any]


@dataclass(frozen=True, slots=True)
class Option:
    """One configuration option and every way to set it."""

    path: str  # "group.field" or "field"
    flag: str
    help: str
    parse: Parser
    env: tuple[str, ...] = ()
    choices: tuple[str, ...] = ()
    check: Callable[[Any], str | None] | None = None
    secret: bool = False
    repeatable: bool = False
    boolean: bool = False
    unsupported: tuple[tuple[str, str], ...] = ()  # (value, why it is refused): values users may rightly expect
    aliases: tuple[tuple[str, str], ...] = ()  # (another name, the choice it means), e.g. warn -> warning


def _bool(text: str) -> bool:
    value = str(text).strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"{text!r} is not a boolean (true/false)")


def _pairs(text: str) -> tuple[tuple[str, str], ...]:
    """``k1=v1,k2=v2`` (W3C baggage style, as OTEL_EXPORTER_OTLP_HEADERS), values URL-decoded."""
    if isinstance(text, Mapping):
        return tuple((str(k), str(v)) for k, v in text.items())
    out: list[tuple[str, str]] = []
    for item in str(text).split(","):
        item = item.strip()
        if not item:
            continue
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"{item!r} is not key=value")
        out.append((urllib.parse.unquote(key.strip()), urllib.parse.unquote(value.strip())))
    return tuple(out)


# Characters a key or value of ``k1=v1,k2=v2`` cannot hold as they are: the separators, the escape itself, and
# whitespace and control characters (an item is stripped when read, and a line break does not belong in YAML's
# one-line form). Everything else, non-ASCII included, is printed as it is.
_PAIR_UNSAFE = re.compile(r"[%,=\s\x00-\x1f\x7f]")


def _quote_pair_part(text: str) -> str:
    """``text`` percent-encoded where ``_pairs`` would read it otherwise (``,`` ``=`` ``%`` whitespace), UTF-8."""
    return _PAIR_UNSAFE.sub(lambda m: urllib.parse.quote(m.group(0), safe=""), text)


def _millis_to_s(text: str) -> float:
    try:
        return float(text) / 1000.0
    except ValueError:
        raise ValueError(f"{text!r} is not a number of milliseconds") from None


# Standard variables whose value is milliseconds where the option's flag takes seconds (the OTLP exporter
# specification: OTEL_EXPORTER_OTLP_TIMEOUT and its per-signal forms).
_MILLIS_VARIABLES = frozenset({"OTEL_EXPORTER_OTLP_TIMEOUT", "OTEL_EXPORTER_OTLP_METRICS_TIMEOUT",
                               "OTEL_EXPORTER_OTLP_PROFILES_TIMEOUT"})


def _range(low: float, high: float) -> Callable[[Any], str | None]:
    def check(value: Any) -> str | None:
        return None if low <= value <= high else f"must be between {_plain(low)} and {_plain(high)}"

    return check


def _plain(number: float) -> str:
    """A bound as people write it: 1099511627776, not 1.09951e+12; 0.001 stays 0.001."""
    return str(int(number)) if float(number).is_integer() else f"{number:g}"


def _unset_or_range(low: float, high: float) -> Callable[[Any], str | None]:
    def check(value: Any) -> str | None:
        return (None if value == 0 or low <= value <= high
                else f"must be 0 (unset) or between {_plain(low)} and {_plain(high)}")

    return check


def _otlp_endpoint(value: Any) -> str | None:
    """An http:// or https:// URL, or host:port without a scheme (gRPC's form: TLS unless --otlp-insecure; the
    protocol is checked with the other settings, in _cross_checks)."""
    if not value or "://" in str(value):
        return _url(value)
    try:
        parsed = urllib.parse.urlsplit(f"//{value}")
        port = parsed.port
    except ValueError as exc:
        return f"is not a valid host:port ({exc})"
    if not parsed.hostname or port is None or parsed.path or parsed.query:
        return "must be an http:// or https:// URL, or host:port for gRPC"
    return None


def _url(value: Any) -> str | None:
    if not value:
        return None
    try:
        parsed = urllib.parse.urlparse(str(value))
        parsed.port  # noqa: B018 - raises ValueError for a port that is not a number in 0..65535
    except ValueError as exc:
        return f"is not a valid URL ({exc})"
    if parsed.scheme not in ("http", "https") or not parsed.netloc:
        return "must be an http:// or https:// URL"
    if parsed.username is not None or parsed.password is not None:
        # a password in a URL ends up in logs and name lookups; credentials have flags of their own
        return ("must not hold a user or password (OTLP: --otlp-headers 'Authorization=Basic ...'; Pyroscope: "
                "--pyroscope-user and --pyroscope-password)")
    if not parsed.hostname:
        return "needs a host name"
    return None


_USERINFO = re.compile(r"(^|//)[^/@\s]*@")
# A query parameter whose name looks like a credential (?token=, &api_key=, ;sig=, X-Amz-Signature=): its value.
_SECRET_QUERY = re.compile(
    r"([?&;][^=&;#\s]*(?:token|key|secret|pass|pwd|auth|sig|credential|session|jwt|bearer)[^=&;#\s]*=)"
    r"[^&;#\s'\"]*", re.IGNORECASE)


def redacted(value: Any) -> Any:
    """``value`` with the user and password of a URL in it masked (``http://***@host``), and the values of query
    parameters named like a secret (``?token=***``, ``&api_key=***``); other values as they are.

    Also applied to whole log lines (``RedactingFilter``): a URL can reach a message through an exception's text.
    """
    if not isinstance(value, str):
        return value
    if "@" in value:
        value = _USERINFO.sub(r"\1***@", value)
    if "=" in value:
        value = _SECRET_QUERY.sub(r"\1***", value)
    return value


class RedactingFilter(logging.Filter):
    """A handler filter that masks URL secrets (see ``redacted``) in each record's message and traceback."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # noqa: BLE001 - a bad format call: left to the handler, which reports it and goes on
            return True
        masked = redacted(message)
        if masked != message:
            record.msg, record.args = masked, ()
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = redacted(record.exc_text)
        return True


def _regex(value: Any) -> str | None:
    try:
        re.compile(value)
    except re.error as exc:
        return f"is not a valid regular expression ({exc})"
    return None


def _port(value: Any) -> str | None:
    return None if 0 <= value <= 65535 else "must be between 0 (off) and 65535"


def _pid(value: Any) -> str | None:
    return None if 0 < value <= PID_MAX else f"is not a process id (1 to {PID_MAX})"


def _library_file(value: Any) -> str | None:
    path = Path(str(value))
    if not path.name.startswith("libotel_gpu_inject"):
        return "must name a copy of libotel_gpu_inject.so (the file name the agent's probes look for)"
    return None if path.is_file() else "is not a file"


def _not_empty(value: Any) -> str | None:
    return None if str(value).strip() else "must name a folder"


OPTIONS: tuple[Option, ...] = (
    Option("duration_s", "--duration", "stop after this many seconds (0: run until interrupted)", float,
           env=("OTEL_GPU_DURATION",), check=_range(0, 10**9)),
    Option("log_level", "--log-level", "log level", str, env=("OTEL_GPU_LOG_LEVEL", "OTEL_LOG_LEVEL"),
           choices=_LOG_LEVELS, aliases=_LOG_LEVEL_ALIASES),
    Option("service_name", "--service-name", "service.name of the agent's own resource", str,
           env=("OTEL_SERVICE_NAME",)),
    Option("node_name", "--node-name", "Kubernetes node name (k8s.node.name; set it from the downward API)", str,
           env=("OTEL_GPU_NODE_NAME", "K8S_NODE_NAME", "NODE_NAME")),
    Option("resource_attributes", "--resource-attributes", "extra resource attributes, k1=v1,k2=v2", _pairs,
           env=("OTEL_RESOURCE_ATTRIBUTES",)),
    # OTLP
    Option("otlp.endpoint", "--otlp-endpoint", "OTLP endpoint for every signal (e.g. http://collector:4317)", str,
           env=("OTEL_EXPORTER_OTLP_ENDPOINT",), check=_otlp_endpoint),
    Option("otlp.metrics_endpoint", "--otlp-metrics-endpoint", "OTLP endpoint for metrics, used as-is", str,
           env=("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT",), check=_otlp_endpoint),
    Option("otlp.profiles_endpoint", "--otlp-profiles-endpoint", "OTLP endpoint for profiles, used as-is", str,
           env=("OTEL_EXPORTER_OTLP_PROFILES_ENDPOINT",), check=_otlp_endpoint),
    Option("otlp.protocol", "--otlp-protocol", "OTLP transport", str, env=("OTEL_EXPORTER_OTLP_PROTOCOL",),
           choices=_PROTOCOLS, unsupported=_UNSUPPORTED_PROTOCOLS),
    Option("otlp.metrics_protocol", "--otlp-metrics-protocol", "OTLP transport for metrics", str,
           env=("OTEL_EXPORTER_OTLP_METRICS_PROTOCOL",), choices=("",) + _PROTOCOLS,
           unsupported=_UNSUPPORTED_PROTOCOLS),
    Option("otlp.profiles_protocol", "--otlp-profiles-protocol", "OTLP transport for profiles", str,
           env=("OTEL_EXPORTER_OTLP_PROFILES_PROTOCOL",), choices=("",) + _PROTOCOLS,
           unsupported=_UNSUPPORTED_PROTOCOLS),
    Option("otlp.headers", "--otlp-headers", "headers for every OTLP request, k1=v1,k2=v2", _pairs,
           env=("OTEL_EXPORTER_OTLP_HEADERS",), secret=True),
    Option("otlp.metrics_headers", "--otlp-metrics-headers", "headers for OTLP metrics requests", _pairs,
           env=("OTEL_EXPORTER_OTLP_METRICS_HEADERS",), secret=True),
    Option("otlp.profiles_headers", "--otlp-profiles-headers", "headers for OTLP profiles requests", _pairs,
           env=("OTEL_EXPORTER_OTLP_PROFILES_HEADERS",), secret=True),
    Option("otlp.certificate", "--otlp-certificate", "PEM file of trusted CA certificates for TLS", str,
           env=("OTEL_EXPORTER_OTLP_CERTIFICATE",)),
    Option("otlp.metrics_certificate", "--otlp-metrics-certificate", "trusted CA certificates for OTLP metrics",
           str, env=("OTEL_EXPORTER_OTLP_METRICS_CERTIFICATE",)),
    Option("otlp.profiles_certificate", "--otlp-profiles-certificate", "trusted CA certificates for OTLP profiles",
           str, env=("OTEL_EXPORTER_OTLP_PROFILES_CERTIFICATE",)),
    Option("otlp.client_key", "--otlp-client-key", "PEM file of the client's private key for mutual TLS", str,
           env=("OTEL_EXPORTER_OTLP_CLIENT_KEY",)),
    Option("otlp.metrics_client_key", "--otlp-metrics-client-key", "client private key for OTLP metrics (mTLS)",
           str, env=("OTEL_EXPORTER_OTLP_METRICS_CLIENT_KEY",)),
    Option("otlp.profiles_client_key", "--otlp-profiles-client-key", "client private key for OTLP profiles (mTLS)",
           str, env=("OTEL_EXPORTER_OTLP_PROFILES_CLIENT_KEY",)),
    Option("otlp.client_certificate", "--otlp-client-certificate",
           "PEM file of the client's certificate (chain) for mutual TLS", str,
           env=("OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE",)),
    Option("otlp.metrics_client_certificate", "--otlp-metrics-client-certificate",
           "client certificate for OTLP metrics (mTLS)", str, env=("OTEL_EXPORTER_OTLP_METRICS_CLIENT_CERTIFICATE",)),
    Option("otlp.profiles_client_certificate", "--otlp-profiles-client-certificate",
           "client certificate for OTLP profiles (mTLS)", str,
           env=("OTEL_EXPORTER_OTLP_PROFILES_CLIENT_CERTIFICATE",)),
    Option("otlp.insecure", "--otlp-insecure", "plaintext gRPC (no TLS) for endpoints without a scheme", _bool,
           env=("OTEL_EXPORTER_OTLP_INSECURE",), boolean=True),
    Option("otlp.compression", "--otlp-compression", "OTLP compression", str,
           env=("OTEL_EXPORTER_OTLP_COMPRESSION",), choices=_COMPRESSIONS),
    Option("otlp.metrics_compression", "--otlp-metrics-compression", "OTLP compression for metrics", str,
           env=("OTEL_EXPORTER_OTLP_METRICS_COMPRESSION",), choices=("",) + _COMPRESSIONS),
    Option("otlp.profiles_compression", "--otlp-profiles-compression", "OTLP compression for profiles", str,
           env=("OTEL_EXPORTER_OTLP_PROFILES_COMPRESSION",), choices=("",) + _COMPRESSIONS),
    Option("otlp.timeout_s", "--otlp-timeout", "OTLP request timeout in seconds (the OTEL_ variable: milliseconds)",
           float, env=("OTEL_GPU_OTLP_TIMEOUT", "OTEL_EXPORTER_OTLP_TIMEOUT"), check=_range(0.001, 3600)),
    Option("otlp.metrics_timeout_s", "--otlp-metrics-timeout",
           "OTLP metrics request timeout in seconds, 0: --otlp-timeout (the variable: milliseconds)", float,
           env=("OTEL_EXPORTER_OTLP_METRICS_TIMEOUT",), check=_unset_or_range(0.001, 3600)),
    Option("otlp.profiles_timeout_s", "--otlp-profiles-timeout",
           "OTLP profiles request timeout in seconds, 0: --otlp-timeout (the variable: milliseconds)", float,
           env=("OTEL_EXPORTER_OTLP_PROFILES_TIMEOUT",), check=_unset_or_range(0.001, 3600)),
    # metrics
    Option("metrics.export_interval_s", "--metric-export-interval",
           "seconds between metric collections and exports (env OTEL_METRIC_EXPORT_INTERVAL is in ms)", float,
           env=("OTEL_GPU_METRICS_EXPORT_INTERVAL",), check=_range(0.1, 86400)),
    Option("metrics.prometheus_port", "--prometheus-port", "serve /metrics for Prometheus on this port (0: off)",
           int, env=("OTEL_GPU_METRICS_PROMETHEUS_PORT",), check=_port),
    Option("metrics.prometheus_host", "--prometheus-host", "address the Prometheus endpoint binds", str,
           env=("OTEL_GPU_METRICS_PROMETHEUS_HOST",)),
    # gpu
    Option("gpu.enabled", "--gpu-metrics", "collect NVML GPU metrics", _bool, env=("OTEL_GPU_GPU_ENABLED",),
           boolean=True),
    Option("gpu.per_process", "--gpu-process-metrics", "per-process GPU memory and SM utilization", _bool,
           env=("OTEL_GPU_GPU_PER_PROCESS",), boolean=True),
    Option("gpu.collection_timeout_s", "--gpu-collection-timeout",
           "seconds a GPU's readings may take before the cycle goes on without them", float,
           env=("OTEL_GPU_GPU_COLLECTION_TIMEOUT",), check=_range(0.001, 3600)),
    # profiling
    Option("profiling.enabled", "--cpu-profiling", "sample CPU stacks with eBPF", _bool,
           env=("OTEL_GPU_PROFILING_ENABLED",), boolean=True),
    Option("profiling.frequency_hz", "--profiling-frequency-hz", "CPU samples per second per CPU", int,
           env=("OTEL_GPU_PROFILING_FREQUENCY_HZ",), check=_range(1, 10000)),
    Option("profiling.interval_s", "--profiling-interval", "seconds between profile reports", float,
           env=("OTEL_GPU_PROFILING_INTERVAL",), check=_range(1, 3600)),
    Option("profiling.pids", "--pid",
           "profile only this process (repeatable; it must be running when the agent starts)", int,
           env=("OTEL_GPU_PROFILING_PIDS",), repeatable=True, check=_pid),
    Option("profiling.process_name", "--process-name", "profile only processes whose name matches this regex",
           str, env=("OTEL_GPU_PROFILING_PROCESS_NAME",), check=_regex),
    Option("profiling.container_id", "--container-id", "profile only processes of this container (id prefix)",
           str, env=("OTEL_GPU_PROFILING_CONTAINER_ID",)),
    Option("profiling.include_self", "--profile-self", "include the agent's own process in profiles", _bool,
           env=("OTEL_GPU_PROFILING_INCLUDE_SELF",), boolean=True),
    Option("profiling.command_args", "--process-command-args",
           "process.command_args (argv, capped, secret-named values masked) on each process's profiles; off by "
           "default: command lines can hold secrets", _bool,
           env=("OTEL_GPU_PROFILING_COMMAND_ARGS",), boolean=True),
    Option("profiling.gpu_time", "--gpu-time-profiling",
           "GPU time by launching stack and CPU time blocked on the GPU, for processes run under `otel-gpu inject`",
           _bool, env=("OTEL_GPU_PROFILING_GPU_TIME",), boolean=True),
    Option("profiling.gpu_time_libraries", "--gpu-time-library",
           "a copy of the injection library that workloads load (e.g. the chart's hostPath copy), attached at start so "
           "their processes are profiled from their first launch (repeatable)", str,
           env=("OTEL_GPU_PROFILING_GPU_TIME_LIBRARIES",), repeatable=True, check=_library_file),
    # pyroscope
    Option("pyroscope.url", "--pyroscope-url", "Grafana Pyroscope base URL (e.g. http://pyroscope:4040)", str,
           env=("OTEL_GPU_PYROSCOPE_URL",), check=_url),
    Option("pyroscope.api", "--pyroscope-api", "OTLP profiles (Pyroscope >= 1.20) or the legacy /ingest pprof API",
           str, env=("OTEL_GPU_PYROSCOPE_API",), choices=_PYROSCOPE_APIS),
    Option("pyroscope.tenant_id", "--pyroscope-tenant-id", "X-Scope-OrgID for multi-tenant Pyroscope", str,
           env=("OTEL_GPU_PYROSCOPE_TENANT_ID",)),
    Option("pyroscope.basic_auth_user", "--pyroscope-user", "basic-auth user for Pyroscope", str,
           env=("OTEL_GPU_PYROSCOPE_USER",)),
    Option("pyroscope.basic_auth_password", "--pyroscope-password", "basic-auth password for Pyroscope", str,
           env=("OTEL_GPU_PYROSCOPE_PASSWORD",), secret=True),
    # output
    Option("output.dir", "--output-dir", "folder for local metric and profile files", str,
           env=("OTEL_GPU_OUTPUT_DIR",), check=_not_empty),
    Option("output.files", "--local-files", "write local files (auto: each signal without a backend of its own)", str,
           env=("OTEL_GPU_OUTPUT_FILES",), choices=_TRISTATE),
    Option("output.console", "--console", "print the terminal summary each interval (auto: as --local-files)",
           str, env=("OTEL_GPU_OUTPUT_CONSOLE",), choices=_TRISTATE),
    Option("output.queue_max_bytes", "--queue-max-bytes",
           "bytes of encoded profiles kept for retry while a backend is down", int,
           env=("OTEL_GPU_OUTPUT_QUEUE_MAX_BYTES",), check=_range(QUEUE_MIN_BYTES, 2**40)),
    Option("output.max_profile_files", "--max-profile-files",
           "most profile files (*.pb.gz) kept in the output folder; the oldest are removed first", int,
           env=("OTEL_GPU_OUTPUT_MAX_PROFILE_FILES",), check=_range(1, 10**7)),
    Option("output.max_profile_bytes", "--max-profile-bytes",
           "most bytes of profile files kept in the output folder; the oldest are removed first", int,
           env=("OTEL_GPU_OUTPUT_MAX_PROFILE_BYTES",), check=_range(1024, 2**50)),
    # Kubernetes names (off by default: the Collector's k8sattributes does it where one runs)
    Option("k8s.names", "--k8s-names",
           "add k8s.pod.name, k8s.namespace.name and k8s.container.name from the API server (needs --node-name and "
           "RBAC to list pods)", _bool, env=("OTEL_GPU_K8S_NAMES",), boolean=True),
    Option("k8s.names_ttl_s", "--k8s-names-ttl",
           "seconds between lists of this node's pods; names are kept at most 3 times as long when the API is down",
           float, env=("OTEL_GPU_K8S_NAMES_TTL",), check=_range(1, 86400)),
    Option("k8s.api_url", "--k8s-api-url", "the API server (default: https://KUBERNETES_SERVICE_HOST:PORT)", str,
           env=("OTEL_GPU_K8S_API_URL",), check=_url),
    Option("k8s.service_account_dir", "--k8s-service-account-dir",
           "folder of the service account's token and ca.crt", str, env=("OTEL_GPU_K8S_SERVICE_ACCOUNT_DIR",)),
)

_BY_PATH = {o.path: o for o in OPTIONS}
_GROUPS: dict[str, type] = {
    "otlp": OTLPConfig, "metrics": MetricsConfig, "gpu": GPUConfig, "profiling": ProfilingConfig,
    "pyroscope": PyroscopeConfig, "output": OutputConfig, "k8s": K8sConfig,
}


def _dest(option: Option) -> str:
    return option.path.replace(".", "__")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add every option's flag to ``parser``; defaults stay ``None`` so that unset flags are visible."""
    parser.add_argument("--config", dest="config_file", metavar="FILE", default=None,
                        help="YAML configuration file (keys as in 'otel-gpu config')")
    groups: dict[str, argparse._ArgumentGroup] = {}
    defaults = AgentConfig()
    for option in OPTIONS:
        group_name = option.path.split(".")[0] if "." in option.path else "general"
        group = groups.get(group_name) or parser.add_argument_group(group_name)
        groups[group_name] = group
        default = _get(defaults, option.path)
        help_text = f"{option.help} (default: {_render(default, option)!s}; env {', '.join(option.env)})"
        if option.boolean:
            group.add_argument(option.flag, dest=_dest(option), default=None, action=argparse.BooleanOptionalAction,
                               help=help_text)
        elif option.repeatable:
            group.add_argument(option.flag, dest=_dest(option), default=None, action="append", metavar="VALUE",
                               help=help_text)
        else:
            group.add_argument(option.flag, dest=_dest(option), default=None, metavar="VALUE", help=help_text)


def load(args: argparse.Namespace | None = None, environ: Mapping[str, str] | None = None) -> AgentConfig:
    """Build and validate the configuration. Raises ConfigError listing every problem."""
    environ = os.environ if environ is None else environ
    values: dict[str, Any] = {}
    problems: list[str] = []
    config_file = getattr(args, "config_file", None) or environ.get("OTEL_GPU_CONFIG_FILE", "")

    # layer 1: YAML file
    if config_file:
        values.update(_read_yaml(config_file, problems))
    # layer 2: environment
    for option in OPTIONS:
        for name in option.env:
            if name in environ and environ[name].strip() != "":
                if name in _MILLIS_VARIABLES:
                    values[option.path] = (_Converted(_millis_to_s, environ[name]),
                                           f"environment variable {name} (milliseconds; flag {option.flag})")
                else:
                    values[option.path] = (environ[name], f"environment variable {name} (flag {option.flag})")
                break
    if "OTEL_METRIC_EXPORT_INTERVAL" in environ and "OTEL_GPU_METRICS_EXPORT_INTERVAL" not in environ:
        values["metrics.export_interval_s"] = (
            _Converted(_millis_to_s, environ["OTEL_METRIC_EXPORT_INTERVAL"]),
            "environment variable OTEL_METRIC_EXPORT_INTERVAL (milliseconds; flag --metric-export-interval)",
        )
    if "k8s.api_url" not in values and environ.get("KUBERNETES_SERVICE_HOST"):  # the in-cluster configuration
        host = environ["KUBERNETES_SERVICE_HOST"]
        host = f"[{host}]" if ":" in host else host
        values["k8s.api_url"] = (f"https://{host}:{environ.get('KUBERNETES_SERVICE_PORT') or '443'}",
                                 "environment variables KUBERNETES_SERVICE_HOST/PORT (flag --k8s-api-url)")
    # layer 3: flags
    for option in OPTIONS:
        raw = getattr(args, _dest(option), None) if args is not None else None
        if raw is not None:
            values[option.path] = (raw, f"flag {option.flag}")
    warnings = _unknown_variables(environ)

    parsed: dict[str, Any] = {}
    for path, (raw, origin) in values.items():
        option = _BY_PATH[path]
        try:
            value = _parse(option, raw)
        except (ValueError, TypeError) as exc:
            if option.secret:  # the text at fault may be the secret itself ("Authorization: Bearer ...")
                problems.append(f"{origin}: {_SECRET_FORMAT.get(option.parse, 'is not valid')} (not shown here: it "
                                "may hold a secret)")
            else:
                problems.append(f"{origin}: {exc}{_allowed(option)}")
            continue
        if option.choices and isinstance(value, str):
            value = _choice(option, value)
        why = dict(option.unsupported).get(value) if isinstance(value, str) else None
        if why:
            problems.append(f"{origin}: {value!r} is not supported: {why}; set {' or '.join(option.env)} (or "
                            f"{option.flag}) to one of {', '.join(repr(c) for c in option.choices if c)}")
            continue
        if option.choices and value not in option.choices:
            problems.append(f"{origin}: {value!r} is not allowed{_allowed(option)}")
            continue
        if _masked(option, value):
            problems.append(f"{origin}: holds {MASK!r}, the mask 'otel-gpu config' prints in place of a secret; "
                            f"give the secret itself (best in {' or '.join(option.env) or option.flag})")
            continue
        failed = _check(option, value)
        if failed:
            problems.append(f"{origin}: {redacted(failed[0])!r} {failed[1]}")
            continue
        parsed[path] = value

    if problems:
        raise ConfigError(problems)
    config = _build(parsed, config_file, warnings)
    problems.extend(_cross_checks(config))
    if problems:
        raise ConfigError(problems)
    return config


class _Converted:
    """A raw value with its own parser (for variables whose unit differs from the option's)."""

    def __init__(self, parse: Parser, raw: str) -> None:
        self.parse, self.raw = parse, raw


def _unknown_variables(environ: Mapping[str, str]) -> tuple[str, ...]:
    """A warning for each ``OTEL_GPU_*`` variable nobody reads (a typo is otherwise silently ignored)."""
    known = {name for option in OPTIONS for name in option.env if name.startswith("OTEL_GPU_")}
    known |= _OTHER_VARIABLES
    warnings = []
    for name in sorted(environ):
        if not name.startswith("OTEL_GPU_") or name in known or name.startswith(_LIBRARY_DEBUG_PREFIX):
            continue
        close = _closest(name, sorted(known))
        hint = f"; did you mean {close}?" if close else ""
        warnings.append(f"environment variable {name} is not an otel-gpu setting and is ignored{hint}")
    return tuple(warnings)


# Read by someone other than the option table: --config's variable, the library `otel-gpu inject` loads into a
# workload (cuda/native/inject.c, emit.c; its OTEL_GPU_DEBUG_* switches are for development) and scripts/h200.
_OTHER_VARIABLES = frozenset({
    "OTEL_GPU_CONFIG_FILE", "OTEL_GPU_OVERHEAD_BUDGET", "OTEL_GPU_WINDOW_MS", "OTEL_GPU_CUPTI_PATH",
    "OTEL_GPU_CUPTI_FINALIZE", "OTEL_GPU_API_ACTIVITY", "OTEL_GPU_INJECT_LIB", "OTEL_GPU_CUDA_GRAPHS",
})
_LIBRARY_DEBUG_PREFIX = "OTEL_GPU_DEBUG_"
_SCALAR = (str, int, float, bool)
_SECRET_FORMAT: dict[Parser, str] = {_pairs: "is not a list of key=value pairs (k1=v1,k2=v2)"}


def _parse(option: Option, raw: Any) -> Any:
    if isinstance(raw, _Converted):
        return raw.parse(raw.raw)
    if option.repeatable:
        listed = isinstance(raw, list | tuple)
        items = raw if listed else [p for p in _scalar(raw).split(",") if p.strip()]
        try:
            return tuple(_parse_one(option, _scalar(item).strip()) for item in items)
        except ValueError as exc:
            raise ValueError(str(exc) if listed else f"{exc} (in {raw!r}, a comma-separated list)") from exc
    if option.boolean and isinstance(raw, bool):
        return raw
    if option.parse in (int, float) and isinstance(raw, bool):
        raise ValueError(f"{raw!r} is not a number")
    if option.parse is int and isinstance(raw, float) and not raw.is_integer():
        raise ValueError(f"{raw!r} is not a whole number")
    if isinstance(raw, Mapping) and option.parse is _pairs:
        return _pairs({_scalar(k): _scalar(v) for k, v in raw.items()})  # type: ignore[arg-type]
    _scalar(raw)
    return _parse_one(option, raw if not isinstance(raw, int | float) or option.parse not in (str,) else str(raw))


def _parse_one(option: Option, raw: Any) -> Any:
    try:
        return option.parse(raw)
    except ValueError as exc:
        if option.parse in (int, float):
            raise ValueError(f"{raw!r} is not a {'whole number' if option.parse is int else 'number'}") from exc
        raise


def _scalar(raw: Any) -> str:
    """``raw`` as text when it is one plain value; a YAML list, mapping or null where one value belongs is refused
    (``str()`` of it would be accepted as, say, a folder name, and of a nest of YAML aliases would never finish)."""
    if raw is None:
        raise ValueError("needs a value")
    if not isinstance(raw, _SCALAR):
        raise ValueError(f"needs a single value, not a {type(raw).__name__}")
    return str(raw)


def _check(option: Option, value: Any) -> tuple[Any, str] | None:
    """(the value at fault, what is wrong with it), or None; for a repeatable option the first bad item."""
    if option.check is None:
        return None
    for item in value if option.repeatable else (value,):
        message = option.check(item)
        if message:
            return item, message
    return None


def _choice(option: Option, value: str) -> str:
    """An enum value as its option's choices spell it: case-insensitive, as the OpenTelemetry specification asks of
    enum variables (``GZIP``, ``HTTP/protobuf``, ``INFO``), with the option's aliases (``warn``) resolved."""
    folded = value.strip().lower()
    return dict(option.aliases).get(folded, folded)


def _allowed(option: Option) -> str:
    if option.choices:
        return f" (allowed: {', '.join(repr(c) for c in option.choices if c) or 'any'})"
    return ""


def _read_yaml(path: str, problems: list[str]) -> dict[str, tuple[Any, str]]:
    try:
        with open(path, "rb") as file:
            raw = file.read(MAX_CONFIG_FILE_BYTES + 1)
    except OSError as exc:
        problems.append(f"flag --config: cannot read {path!r}: {exc.strerror or exc}")
        return {}
    if len(raw) > MAX_CONFIG_FILE_BYTES:
        problems.append(f"flag --config: {path!r} is larger than {MAX_CONFIG_FILE_BYTES} bytes; is it the right file?")
        return {}
    import yaml  # here, not at the top: a run without --config never needs it (about 1.3 MB)

    try:
        data = yaml.load(raw.decode("utf-8"), Loader=_unique_key_loader(yaml)) or {}
    except UnicodeDecodeError as exc:
        problems.append(f"flag --config: {path!r} is not UTF-8 text (byte {exc.start}: {exc.reason})")
        return {}
    except yaml.YAMLError as exc:  # where and what only: PyYAML's own message quotes the line, maybe a password
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problems.append(f"flag --config: {path!r} is not valid YAML{where}: "
                        f"{getattr(exc, 'problem', None) or type(exc).__name__}")
        return {}
    except RecursionError:
        problems.append(f"flag --config: {path!r} nests too deeply to be a configuration")
        return {}
    if not isinstance(data, dict):
        problems.append(f"flag --config: {path!r} must hold a mapping of options")
        return {}
    out: dict[str, tuple[Any, str]] = {}

    def walk(prefix: str, node: Mapping[str, Any]) -> None:
        for key, value in node.items():
            path_key = f"{prefix}{key}"
            if isinstance(value, dict) and str(key) in _GROUPS and not prefix:
                walk(f"{key}.", value)
            elif path_key in _BY_PATH:
                out[path_key] = (value, f"{path} key {path_key!r} (flag {_BY_PATH[path_key].flag})")
            elif str(key) in _GROUPS and not prefix:
                keys = ", ".join(k.split(".", 1)[1] for k in sorted(_BY_PATH) if k.startswith(f"{key}."))
                problems.append(f"flag --config: {path!r} key {path_key!r} is a group of settings, a mapping of "
                                f"some of {keys}; not a {type(value).__name__}")
            else:
                close = _closest(path_key, sorted(_BY_PATH))
                in_group = sorted(k for k in _BY_PATH if prefix and k.startswith(prefix)) or sorted(_BY_PATH)
                hint = f"did you mean {close!r}?" if close else f"known keys: {', '.join(in_group)}"
                problems.append(f"flag --config: {path!r} has unknown key {path_key!r} ({hint})")

    walk("", data)
    return out


def _closest(name: str, known: Sequence[str]) -> str:
    """The known name ``name`` most likely misspells, or "" when none is close (a typo, not another word)."""
    close = difflib.get_close_matches(name, known, n=1, cutoff=0.8)
    return close[0] if close else ""


def _unique_key_loader(yaml: Any) -> type:
    """PyYAML's safe loader, refusing a key given twice in one mapping (PyYAML keeps the last silently, so an edit
    lower in the file would quietly undo one above it)."""

    class UniqueKeyLoader(yaml.SafeLoader):  # type: ignore[misc, name-defined]
        def construct_mapping(self, node: Any, deep: bool = False) -> Any:
            seen: dict[Any, Any] = {}
            for key_node, _ in node.value:
                if isinstance(key_node, yaml.ScalarNode) and key_node.tag != "tag:yaml.org,2002:merge":
                    if key_node.value in seen:
                        first = seen[key_node.value].start_mark.line + 1
                        raise yaml.constructor.ConstructorError(
                            None, None, f"key {key_node.value!r} is given twice (first at line {first}); keep one",
                            key_node.start_mark)
                    seen[key_node.value] = key_node
            return super().construct_mapping(node, deep)

    return UniqueKeyLoader


def _build(parsed: Mapping[str, Any], config_file: str, warnings: tuple[str, ...] = ()) -> AgentConfig:
    top: dict[str, Any] = {"config_file": config_file, "warnings": warnings}
    grouped: dict[str, dict[str, Any]] = {name: {} for name in _GROUPS}
    for path, value in parsed.items():
        if "." in path:
            group, name = path.split(".", 1)
            grouped[group][name] = value
        else:
            top[path] = value
    for group, kwargs in grouped.items():
        top[group] = _GROUPS[group](**kwargs)
    return AgentConfig(**top)


def _schemeless_endpoints(otlp: OTLPConfig) -> list[str]:
    """host:port endpoints (no scheme) of signals that do not go over gRPC: HTTP needs a URL."""
    problems: list[str] = []
    schemeless: dict[tuple[str, str, str, str], list[str]] = {}  # (flag, variable, endpoint, protocol) -> signals
    for signal in ("metrics", "profiles"):
        own = getattr(otlp, f"{signal}_endpoint")
        endpoint = own or otlp.endpoint
        protocol = getattr(otlp, f"{signal}_protocol") or otlp.protocol
        if endpoint and "://" not in endpoint and protocol != "grpc":
            flag, variable = ((f"--otlp-{signal}-endpoint", f"OTEL_EXPORTER_OTLP_{signal.upper()}_ENDPOINT") if own
                              else ("--otlp-endpoint", "OTEL_EXPORTER_OTLP_ENDPOINT"))
            schemeless.setdefault((flag, variable, endpoint, protocol), []).append(signal)
    for (flag, variable, endpoint, protocol), signals in schemeless.items():
        problems.append(f"flag {flag} (environment variable {variable}): {endpoint!r} has no scheme, which only gRPC "
                        f"takes (host:port); {' and '.join(signals)} go over {protocol}, which needs an http:// or "
                        "https:// URL")
    return problems


def _cross_checks(config: AgentConfig) -> list[str]:
    problems: list[str] = []
    for option in OPTIONS:  # every TLS file: CA certificates, client keys and client certificates
        if option.path.startswith("otlp.") and option.path.endswith(("certificate", "client_key")):
            path = _get(config, option.path)
            if path and not Path(path).is_file():
                problems.append(f"flag {option.flag} (environment variable {', '.join(option.env)}): {path!r} is "
                                "not a readable file")
    problems += _schemeless_endpoints(config.otlp)
    for signal in ("metrics", "profiles"):
        resolved = config.otlp.signal(signal)
        if bool(resolved.client_key) != bool(resolved.client_certificate):
            have, lack = ("key", "certificate") if resolved.client_key else ("certificate", "key")
            problems.append(f"flag --otlp-{signal}-client-{lack} (or --otlp-client-{lack}): mutual TLS for {signal} "
                            f"has a client {have} but no client {lack} (OTEL_EXPORTER_OTLP_CLIENT_KEY and "
                            "OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE go together)")
    if config.pyroscope.basic_auth_password and not config.pyroscope.basic_auth_user:
        problems.append("flag --pyroscope-password: needs --pyroscope-user as well")
    if config.write_files and (message := output_dir_problem(config.output.dir)):
        problems.append(f"flag --output-dir: {config.output.dir!r} {message}")
    if config.k8s.names and not config.node_name:
        problems.append("flag --k8s-names: needs --node-name (the pods of this node are listed; set it from the "
                        "downward API: spec.nodeName)")
    if config.k8s.names and not config.k8s.api_url:
        problems.append("flag --k8s-names: no API server: set --k8s-api-url, or run in a pod "
                        "(KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT)")
    for pid in config.profiling.pids:
        if not os.path.exists(f"/proc/{pid}"):
            # A filter that can never match would run an agent that profiles nothing, silently; say so at once.
            problems.append(f"flag --pid: no process {pid} is running (the agent sees the processes of its own PID "
                            "namespace; use hostPID in a container)")
    return problems


# Kernel file systems: nothing written there is a file (and a folder made under cgroup2 is a new cgroup).
_KERNEL_FILE_SYSTEMS = frozenset({"proc", "sysfs", "cgroup", "cgroup2", "debugfs", "tracefs", "securityfs", "bpf",
                                  "devpts", "configfs", "pstore", "efivarfs", "fusectl", "binfmt_misc", "mqueue"})


def output_dir_problem(directory: str) -> str | None:
    """Why files cannot go to ``directory`` (it or a folder above is a file, a kernel file system, read-only,
    not writable), or None. Creates nothing: the folder is made when the agent starts."""
    path = Path(os.path.abspath(directory))
    existing = path
    while not os.path.exists(existing):  # the nearest folder that is already there decides
        if os.path.islink(existing):
            return f"is under {str(existing)!r}, a link that leads nowhere"
        existing = existing.parent
    if not os.path.isdir(existing):
        return "is a file" if existing == path else f"is under {str(existing)!r}, which is a file"
    file_system = _file_system_type(existing)
    if file_system in _KERNEL_FILE_SYSTEMS:
        return f"is on the kernel's {file_system} file system, which holds no files"
    try:
        read_only = bool(os.statvfs(existing).f_flag & os.ST_RDONLY)
    except OSError:
        read_only = False
    if read_only:
        return f"is on a read-only file system ({str(existing)!r})"
    if not os.access(existing, os.W_OK | os.X_OK):
        return f"cannot be written: {str(existing)!r} is not writable for this user"
    return None


def _file_system_type(path: Path) -> str:
    """The type of the file system that holds ``path``, from the longest mount point above it ("" when unknown)."""
    try:
        lines = Path("/proc/self/mounts").read_text(errors="replace").splitlines()
    except OSError:
        return ""
    resolved, best, kind = str(path.resolve()), "", ""
    for line in lines:
        fields = line.split()
        if len(fields) < 3:
            continue
        mount_point = fields[1].replace("\\040", " ")
        inside = resolved == mount_point or resolved.startswith(mount_point.rstrip("/") + "/")
        if inside and len(mount_point) >= len(best):
            best, kind = mount_point, fields[2]
    return kind


def _get(config: Any, path: str) -> Any:
    for part in path.split("."):
        config = getattr(config, part)
    return config


MASK = "***"


def _masked(option: Option, value: Any) -> bool:
    """Whether ``value`` still holds the mask ``otel-gpu config`` prints in place of a secret (a hand-copied
    ``authorization=***`` or ``?api_key=***`` would otherwise be sent as the credential)."""
    if option.secret:
        if isinstance(value, tuple):
            return any(v == MASK for _, v in value)
        return value == MASK
    # a URL masked where a secret would be
    if isinstance(value, str) and MASK in value and option.check in (_url, _otlp_endpoint):
        unmasked = value.replace(MASK, "x")
        return redacted(value) == value and redacted(unmasked) != unmasked
    return False


def _render(value: Any, option: Option) -> Any:
    if option.secret and value:
        if isinstance(value, tuple):
            return ",".join(f"{k}={MASK}" for k, _ in value)
        return MASK
    value = redacted(value)
    if isinstance(value, tuple) and value and isinstance(value[0], tuple):  # encoded as read: the same on load
        return ",".join(f"{_quote_pair_part(k)}={_quote_pair_part(v)}" for k, v in value)
    if isinstance(value, tuple):
        return ",".join(str(v) for v in value)
    return value


def effective(config: AgentConfig) -> dict[str, Any]:
    """The configuration as nested YAML-ready data that ``--config`` loads back: every option under its YAML key,
    secrets that are set left out (``secrets_left_out`` names them), URL secrets masked (a masked URL is refused
    on load, see ``_masked``)."""
    out: dict[str, Any] = {}
    for option in OPTIONS:
        value = _get(config, option.path)
        if option.secret and value:
            continue
        value = _render(value, option)
        if "." in option.path:
            group, name = option.path.split(".", 1)
            out.setdefault(group, {})[name] = value
        else:
            out[option.path] = value
    return out


def secrets_left_out(config: AgentConfig) -> list[str]:
    """One line per secret that is set but not printed by ``effective``: its YAML key, the names it has (header
    names, never values) and where to set it."""
    lines = []
    for option in OPTIONS:
        value = _get(config, option.path)
        if option.secret and value:
            lines.append(f"{option.path}: {_render(value, option)} (a secret, left out; set it with "
                         f"{' or '.join(option.env)} or {option.flag})")
    return lines


def effective_yaml(config: AgentConfig) -> str:
    """What ``otel-gpu config`` prints: YAML that ``otel-gpu run --config FILE`` loads back to the same
    configuration, less the secrets, which are named in comments at the top and must come from the environment
    or flags (a file written by a command should not hold a password)."""
    import yaml

    head = ["# otel-gpu effective configuration; load it with: otel-gpu run --config FILE"]
    if config.config_file:
        head.append(f"# read from {config.config_file} (and the environment and flags)")
    head += [f"# {line}" for line in secrets_left_out(config)]
    return "\n".join(head) + "\n" + yaml.safe_dump(effective(config), sort_keys=False)
