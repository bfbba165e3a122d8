# SPDX-License-Identifier: Apache-2.0
"""What every profile exporter offers the agent, and the queued base that keeps the network off its loop."""

from __future__ import annotations

import logging
from typing import Protocol, runtime_checkable

from otel_gpu import selfmetrics, semconv
from otel_gpu.exporters.queue import Backoff, Payload, RetryQueue, SendResult
from otel_gpu.profiles.model import ProfileBatch

_logger = logging.getLogger(__name__)

@runtime_checkable
class ProfileExporter(Protocol):
    """Sends profile batches somewhere. ``export`` returns at once; ``shutdown`` flushes within its timeout."""

    name: str

    def export(self, batch: ProfileBatch) -> bool: ...

    def shutdown(self, timeout_s: float = 5.0) -> None: ...


class QueuedProfileExporter:
    """Encodes on the caller's thread (pure, fast), then queues the bytes for a sender thread with retries.

    Subclasses implement :meth:`payloads` (batch -> encoded requests) and :meth:`send` (one request -> result).
    """

    name = "queued"

    def __init__(self, name: str, queue_max_bytes: int, backoff: Backoff | None = None) -> None:
        self.name = name
        self._encode_error_logged = False
        self.queue = RetryQueue(name, self.send, queue_max_bytes, backoff)

    def payloads(self, batch: ProfileBatch) -> list[Payload]:
        raise NotImplementedError

    def send(self, payload: Payload) -> SendResult:
        raise NotImplementedError

    def export(self, batch: ProfileBatch) -> bool:
        """Queue the batch; False when (part of) it was dropped at once. Never blocks on the network."""
        try:
            payloads = self.payloads(batch)
        except Exception:  # loop boundary: a batch we cannot encode is dropped, the agent goes on
            if not self._encode_error_logged:
                self._encode_error_logged = True
                _logger.exception("%s: could not encode a profile batch; dropping it (further failures are only "
                                  "counted in %s)", self.name, semconv.SELF_DROPPED.name)
            selfmetrics.count(semconv.SELF_DROPPED.name, otel_gpu__reason=semconv.Reason.ENCODE_ERROR,
                              otel_gpu__signal=semconv.Signal.PROFILES, otel_gpu__exporter=self.name)
            return False
        queued = [self.queue.put(payload) for payload in payloads]
        return all(queued)

    def shutdown(self, timeout_s: float = 5.0) -> None:
        self.queue.shutdown(timeout_s)
        self.close()

    def close(self) -> None:
        """Release transport resources (channels); called once the queue has stopped."""
