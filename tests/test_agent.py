# SPDX-License-Identifier: Apache-2.0
"""Agent wiring that has no other home: every profile source is stopped and drained alike; the start-up line names
only endpoints that listen; stopping is bounded and a second signal ends it at once; secrets never show in logs or
self-metrics."""

from __future__ import annotations

import base64
import contextlib
import io
import os
import queue
import signal
import socket
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from otel_gpu.agent import Agent
from otel_gpu.config import EXIT_CONFIG_ERROR, AgentConfig, GPUConfig, OutputConfig, ProfilingConfig
from otel_gpu.procfs import ProcessInfo
from otel_gpu.profiles.model import Frame, ProcessProfile, ProfileBatch, Sample, gpu_time_profile_type
from tests.conftest import REPO, agent_command


def _batch(*pids: int) -> ProfileBatch:
    processes = tuple(ProcessProfile(ProcessInfo(pid=pid, executable_name="python3"),
                                     (Sample(frames=(Frame("matmul_kernel"),), value=5),)) for pid in pids)
    return ProfileBatch(type=gpu_time_profile_type(), start_unix_nano=1, duration_nano=2, processes=processes)


class _Source:
    """A ProfileSource that notes what the agent asked of it."""

    def __init__(self, name: str, batches: list[ProfileBatch]) -> None:
        self.name = name
        self.batches = batches
        self.calls: list[str] = []

    def open(self) -> None:
        self.calls.append("open")

    def drain(self) -> list[ProfileBatch]:
        self.calls.append("drain")
        return self.batches

    def stop(self) -> None:
        self.calls.append("stop")

    def close(self) -> None:
        self.calls.append("close")


class _Exporter:
    name = "recording"

    def __init__(self) -> None:
        self.exported: list[ProfileBatch] = []

    def export(self, batch: ProfileBatch) -> bool:
        self.exported.append(batch)
        return True


def test_the_loop_treats_every_source_alike() -> None:
    """Each source is stopped, then drained once more; every batch with processes goes out, whichever source it
    came from; nothing is filtered on the way (each source applies the selection itself)."""
    cpu, gpu = _Source("cpu_profiler", [_batch(10)]), _Source("gpu_time", [_batch(11), _batch()])
    exporter = _Exporter()
    agent = Agent(AgentConfig(profiling=ProfilingConfig(pids=(10,))))
    agent.stop()  # the loop ends at once: only the last report
    agent._loop([cpu, gpu], [exporter])
    assert cpu.calls == gpu.calls == ["stop", "drain"]
    assert [[p.process.pid for p in b.processes] for b in exporter.exported] == [[10], [11]]


def test_duration_counts_from_the_start_and_ends_with_one_report() -> None:
    """--duration counts from when the agent started (the CLI passes the process's start), so a start-up that took
    longer than the duration leaves no wait: the loop ends with the last report only (stop, then one drain), never
    a regular report followed by the last one."""
    source = _Source("cpu_profiler", [_batch(10)])
    exporter = _Exporter()
    config = AgentConfig(duration_s=60.0, profiling=ProfilingConfig(interval_s=30.0))
    agent = Agent(config, started_monotonic=time.monotonic() - 61.0)
    loop = threading.Thread(target=agent._loop, args=([source], [exporter]), daemon=True)
    loop.start()
    loop.join(timeout=30.0)  # counted from the loop's start it would wait 60 s
    finished = not loop.is_alive()
    agent.stop()
    assert finished and source.calls == ["stop", "drain"] and len(exporter.exported) == 1


def test_the_first_report_comes_one_interval_after_profiling_opened() -> None:
    """The first profile covers one interval from when its source opened, however long the rest of start-up took
    (the other sources, exporters): 1.9 s of a 2 s interval passed before the loop, so it reports at once, again 2 s
    later, and last at the 3 s deadline (counted from the loop's start: 2 s, then the deadline)."""
    source = _Source("cpu_profiler", [])
    began = time.monotonic()
    agent = Agent(AgentConfig(duration_s=3.0, profiling=ProfilingConfig(interval_s=2.0)), started_monotonic=began)
    agent._profiling_since = began - 1.9
    agent._loop([source], [_Exporter()])
    assert source.calls == ["drain", "drain", "stop", "drain"]


# --- the agent as a process: start-up line, stopping with a backend that hangs, a second signal ---------------------

