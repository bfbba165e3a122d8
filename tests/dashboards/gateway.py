# SPDX-License-Identifier: Apache-2.0
"""A stand-in for the gateway Collector (collector-config/otel-gpu-to-lgtm.yaml) between agent and VictoriaMetrics.

No Collector binary can be had here, so this applies, on the OTLP/HTTP wire, what that file's metrics processors
do to the agent's data: ``resource`` adds k8s.cluster.name where the agent sent none; ``groupbyattrs`` moves a data
point's k8s.pod.uid and container.id up to its own resource; ``k8sattributes`` finds the pod by k8s.pod.uid and adds
k8s.pod.name, k8s.namespace.name and the workload's name; ``transform`` copies the listed resource attributes onto
every data point. The dashboards' queries then see the labels a real gateway would give them.
"""

from __future__ import annotations

import gzip
import threading
import urllib.request
from collections.abc import Iterator, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue

# the resource attributes transform copies onto data points (collector-config/otel-gpu-to-lgtm.yaml, transform/labels)
COPIED = ("k8s.cluster.name", "host.name", "k8s.node.name", "k8s.namespace.name", "k8s.pod.name",
          "k8s.deployment.name", "k8s.statefulset.name", "k8s.job.name", "container.id", "k8s.pod.uid")


def _points(request: ExportMetricsServiceRequest) -> Iterator[tuple[object, object]]:
    for resource_metrics in request.resource_metrics:
        for scope_metrics in resource_metrics.scope_metrics:
            for metric in scope_metrics.metrics:
                data = getattr(metric, metric.WhichOneof("data"))
                for point in data.data_points:
                    yield resource_metrics.resource, point


def enrich(request: ExportMetricsServiceRequest, cluster: str, pods: Mapping[str, dict[str, str]]) -> None:
    """Apply the gateway's processors to ``request`` in place; ``pods``: pod uid -> attributes k8sattributes adds."""
    for resource, point in _points(request):
        attributes = {kv.key: kv.value.string_value for kv in resource.attributes}  # type: ignore[attr-defined]
        attributes.setdefault("k8s.cluster.name", cluster)  # resource/cluster: action insert
        pod_uid = next((kv.value.string_value for kv in point.attributes  # type: ignore[attr-defined]
                        if kv.key == "k8s.pod.uid"), "")
        attributes.update(pods.get(pod_uid, {}))
        present = {kv.key for kv in point.attributes}  # type: ignore[attr-defined]
        for key in COPIED:
            if attributes.get(key) and key not in present:
                point.attributes.append(KeyValue(key=key, value=AnyValue(string_value=attributes[key])))  # type: ignore[attr-defined]


class Gateway:
    """OTLP/HTTP metrics in at :attr:`otlp_metrics_url`, enriched, forwarded to ``forward_url``."""

    def __init__(self, forward_url: str, cluster: str, pods: Mapping[str, dict[str, str]]) -> None:
        gateway = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                request = ExportMetricsServiceRequest.FromString(body)
                enrich(request, cluster, pods)
                forward = urllib.request.Request(forward_url, data=request.SerializeToString(), method="POST",
                                                 headers={"Content-Type": "application/x-protobuf"})
                with urllib.request.urlopen(forward, timeout=10) as response:  # noqa: S310 - loopback
                    status = response.status
                gateway.forwarded += 1
                self.send_response(status)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - quiet
                pass

        self.forwarded = 0
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, name="test-gateway", daemon=True)
        self.thread.start()

    @property
    def otlp_metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/v1/metrics"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
