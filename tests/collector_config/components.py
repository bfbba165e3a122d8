# SPDX-License-Identifier: Apache-2.0
"""The configuration keys of the Collector components collector-config/ uses, as OpenTelemetry Collector-contrib
v0.159.0 defines them (read 2026-12-03, signals re-checked 2026-12-04; no Collector binary with the OTLP receiver can
be had here to check them). collector-config/README.md ("What was checked against what") lists the sources per
component with the version each was read at.

Sources, by component (``mapstructure`` tags of the config structs, the component's metadata.yaml for the signals):
- core repository open-telemetry/opentelemetry-collector at tag v0.159.0 (commit 934999fb):
  receiver/otlpreceiver/config.go, config/configgrpc/configgrpc.go, config/confighttp/{client,server}.go,
  config/configtls/generated_config.go, config/configretry/generated_config.go,
  exporter/exporterhelper/internal/queuebatch/config.go (+ configoptional's ``enabled``), exporter/otlpexporter and
  otlphttpexporter config.go and metadata.yaml (types ``otlp_grpc`` / ``otlp_http``, profiles alpha),
  processor/batchprocessor (no profiles), internal/memorylimiter/config.go (memory_limiter: profiles alpha),
  service/metadata.yaml (feature gate ``service.profilesSupport``, alpha since v0.112.0).
- contrib repository open-telemetry/opentelemetry-collector-contrib (stored snapshots of its files):
  processor/k8sattributesprocessor/config.go (+ internal/k8sconfig ``auth_type``; profiles since PR #35999),
  processor/groupbyattrsprocessor/config.go (``keys``), processor/resourceprocessor (``attributes``, the
  internal/coreinternal/attraction ActionKeyValue keys), processor/transformprocessor README (``error_mode``,
  ``metric_statements`` of ``context`` / ``conditions`` / ``statements``), extension/healthcheckextension.
- signals per processor, from the newest README status tables found (pkg.go.dev / release tags) and stored
  metadata.yaml files: k8sattributes development: profiles (v0.135.0), transform development: profiles (v0.135.0;
  its metadata.yaml with the v0.150.0 ``processor.transform.defaultErrorModeIgnore`` gate), resource development:
  profiles (v0.133.0 tag, v0.135.0), groupbyattrs traces / metrics / logs only (v0.142.0).

A schema is a dict of key -> sub-schema; ``LEAF`` is a scalar or a list of scalars; ``ANY_MAP`` takes any keys
(headers); ``[schema]`` is a list of mappings each following ``schema``.
"""

from __future__ import annotations

from typing import Any, Final

LEAF: Final = None
ANY_MAP: Final = "any-map"
SIGNALS: Final = ("traces", "metrics", "logs", "profiles")

TLS_CLIENT: Final = {k: LEAF for k in (
    "insecure", "insecure_skip_verify", "server_name_override", "ca_file", "ca_pem", "cert_file", "cert_pem",
    "cipher_suites", "curve_preferences", "include_insecure_cipher_suites", "include_system_ca_certs_pool", "key_file",
    "key_pem", "max_version", "min_version", "reload_interval")}
TLS_SERVER: Final = {**{k: LEAF for k in TLS_CLIENT if not k.startswith("insecure") and k != "server_name_override"},
                     "client_ca_file": LEAF, "client_ca_file_reload": LEAF}
RETRY: Final = {k: LEAF for k in ("enabled", "initial_interval", "max_interval", "max_elapsed_time", "multiplier",
                                  "randomization_factor")}
QUEUE: Final = {**{k: LEAF for k in ("enabled", "wait_for_result", "sizer", "queue_size", "block_on_overflow",
                                     "storage", "num_consumers")},
                "batch": {k: LEAF for k in ("flush_timeout", "sizer", "min_size", "max_size")}}
GRPC_CLIENT: Final = {**{k: LEAF for k in ("endpoint", "compression", "read_buffer_size", "write_buffer_size",
                                           "wait_for_ready", "user_agent", "balancer_name", "authority")},
                      "tls": TLS_CLIENT, "headers": ANY_MAP,
                      "keepalive": {"time": LEAF, "timeout": LEAF, "permit_without_stream": LEAF}}
HTTP_CLIENT: Final = {**{k: LEAF for k in ("endpoint", "proxy_url", "read_buffer_size", "write_buffer_size", "timeout",
                                           "compression", "max_idle_conns", "max_idle_conns_per_host",
                                           "max_conns_per_host", "idle_conn_timeout", "disable_keep_alives",
                                           "http2_read_idle_timeout", "http2_ping_timeout", "force_attempt_http2")},
                      "tls": TLS_CLIENT, "headers": ANY_MAP}
GRPC_SERVER: Final = {**{k: LEAF for k in ("endpoint", "transport", "max_recv_msg_size_mib", "max_concurrent_streams",
                                           "read_buffer_size", "write_buffer_size", "include_metadata")},
                      "tls": TLS_SERVER}
HTTP_SERVER: Final = {**{k: LEAF for k in ("endpoint", "max_request_body_size", "include_metadata",
                                           "compression_algorithms", "read_timeout", "read_header_timeout",
                                           "write_timeout", "idle_timeout", "keep_alives_enabled", "traces_url_path",
                                           "metrics_url_path", "logs_url_path")},
                      "tls": TLS_SERVER, "response_headers": ANY_MAP,
                      "cors": {"allowed_origins": LEAF, "allowed_headers": LEAF, "max_age": LEAF}}