QUIET_RUN = ("--no-cpu-profiling", "--no-gpu-metrics", "--no-gpu-time-profiling", "--console", "off",
             "--local-files", "off")


class _AgentProcess:
    """``otel-gpu run`` in a subprocess whose log lines are read as they come."""

    def __init__(self, *args: str) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
        self.process = subprocess.Popen(agent_command("run", *QUIET_RUN, *args), stderr=subprocess.PIPE, text=True,
                                        cwd=REPO, env=env)
        self.lines: queue.Queue[str] = queue.Queue()
        self.log: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.process.stderr is not None
        for line in self.process.stderr:
            self.lines.put(line)

    def wait_for_line(self, text: str, timeout_s: float = 60.0) -> str:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                line = self.lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                break
            self.log.append(line)
            if text in line:
                return line
        raise AssertionError(f"no line with {text!r} within {timeout_s:g} s; so far: {''.join(self.log)}")

    def finish(self, timeout_s: float) -> int:
        """The exit code, or an AssertionError when the process is still running after ``timeout_s``."""
        try:
            return self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            raise AssertionError(f"still running {timeout_s:g} s later") from None
        finally:
            while not self.lines.empty():
                self.log.append(self.lines.get())


@contextlib.contextmanager
def _hanging_backend() -> Iterator[int]:
    """A port that takes connections and never answers them."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(64)
        yield int(sock.getsockname()[1])


def test_a_taken_prometheus_port_is_not_announced() -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        agent = _AgentProcess("--duration", "0.5", "--prometheus-port", str(port), "--prometheus-host", "127.0.0.1")
        error = agent.wait_for_line("--prometheus-port")
        running = agent.wait_for_line("otel-gpu running")
        assert agent.finish(60) == 0
    assert "ERROR" in error and f"127.0.0.1:{port}" in error
    assert "Prometheus" not in running and "metrics -> nowhere" in running
    assert any("metrics have no destination left (--local-files off, --console off" in line for line in agent.log)


def test_a_taken_prometheus_port_leaves_metrics_on_the_local_default(tmp_path: Path) -> None:
    """The scrape endpoint was the metrics' only backend and cannot listen: metrics go to the files and the terminal
    as with no backend at all, said in one line, instead of nowhere."""
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        clean = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
        ran = subprocess.run(agent_command("run", "--duration", "1.5", "--no-cpu-profiling", "--no-gpu-metrics",
                                           "--no-gpu-time-profiling", "--metric-export-interval", "0.5",
                                           "--prometheus-port", str(port), "--prometheus-host", "127.0.0.1",
                                           "--output-dir", str(tmp_path / "out")),
                             capture_output=True, text=True, timeout=60, cwd=REPO, env=clean)
    assert ran.returncode == 0, ran.stderr
    assert f"metrics go to the local default instead: files in {tmp_path / 'out'} and the terminal" in ran.stderr
    assert f"metrics -> files in {tmp_path / 'out'} + terminal" in ran.stderr
    assert (tmp_path / "out" / "metrics.jsonl").stat().st_size > 0
    assert "GPU metrics are off (the log says why), so there is no GPU table" in ran.stdout  # the terminal's line


def test_a_prometheus_port_that_listens_is_announced_with_its_address() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    agent = _AgentProcess("--duration", "0.5", "--prometheus-port", str(port), "--prometheus-host", "127.0.0.1")
    running = agent.wait_for_line("otel-gpu running")
    assert agent.finish(60) == 0
    assert f"Prometheus scrape on 127.0.0.1:{port}/metrics" in running


def test_stopping_with_a_backend_that_hangs_ends() -> None:
    with _hanging_backend() as port:
        # each export may take 300 s; stopping must not wait for that
        agent = _AgentProcess("--otlp-endpoint", f"http://127.0.0.1:{port}", "--otlp-timeout", "300",
                              "--metric-export-interval", "0.2")
        agent.wait_for_line("otel-gpu running")
        time.sleep(1)  # an export is under way by now
        agent.process.send_signal(signal.SIGTERM)
        # generous: this checks that stopping ends, not how fast (the limit is agent.SHUTDOWN_TIMEOUT_S)
        assert agent.finish(120) == 0, "".join(agent.log)
    assert any("otel-gpu stopping" in line for line in agent.log)


def test_a_second_signal_ends_the_agent_at_once() -> None:
    with _hanging_backend() as port:
        agent = _AgentProcess("--otlp-endpoint", f"http://127.0.0.1:{port}", "--otlp-timeout", "300",
                              "--metric-export-interval", "0.2")
        agent.wait_for_line("otel-gpu running")
        time.sleep(1)
        agent.process.send_signal(signal.SIGTERM)
        agent.wait_for_line("otel-gpu stopping")  # the last export now waits on the backend
        agent.process.send_signal(signal.SIGTERM)
        code = agent.finish(120)
    assert code == 128 + signal.SIGTERM, "".join(agent.log)
    assert any("second SIGTERM: stopping now" in line for line in agent.log)


def test_an_output_folder_that_cannot_be_made_is_a_configuration_error(tmp_path: Path) -> None:
    (tmp_path / "a-file").write_text("in the way")
    config = AgentConfig(output=OutputConfig(dir=str(tmp_path / "a-file" / "sub"), files="on", console="off"),
                         gpu=GPUConfig(enabled=False), profiling=ProfilingConfig(enabled=False, gpu_time=False))
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        assert Agent(config).run() == EXIT_CONFIG_ERROR  # validated earlier, but a folder can vanish or turn
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)


@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
def test_secrets_never_show_in_logs_at_any_level_or_in_self_metrics(tmp_path: Path, protocol: str) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # nothing listens here: every export fails and is logged
    secrets = ("HEADERSECRET", "METRICSSECRET", "PYROSCOPESECRET")
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env["OTEL_EXPORTER_OTLP_METRICS_HEADERS"] = "x-api-key=METRICSSECRET"
    result = subprocess.run(
        agent_command("run", "--log-level", "debug", "--duration", "2", "--no-cpu-profiling", "--no-gpu-metrics",
                      "--no-gpu-time-profiling", "--console", "on", "--local-files", "on", "--output-dir",
                      str(tmp_path), "--metric-export-interval", "0.2", "--otlp-timeout", "0.5",
                      "--otlp-endpoint", f"http://127.0.0.1:{port}", "--otlp-protocol", protocol,
                      "--otlp-headers", "authorization=Bearer HEADERSECRET", "--pyroscope-url",
                      f"http://127.0.0.1:{port}", "--pyroscope-user", "me", "--pyroscope-password", "PYROSCOPESECRET"),
        capture_output=True, text=True, timeout=120, cwd=REPO, env=env)
    assert result.returncode == 0, result.stderr
    assert "is failing" in result.stderr  # the failure was logged, so there was a chance to leak
    self_metrics = (tmp_path / "metrics.jsonl").read_text()
    assert "otel_gpu.export.failures" in self_metrics
    basic = base64.b64encode(b"me:PYROSCOPESECRET").decode()
    for secret in (*secrets, basic):
        for where, text in (("stdout", result.stdout), ("stderr", result.stderr), ("metrics.jsonl", self_metrics)):
            assert secret not in text, f"{secret} in {where}"


# --- where data goes: every signal reaches a destination; the node's identity on every profile ----------------------

def test_profiles_carry_the_node_and_a_profile_without_destination_is_counted() -> None:
    from otel_gpu import selfmetrics, semconv

    config = AgentConfig(node_name="gpu-node-7", resource_attributes=(("k8s.cluster.name", "east"),
                                                                     ("service.name", "the-agent")))
    exporter = _Exporter()
    Agent(config)._report([_Source("gpu_time", [_batch(11)])], [exporter])
    assert dict(exporter.exported[0].node) == {"host.name": "gpu-node-7", "k8s.node.name": "gpu-node-7",
                                               "k8s.cluster.name": "east"}
    selfmetrics.reset()
    Agent(config)._report([_Source("gpu_time", [_batch(11), _batch(12)])], [])
    assert selfmetrics.total(semconv.SELF_DROPPED.name, otel_gpu__reason=semconv.Reason.NO_DESTINATION,
                             otel_gpu__signal=semconv.Signal.PROFILES) == 2


def test_an_idle_interval_is_said_on_the_terminal_once_and_sent_nowhere_else() -> None:
    """An idle node (no process sampled, no injected workload) still tells the terminal that profiling ran, once
    until something is recorded again; files and backends get no empty profile."""
    from otel_gpu.exporters.console import ConsoleProfileExporter

    terminal, files = io.StringIO(), _Exporter()
    exporters = [ConsoleProfileExporter(terminal), files]
    idle = ProfileBatch(type=gpu_time_profile_type(), start_unix_nano=1, duration_nano=10**10, processes=())
    agent = Agent(AgentConfig())
    for batch in (idle, idle, _batch(11), idle):
        agent._report([_Source("gpu_time", [batch])], exporters)
    lines = [line for line in terminal.getvalue().splitlines() if line.startswith("==")]
    assert lines[0] == "== gpu_time over 10.0 s: nothing recorded"
    assert lines[1].startswith("== gpu_time over 0.0 s: 1 process, 1 stacks")
    assert lines[2] == "== gpu_time over 10.0 s: nothing recorded"
    assert len(lines) == 3
    assert [batch.processes[0].process.pid for batch in files.exported] == [11]


def test_a_generic_endpoint_with_a_path_is_a_metrics_backend_and_gets_no_profiles() -> None:
    from otel_gpu.config import OTLPConfig

    mimir = OTLPConfig(endpoint="http://mimir:8080/otlp", protocol="http/protobuf")
    assert mimir.metrics_target() == ("http/protobuf", "http://mimir:8080/otlp/v1/metrics")
    assert mimir.profiles_target() is None
    collector = OTLPConfig(endpoint="http://collector:4318/", protocol="http/protobuf")
    assert collector.profiles_target() == ("http/protobuf", "http://collector:4318/v1development/profiles")
    assert OTLPConfig(endpoint="http://collector:4317").profiles_target() == ("grpc", "http://collector:4317")
    explicit = OTLPConfig(endpoint="http://mimir:8080/otlp", protocol="http/protobuf",
                          profiles_endpoint="http://collector:4318/v1development/profiles")
    assert explicit.profiles_target() == ("http/protobuf", "http://collector:4318/v1development/profiles")

    config = AgentConfig(otlp=mimir, output=OutputConfig(dir="out"))
    assert not config.writes_files("metrics") and config.writes_files("profiles") and config.shows_console("profiles")
    line = Agent(config)._destinations(None)
    assert line.startswith("metrics -> OTLP http/protobuf http://mimir:8080/otlp/v1/metrics; "
                           "profiles -> files in out + terminal (the OTLP endpoint http://mimir:8080/otlp has a path")
    assert "--otlp-profiles-endpoint or --pyroscope-url" in line


def test_the_start_up_line_says_profiles_are_off_when_no_profile_source_runs(tmp_path: Path) -> None:
    line = Agent(AgentConfig(output=OutputConfig(dir="out")))._destinations(None, profiling=False)
    assert line == "metrics -> files in out + terminal; profiles -> off (no profile source runs)"
    clean = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    ran = subprocess.run(agent_command("run", "--duration", "0.5", "--no-cpu-profiling", "--no-gpu-time-profiling",
                                       "--no-gpu-metrics", "--prometheus-port", "0", "--console", "off",
                                       "--output-dir", str(tmp_path / "out")),
                         capture_output=True, text=True, timeout=60, cwd=REPO, env=clean)
    assert ran.returncode == 0, ran.stderr
    assert f"metrics -> files in {tmp_path / 'out'}; profiles -> off (no profile source runs)" in ran.stderr, \
        ran.stderr


def test_the_cost_line_comes_after_the_last_export() -> None:
    """Stopping's last report and flush are part of the agent's cost: the line is logged once they are over (here
    after the last metrics export to a backend that is down has failed)."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    ran = subprocess.run(agent_command("run", "--duration", "0.5", "--no-cpu-profiling", "--no-gpu-time-profiling",
                                       "--no-gpu-metrics", "--otlp-metrics-endpoint", "http://127.0.0.1:1",
                                       "--otlp-timeout", "0.5", "--metric-export-interval", "60"),
                         capture_output=True, text=True, timeout=60, cwd=REPO, env=clean)
    assert ran.returncode == 0, ran.stderr
    lines = ran.stderr.splitlines()
    cost = [i for i, line in enumerate(lines) if "otel-gpu cost: " in line]
    failing = [i for i, line in enumerate(lines) if "metrics export to otlp_grpc" in line and "is failing" in line]
    assert len(cost) == 1 and failing and failing[-1] < cost[0], ran.stderr
    assert "CPU-s by thread since start-up" in lines[cost[0]]


