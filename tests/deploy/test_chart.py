# SPDX-License-Identifier: Apache-2.0
"""The Helm chart (helm/otel-gpu) with a real helm binary (scripts/fetch-helm.sh): lint and template for the
default values and each toggle, every rendered object valid against the Kubernetes schemas of several minor
versions (kubernetes-validate, offline), the properties the chart promises, and values that break its schema
refused at template time.
"""

from __future__ import annotations

import base64
import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from tests.conftest import REPO

HELM = REPO / ".cache" / "helm" / "bin" / "helm"
CHART = REPO / "helm" / "otel-gpu"
KUBERNETES_VERSIONS = ("1.30.0", "1.33.0", "1.35.0")
CRD_KINDS = {"ServiceMonitor", "PodMonitor"}  # prometheus-operator CRDs: checked by their fields below
AGENT_CAPABILITIES = ["BPF", "PERFMON", "SYS_PTRACE", "DAC_READ_SEARCH", "SYSLOG"]

pytestmark = pytest.mark.skipif(not HELM.exists(), reason=f"{HELM} is missing: run scripts/fetch-helm.sh "
                                                          "(make test-deps)")

# each toggle of the chart, as --set arguments ("string:" for --set-string)
TOGGLES: dict[str, list[str]] = {
    "defaults": [],
    "privileged": ["securityContext.privileged=true"],
    "no-gpu-time": ["profiling.gpuTime=false"],
    "command-args": ["profiling.commandArgs=true"],
    "otlp": ["otlp.endpoint=https://collector.observability:4317", "otlp.protocol=grpc",
             "otlp.headers.X-Scope-OrgID=team-a", "otlp.headersSecret.value=Authorization=Bearer%20abc",
             "otlp.tls.caSecret=collector-ca", "clusterName=gpu-east",
             "resourceAttributes.deployment\\.environment=prod"],
    "otlp-existing-secret": ["otlp.endpoint=http://collector:4318", "otlp.protocol=http/protobuf",
                             "otlp.headersSecret.existingSecret=otlp-auth", "otlp.tls.caConfigMap=ca-bundle",
                             "otlp.insecure=true"],
    "pyroscope": ["pyroscope.url=http://pyroscope:4040", "pyroscope.tenantId=team-a", "pyroscope.user=u",
                  "pyroscope.password=p"],
    "pyroscope-existing-secret": ["pyroscope.url=http://pyroscope:4040", "pyroscope.existingSecret=pyro",
                                  "pyroscope.passwordKey=pw"],
    "service-monitor": ["metrics.prometheusPort=9464", "metrics.serviceMonitor.enabled=true",
                        "metrics.serviceMonitor.labels.release=kube-prometheus"],
    "pod-monitor": ["metrics.prometheusPort=9464", "metrics.podMonitor.enabled=true"],
    "priority-class": ["priorityClass.create=true"],
    "priority-class-name": ["priorityClassName=system-node-critical"],
    "runtime-class": ["runtimeClassName=nvidia"],
    "no-injection": ["injection.enabled=false"],
    "no-dashboards": ["dashboards.enabled=false"],
    "no-service-account": ["serviceAccount.create=false"],
    "k8s-names": ["k8sNames.enabled=true", "k8sNames.ttlSeconds=30"],
    "node-selector": ["string:nodeSelector.nvidia\\.com/gpu\\.present=true", "affinity=null"],
    "extras": ["extraArgs={--process-name,python}", "extraEnv[0].name=OTEL_GPU_PROFILING_INCLUDE_SELF",
               "string:extraEnv[0].value=true", "podAnnotations.a=b", "podLabels.team=ml"],
}


def helm(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(HELM), *args], capture_output=True, text=True, check=check, timeout=60)


def set_args(sets: list[str]) -> list[str]:
    out = []
    for item in sets:
        out += ["--set-string", item.removeprefix("string:")] if item.startswith("string:") else ["--set", item]
    return out


def render(sets: list[str], extra: list[str] | None = None) -> list[dict[str, Any]]:
    done = helm("template", "gpu", str(CHART), "--namespace", "monitoring", *(extra or []), *set_args(sets),
                check=False)
    assert done.returncode == 0, done.stderr
    return [doc for doc in yaml.safe_load_all(done.stdout) if doc]


