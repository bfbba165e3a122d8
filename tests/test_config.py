# SPDX-License-Identifier: Apache-2.0
"""Configuration: flag > environment > YAML > default, standard OTEL_* variables, validation, masked secrets.

The last tests run the real ``otel-gpu`` command in a subprocess (exit codes, output).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from otel_gpu import cli, config
from tests.conftest import REPO, agent_command


def _load(argv: list[str], environ: dict[str, str] | None = None) -> config.AgentConfig:
    args = cli._parser().parse_args(["run", *argv])
    return config.load(args, environ=environ or {})


def _yaml(tmp_path: Path, data: dict) -> str:  # type: ignore[type-arg]
    path = tmp_path / "agent.yaml"
    path.write_text(yaml.safe_dump(data))
    return str(path)


def test_defaults() -> None:
    cfg = _load([])
    assert cfg == config.AgentConfig()
    assert cfg.metrics.export_interval_s == 10.0 and cfg.metrics.prometheus_port == 0
    assert cfg.output.dir == "./otel-gpu-data"
    assert cfg.write_files and cfg.show_console and not cfg.has_backend


def test_precedence_flag_over_env_over_yaml_over_default(tmp_path: Path) -> None:
    file = _yaml(tmp_path, {"metrics": {"export_interval_s": 30, "prometheus_port": 9400},
                            "log_level": "warning", "output": {"dir": "/from/yaml"}})
    env = {"OTEL_GPU_METRICS_EXPORT_INTERVAL": "20", "OTEL_GPU_LOG_LEVEL": "error"}
    cfg = _load(["--config", file, "--metric-export-interval", "5"], env)
    assert cfg.metrics.export_interval_s == 5.0  # flag beats env and file
    assert cfg.log_level == "error"  # env beats file
    assert cfg.metrics.prometheus_port == 9400 and cfg.output.dir == "/from/yaml"  # file beats default
    assert cfg.gpu.collection_timeout_s == config.GPUConfig().collection_timeout_s  # default
    # without the flag the environment wins; without both, the file
    assert _load(["--config", file], env).metrics.export_interval_s == 20.0
    assert _load(["--config", file]).metrics.export_interval_s == 30.0


def test_standard_otel_variables() -> None:
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
           "OTEL_EXPORTER_OTLP_HEADERS": "authorization=Bearer%20abc,x-tenant=t1",
           "OTEL_EXPORTER_OTLP_METRICS_HEADERS": "x-tenant=metrics-only",
           "OTEL_METRIC_EXPORT_INTERVAL": "15000", "OTEL_SERVICE_NAME": "gpu-agent",
           "OTEL_RESOURCE_ATTRIBUTES": "deployment.environment=prod,k8s.cluster.name=c1"}
    cfg = _load([], env)
    assert cfg.otlp.metrics_target() == ("http/protobuf", "http://collector:4318/v1/metrics")
    assert cfg.otlp.headers_for("metrics") == {"authorization": "Bearer abc", "x-tenant": "metrics-only"}
    assert cfg.metrics.export_interval_s == 15.0  # OTEL_METRIC_EXPORT_INTERVAL is milliseconds
    assert cfg.service_name == "gpu-agent"
    assert dict(cfg.resource_attributes) == {"deployment.environment": "prod", "k8s.cluster.name": "c1"}
    assert cfg.has_backend and not cfg.write_files and not cfg.show_console
    # the signal-specific endpoint is used as-is, and gRPC endpoints get no path
    assert _load([], {"OTEL_EXPORTER_OTLP_METRICS_ENDPOINT": "http://vm:8428/opentelemetry/v1/metrics"}
                 ).otlp.metrics_target() == ("grpc", "http://vm:8428/opentelemetry/v1/metrics")
    assert _load(["--otlp-endpoint", "http://c:4317"]).otlp.metrics_target() == ("grpc", "http://c:4317")


def test_every_problem_is_listed_with_its_flag(tmp_path: Path) -> None:
    file = _yaml(tmp_path, {"metrics": {"bogus_key": 1}})
    with pytest.raises(config.ConfigError) as caught:
        _load(["--config", file, "--otlp-protocol", "carrier-pigeon", "--prometheus-port", "70000",
               "--metric-export-interval", "abc"], {"OTEL_EXPORTER_OTLP_ENDPOINT": "collector:grpc"})
    problems = caught.value.problems
    joined = "\n".join(problems)
    assert len(problems) == 5, joined
    assert "--otlp-protocol" in joined and "'grpc'" in joined and "'http/protobuf'" in joined
    assert "--prometheus-port" in joined and "65535" in joined
    assert "--metric-export-interval" in joined
    assert "OTEL_EXPORTER_OTLP_ENDPOINT" in joined and "--otlp-endpoint" in joined
    assert "metrics.bogus_key" in joined


def _run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "K8S_", "NODE_NAME"))}
    return subprocess.run(agent_command(*args), capture_output=True, text=True, timeout=60, cwd=REPO,
                          env={**clean, **(env or {})})


def test_config_command_masks_secrets() -> None:
    result = _run("config", "--otlp-headers", "authorization=Bearer topsecret", "--pyroscope-user", "me",
                  "--pyroscope-password", "hunter2", env={"OTEL_EXPORTER_OTLP_METRICS_HEADERS": "x-key=k3y"})
    assert result.returncode == 0, result.stderr
    assert "topsecret" not in result.stdout and "hunter2" not in result.stdout and "k3y" not in result.stdout
    shown = yaml.safe_load(result.stdout)
    # secrets are left out of the YAML and named (never their values) in comments, with where to set them
    assert "headers" not in shown["otlp"] and "metrics_headers" not in shown["otlp"]
    assert "basic_auth_password" not in shown["pyroscope"] and shown["pyroscope"]["basic_auth_user"] == "me"
    assert "# otlp.headers: authorization=*** (a secret, left out; set it with OTEL_EXPORTER_OTLP_HEADERS or " \
           "--otlp-headers)" in result.stdout
    assert "# otlp.metrics_headers: x-key=***" in result.stdout
    assert "# pyroscope.basic_auth_password: ***" in result.stdout


def test_the_printed_configuration_loads_back(tmp_path: Path) -> None:
    """otel-gpu config > f.yaml; otel-gpu run --config f.yaml: the same configuration, secrets from the environment."""
    source = _yaml(tmp_path, {"metrics": {"prometheus_port": 9464}, "profiling": {"pids": [os.getpid()]}})
    secrets = {"OTEL_EXPORTER_OTLP_HEADERS": "authorization=Bearer%20topsecret", "OTEL_GPU_PYROSCOPE_PASSWORD": "pw"}
    flags = ("--config", source, "--otlp-endpoint", "http://collector:4318/?api_key=K", "--otlp-protocol",
             "http/protobuf", "--resource-attributes", "a=1,b=2", "--process-name", "python", "--pyroscope-url",
             "http://pyroscope:4040", "--pyroscope-user", "me")
    printed = _run("config", *flags, env=secrets)
    assert printed.returncode == 0, printed.stderr
    assert "topsecret" not in printed.stdout and "api_key=***" in printed.stdout
    saved = tmp_path / "effective.yaml"
    saved.write_text(printed.stdout.replace("api_key=***", "api_key=K"))  # a URL secret is masked too: put it back
    again = _run("config", "--config", str(saved), env=secrets)
    assert again.returncode == 0, again.stderr
    assert again.stdout.split("\n", 2)[2] == printed.stdout.split("\n", 2)[2]  # all but the "read from" line
    args = cli._parser().parse_args(["run", *flags])
    original = config.load(args, environ=secrets)
    loaded = config.load(cli._parser().parse_args(["run", "--config", str(saved)]), environ=secrets)
    assert loaded == dataclasses.replace(original, config_file=str(saved))
    assert loaded.otlp.headers_for("metrics") == {"authorization": "Bearer topsecret"}
    ran = _run("run", "--config", str(saved), "--duration", "0.1", "--no-cpu-profiling", "--no-gpu-metrics",
               "--no-gpu-time-profiling", "--prometheus-port", "0", "--otlp-endpoint", "", "--pyroscope-url", "",
               "--local-files", "off", "--console", "off", env=secrets)
    assert ran.returncode == 0, ran.stderr


@pytest.mark.parametrize(("content", "names"), [
    ("otlp:\n  headers: authorization=***\n", "otlp.headers"),
    ("pyroscope:\n  basic_auth_user: me\n  basic_auth_password: '***'\n", "pyroscope.basic_auth_password"),
    ("otlp:\n  endpoint: http://c:4318/?token=***\n", "otlp.endpoint"),
])
def test_a_masked_secret_is_refused_on_load(tmp_path: Path, content: str, names: str) -> None:
    path = tmp_path / "agent.yaml"
    path.write_text(content)
    result = _run("run", "--config", str(path), "--duration", "0.1")
    assert result.returncode == 2, result.stderr
    assert f"key {names!r}" in result.stderr and "the mask 'otel-gpu config' prints" in result.stderr, result.stderr


def test_bad_configuration_exits_2_naming_each_flag() -> None:
    result = _run("run", "--otlp-protocol", "udp", "--metric-export-interval", "0", "--console", "sometimes",
                  env={"OTEL_GPU_METRICS_PROMETHEUS_PORT": "-1"})
    assert result.returncode == 2
    for flag in ("--otlp-protocol", "--metric-export-interval", "--console", "--prometheus-port"):
        assert flag in result.stderr, (flag, result.stderr)
    assert "OTEL_GPU_METRICS_PROMETHEUS_PORT" in result.stderr
    assert result.stdout == ""


def test_passwords_in_urls_are_refused_and_never_shown() -> None:
    for command in ("config", "run"):
        result = _run(command, "--otlp-endpoint", "http://u:SECRET@127.0.0.1:4317",
                      env={"OTEL_GPU_PYROSCOPE_URL": "https://me:hunter2@pyroscope:4040"})
        assert result.returncode == 2, result.stderr
        assert "SECRET" not in result.stdout + result.stderr and "hunter2" not in result.stdout + result.stderr
        assert "--otlp-endpoint" in result.stderr and "OTEL_GPU_PYROSCOPE_URL" in result.stderr
        assert "http://***@127.0.0.1:4317" in result.stderr and "must not hold a user or password" in result.stderr
    assert config.redacted("u:SECRET@host:4317") == "***@host:4317" and config.redacted(7) == 7


def test_secret_query_parameters_are_masked() -> None:
    assert config.redacted("http://h:4040/?token=SECRET&org=1") == "http://h:4040/?token=***&org=1"
    assert config.redacted("https://h/v1?a=1&API_KEY=SECRET;sig=S2#x") == "https://h/v1?a=1&API_KEY=***;sig=***#x"
    assert config.redacted("sending to http://u:p@h/?x-amz-signature=SECRET failed") == \
        "sending to http://***@h/?x-amz-signature=*** failed"
    assert config.redacted("http://h/?page=2&q=tokens") == "http://h/?page=2&q=tokens"  # the name, not the value
    cfg = _load(["--otlp-endpoint", "http://h:4318/otlp/?api_key=K", "--otlp-protocol", "http/protobuf"])
    assert cfg.otlp.metrics_target() == ("http/protobuf", "http://h:4318/otlp/v1/metrics?api_key=K")


def test_the_log_filter_masks_messages_and_tracebacks_and_lets_bad_format_calls_through() -> None:
    masking = config.RedactingFilter()
    record = logging.LogRecord("t", logging.WARNING, __file__, 1, "sending to %s failed", ("http://h/?token=S3",), None)
    assert masking.filter(record) and record.getMessage() == "sending to http://h/?token=*** failed"
    try:
        raise ConnectionError("http://h/v1/metrics?api_key=S3: refused")
    except ConnectionError:
        record = logging.LogRecord("t", logging.ERROR, __file__, 1, "failed", (), sys.exc_info())
    assert masking.filter(record) and "S3" not in logging.Formatter().format(record)
    bad = logging.LogRecord("t", logging.WARNING, __file__, 1, "%d items", ("not a number",), None)
    assert masking.filter(bad)  # the handler reports the format error itself, as without the filter


def test_url_secrets_are_masked_in_the_config_command_and_in_every_log_line(tmp_path: Path) -> None:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # nothing listens here: every export fails and is logged with its URL
    urls = ("--otlp-endpoint", f"http://127.0.0.1:{port}/?api_key=OTLPSECRET", "--pyroscope-url",
            f"http://127.0.0.1:{port}/?token=PYROSCOPESECRET")
    shown = _run("config", *urls)
    assert shown.returncode == 0, shown.stderr
    assert "SECRET" not in shown.stdout and "?token=***" in shown.stdout and "?api_key=***" in shown.stdout
    ran = _run("run", "--log-level", "debug", "--duration", "2", "--no-cpu-profiling", "--no-gpu-metrics",
               "--no-gpu-time-profiling", "--console", "off", "--local-files", "off", "--metric-export-interval",
               "0.2", "--otlp-timeout", "0.5", "--otlp-protocol", "http/protobuf", *urls)
    assert ran.returncode == 0, ran.stderr
    assert "SECRET" not in ran.stdout + ran.stderr, ran.stderr
    # no profile source runs, so the start-up line says profiles are off and names no Pyroscope URL
    assert "otel-gpu running" in ran.stderr and "?api_key=***" in ran.stderr, ran.stderr


@pytest.mark.parametrize("url", ["https://[::1", "http://127.0.0.1:notaport", "http://127.0.0.1:99999", "http://:4317"])
def test_malformed_endpoints_exit_2_naming_the_flag(url: str) -> None:
    result = _run("run", "--otlp-endpoint", url)
    assert result.returncode == 2, result.stderr
    assert "flag --otlp-endpoint" in result.stderr and "Traceback" not in result.stderr


def test_config_command_shows_the_precedence_result(tmp_path: Path) -> None:
    file = _yaml(tmp_path, {"metrics": {"export_interval_s": 30, "prometheus_port": 9400}})
    result = _run("config", "--config", file, "--prometheus-port", "9500",
                  env={"OTEL_GPU_METRICS_EXPORT_INTERVAL": "20"})
    assert result.returncode == 0, result.stderr
    shown = yaml.safe_load(result.stdout)
    assert shown["metrics"]["prometheus_port"] == 9500 and shown["metrics"]["export_interval_s"] == 20.0


@pytest.mark.parametrize(("make_dir", "expected"), [
    (lambda tmp: str(tmp / "a-file" / "sub"), "which is a file"),
    (lambda tmp: str(tmp / "a-file"), "is a file"),
    (lambda tmp: "/proc/otel-gpu-data", "proc file system"),
    (lambda tmp: "", "must name a folder"),
], ids=["under-a-file", "a-file", "under-proc", "empty"])
def test_unusable_output_folders_exit_2_naming_the_flag(tmp_path: Path, make_dir: Callable[[Path], str],
                                                        expected: str) -> None:
    (tmp_path / "a-file").write_text("not a folder")
    for command in ("config", "run"):
        result = _run(command, "--output-dir", make_dir(tmp_path), "--duration", "1")
        assert result.returncode == 2, result.stderr
        assert "flag --output-dir" in result.stderr and expected in result.stderr, result.stderr
        assert "Traceback" not in result.stderr


def test_output_folder_on_a_read_only_mount_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real_statvfs = os.statvfs

    def read_only(path: str | os.PathLike[str]) -> os.statvfs_result:
        got = real_statvfs(path)
        return os.statvfs_result((*got[:8], got.f_flag | os.ST_RDONLY, got.f_namemax))

    monkeypatch.setattr(os, "statvfs", read_only)
    with pytest.raises(config.ConfigError) as caught:
        _load(["--output-dir", str(tmp_path / "new" / "folder")])
    assert caught.value.problems == [f"flag --output-dir: {str(tmp_path / 'new' / 'folder')!r} is on a read-only "
                                     f"file system ({str(tmp_path)!r})"]
    # the folder is only checked when files are written: a backend-only agent does not care
    assert _load(["--output-dir", str(tmp_path), "--local-files", "off"]).output.dir == str(tmp_path)


def test_a_writable_output_folder_is_accepted_and_not_created_by_validation(tmp_path: Path) -> None:
    cfg = _load(["--output-dir", str(tmp_path / "not" / "yet")])
    assert cfg.output.dir == str(tmp_path / "not" / "yet") and not (tmp_path / "not").exists()


@pytest.mark.parametrize(("pid", "expected"), [("-4", "is not a process id"), ("0", "is not a process id"),
                                               ("4194305", "is not a process id"),
                                               ("999999", "no process 999999 is running")])
def test_pids_that_cannot_be_profiled_exit_2_naming_the_flag(pid: str, expected: str) -> None:
    if pid == "999999" and Path("/proc/999999").exists():
        pytest.skip("a process 999999 happens to exist")
    result = _run("run", "--pid", pid, "--duration", "1")
    assert result.returncode == 2, result.stderr
    assert "flag --pid" in result.stderr and expected in result.stderr and "Traceback" not in result.stderr
    assert _load(["--pid", str(os.getpid())]).profiling.pids == (os.getpid(),)


@pytest.mark.parametrize(("content", "expected"), [
    (b"log_level: \xff\xfe\n", "is not UTF-8"),
    (b"metrics: [unclosed\n", "is not valid YAML at line 2"),
    (b"- just\n- a list\n", "must hold a mapping"),
    (b"output:\n  dir: [1, 2]\n", "needs a single value, not a list"),
    (b"output:\n  dir:\n", "needs a value"),
    (b"profiling:\n  frequency_hz: 1.5\n", "1.5 is not a whole number"),
    (b"a: " + b"[" * 100_000 + b"]" * 100_000 + b"\n", "nests too deeply"),
    (b"# " + b"x" * (2 << 20) + b"\n", "is larger than"),  # a log file given by mistake
])
def test_malformed_config_files_exit_2_naming_the_flag(tmp_path: Path, content: bytes, expected: str) -> None:
    path = tmp_path / "agent.yaml"
    path.write_bytes(content)
    result = _run("config", "--config", str(path))
    assert result.returncode == 2, result.stderr
    assert "flag --" in result.stderr and expected in result.stderr, result.stderr  # --config, or the key's flag
    assert "Traceback" not in result.stderr and result.stdout == ""


def test_a_nest_of_yaml_aliases_is_refused_without_expanding_it(tmp_path: Path) -> None:
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, 30)]
    lines += ["output:", "  dir: *a29"]  # str() of it would be 9**30 items long
    path = tmp_path / "agent.yaml"
    path.write_text("\n".join(lines) + "\n")
    result = _run("config", "--config", str(path))
    assert result.returncode == 2 and "needs a single value, not a list" in result.stderr


def test_config_objects_do_not_show_secrets() -> None:
    cfg = _load(["--otlp-headers", "authorization=Bearer topsecret", "--pyroscope-user", "me",
                 "--pyroscope-password", "hunter2"], {"OTEL_EXPORTER_OTLP_PROFILES_HEADERS": "x-key=k3y"})
    assert cfg.otlp.headers_for("profiles") == {"authorization": "Bearer topsecret", "x-key": "k3y"}
    shown = repr(cfg)
    assert "topsecret" not in shown and "hunter2" not in shown and "k3y" not in shown
    assert "basic_auth_user='me'" in shown  # the rest is there as before


def test_secrets_stay_hidden_in_problems() -> None:
    result = _run("config", "--otlp-headers", "Authorization: Bearer topsecret")  # a colon where '=' belongs
    assert result.returncode == 2 and "flag --otlp-headers" in result.stderr
    assert "topsecret" not in result.stderr


def test_a_yaml_error_does_not_quote_the_line(tmp_path: Path) -> None:
    path = tmp_path / "agent.yaml"
    path.write_text('pyroscope:\n  basic_auth_password: "hunter2\n')  # the quote is never closed
    result = _run("config", "--config", str(path))
    assert result.returncode == 2 and "is not valid YAML" in result.stderr
    assert "hunter2" not in result.stderr


def test_misspelled_otel_gpu_variables_are_named_with_the_closest_known_one() -> None:
    cfg = _load([], {"OTEL_GPU_OUTPUT_DIRR": "/x", "OTEL_GPU_PROFILNG_PIDS": "1", "OTEL_GPU_NONSENSE_THING": "1",
                     "OTEL_GPU_OVERHEAD_BUDGET": "0.05", "OTEL_GPU_DEBUG_STATS": "1", "OTEL_GPU_LOG_LEVEL": "info",
                     "OTEL_SOMETHING_ELSE": "1"})
    assert cfg.warnings == (
        "environment variable OTEL_GPU_NONSENSE_THING is not an otel-gpu setting and is ignored",
        "environment variable OTEL_GPU_OUTPUT_DIRR is not an otel-gpu setting and is ignored; did you mean "
        "OTEL_GPU_OUTPUT_DIR?",
        "environment variable OTEL_GPU_PROFILNG_PIDS is not an otel-gpu setting and is ignored; did you mean "
        "OTEL_GPU_PROFILING_PIDS?",
    )
    assert cfg.output.dir == config.OutputConfig().dir  # ignored, as the warning says
    for command in ("config", "run"):
        result = _run(command, "--duration", "0.1", "--no-cpu-profiling", "--no-gpu-metrics",
                      "--no-gpu-time-profiling", "--console", "off", "--local-files", "off",
                      env={"OTEL_GPU_PYROSCOPE_PASWORD": "hunter2"})
        assert result.returncode == 0, result.stderr
        assert "OTEL_GPU_PYROSCOPE_PASWORD" in result.stderr and "OTEL_GPU_PYROSCOPE_PASSWORD?" in result.stderr
        assert "hunter2" not in result.stderr  # names only, never values


@pytest.mark.parametrize("value", ["inf", "nan", "0", "-1"])
def test_timeouts_are_finite_and_positive(value: str) -> None:
    with pytest.raises(config.ConfigError) as caught:
        _load(["--otlp-timeout", value, "--gpu-collection-timeout", value])
    assert [p.split(":")[0] for p in caught.value.problems] == ["flag --otlp-timeout", "flag --gpu-collection-timeout"]


def test_otlp_timeout_compression_and_tls_files_per_signal_over_generic(tmp_path: Path) -> None:
    """The OTLP exporter specification: per-signal variables win over generic ones; timeouts are milliseconds;
    compression is none unless asked."""
    files = {name: tmp_path / f"{name}.pem" for name in ("ca", "mca", "key", "cert", "pkey", "pcert")}
    for file in files.values():
        file.write_text("PEM")
    assert config.OTLPConfig().signal("metrics").compression == "none"
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": "https://c:4317", "OTEL_EXPORTER_OTLP_TIMEOUT": "2500",
           "OTEL_EXPORTER_OTLP_PROFILES_TIMEOUT": "30000", "OTEL_EXPORTER_OTLP_COMPRESSION": "gzip",
           "OTEL_EXPORTER_OTLP_METRICS_COMPRESSION": "none", "OTEL_EXPORTER_OTLP_CERTIFICATE": str(files["ca"]),
           "OTEL_EXPORTER_OTLP_METRICS_CERTIFICATE": str(files["mca"]),
           "OTEL_EXPORTER_OTLP_CLIENT_KEY": str(files["key"]),
           "OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE": str(files["cert"]),
           "OTEL_EXPORTER_OTLP_PROFILES_CLIENT_KEY": str(files["pkey"]),
           "OTEL_EXPORTER_OTLP_PROFILES_CLIENT_CERTIFICATE": str(files["pcert"])}
    cfg = _load([], env)
    metrics, profiles = cfg.otlp.signal("metrics"), cfg.otlp.signal("profiles")
    assert (metrics.timeout_s, profiles.timeout_s) == (2.5, 30.0)
    assert (metrics.compression, profiles.compression) == ("none", "gzip")
    assert (metrics.certificate, profiles.certificate) == (str(files["mca"]), str(files["ca"]))
    assert (metrics.client_key, metrics.client_certificate) == (str(files["key"]), str(files["cert"]))
    assert (profiles.client_key, profiles.client_certificate) == (str(files["pkey"]), str(files["pcert"]))
    # a flag beats the variable (seconds there); the project's own variable beats the standard one
    assert _load(["--otlp-metrics-timeout", "4"], env).otlp.signal("metrics").timeout_s == 4.0
    assert _load([], {**env, "OTEL_GPU_OTLP_TIMEOUT": "3"}).otlp.signal("metrics").timeout_s == 3.0


def test_http_json_is_refused_naming_the_variable_and_the_alternatives() -> None:
    for name in ("OTEL_EXPORTER_OTLP_PROTOCOL", "OTEL_EXPORTER_OTLP_METRICS_PROTOCOL"):
        result = _run("run", "--duration", "0.1", env={name: "http/json",
                                                       "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"})
        assert result.returncode == 2, result.stderr
        assert f"environment variable {name}" in result.stderr and "'http/json' is not supported" in result.stderr
        assert "no OTLP/JSON exporter" in result.stderr and "'http/protobuf'" in result.stderr, result.stderr


@pytest.mark.parametrize(("name", "value", "expected"), [
    ("OTEL_EXPORTER_OTLP_TIMEOUT", "ten", "'ten' is not a number of milliseconds"),
    ("OTEL_EXPORTER_OTLP_METRICS_TIMEOUT", "-5", "must be 0 (unset) or between"),
    ("OTEL_EXPORTER_OTLP_COMPRESSION", "brotli", "'brotli' is not allowed"),
    ("OTEL_EXPORTER_OTLP_PROFILES_COMPRESSION", "zstd", "'zstd' is not allowed"),
    ("OTEL_EXPORTER_OTLP_METRICS_CERTIFICATE", "/nonexistent/ca.pem", "is not a readable file"),
    ("OTEL_EXPORTER_OTLP_CLIENT_KEY", "/nonexistent/key.pem", "is not a readable file"),
])
def test_invalid_otlp_variables_exit_2_naming_the_variable(name: str, value: str, expected: str) -> None:
    result = _run("run", "--duration", "0.1", env={name: value})
    assert result.returncode == 2, result.stderr
    assert name in result.stderr and expected in result.stderr, result.stderr


def test_host_and_port_without_a_scheme_is_grpcs_form_and_insecure_means_plaintext() -> None:
    """OTEL_EXPORTER_OTLP_ENDPOINT=collector:4317 with OTEL_EXPORTER_OTLP_INSECURE=true, as the OpenTelemetry
    specification lets gRPC exporters take it; over HTTP such an endpoint is refused, naming the flag and signals."""
    loaded = _load([], {"OTEL_EXPORTER_OTLP_ENDPOINT": "collector:4317", "OTEL_EXPORTER_OTLP_INSECURE": "true"})
    for signal in ("metrics", "profiles"):
        resolved = loaded.otlp.signal(signal)
        assert (resolved.protocol, resolved.url, resolved.insecure) == ("grpc", "collector:4317", True)
    assert _load(["--otlp-endpoint", "[::1]:4317"]).otlp.signal("metrics").url == "[::1]:4317"
    with pytest.raises(config.ConfigError) as caught:
        _load(["--otlp-endpoint", "collector:4317", "--otlp-metrics-protocol", "http/protobuf"])
    (problem,) = caught.value.problems
    assert problem.startswith("flag --otlp-endpoint (environment variable OTEL_EXPORTER_OTLP_ENDPOINT):")
    assert "metrics go over http/protobuf, which needs an http:// or https:// URL" in problem
    with pytest.raises(config.ConfigError) as caught:
        _load(["--otlp-profiles-endpoint", "collector:4317", "--otlp-protocol", "http/protobuf"])
    (problem,) = caught.value.problems
    assert "flag --otlp-profiles-endpoint" in problem and "profiles go over http/protobuf" in problem
    for bad in ("collector", "collector:4317/v1", "collector:port", ":4317"):
        with pytest.raises(config.ConfigError) as caught:
            _load(["--otlp-endpoint", bad])
        assert "flag --otlp-endpoint" in caught.value.problems[0], bad


@pytest.mark.root
def test_the_agent_sends_both_signals_to_schemeless_grpc_endpoints_in_plaintext() -> None:
    """`otel-gpu run` with host:port endpoints and --otlp-insecure: metrics and CPU profiles arrive at plaintext
    gRPC receivers (before, the configuration refused the endpoints and the flag did nothing)."""
    from tests.exporters.receivers import GrpcProfilesReceiver, free_port
    from tests.metrics.test_pipeline import _serve

    metrics_server, metrics = _serve(port := free_port())
    profiles = GrpcProfilesReceiver().start()
    busy = subprocess.Popen(["sh", "-c", "while :; do :; done"])  # something to profile every interval
    try:
        ran = _run("run", "--duration", "5", "--pid", str(busy.pid), "--no-gpu-metrics", "--no-gpu-time-profiling",
                   "--console", "off", "--local-files", "off", "--metric-export-interval", "0.5",
                   "--profiling-interval", "1", "--otlp-metrics-endpoint", f"127.0.0.1:{port}",
                   "--otlp-profiles-endpoint", f"127.0.0.1:{profiles.port}", "--otlp-insecure")
        assert ran.returncode == 0, ran.stderr[-3000:]
        assert metrics.names(), ran.stderr[-3000:]
        assert profiles.wait_for(1, timeout_s=5), ran.stderr[-3000:]
    finally:
        busy.kill()
        busy.wait()
        metrics_server.stop(grace=None)
        profiles.stop()


@pytest.mark.parametrize(("argv", "environ", "expected"), [
    (["--pid", "abc"], {}, "flag --pid: 'abc' is not a whole number"),
    ([], {"OTEL_GPU_PROFILING_PIDS": "1 2"}, "'1 2' is not a whole number (in '1 2', a comma-separated list)"),
    (["--queue-max-bytes", "-1"], {}, "must be between 1048576 and 1099511627776"),
    (["--queue-max-bytes", "65536"], {}, "flag --queue-max-bytes: 65536 must be between 1048576 and 1099511627776"),
    (["--otlp-metrics-timeout", "-1"], {}, "must be 0 (unset) or between 0.001 and 3600"),
    (["--profiling-interval", "x"], {}, "flag --profiling-interval: 'x' is not a number"),
])
def test_number_problems_read_as_numbers(argv: list[str], environ: dict[str, str], expected: str) -> None:
    with pytest.raises(config.ConfigError) as caught:
        _load(argv, environ)
    assert any(expected in problem for problem in caught.value.problems), caught.value.problems


def test_a_group_given_one_value_in_the_file_is_named_as_a_group(tmp_path: Path) -> None:
    with pytest.raises(config.ConfigError) as caught:
        _load(["--config", _yaml(tmp_path, {"profiling": 5})])
    (problem,) = caught.value.problems
    assert "key 'profiling' is a group of settings, a mapping of some of command_args, container_id, enabled" in problem
    assert problem.endswith("not a int") and "unknown key" not in problem


def test_a_client_key_needs_a_client_certificate(tmp_path: Path) -> None:
    key = tmp_path / "key.pem"
    key.write_text("PEM")
    with pytest.raises(config.ConfigError) as caught:
        _load([], {"OTEL_EXPORTER_OTLP_METRICS_CLIENT_KEY": str(key)})
    assert len(caught.value.problems) == 1
    assert "--otlp-metrics-client-certificate" in caught.value.problems[0]
    assert "client key but no client certificate" in caught.value.problems[0]


def test_gpu_time_library_names_an_existing_copy_of_the_library(tmp_path: Path) -> None:
    """--gpu-time-library (the chart's hostPath copy that workloads load) must be a file named like the library:
    the probes attach to it at start; anything else exits 2 naming the flag."""
    other = tmp_path / "libcuda.so.1"
    other.write_bytes(b"\x7fELF")
    for value, why in ((str(other), "must name a copy of libotel_gpu_inject.so"),
                       (str(tmp_path / "libotel_gpu_inject.so"), "is not a file")):
        result = _run("run", "--gpu-time-library", value, "--duration", "0.1")
        assert result.returncode == 2, result.stderr
        assert "--gpu-time-library" in result.stderr and why in result.stderr, result.stderr
    copy = tmp_path / "libotel_gpu_inject.so"
    copy.write_bytes(b"\x7fELF")
    result = _run("config", "--gpu-time-library", str(copy), env={"OTEL_GPU_PROFILING_GPU_TIME_LIBRARIES": ""})
    assert result.returncode == 0, result.stderr
    assert str(copy) in result.stdout


def test_the_gpu_time_source_attaches_the_named_copies_at_open(tmp_path: Path) -> None:
    from otel_gpu.cuda.source import GPUTimeSource

    copy = tmp_path / "libotel_gpu_inject.so"
    source = GPUTimeSource(library_paths=[copy])
    assert source._probes._library_paths == [copy]  # what _attach_known attaches at open (test_attach_early)


def test_percent_encoded_pairs_print_as_they_load_back(tmp_path: Path) -> None:
    """A resource attribute holding ',', '=', '%', spaces or non-ASCII prints encoded, so the file loads back to it."""
    environ = {"OTEL_RESOURCE_ATTRIBUTES": "x=%2C,y=a%3Db,pct=50%25,sp=%20two words%20,de=Grüße,k%3Dey=v,e="}
    original = _load([], environ)
    assert dict(original.resource_attributes) == {"x": ",", "y": "a=b", "pct": "50%", "sp": " two words ",
                                                  "de": "Grüße", "k=ey": "v", "e": ""}
    saved = tmp_path / "effective.yaml"
    saved.write_text(config.effective_yaml(original))
    loaded = _load(["--config", str(saved)])
    assert loaded == dataclasses.replace(original, config_file=str(saved))
    assert "resource_attributes: x=,,y=a=b" not in saved.read_text()  # the decoded form, which loads back as x=''
    printed = _run("config", env=environ)
    assert printed.returncode == 0, printed.stderr
    assert yaml.safe_load(printed.stdout)["resource_attributes"] == config.effective(original)["resource_attributes"]


@pytest.mark.parametrize(("variable", "value", "path", "expected"), [
    ("OTEL_LOG_LEVEL", "warn", "log_level", "warning"),
    ("OTEL_LOG_LEVEL", "WARN", "log_level", "warning"),
    ("OTEL_LOG_LEVEL", "INFO", "log_level", "info"),
    ("OTEL_GPU_LOG_LEVEL", "Debug", "log_level", "debug"),
    ("OTEL_EXPORTER_OTLP_COMPRESSION", "GZIP", "otlp.compression", "gzip"),
    ("OTEL_EXPORTER_OTLP_METRICS_COMPRESSION", "None", "otlp.metrics_compression", "none"),
    ("OTEL_EXPORTER_OTLP_PROFILES_COMPRESSION", "Gzip", "otlp.profiles_compression", "gzip"),
    ("OTEL_EXPORTER_OTLP_PROTOCOL", "HTTP/Protobuf", "otlp.protocol", "http/protobuf"),
    ("OTEL_EXPORTER_OTLP_METRICS_PROTOCOL", "GRPC", "otlp.metrics_protocol", "grpc"),
    ("OTEL_EXPORTER_OTLP_PROFILES_PROTOCOL", "gRPC", "otlp.profiles_protocol", "grpc"),
    ("OTEL_GPU_OUTPUT_FILES", "ON", "output.files", "on"),
    ("OTEL_GPU_OUTPUT_CONSOLE", "Off", "output.console", "off"),
    ("OTEL_GPU_PYROSCOPE_API", "INGEST", "pyroscope.api", "ingest"),
])
def test_enum_variables_are_case_insensitive(variable: str, value: str, path: str, expected: str) -> None:
    assert config._get(_load([], {variable: value}), path) == expected


def test_enum_flags_and_keys_are_case_insensitive_and_warn_means_warning(tmp_path: Path) -> None:
    assert _load(["--log-level", "warn", "--otlp-compression", "GZIP"]).log_level == "warning"
    assert _load(["--config", _yaml(tmp_path, {"log_level": "WARN", "otlp": {"protocol": "HTTP/PROTOBUF"}})]) \
        .otlp.protocol == "http/protobuf"
    result = _run("config", env={"OTEL_LOG_LEVEL": "warn"})
    assert result.returncode == 0, result.stderr
    assert yaml.safe_load(result.stdout)["log_level"] == "warning"
    refused = _run("run", "--duration", "0.1", env={"OTEL_EXPORTER_OTLP_PROTOCOL": "HTTP/JSON",
                                                    "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"})
    assert refused.returncode == 2 and "'http/json' is not supported" in refused.stderr, refused.stderr


def test_a_misspelled_yaml_key_is_named_with_the_closest_known_one(tmp_path: Path) -> None:
    result = _run("config", "--config", _yaml(tmp_path, {"metrics": {"prometheus_prot": 9464}}))
    assert result.returncode == 2, result.stderr
    assert "unknown key 'metrics.prometheus_prot' (did you mean 'metrics.prometheus_port'?)" in result.stderr
    assert "known keys" not in result.stderr and "otlp.endpoint" not in result.stderr, result.stderr
    far = _run("config", "--config", _yaml(tmp_path, {"metrics": {"zzz": 1}}))
    assert far.returncode == 2 and "known keys: metrics.export_interval_s," in far.stderr, far.stderr
    assert "otlp.endpoint" not in far.stderr  # the keys of the group it is in, not all 60


@pytest.mark.parametrize(("content", "key", "line"), [
    ("metrics:\n  prometheus_port: 9464\n  prometheus_port: 9465\n", "prometheus_port", 3),
    ("metrics:\n  prometheus_port: 9464\nlog_level: info\nmetrics:\n  export_interval_s: 5\n", "metrics", 4),
])
def test_a_key_given_twice_is_refused_naming_it(tmp_path: Path, content: str, key: str, line: int) -> None:
    path = tmp_path / "agent.yaml"
    path.write_text(content)
    result = _run("config", "--config", str(path))
    assert result.returncode == 2, result.stderr
    assert f"at line {line}" in result.stderr and f"key {key!r} is given twice" in result.stderr, result.stderr
    assert result.stdout == ""


def test_an_unknown_flag_shows_the_commands_own_usage() -> None:
    result = _run("run", "--bogus-flag")
    assert result.returncode == 2
    assert result.stderr.startswith("usage: otel-gpu run ") and "--otlp-endpoint" in result.stderr, result.stderr
    assert "otel-gpu run: error: unrecognized arguments: --bogus-flag" in result.stderr
    shown = _run("config", "--bogus-flag")
    assert shown.returncode == 2 and shown.stderr.startswith("usage: otel-gpu config "), shown.stderr
