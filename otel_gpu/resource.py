# SPDX-License-Identifier: Apache-2.0
"""The agent's own OpenTelemetry resource (service, instance, host and Kubernetes node identity), and the node's
part of it that every profile carries."""

from __future__ import annotations

import socket
import uuid

from opentelemetry.sdk.resources import Resource

from otel_gpu import __version__, semconv
from otel_gpu.config import AgentConfig


def agent_resource(config: AgentConfig) -> Resource:
    """service.name/version/instance.id, host.name, k8s.node.name (when known), then OTEL_RESOURCE_ATTRIBUTES on top.

    ``service.instance.id`` is a UUID v5 of the node's name (the semantic conventions' namespace for it): stable
    across restarts and distinct per node, so Prometheus' OTLP translation gives each node its own ``instance``,
    without sending the host name in clear a second time.
    """
    host = host_name(config)
    attributes: dict[str, str] = {
        semconv.SERVICE_NAME: config.service_name,
        semconv.SERVICE_VERSION: __version__,
        semconv.SERVICE_INSTANCE_ID: service_instance_id(host),
        **dict(node_attributes(config)),
    }
    attributes.update(dict(config.resource_attributes))
    # Resource(...) rather than Resource.create(): create() would read the environment, which only config.py does.
    return Resource(attributes)


def node_attributes(config: AgentConfig) -> tuple[tuple[str, str], ...]:
    """What every profile's resource gets from the node: host.name, k8s.node.name (when known) and the
    OTEL_RESOURCE_ATTRIBUTES that do not describe the agent itself (no ``service.*``: a process has its own)."""
    pairs: dict[str, str] = {semconv.HOST_NAME: host_name(config)}
    if config.node_name:
        pairs[semconv.K8S_NODE_NAME] = config.node_name
    pairs.update((key, value) for key, value in config.resource_attributes if not key.startswith("service."))
    return tuple(pairs.items())


def host_name(config: AgentConfig) -> str:
    """The Kubernetes node name when given (a pod's own host name is the pod's), else this machine's."""
    return config.node_name or socket.gethostname()


def service_instance_id(host: str) -> str:
    """A UUID v5 of ``host`` in the semantic conventions' namespace for ``service.instance.id``: ``uuid.uuid5``'s
    SHA-1, taken from the interpreter's own SHA-1 where it has one (hashlib's is OpenSSL's: importing it maps
    libcrypto, ~3.5 MB resident in the agent for one hash)."""
    try:
        from _sha1 import sha1  # CPython's built-in SHA-1, what hashlib itself falls back to
    except ImportError:
        from hashlib import sha1
    digest = sha1(uuid.UUID(semconv.SERVICE_INSTANCE_ID_NAMESPACE).bytes + host.encode()).digest()
    return str(uuid.UUID(bytes=digest[:16], version=5))