def by_kind(objects: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [o for o in objects if o["kind"] == kind]


def agent(objects: list[dict[str, Any]]) -> dict[str, Any]:
    (daemonset,) = by_kind(objects, "DaemonSet")
    (container,) = [c for c in daemonset["spec"]["template"]["spec"]["containers"] if c["name"] == "agent"]
    return container


def env_of(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}


@pytest.fixture(scope="module")
def defaults() -> list[dict[str, Any]]:
    return render([])


@pytest.fixture
def dashboards_dir() -> Iterator[Path]:
    """Two dashboard files in the chart for one test (removed after; files already there are left alone)."""
    folder = CHART / "dashboards"
    folder.mkdir(exist_ok=True)
    made = [folder / "zz-test-fleet.json", folder / "zz_test_gpu.json"]
    for i, path in enumerate(made):
        path.write_text(json.dumps({"title": f"test {i}", "panels": [], "schemaVersion": 41}))
    try:
        yield folder
    finally:
        for path in made:
            path.unlink()


def test_helm_lint_passes_for_defaults_and_every_toggle() -> None:
    for name, sets in TOGGLES.items():
        done = helm("lint", "--strict", str(CHART), *set_args(sets), check=False)
        assert done.returncode == 0, f"{name}: {done.stdout}{done.stderr}"


@pytest.mark.parametrize("toggle", list(TOGGLES))
def test_rendered_objects_are_valid_kubernetes(toggle: str) -> None:
    objects = render(TOGGLES[toggle])
    assert by_kind(objects, "DaemonSet")
    for obj in objects:
        if obj["kind"] in CRD_KINDS:
            continue
        for version in KUBERNETES_VERSIONS:
            try:
                kubernetes_validate.validate(obj, version, strict=True)
            except kubernetes_validate.ValidationError as exc:
                pytest.fail(f"{toggle}: {obj['kind']} {obj['metadata']['name']} on Kubernetes {version}: {exc}")


def test_default_daemonset_runs_on_gpu_nodes_without_taking_a_gpu(defaults: list[dict[str, Any]]) -> None:
    (daemonset,) = by_kind(defaults, "DaemonSet")
    spec = daemonset["spec"]["template"]["spec"]
    assert spec["hostPID"] is True
    terms = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    keys = {e["key"] for term in terms for e in term["matchExpressions"]}
    assert keys == {"nvidia.com/gpu.present", "feature.node.kubernetes.io/pci-10de.present"}
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in spec["tolerations"]
    container = agent(defaults)
    env = env_of(container)
    assert env["NVIDIA_VISIBLE_DEVICES"] == "all" and env["NVIDIA_DRIVER_CAPABILITIES"] == "utility"
    for kind in ("requests", "limits"):
        assert not any("nvidia.com" in key for key in container["resources"].get(kind, {}))
    assert container["resources"]["limits"]["memory"] == "256Mi"
    assert "cpu" not in container["resources"]["limits"]
    assert "runtimeClassName" not in spec and "priorityClassName" not in spec


def test_default_security_is_the_capability_list_not_privileged(defaults: list[dict[str, Any]]) -> None:
    context = agent(defaults)["securityContext"]
    assert context["privileged"] is False
    assert context["allowPrivilegeEscalation"] is False
    assert context["capabilities"] == {"drop": ["ALL"], "add": AGENT_CAPABILITIES + ["SYS_ADMIN"]}
    assert context["readOnlyRootFilesystem"] is True
    assert context["seccompProfile"] == {"type": "Unconfined"}
    no_gpu_time = agent(render(TOGGLES["no-gpu-time"]))["securityContext"]
    assert no_gpu_time["capabilities"]["add"] == AGENT_CAPABILITIES
    privileged = agent(render(TOGGLES["privileged"]))["securityContext"]
    assert privileged["privileged"] is True and "capabilities" not in privileged


def test_host_mounts_are_read_only_and_the_injection_folder_writable_only_in_the_init_container(
        defaults: list[dict[str, Any]]) -> None:
    (daemonset,) = by_kind(defaults, "DaemonSet")
    spec = daemonset["spec"]["template"]["spec"]
    host_volumes = {v["name"]: v["hostPath"]["path"] for v in spec["volumes"] if "hostPath" in v}
    assert host_volumes == {"btf": "/sys/kernel/btf", "injection-library": "/opt/otel-gpu/lib"}
    for mount in agent(defaults)["volumeMounts"]:
        if mount["name"] in host_volumes:
            assert mount.get("readOnly") is True, mount
    # the agent attaches to the node's copy (the file workloads load) at start: mounted read-only, named by a flag
    # the agent accepts
    library = {m["name"]: m["mountPath"] for m in agent(defaults)["volumeMounts"]}["injection-library"]
    assert f"--gpu-time-library={library}/libotel_gpu_inject.so" in agent(defaults)["args"]
    no_gpu_time = agent(render(TOGGLES["no-gpu-time"]))
    assert "injection-library" not in {m["name"] for m in no_gpu_time["volumeMounts"]}
    assert not any(a.startswith("--gpu-time-library") for a in no_gpu_time["args"])
    (init,) = spec["initContainers"]
    assert init["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert "/opt/otel-gpu/lib/libotel_gpu_inject.so" in init["args"][0]
    assert [m["mountPath"] for m in init["volumeMounts"]] == ["/host-lib"]
    assert "initContainers" not in by_kind(render(TOGGLES["no-injection"]), "DaemonSet")[0]["spec"]["template"]["spec"]


def test_command_args_flag_is_passed_only_when_asked(tmp_path: Path) -> None:
    """profiling.commandArgs puts --process-command-args on the agent's command line, and only then: command lines
    can hold secrets, so the default leaves process.command_args off. The rendered args are parsed by the agent's own
    parser with the chart's environment, so a flag it does not know fails here."""
    from otel_gpu import cli, config

    library = tmp_path / "libotel_gpu_inject.so"  # the node's copy, mounted at /host-lib in the pod
    library.write_bytes(b"\x7fELF")
    for sets, expected in (([], False), (["profiling.commandArgs=false"], False), (TOGGLES["command-args"], True)):
        objects = render(sets)
        args = agent(objects)["args"]
        assert ("--process-command-args" in args) is expected, (sets, args)
        assert args[0] == "run" and not any(a.startswith("--no-process-command-args") for a in args)
        args = [a.replace("/host-lib/libotel_gpu_inject.so", str(library)) for a in args]
        environ = kubelet_environment(objects, {}, tmp_path / "unused")
        loaded = config.load(cli._parser().parse_args(args), environ=environ)
        assert loaded.profiling.command_args is expected, sets


def test_environment_names_are_the_ones_the_agent_reads(defaults: list[dict[str, Any]]) -> None:
    from otel_gpu.config import OPTIONS

    readable = {name for option in OPTIONS for name in option.env}
    readable |= {"NVIDIA_VISIBLE_DEVICES", "NVIDIA_DRIVER_CAPABILITIES"}  # read by the NVIDIA container toolkit
    for toggle in ("defaults", "otlp", "pyroscope", "service-monitor"):
        env = env_of(agent(render(TOGGLES[toggle])))
        unknown = set(env) - readable - {"OTLP_SECRET_HEADERS"}  # the Secret's part of OTEL_EXPORTER_OTLP_HEADERS
        assert not unknown, f"{toggle}: the agent reads no {sorted(unknown)}"
    env = env_of(agent(defaults))
    assert env["K8S_NODE_NAME"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    assert "OTEL_EXPORTER_OTLP_ENDPOINT" not in env and "OTEL_GPU_PYROSCOPE_URL" not in env


def test_otlp_values_map_to_the_standard_variables_with_tokens_from_a_secret() -> None:
    objects = render(TOGGLES["otlp"])
    env = env_of(agent(objects))
    assert env["OTEL_EXPORTER_OTLP_ENDPOINT"] == "https://collector.observability:4317"
    assert env["OTEL_EXPORTER_OTLP_PROTOCOL"] == "grpc"
    assert env["OTEL_EXPORTER_OTLP_HEADERS"] == "$(OTLP_SECRET_HEADERS),X-Scope-OrgID=team-a"
    (secret,) = by_kind(objects, "Secret")
    key_ref = env["OTLP_SECRET_HEADERS"]["secretKeyRef"]
    assert key_ref == {"name": secret["metadata"]["name"], "key": "otlp-headers"}
    assert base64.b64decode(secret["data"]["otlp-headers"]).decode() == "Authorization=Bearer%20abc"
    assert env["OTEL_EXPORTER_OTLP_CERTIFICATE"] == "/etc/otel-gpu/tls/ca.crt"
    attributes = dict(pair.split("=") for pair in env["OTEL_RESOURCE_ATTRIBUTES"].split(","))
    assert attributes == {"deployment.environment": "prod", "k8s.cluster.name": "gpu-east"}
    # the secret header reference precedes the plain headers, as Kubernetes expands $(VAR) of earlier entries only
    names = [e["name"] for e in agent(objects)["env"]]
    assert names.index("OTLP_SECRET_HEADERS") < names.index("OTEL_EXPORTER_OTLP_HEADERS")

    existing = render(TOGGLES["otlp-existing-secret"])
    assert not by_kind(existing, "Secret")
    env = env_of(agent(existing))
    assert env["OTLP_SECRET_HEADERS"]["secretKeyRef"] == {"name": "otlp-auth", "key": "otlp-headers"}
    assert env["OTEL_EXPORTER_OTLP_HEADERS"] == "$(OTLP_SECRET_HEADERS)"
    assert env["OTEL_EXPORTER_OTLP_PROTOCOL"] == "http/protobuf" and env["OTEL_EXPORTER_OTLP_INSECURE"] == "true"
    (daemonset,) = by_kind(existing, "DaemonSet")
    tls = [v for v in daemonset["spec"]["template"]["spec"]["volumes"] if v["name"] == "tls"]
    assert tls == [{"name": "tls", "configMap": {"name": "ca-bundle"}}]


def test_otlp_timeout_is_set_only_when_given() -> None:
    assert "OTEL_EXPORTER_OTLP_TIMEOUT" not in env_of(agent(render([])))
    assert env_of(agent(render(["otlp.timeoutMs=2500"])))["OTEL_EXPORTER_OTLP_TIMEOUT"] == "2500"


PER_SIGNAL = ("OTEL_EXPORTER_OTLP_METRICS_", "OTEL_EXPORTER_OTLP_PROFILES_")


def test_per_signal_otlp_values_map_to_the_per_signal_variables() -> None:
    sets = ["otlp.endpoint=http://collector:4317", "otlp.metricsProtocol=http/protobuf",
            "otlp.profilesProtocol=grpc", "otlp.metricsCompression=none", "otlp.profilesCompression=gzip",
            "otlp.metricsTimeoutMs=2000", "otlp.profilesTimeoutMs=30000", "otlp.tls.caSecret=collector-tls",
            "otlp.tls.caKey=", "otlp.tls.metricsCaKey=metrics-ca.crt", "otlp.tls.profilesCaKey=profiles-ca.crt",
            "otlp.tls.profilesClientKeyKey=p.key", "otlp.tls.profilesClientCertificateKey=p.crt"]
    env = env_of(agent(render(sets)))
    assert {name: value for name, value in env.items() if name.startswith(PER_SIGNAL)} == {
        "OTEL_EXPORTER_OTLP_METRICS_PROTOCOL": "http/protobuf", "OTEL_EXPORTER_OTLP_PROFILES_PROTOCOL": "grpc",
        "OTEL_EXPORTER_OTLP_METRICS_COMPRESSION": "none", "OTEL_EXPORTER_OTLP_PROFILES_COMPRESSION": "gzip",
        "OTEL_EXPORTER_OTLP_METRICS_TIMEOUT": "2000", "OTEL_EXPORTER_OTLP_PROFILES_TIMEOUT": "30000",
        "OTEL_EXPORTER_OTLP_METRICS_CERTIFICATE": "/etc/otel-gpu/tls/metrics-ca.crt",
        "OTEL_EXPORTER_OTLP_PROFILES_CERTIFICATE": "/etc/otel-gpu/tls/profiles-ca.crt",
        "OTEL_EXPORTER_OTLP_PROFILES_CLIENT_KEY": "/etc/otel-gpu/tls/p.key",
        "OTEL_EXPORTER_OTLP_PROFILES_CLIENT_CERTIFICATE": "/etc/otel-gpu/tls/p.crt"}
    assert "OTEL_EXPORTER_OTLP_CERTIFICATE" not in env  # caKey "": only the per-signal files
    # unset per-signal values leave only the general variables, which the agent then uses for both signals
    env = env_of(agent(render(["otlp.endpoint=http://collector:4317"])))
    assert not [name for name in env if name.startswith(PER_SIGNAL)]
    assert env["OTEL_EXPORTER_OTLP_COMPRESSION"] == "gzip"  # the chart's deliberate choice (README: otlp.compression)
    for sets, message in ((["otlp.tls.metricsCaKey=ca.crt"], "needs otlp.tls.caSecret or otlp.tls.caConfigMap"),
                          (["otlp.tls.caSecret=s", "otlp.tls.metricsClientKeyKey=k"], "go together"),
                          (["otlp.tls.caConfigMap=c", "otlp.tls.profilesClientKeyKey=k",
                            "otlp.tls.profilesClientCertificateKey=c"], "go together")):
        done = helm("template", "gpu", str(CHART), *set_args(sets), check=False)
        assert done.returncode != 0 and message in done.stderr, (sets, done.stderr)


def test_spaces_and_plus_signs_in_pairs_reach_the_agent_unchanged(tmp_path: Path) -> None:
    from otel_gpu import config

    sets = ["otlp.endpoint=http://collector:4317", "string:resourceAttributes.team=ml platform+infra",
            "string:otlp.headers.X-Note=a b"]
    loaded = config.load(environ=kubelet_environment(render(sets), {}, tmp_path / "unused"))
    assert dict(loaded.resource_attributes)["team"] == "ml platform+infra"
    assert loaded.otlp.headers_for("metrics")["X-Note"] == "a b"


def test_the_agent_reads_the_per_signal_chart_environment(tmp_path: Path) -> None:
    from otel_gpu import config

    for name in ("m.crt", "p.crt", "p.key", "pc.crt"):
        (tmp_path / name).write_text("-----BEGIN CERTIFICATE-----\n")
    sets = ["otlp.endpoint=http://collector:4317", "otlp.metricsEndpoint=http://mimir:8080/otlp/v1/metrics",
            "otlp.metricsProtocol=http/protobuf", "otlp.metricsCompression=none", "otlp.profilesTimeoutMs=30000",
            "otlp.tls.caSecret=tls", "otlp.tls.caKey=", "otlp.tls.metricsCaKey=m.crt",
            "otlp.tls.profilesCaKey=p.crt", "otlp.tls.profilesClientKeyKey=p.key",
            "otlp.tls.profilesClientCertificateKey=pc.crt"]
    environ = kubelet_environment(render(sets), {}, tmp_path / "unused")
    environ = {name: value.replace("/etc/otel-gpu/tls", str(tmp_path)) for name, value in environ.items()}
    loaded = config.load(environ=environ)
    assert loaded.otlp.metrics_target() == ("http/protobuf", "http://mimir:8080/otlp/v1/metrics")
    assert loaded.otlp.profiles_target() == ("grpc", "http://collector:4317")
    assert loaded.otlp.metrics_compression == "none" and loaded.otlp.compression == "gzip"
    assert loaded.otlp.profiles_timeout_s == 30.0 and loaded.otlp.metrics_timeout_s == 0
    assert loaded.otlp.metrics_certificate == str(tmp_path / "m.crt") and loaded.otlp.certificate == ""
    assert (loaded.otlp.profiles_client_key, loaded.otlp.profiles_client_certificate) == \
        (str(tmp_path / "p.key"), str(tmp_path / "pc.crt"))


def test_monitors_give_the_labels_the_dashboards_select_by() -> None:
    node = {"sourceLabels": ["__meta_kubernetes_pod_node_name"], "targetLabel": "host_name"}
    cluster = {"targetLabel": "k8s_cluster_name", "replacement": "gpu-east"}
    for clustered in (False, True):
        extra = ["clusterName=gpu-east"] if clustered else []
        (pod_monitor,) = by_kind(render(TOGGLES["pod-monitor"] + extra), "PodMonitor")
        (service_monitor,) = by_kind(render(TOGGLES["service-monitor"] + extra), "ServiceMonitor")
        for endpoint in (pod_monitor["spec"]["podMetricsEndpoints"][0], service_monitor["spec"]["endpoints"][0]):
            assert node in endpoint["relabelings"]
            assert (cluster in endpoint["relabelings"]) is clustered


def test_both_monitors_at_once_are_refused() -> None:
    done = helm("template", "gpu", str(CHART), "--set", "metrics.prometheusPort=9464",
                "--set", "metrics.podMonitor.enabled=true", "--set", "metrics.serviceMonitor.enabled=true", check=False)
    assert done.returncode != 0 and "scrape every agent twice" in done.stderr, done.stderr


def notes(*sets: str) -> str:
    """What ``helm install`` prints after the objects (NOTES.txt) for these --set arguments."""
    done = helm("install", "gpu", str(CHART), "--dry-run=client", *set_args(list(sets)), check=False)
    assert done.returncode == 0, done.stderr
    return done.stdout.split("NOTES:", 1)[1]


def test_notes_say_when_the_image_has_no_registry() -> None:
    assert "No image is published" in notes()
    assert "No image is published" not in notes("image.repository=registry.example/otel-gpu")


def test_notes_say_which_nodes_and_what_the_namespace_needs() -> None:
    """The default affinity keeps the agent to GPU nodes whether or not a nodeSelector narrows them further."""
    default = notes()
    assert "on GPU nodes\n(those the affinity selects: by default nodes labelled nvidia.com/gpu.present=true" in default
    assert "pod-security.kubernetes.io/enforce=privileged" in default
    assert 'on GPU nodes matching nodeSelector {"a":"b"}\n' in notes("string:nodeSelector.a=b")
    alone = notes("string:nodeSelector.a=b", "affinity=null")
    assert 'on nodes matching nodeSelector {"a":"b"} (no affinity)' in alone and "GPU nodes" not in alone


def test_notes_show_the_workload_snippet_only_when_gpu_time_is_profiled() -> None:
    assert "CUDA_INJECTION64_PATH" in notes()
    assert "CUDA_INJECTION64_PATH" not in notes("profiling.gpuTime=false")
    assert "CUDA_INJECTION64_PATH" not in notes("injection.enabled=false")


def test_notes_say_the_flame_graphs_need_pyroscope_over_otlp() -> None:
    assert "flame graphs stay empty" in notes("pyroscope.url=http://p:4040", "pyroscope.api=ingest")
    assert "flame graphs stay empty" not in notes("pyroscope.url=http://p:4040")
    assert "flame graphs stay empty" not in notes("pyroscope.url=http://p:4040", "pyroscope.api=ingest",
                                                  "dashboards.enabled=false")


def test_mutual_tls_files_come_from_the_ca_secret() -> None:
    env = env_of(agent(render(["otlp.tls.caSecret=collector-tls", "otlp.tls.clientKeyKey=tls.key",
                               "otlp.tls.clientCertificateKey=tls.crt"])))
    assert env["OTEL_EXPORTER_OTLP_CLIENT_KEY"] == "/etc/otel-gpu/tls/tls.key"
    assert env["OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE"] == "/etc/otel-gpu/tls/tls.crt"
    for sets in (["otlp.tls.clientKeyKey=tls.key"], ["otlp.tls.caConfigMap=ca", "otlp.tls.clientKeyKey=tls.key",
                                                       "otlp.tls.clientCertificateKey=tls.crt"]):
        done = helm("template", "gpu", str(CHART), *set_args(sets), check=False)
        assert done.returncode != 0 and "go together" in done.stderr, done.stderr


def test_pyroscope_values_and_password_secret() -> None:
    objects = render(TOGGLES["pyroscope"])
    env = env_of(agent(objects))
    assert env["OTEL_GPU_PYROSCOPE_URL"] == "http://pyroscope:4040"
    assert env["OTEL_GPU_PYROSCOPE_TENANT_ID"] == "team-a" and env["OTEL_GPU_PYROSCOPE_USER"] == "u"
    (secret,) = by_kind(objects, "Secret")
    assert base64.b64decode(secret["data"]["pyroscope-password"]).decode() == "p"
    assert env["OTEL_GPU_PYROSCOPE_PASSWORD"]["secretKeyRef"]["name"] == secret["metadata"]["name"]
    env = env_of(agent(render(TOGGLES["pyroscope-existing-secret"])))
    assert env["OTEL_GPU_PYROSCOPE_PASSWORD"]["secretKeyRef"] == {"name": "pyro", "key": "pw"}


def test_monitors_scrape_the_prometheus_port() -> None:
    objects = render(TOGGLES["service-monitor"])
    assert env_of(agent(objects))["OTEL_GPU_METRICS_PROMETHEUS_PORT"] == "9464"
    assert agent(objects)["ports"] == [{"name": "metrics", "containerPort": 9464, "protocol": "TCP"}]
    (service,) = by_kind(objects, "Service")
    (monitor,) = by_kind(objects, "ServiceMonitor")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus"
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert monitor["spec"]["endpoints"][0]["port"] == service["spec"]["ports"][0]["name"] == "metrics"
    (pod_monitor,) = by_kind(render(TOGGLES["pod-monitor"]), "PodMonitor")
    assert pod_monitor["spec"]["podMetricsEndpoints"][0]["port"] == "metrics"
    done = helm("template", "gpu", str(CHART), "--set", "metrics.podMonitor.enabled=true", check=False)
    assert done.returncode != 0 and "metrics.prometheusPort" in done.stderr


def test_local_files_fit_the_output_volume() -> None:
    """Without a backend the agent writes its files to the output emptyDir: the profile files' cap the chart passes,
    metrics.jsonl with its rotated copy and summary.txt with its copy must stay under the volume's size limit, or
    the kubelet evicts the pod."""
    from otel_gpu.exporters.files import MAX_SUMMARY_BYTES
    from otel_gpu.metrics.files import DEFAULT_MAX_FILE_BYTES

    for limit_mib in (None, 256, 4096):
        objects = render([] if limit_mib is None else [f"localFilesSizeLimitMiB={limit_mib}"])
        (daemonset,) = by_kind(objects, "DaemonSet")
        (output,) = [v for v in daemonset["spec"]["template"]["spec"]["volumes"] if v["name"] == "output"]
        size_limit = output["emptyDir"]["sizeLimit"]
        assert size_limit == f"{limit_mib or 1024}Mi"
        profile_bytes = int(env_of(agent(objects))["OTEL_GPU_OUTPUT_MAX_PROFILE_BYTES"])
        assert profile_bytes > 0
        assert profile_bytes + 2 * DEFAULT_MAX_FILE_BYTES + 2 * MAX_SUMMARY_BYTES < int(size_limit[:-2]) << 20, \
            size_limit


# peak RSS with every source on under a CUDA torch load on the H200 (docs/benchmarks.md), before native unwinding
MEASURED_PEAK_BYTES = 110 * 10**6


def test_the_memory_limit_holds_the_measured_peak_and_every_bounded_part() -> None:
    """The measured peak plus what was not in that run: the unwinder's table cache, its unwind_rows BPF map (8 bytes
    a row, charged to the pod) and the retry queues of the profile backends, full while they are down. Each
    backend keeps its own queue, so the chart shares profiling.retryQueueMiB between them."""
    from otel_gpu.cpu.sampler import DEFAULT_UNWIND_ROWS
    from otel_gpu.unwind.table import _CACHE_BYTES

    values = yaml.safe_load((CHART / "values.yaml").read_text())
    limit = values["resources"]["limits"]["memory"]
    assert limit.endswith("Mi")
    for sets, backends in (([], 0), (TOGGLES["otlp"], 1), (TOGGLES["pyroscope"], 1),
                           (TOGGLES["otlp"] + TOGGLES["pyroscope"], 2)):
        queue_bytes = int(env_of(agent(render(sets)))["OTEL_GPU_OUTPUT_QUEUE_MAX_BYTES"])
        assert queue_bytes * max(1, backends) == values["profiling"]["retryQueueMiB"] << 20
        worst = MEASURED_PEAK_BYTES + _CACHE_BYTES + 8 * DEFAULT_UNWIND_ROWS + backends * queue_bytes
        assert worst < int(limit[:-2]) << 20, (sets, worst)


def test_priority_and_runtime_class() -> None:
    objects = render(TOGGLES["priority-class"])
    (priority,) = by_kind(objects, "PriorityClass")
    assert by_kind(objects, "DaemonSet")[0]["spec"]["template"]["spec"]["priorityClassName"] == \
        priority["metadata"]["name"]
    spec = by_kind(render(TOGGLES["priority-class-name"] + TOGGLES["runtime-class"]), "DaemonSet")[0]["spec"]
    assert spec["template"]["spec"]["priorityClassName"] == "system-node-critical"
    assert spec["template"]["spec"]["runtimeClassName"] == "nvidia"


def test_dashboards_become_configmaps_with_the_sidecar_label(dashboards_dir: Path) -> None:
    objects = render([])
    maps = {m["metadata"]["name"]: m for m in by_kind(objects, "ConfigMap")}
    for name, file in (("gpu-otel-gpu-dashboard-zz-test-fleet", "zz-test-fleet.json"),
                       ("gpu-otel-gpu-dashboard-zz-test-gpu", "zz_test_gpu.json")):
        assert maps[name]["metadata"]["labels"]["grafana_dashboard"] == "1"
        assert json.loads(maps[name]["data"][file]) == json.loads((dashboards_dir / file).read_text())
    assert not by_kind(render(TOGGLES["no-dashboards"]), "ConfigMap")


@pytest.mark.parametrize("bad", [
    "otlp.protocol=http",
    "otlp.endpoint=collector:4317",
    "otlp.endpoint=http://user:pw@collector:4317",
    "pyroscope.api=push",
    "metrics.prometheusPort=70000",
    "profiling.frequencyHz=0",
    "profiling.retryQueueMiB=0",
    "profiling.commandArgs=yes",
    "securityContext.privileged=yes",
    "securityContext.capabilities={CAP_BPF}",
    "logLevel=verbose",
    "localFiles=maybe",
    "localFilesSizeLimitMiB=128",
    "nvidia.driverCapabilities=utility;compute",
    "injection.hostPath=relative/path",
    "image.pullPolicy=Sometimes",
    "unknownKey=1",
    "otlp.unknown=1",
    "otlp.timeoutMs=-1",
    "otlp.timeoutMs=10s",
    "otlp.metricsCompression=zstd",
    "otlp.profilesProtocol=http/json",
    "otlp.metricsTimeoutMs=-5",
    "otlp.tls.profilesCaKey=a/b",
])
def test_values_that_break_the_schema_are_refused(bad: str) -> None:
    done = helm("template", "gpu", str(CHART), "--set", bad, check=False)
    assert done.returncode != 0, f"{bad} was accepted"
    assert "schema" in done.stderr.lower() or "at '/" in done.stderr, done.stderr


def test_one_secret_source_at_a_time() -> None:
    done = helm("template", "gpu", str(CHART), "--set", "otlp.headersSecret.value=a=b",
                "--set", "otlp.headersSecret.existingSecret=s", check=False)
    assert done.returncode != 0, "both a value and an existing Secret were accepted"


def test_notes_name_the_backend_and_the_workload_snippet() -> None:
    done = helm("install", "gpu", str(CHART), "--dry-run=client", "--namespace", "monitoring",
                "--set", "otlp.endpoint=http://collector:4317", check=False)
    assert done.returncode == 0, done.stderr
    notes = done.stdout.split("NOTES:", 1)[1]
    assert "OTLP (grpc): http://collector:4317" in notes
    done = helm("install", "gpu", str(CHART), "--dry-run=client", "--namespace", "monitoring",
                "--set", "otlp.profilesEndpoint=http://collector:4317", "--set", "otlp.profilesProtocol=grpc",
                "--set", "otlp.metricsEndpoint=http://mimir/otlp/v1/metrics", "--set", "otlp.protocol=http/protobuf",
                check=False)
    assert done.returncode == 0, done.stderr
    notes = done.stdout.split("NOTES:", 1)[1]
    assert "OTLP profiles (grpc): http://collector:4317" in notes and "No backend is set" not in notes
    assert "OTLP metrics (http/protobuf): http://mimir/otlp/v1/metrics" in notes
    assert "CUDA_INJECTION64_PATH" in notes and "/opt/otel-gpu/lib" in notes


def test_chart_readme_lists_every_value() -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    rows = [line.split("|")[1] for line in (CHART / "README.md").read_text().splitlines()
            if line.startswith("| `")]
    documented = {key for row in rows for key in row.replace("`", " ").replace(",", " ").split()}

    def leaves(node: Any, prefix: str) -> Iterator[str]:
        if isinstance(node, dict) and node and prefix not in documented:
            for key, value in node.items():
                yield from leaves(value, f"{prefix}.{key}" if prefix else key)
        else:
            yield prefix

    missing = [key for key in leaves(values, "") if key not in documented]
    assert not missing, f"helm/otel-gpu/README.md's values table lacks {missing}"


def kubelet_environment(objects: list[dict[str, Any]], existing_secrets: dict[str, dict[str, str]],
                        certificate: Path) -> dict[str, str]:
    """The agent container's environment as the kubelet would give it: downward API and Secret values filled in,
    ``$(VAR)`` of earlier entries expanded, the CA file moved to ``certificate`` (the mount is not here)."""
    secrets = {s["metadata"]["name"]: {k: base64.b64decode(v).decode() for k, v in s["data"].items()}
               for s in by_kind(objects, "Secret")}
    secrets.update(existing_secrets)
    environ: dict[str, str] = {}
    for entry in agent(objects)["env"]:
        if "value" in entry:
            value = entry["value"]
            for name, earlier in environ.items():
                value = value.replace(f"$({name})", earlier)
        elif "fieldRef" in entry["valueFrom"]:
            value = {"spec.nodeName": "gpu-node-7"}[entry["valueFrom"]["fieldRef"]["fieldPath"]]
        else:
            ref = entry["valueFrom"]["secretKeyRef"]
            value = secrets[ref["name"]][ref["key"]]
        environ[entry["name"]] = value
    if "OTEL_EXPORTER_OTLP_CERTIFICATE" in environ:
        environ["OTEL_EXPORTER_OTLP_CERTIFICATE"] = str(certificate)
    return environ


def test_the_agent_accepts_the_chart_environment(tmp_path: Path) -> None:
    from otel_gpu import config

    certificate = tmp_path / "ca.crt"
    certificate.write_text("-----BEGIN CERTIFICATE-----\n")
    existing = {"otlp-auth": {"otlp-headers": "Authorization=Basic%20dXNlcjpwdw=="}, "pyro": {"pw": "secret"}}
    loaded = {}
    for toggle in ("defaults", "otlp", "otlp-existing-secret", "pyroscope", "service-monitor", "no-gpu-time"):
        environ = kubelet_environment(render(TOGGLES[toggle]), existing, certificate)
        try:
            loaded[toggle] = config.load(environ=environ)
        except config.ConfigError as exc:
            pytest.fail(f"{toggle}: the agent refuses the chart's environment: {exc.problems}")
        assert loaded[toggle].warnings == (), f"{toggle}: {loaded[toggle].warnings}"
        assert loaded[toggle].node_name == "gpu-node-7"
    assert loaded["defaults"].write_files and not loaded["defaults"].show_console
    assert loaded["defaults"].output.max_profile_bytes == (1024 - 192) << 20  # localFilesSizeLimitMiB less the rest
    otlp = loaded["otlp"]
    assert otlp.otlp.profiles_target() == ("grpc", "https://collector.observability:4317")
    assert otlp.otlp.headers_for("profiles") == {"Authorization": "Bearer abc", "X-Scope-OrgID": "team-a"}
    assert dict(otlp.resource_attributes) == {"deployment.environment": "prod", "k8s.cluster.name": "gpu-east"}
    assert not otlp.write_files
    assert otlp.output.queue_max_bytes == 32 << 20  # profiling.retryQueueMiB, one profile backend
    assert loaded["otlp-existing-secret"].otlp.headers_for("metrics") == {"Authorization": "Basic dXNlcjpwdw=="}
    assert loaded["otlp-existing-secret"].otlp.metrics_target() == ("http/protobuf", "http://collector:4318/v1/metrics")
    pyroscope = loaded["pyroscope"].pyroscope
    assert (pyroscope.url, pyroscope.tenant_id, pyroscope.basic_auth_user, pyroscope.basic_auth_password) == \
        ("http://pyroscope:4040", "team-a", "u", "p")
    assert loaded["service-monitor"].metrics.prometheus_port == 9464
    assert loaded["no-gpu-time"].profiling.gpu_time is False and loaded["defaults"].profiling.gpu_time is True


def test_k8s_names_bring_a_token_and_a_role_that_may_only_list_pods(tmp_path: Path) -> None:
    from otel_gpu import config

    plain = render([])
    assert not by_kind(plain, "ClusterRole") and not by_kind(plain, "ClusterRoleBinding")
    daemonset = by_kind(plain, "DaemonSet")[0]["spec"]["template"]["spec"]
    assert daemonset["automountServiceAccountToken"] is False
    assert by_kind(plain, "ServiceAccount")[0]["automountServiceAccountToken"] is False

    objects = render(TOGGLES["k8s-names"])
    (role,) = by_kind(objects, "ClusterRole")
    assert role["rules"] == [{"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]}]
    (binding,) = by_kind(objects, "ClusterRoleBinding")
    (account,) = by_kind(objects, "ServiceAccount")
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": account["metadata"]["name"],
                                    "namespace": "monitoring"}]
    pod = by_kind(objects, "DaemonSet")[0]["spec"]["template"]["spec"]
    assert pod["automountServiceAccountToken"] is True and pod["serviceAccountName"] == account["metadata"]["name"]
    # in the pod the kubelet adds the in-cluster variables; the agent then turns the lookup on
    environ = kubelet_environment(objects, {}, tmp_path / "ca.crt")
    environ.update(KUBERNETES_SERVICE_HOST="10.96.0.1", KUBERNETES_SERVICE_PORT="443")
    loaded = config.load(environ=environ)
    assert loaded.k8s.names and loaded.k8s.names_ttl_s == 30 and loaded.k8s.api_url == "https://10.96.0.1:443"
    assert loaded.warnings == ()
