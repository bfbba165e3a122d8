# SPDX-License-Identifier: Apache-2.0
"""What a run imports (issue 12, memory): a module that a run's configuration does not use stays unimported. grpc alone
holds ~9 MB of anonymous memory and maps ~12 MB of library once imported; pyelftools ~5 MB, yaml ~1.3 MB; ssl maps
libcrypto and libssl (~4 MB resident), with http.client and urllib.request for the network exporters and the
Kubernetes pod lookup; hashlib's OpenSSL part (_hashlib) maps libcrypto too."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# what `otel-gpu run` imports with every source on, profiles to local files, metrics to a file, no --config
_RUN = """
import os
import sys
from otel_gpu import config as config_module
from otel_gpu.agent import Agent
from otel_gpu.cpu.source import CPUProfileSource
from otel_gpu.cuda.source import GPUTimeSource
from otel_gpu.exporters import build_profile_exporters
from otel_gpu.gpu.source import NVMLSource
from otel_gpu.metrics.pipeline import MetricsPipeline
from otel_gpu.resource import agent_resource

config = config_module.load(None, {**os.environ, "OTEL_GPU_OUTPUT_DIR": sys.argv[1]})
exporters = build_profile_exporters(config)
pipeline = MetricsPipeline(config, agent_resource(config))
pipeline.shutdown(1.0)
from otel_gpu.instrumentation.locate import find_span_table  # what the CPU source runs on each sampled process
find_span_table(os.getpid())
print(" ".join(sorted(name for name in ("grpc", "yaml", "elftools", "ssl", "http.client", "urllib.request",
                                       "_hashlib") if name in sys.modules)))
print(" ".join(type(exporter).__name__ for exporter in exporters))
"""


def _imported(tmp_path: Path, env: dict[str, str] | None = None) -> tuple[set[str], list[str]]:
    done = subprocess.run([sys.executable, "-c", _RUN, str(tmp_path)], cwd=REPO, capture_output=True, text=True,
                          check=True, env=env)
    modules, exporters = done.stdout.splitlines()[-2:]
    return set(modules.split()), exporters.split()


def test_a_local_run_without_a_config_file_imports_neither_grpc_nor_yaml_nor_pyelftools_nor_ssl(tmp_path: Path) -> None:
    modules, exporters = _imported(tmp_path, {"PATH": "/usr/bin:/bin"})
    assert exporters == ["FilesProfileExporter", "ConsoleProfileExporter"]
    assert modules == set()


def test_the_grpc_profile_exporter_still_imports_grpc(tmp_path: Path) -> None:
    modules, exporters = _imported(tmp_path, {"PATH": "/usr/bin:/bin",
                                              "OTEL_EXPORTER_OTLP_PROFILES_ENDPOINT": "http://127.0.0.1:4317"})
    assert "OTLPGrpcProfileExporter" in exporters
    assert "grpc" in modules


def test_an_http_profile_exporter_imports_what_it_sends_with(tmp_path: Path) -> None:
    modules, exporters = _imported(tmp_path, {"PATH": "/usr/bin:/bin",
                                              "OTEL_EXPORTER_OTLP_PROFILES_ENDPOINT": "http://127.0.0.1:4318",
                                              "OTEL_EXPORTER_OTLP_PROFILES_PROTOCOL": "http/protobuf"})
    assert "OTLPHttpProfileExporter" in exporters
    assert {"ssl", "urllib.request"} <= modules