@contextlib.contextmanager
def _busy_process() -> Iterator[int]:
    busy = subprocess.Popen(["sh", "-c", "while :; do :; done"])
    try:
        yield busy.pid
    finally:
        busy.kill()
        busy.wait()


def _profiling_run(tmp_path: Path, pid: int, *args: str, env: dict[str, str] | None = None
                   ) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    return subprocess.run(
        agent_command("run", "--duration", "3", "--profiling-interval", "1", "--no-gpu-metrics",
                      "--no-gpu-time-profiling", "--pid", str(pid), "--output-dir", str(tmp_path / "out"), *args),
        capture_output=True, text=True, timeout=120, cwd=REPO, env={**clean, **(env or {})})


@pytest.mark.root
def test_a_metrics_backend_leaves_profiles_on_the_local_default(tmp_path: Path) -> None:
    """The README's `--prometheus-port` example: metrics are scraped, profiles still go to files and the terminal."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with _busy_process() as pid:
        ran = _profiling_run(tmp_path, pid, "--prometheus-port", str(port), "--prometheus-host", "127.0.0.1")
    assert ran.returncode == 0, ran.stderr
    assert f"metrics -> Prometheus scrape on 127.0.0.1:{port}/metrics; profiles -> files in" in ran.stderr
    assert sorted((tmp_path / "out").glob("profile-cpu-*.pb.gz")), ran.stderr
    assert not (tmp_path / "out" / "metrics.jsonl").exists()  # metrics have their backend
    assert f"sh[{pid}]" in ran.stdout  # the profile's terminal summary


@pytest.mark.root
def test_a_metrics_only_otlp_endpoint_never_receives_profiles(tmp_path: Path) -> None:
    """The Mimir example: the generic endpoint has a path; metrics go there, profiles to the local default."""
    from tests.exporters.receivers import HttpReceiver

    mimir = HttpReceiver().start()
    try:
        with _busy_process() as pid:
            ran = _profiling_run(tmp_path, pid, "--metric-export-interval", "0.5",
                                 env={"OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{mimir.port}/otlp",
                                      "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf"})
    finally:
        mimir.stop()
    assert ran.returncode == 0, ran.stderr
    paths = {request.path for request in mimir.requests}
    assert paths == {"/otlp/v1/metrics"}, paths
    assert sorted((tmp_path / "out").glob("profile-cpu-*.pb.gz")), ran.stderr
    assert "has a path, as a metrics backend's has, so it gets no profiles" in ran.stderr


def test_the_agent_resource_has_a_stable_instance_per_node() -> None:
    from otel_gpu.resource import agent_resource, service_instance_id

    def resource(**kwargs: object) -> dict[str, object]:
        return dict(agent_resource(AgentConfig(**kwargs)).attributes)  # type: ignore[arg-type]

    a, again, b = resource(node_name="node-a"), resource(node_name="node-a"), resource(node_name="node-b")
    assert a["service.instance.id"] == again["service.instance.id"] == service_instance_id("node-a")
    assert a["service.instance.id"] != b["service.instance.id"]
    # the semantic conventions' namespace for UUID v5 service.instance.id values
    assert service_instance_id("node-a") == str(uuid.uuid5(uuid.UUID("4d63009a-8d0f-11ee-aad7-4c796ed8e320"), "node-a"))
    assert a["host.name"] == a["k8s.node.name"] == "node-a" and a["service.name"] == "otel-gpu"
    assert resource(resource_attributes=(("service.instance.id", "mine"),))["service.instance.id"] == "mine"


@pytest.mark.root
def test_profiles_with_every_destination_off_are_announced_at_start(tmp_path: Path) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with _busy_process() as pid:
        ran = _profiling_run(tmp_path, pid, "--prometheus-port", str(port), "--prometheus-host", "127.0.0.1",
                             "--local-files", "off", "--console", "off")
    assert ran.returncode == 0, ran.stderr
    warning = [line for line in ran.stderr.splitlines() if "profiles have no destination" in line]
    assert len(warning) == 1 and "otel_gpu.dropped" in warning[0], ran.stderr
    assert "profiles -> nowhere" in ran.stderr and not (tmp_path / "out").exists()
