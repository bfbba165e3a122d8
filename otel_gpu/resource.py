# SPDX-License-Identifier: Apache-2.0
"""The agent's own OpenTelemetry resource: service, host and Kubernetes node identity."""

from __future__ import annotations

import socket

from opentelemetry.sdk.resources import Resource

from otel_gpu import __version__, semconv
from otel_gpu.config import AgentConfig


def agent_resource(config: AgentConfig) -> Resource:
    """service.name/version, host.name, k8s.node.name (when known), then OTEL_RESOURCE_ATTRIBUTES on top."""
    attributes: dict[str, str] = {
        semconv.SERVICE_NAME: config.service_name,
        semconv.SERVICE_VERSION: __version__,
        semconv.HOST_NAME: config.node_name or socket.gethostname(),
    }
    if config.node_name:
        attributes[semconv.K8S_NODE_NAME] = config.node_name
    attributes.update(dict(config.resource_attributes))
    # Resource(...) rather than Resource.create(): create() would read the environment, which only config.py does.
    return Resource(attributes)
