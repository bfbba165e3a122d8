# SPDX-License-Identifier: Apache-2.0
"""Real backends for the tests: VictoriaMetrics (receives OTLP/HTTP) and Prometheus (scrapes the agent).

Both run from the Debian packages that ``scripts/fetch-backends.sh`` (``make test-deps``) extracts under
``.cache/backends``, on loopback ports chosen here, with their data in a pytest temporary folder. Each helper waits
until the backend answers before returning, and stops it with SIGTERM (then SIGKILL) afterwards.

Import the fixtures into a test module (``from tests.backends import victoria_metrics, prometheus_factory``).
"""

from __future__ import annotations

import json
import socket
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import BACKENDS

VICTORIA_METRICS_BIN = BACKENDS / "victoria-metrics" / "usr" / "bin" / "victoria-metrics"
PROMETHEUS_BIN = BACKENDS / "prometheus" / "usr" / "bin" / "prometheus"
READY_TIMEOUT_S = 60.0


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _require(binary: Path) -> None:
    if not binary.exists():
        pytest.fail(f"{binary} is missing: run 'make test-deps' (scripts/fetch-backends.sh) first", pytrace=False)


def http_get(url: str, timeout_s: float = 5.0) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout_s) as response:  # noqa: S310 - loopback URLs built here
        return bytes(response.read())


def wait_until(check: Callable[[], Any], timeout_s: float, what: str, interval_s: float = 0.25) -> Any:
    """Call ``check`` until it returns something truthy (exceptions count as "not yet"); fail after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    last: Any = None
    while True:
        try:
            last = check()
            if last:
                return last
        except (OSError, ValueError, KeyError) as exc:
            last = exc
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout_s:g} s waiting for {what} (last: {last!r})")
        time.sleep(interval_s)


def settle(read: Callable[[], Any], expected: Any, timeout_s: float = 30.0) -> Any:
    """Wait until ``read()`` equals ``expected`` (or is non-empty when ``expected`` is None); assert on timeout."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = read()
        if (value == expected) if expected is not None else bool(value):
            return value
        if time.monotonic() >= deadline:
            assert value == expected, f"still {value!r} after {timeout_s:g} s"
            raise AssertionError(f"still empty after {timeout_s:g} s")
        time.sleep(0.25)


class _Server:
    """A backend process on 127.0.0.1:``port`` with a PromQL API at ``/api/v1/query``."""

    name = "backend"
    ready_path = "/"

    def __init__(self, port: int, log_path: Path) -> None:
        self.port = port
        self.log_path = log_path
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        raise NotImplementedError

    def start(self) -> None:
        if self.process is not None and self.process.poll() is None:
            return
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(self.command(), stdout=log, stderr=subprocess.STDOUT,
                                            stdin=subprocess.DEVNULL)
        wait_until(self._ready, READY_TIMEOUT_S, f"{self.name} on {self.url} (log: {self.log_path})")

    def _ready(self) -> bool:
        if self.process is not None and self.process.poll() is not None:
            raise AssertionError(f"{self.name} exited with {self.process.returncode}; log:\n{self.log_tail()}")
        http_get(self.url + self.ready_path, timeout_s=2.0)
        return True

    def stop(self) -> None:
        if self.process is None:
            return
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)
        self.process = None

    def log_tail(self, chars: int = 3000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def query(self, promql: str) -> list[dict[str, Any]]:
        """Instant PromQL query: the ``data.result`` list (each with ``metric`` labels and ``value`` [t, "v"])."""
        body = http_get(f"{self.url}/api/v1/query?" + urllib.parse.urlencode({"query": promql}))
        document = json.loads(body)
        if document.get("status") != "success":
            raise AssertionError(f"{self.name} query {promql!r} failed: {document}")
        return list(document["data"]["result"])

    def series_names(self) -> set[str]:
        """Every metric name the backend holds."""
        body = http_get(f"{self.url}/api/v1/label/__name__/values")
        return set(json.loads(body)["data"])


class VictoriaMetrics(_Server):
    """Single-node VictoriaMetrics; OTLP/HTTP ingestion at :attr:`otlp_metrics_url`."""

    name = "victoria-metrics"
    ready_path = "/health"

    def __init__(self, port: int, data_dir: Path, log_path: Path) -> None:
        super().__init__(port, log_path)
        self.data_dir = data_dir

    @property
    def otlp_metrics_url(self) -> str:
        return f"{self.url}/opentelemetry/v1/metrics"

    def command(self) -> list[str]:
        return [str(VICTORIA_METRICS_BIN), f"-httpListenAddr=127.0.0.1:{self.port}",
                f"-storageDataPath={self.data_dir}", "-search.latencyOffset=0s",
                "-opentelemetry.usePrometheusNaming", "-loggerLevel=WARN", "-retentionPeriod=1d"]


class Prometheus(_Server):
    """Prometheus scraping ``targets`` (host:port) every ``scrape_interval_s`` seconds."""

    name = "prometheus"
    ready_path = "/-/ready"

    def __init__(self, port: int, data_dir: Path, log_path: Path, targets: list[str],
                 scrape_interval_s: float = 1.0) -> None:
        super().__init__(port, log_path)
        self.data_dir = data_dir
        self.config_path = data_dir / "prometheus.yml"
        data_dir.mkdir(parents=True, exist_ok=True)
        target_list = ", ".join(f"'{t}'" for t in targets)
        interval = f"{int(scrape_interval_s * 1000)}ms"
        self.config_path.write_text(
            "global:\n"
            f"  scrape_interval: {interval}\n"
            f"  scrape_timeout: {interval}\n"
            "scrape_configs:\n"
            "  - job_name: otel-gpu\n"
            f"    static_configs:\n      - targets: [{target_list}]\n")

    def command(self) -> list[str]:
        return [str(PROMETHEUS_BIN), f"--config.file={self.config_path}", f"--storage.tsdb.path={self.data_dir}/tsdb",
                f"--web.listen-address=127.0.0.1:{self.port}", "--log.level=warn",
                "--query.lookback-delta=30s"]

    def targets_up(self) -> bool:
        """True once every configured target was scraped successfully."""
        result = self.query("up")
        return bool(result) and all(item["value"][1] == "1" for item in result)


def values_by(result: list[dict[str, Any]], label: str) -> dict[str, float]:
    """{label value: sample value} of an instant-query result."""
    return {item["metric"].get(label, ""): float(item["value"][1]) for item in result}


@pytest.fixture
def victoria_metrics(tmp_path_factory: pytest.TempPathFactory) -> Iterator[VictoriaMetrics]:
    """A started VictoriaMetrics on a free loopback port; stopped after the test."""
    _require(VICTORIA_METRICS_BIN)
    folder = tmp_path_factory.mktemp("victoria-metrics")
    server = VictoriaMetrics(free_port(), folder / "data", folder / "victoria-metrics.log")
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def prometheus_factory(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[[list[str]], Prometheus]]:
    """Call with scrape targets (``["127.0.0.1:PORT"]``) to start a Prometheus; all are stopped after the test."""
    _require(PROMETHEUS_BIN)
    started: list[Prometheus] = []

    def start(targets: list[str]) -> Prometheus:
        folder = tmp_path_factory.mktemp("prometheus")
        server = Prometheus(free_port(), folder, folder / "prometheus.log", targets)
        server.start()
        started.append(server)
        return server

    try:
        yield start
    finally:
        for server in started:
            server.stop()