EXPORTER_HELPER: Final = {"timeout": LEAF, "retry_on_failure": RETRY, "sending_queue": QUEUE}
K8S_FIELD: Final = {k: LEAF for k in ("tag_name", "key", "key_regex", "from")}
K8S_FILTER_FIELD: Final = {k: LEAF for k in ("key", "value", "op")}


class Component:
    """One component type: its configuration schema and the signals it supports."""

    def __init__(self, schema: dict[str, Any], signals: tuple[str, ...]) -> None:
        self.schema = schema
        self.signals = signals


RECEIVERS: Final = {
    "otlp": Component({"protocols": {"grpc": GRPC_SERVER, "http": HTTP_SERVER}}, SIGNALS),
}
PROCESSORS: Final = {
    "memory_limiter": Component({k: LEAF for k in (
        "check_interval", "limit_mib", "spike_limit_mib", "limit_percentage", "spike_limit_percentage",
        "min_gc_interval_when_soft_limited", "min_gc_interval_when_hard_limited",
        "max_gc_interval_when_soft_limited", "max_gc_interval_when_hard_limited")}, SIGNALS),
    "batch": Component({k: LEAF for k in ("timeout", "send_batch_size", "send_batch_max_size", "metadata_keys",
                                          "metadata_cardinality_limit")}, ("traces", "metrics", "logs")),
    "k8sattributes": Component({
        "auth_type": LEAF, "kube_config_path": LEAF, "context": LEAF, "passthrough": LEAF,
        "wait_for_metadata": LEAF, "wait_for_metadata_timeout": LEAF,
        "extract": {"metadata": LEAF, "annotations": [K8S_FIELD], "labels": [K8S_FIELD], "otel_annotations": LEAF},
        "filter": {"node": LEAF, "node_from_env_var": LEAF, "namespace": LEAF, "fields": [K8S_FILTER_FIELD],
                   "labels": [K8S_FILTER_FIELD]},
        "pod_association": [{"sources": [{"from": LEAF, "name": LEAF}]}],
        "exclude": {"pods": [{"name": LEAF}]},
    }, SIGNALS),
    "groupbyattrs": Component({"keys": LEAF}, ("traces", "metrics", "logs")),
    # profiles at development stability since March 2025 (contrib PR #36208; README status of v0.133.0, v0.135.0)
    "resource": Component({"attributes": [{k: LEAF for k in ("key", "value", "pattern", "from_attribute",
                                                             "from_context", "converted_type", "action")}]},
                          SIGNALS),
    # config.go of the v0.150 era (default error_mode ignore): trace/metric/log/profile_statements, flatten_data
    "transform": Component({"error_mode": LEAF, "flatten_data": LEAF, **{f"{signal}_statements": [
        {"context": LEAF, "conditions": LEAF, "statements": LEAF, "error_mode": LEAF}]
        for signal in ("trace", "metric", "log", "profile")}}, SIGNALS),
}
EXPORTERS: Final = {
    "otlp_grpc": Component({**GRPC_CLIENT, **EXPORTER_HELPER}, SIGNALS),
    "otlp_http": Component({**HTTP_CLIENT, **EXPORTER_HELPER, "traces_endpoint": LEAF, "metrics_endpoint": LEAF,
                            "logs_endpoint": LEAF, "profiles_endpoint": LEAF, "encoding": LEAF}, SIGNALS),
}
EXTENSIONS: Final = {
    "health_check": Component({"endpoint": LEAF, "path": LEAF, "tls": TLS_SERVER,
                               "check_collector_pipeline": {"enabled": LEAF, "interval": LEAF,
                                                            "exporter_failure_threshold": LEAF}}, ()),
}
# k8sattributes' extract.metadata values (config.go Validate)
K8S_METADATA: Final = frozenset({
    "k8s.namespace.name", "k8s.pod.name", "k8s.pod.uid", "k8s.pod.hostname", "k8s.pod.start_time", "k8s.pod.ip",
    "k8s.deployment.name", "k8s.deployment.uid", "k8s.replicaset.name", "k8s.replicaset.uid", "k8s.daemonset.name",
    "k8s.daemonset.uid", "k8s.statefulset.name", "k8s.statefulset.uid", "k8s.job.name", "k8s.job.uid",
    "k8s.cronjob.name", "k8s.node.name", "k8s.node.uid", "k8s.container.name", "container.id",
    "container.image.name", "container.image.tag", "container.image.repo_digests", "k8s.cluster.uid"})
K8S_ASSOCIATION_FROM: Final = frozenset({"connection", "resource_attribute"})
RESOURCE_ACTIONS: Final = frozenset({"insert", "update", "upsert", "delete", "hash", "extract", "convert"})
TRANSFORM_CONTEXTS: Final = frozenset({"resource", "scope", "metric", "datapoint"})
ERROR_MODES: Final = frozenset({"ignore", "silent", "propagate"})
PROFILES_FEATURE_GATE: Final = "service.profilesSupport"
COLLECTOR_VERSION: Final = "v0.159.0"
