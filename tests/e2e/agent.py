# SPDX-License-Identifier: Apache-2.0
"""The real agent in a subprocess (GPU metrics only) with the fake ``libnvidia-ml.so.1`` on the library path."""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import NATIVE, REPO, agent_command

FAKE_NVML_DIR = NATIVE / "nvml" / "build"
FAKE_NVML = FAKE_NVML_DIR / "libnvidia-ml.so.1"
GIB = 1024**3
MEMORY_TOTAL_BYTES = 150754820096
GPU_UUIDS = ("GPU-00000000-fa4e-4c1d-9a6b-000000000000", "GPU-00000000-fa4e-4c1d-9a6b-000000000001")


def build_fake_nvml() -> Path:
    """``make -C tests/native/nvml`` (a no-op when up to date); fails the test if it does not build."""
    result = subprocess.run(["make", "-s", "-C", str(NATIVE / "nvml")], capture_output=True, text=True, timeout=300)
    if result.returncode != 0 or not FAKE_NVML.exists():
        pytest.fail(f"building the fake NVML failed:\n{result.stdout}\n{result.stderr}", pytrace=False)
    return FAKE_NVML


class AgentProcess:
    """``otel-gpu run ARGS`` with the fake NVML; stdout and stderr go to files under ``folder``."""

    def __init__(self, folder: Path, args: list[str], fake_nvml: dict[str, str] | None = None) -> None:
        self.folder = folder
        self.stdout_path = folder / "agent.stdout"
        self.stderr_path = folder / "agent.stderr"
        clean = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "FAKE_NVML_", "K8S_"))}
        env = {**clean, "LD_LIBRARY_PATH": f"{FAKE_NVML_DIR}:{clean.get('LD_LIBRARY_PATH', '')}".rstrip(":"),
               "PYTHONUNBUFFERED": "1"}
        env.update({f"FAKE_NVML_{k}": v for k, v in (fake_nvml or {}).items()})
        with open(self.stdout_path, "wb") as out, open(self.stderr_path, "wb") as err:
            command = agent_command("run", "--no-cpu-profiling", "--no-gpu-time-profiling", *args)
            self.process = subprocess.Popen(command, cwd=folder, env=env, stdout=out, stderr=err,
                                            stdin=subprocess.DEVNULL)

    @property
    def pid(self) -> int:
        return self.process.pid

    def running(self) -> bool:
        return self.process.poll() is None

    def stop(self, timeout_s: float = 30.0) -> int:
        """SIGTERM and wait; returns the exit code."""
        if self.running():
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)
                raise AssertionError(f"the agent did not stop within {timeout_s:g} s of SIGTERM") from None
        return int(self.process.returncode)

    def wait(self, timeout_s: float) -> int:
        return int(self.process.wait(timeout=timeout_s))

    def rss_bytes(self) -> int:
        """Resident set size from /proc/<pid>/status."""
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        raise AssertionError("no VmRSS line")

    def stdout(self) -> str:
        return self.stdout_path.read_text(errors="replace")

    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace")


@pytest.fixture
def sleepers() -> Iterator[list[subprocess.Popen[bytes]]]:
    """Two real processes (named ``sleep``) for the fake NVML to list as GPU processes."""
    started = [subprocess.Popen(["sleep", "600"], cwd=REPO) for _ in range(2)]
    try:
        yield started
    finally:
        for process in started:
            process.kill()
            process.wait()


def run_profiling_agent(workload: subprocess.Popen, receiver, *args: str) -> subprocess.CompletedProcess[str]:  # type: ignore[type-arg,no-untyped-def]
    """``otel-gpu run ARGS`` sending profiles over OTLP gRPC to ``receiver`` while ``workload`` runs; then the workload
    is killed and the receiver stopped (also when the agent fails). The agent must exit 0."""
    try:
        agent = subprocess.run(
            agent_command("run", *args, "--otlp-profiles-endpoint", f"http://127.0.0.1:{receiver.port}",
                          "--otlp-profiles-protocol", "grpc", "--metric-export-interval", "60"),
            capture_output=True, text=True, timeout=120, check=False)
    finally:
        workload.kill()
        workload.wait()
        receiver.stop()
    assert agent.returncode == 0, f"agent failed ({agent.returncode}):\n{agent.stderr[-4000:]}"
    return agent
