# SPDX-License-Identifier: Apache-2.0
"""A send queue bounded in bytes, drained by one sender thread with exponential backoff and jitter.

``put()`` never blocks on the network: it appends the encoded payload and returns. When the bytes queued (waiting
plus the one being sent) would pass ``max_bytes``, the oldest payloads are dropped first, so a long outage keeps
the newest data. Every drop is counted in ``otel_gpu.dropped`` (``otel_gpu.reason``: ``queue_full``,
``too_large``, ``rejected``, ``shutdown``) and every failed attempt in ``otel_gpu.export.failures``.
An outage is logged once when it starts and once when it ends, never per attempt. The backoff belongs to the
outage, not to a payload: evicting the payload being retried neither resets it nor lets the next one go out early.
Any answer ends the outage, a refusal too (the backend is reachable): the next failure starts a new one from the
first backoff step. Refusals are logged like outages: the first with its reason (and a new reason at once), then at
most one line a ``REFUSAL_LOG_INTERVAL_S`` with the count, and one when the backend accepts again; they are counted
apart from the outage's drops. Payloads larger than the whole queue are logged the same way: the first at once,
then at most one line a ``REFUSAL_LOG_INTERVAL_S`` with the count.
"""

from __future__ import annotations

import collections
import enum
import logging
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from otel_gpu import selfmetrics, semconv

_logger = logging.getLogger(__name__)

REFUSAL_LOG_INTERVAL_S = 300.0  # at most one line this often while a backend keeps refusing for the same reason
_JOIN_SLACK_S = 0.25  # time for the sender to notice shutdown's deadline; past it, shutdown drops what is left itself


class Outcome(enum.Enum):
    OK = "ok"
    RETRY = "retry"  # transient: the backend is down, overloaded or timed out
    FAIL = "fail"  # permanent: the backend refused this payload; retrying cannot help


@dataclass(frozen=True, slots=True)
class SendResult:
    """What one attempt did. ``retry_after_s`` is the server's hint (Retry-After, gRPC RetryInfo), 0 when none."""

    outcome: Outcome
    detail: str = ""
    retry_after_s: float = 0.0


@dataclass(slots=True)
class Payload:
    """One encoded request: ``body`` bytes plus whatever the transport needs to send it (path, headers)."""

    body: bytes
    context: dict[str, str] = field(default_factory=dict)
    abandoned: bool = False

    @property
    def size_bytes(self) -> int:
        return len(self.body)


Sender = Callable[[Payload], SendResult]


@dataclass(frozen=True, slots=True)
class Backoff:
    """Exponential backoff: ``initial_s`` x ``multiplier``^attempt, capped at ``max_s``, times a jitter factor
    drawn uniformly from [1 - jitter, 1 + jitter]."""

    initial_s: float = 1.0
    max_s: float = 30.0
    multiplier: float = 2.0
    jitter: float = 0.2

    def delay_s(self, attempt: int, rng: random.Random) -> float:
        base = min(self.max_s, self.initial_s * self.multiplier ** attempt)
        return base * rng.uniform(1.0 - self.jitter, 1.0 + self.jitter)


class RetryQueue:
    """Payloads waiting for one destination, and the thread that sends them in order."""

    def __init__(self, name: str, send: Sender, max_bytes: int, backoff: Backoff | None = None,
                 signal: semconv.Signal = semconv.Signal.PROFILES) -> None:
        self.name = name
        self._send = send
        self._max_bytes = max_bytes
        self._backoff = backoff or Backoff()
        self._signal = signal
        self._rng = random.Random()
        self._waiting: collections.deque[Payload] = collections.deque()
        self._inflight: Payload | None = None
        self._bytes = 0
        self._cond = threading.Condition()
        self._closing = False
        self._deadline = 0.0  # monotonic time by which shutdown gives up on what is left
        self._outage_failures = 0
        self._outage_dropped = 0
        self._attempt = 0  # failed attempts in this outage: the backoff's exponent
        self._retry_at = 0.0  # monotonic time before which nothing is sent
        self._refusal_reason = ""  # the kind of the last refusal logged; "" while the backend accepts
        self._refusals = 0  # refusals since the backend last accepted
        self._refusals_unlogged = 0  # of those, refusals not yet in a log line
        self._refusal_logged_at = 0.0  # monotonic time of the last refusal line
        self._too_large_unlogged = 0  # payloads larger than the whole queue not yet in a log line
        self._too_large_logged_at: float | None = None  # monotonic time of the last line about them
        self.sent = 0  # payloads delivered (for tests and logs)
        self._thread = threading.Thread(target=self._run, name=f"otel-gpu-export-{name}", daemon=True)
        self._thread.start()

    @property
    def queued_bytes(self) -> int:
        """Bytes waiting or in flight (never more than ``max_bytes``)."""
        with self._cond:
            return self._bytes

    @property
    def queued_count(self) -> int:
        with self._cond:
            return len(self._waiting) + (1 if self._inflight is not None and not self._inflight.abandoned else 0)

    def put(self, payload: Payload) -> bool:
        """Queue ``payload`` for sending; False when it was dropped at once (too large, or shutting down)."""
        size = payload.size_bytes
        with self._cond:
            if self._closing:
                self._drop(1, semconv.Reason.SHUTDOWN)
                return False
            if size > self._max_bytes:
                self._drop(1, semconv.Reason.TOO_LARGE)
                self._log_too_large(size)
                return False
            while self._bytes + size > self._max_bytes:
                self._evict_oldest()
            self._waiting.append(payload)
            self._bytes += size
            self._cond.notify_all()
        return True

    def shutdown(self, timeout_s: float = 5.0) -> None:
        """Try to send what is queued within ``timeout_s``, then drop (and count) the rest and stop. Idempotent."""
        with self._cond:
            if not self._closing:
                self._closing = True
                self._deadline = time.monotonic() + max(0.0, timeout_s)
            self._cond.notify_all()
        self._thread.join(max(0.0, self._deadline - time.monotonic()) + _JOIN_SLACK_S)
        with self._cond:
            if not self._thread.is_alive():
                return
            # the sender is stuck in a send that outlives the deadline: what is left will never go out
            left = len(self._waiting)
            if self._inflight is not None and not self._inflight.abandoned:
                self._inflight.abandoned = True
                left += 1
            self._waiting.clear()
            self._bytes = 0
            if left:
                self._drop(left, semconv.Reason.SHUTDOWN)
                _logger.warning("%s: a send was still hanging at shutdown; dropped %d queued payloads",
                                self.name, left)

    # --- inside the lock ---------------------------------------------------------------------------------------

    def _evict_oldest(self) -> None:
        if self._inflight is not None and not self._inflight.abandoned:
            # the oldest payload is the one being retried: give it up; the sender stops retrying it
            self._inflight.abandoned = True
            self._bytes -= self._inflight.size_bytes
        else:
            self._bytes -= self._waiting.popleft().size_bytes
        self._drop(1, semconv.Reason.QUEUE_FULL)

    def _log_too_large(self, size: int) -> None:
        """Inside the lock: the first payload larger than the queue at once, later ones at most once a
        REFUSAL_LOG_INTERVAL_S, counted (every profile is too large for a tiny queue: not a line each interval)."""
        self._too_large_unlogged += 1
        now = time.monotonic()
        if self._too_large_logged_at is None:
            _logger.warning("%s: dropped a %d-byte payload larger than the whole queue (%d bytes; raise "
                            "--queue-max-bytes); more are logged at most every %g s", self.name, size,
                            self._max_bytes, REFUSAL_LOG_INTERVAL_S)
        elif now - self._too_large_logged_at >= REFUSAL_LOG_INTERVAL_S:
            _logger.warning("%s: dropped %d more payloads larger than the whole queue in %.0f s (the last %d bytes; "
                            "the queue holds %d; raise --queue-max-bytes)", self.name, self._too_large_unlogged,
                            now - self._too_large_logged_at, size, self._max_bytes)
        else:
            return
        self._too_large_unlogged, self._too_large_logged_at = 0, now

    def _drop(self, count: int, reason: semconv.Reason) -> None:
        if reason is not semconv.Reason.REJECTED:  # refusals are counted and logged apart from outages
            self._outage_dropped += count
        selfmetrics.count(semconv.SELF_DROPPED.name, count, otel_gpu__reason=reason, otel_gpu__signal=self._signal,
                          otel_gpu__exporter=self.name)

    # --- the sender thread -------------------------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._waiting and not self._closing:
                    self._cond.wait()
                if not self._waiting:
                    return  # closing and nothing left
                if self._closing and time.monotonic() >= self._deadline:
                    left = len(self._waiting)
                    self._bytes -= sum(p.size_bytes for p in self._waiting)
                    self._waiting.clear()
                    self._drop(left, semconv.Reason.SHUTDOWN)
                    _logger.warning("%s: shutdown timeout reached; dropped %d queued payloads", self.name, left)
                    return
                payload = self._inflight = self._waiting.popleft()
            self._deliver(payload)
            with self._cond:
                if not payload.abandoned:
                    self._bytes -= payload.size_bytes
                self._inflight = None

    def _deliver(self, payload: Payload) -> None:
        """Send ``payload`` until it is delivered, refused, abandoned, or shutdown's deadline passes."""
        while True:
            if not self._wait_for_retry_time(payload):
                return
            try:
                result = self._send(payload)
            except Exception as exc:  # loop boundary: a transport bug must not kill the sender thread
                _logger.exception("%s: sending failed unexpectedly", self.name)
                result = SendResult(Outcome.FAIL, f"{type(exc).__name__}: {exc}")
            if result.outcome is Outcome.OK:
                self.sent += 1
                self._recovered()
                return
            selfmetrics.count(semconv.SELF_EXPORT_FAILURES.name, otel_gpu__exporter=self.name,
                              otel_gpu__signal=self._signal)
            if payload.abandoned:
                return  # already dropped and counted (queue full, or shutdown gave up on it)
            if result.outcome is Outcome.FAIL:
                self._reachable()  # a refusal is an answer: whatever outage there was is over
                with self._cond:
                    self._drop(1, semconv.Reason.REJECTED)
                self._refused(result.detail)
                return
            self._outage_failures += 1
            if self._outage_failures == 1:
                _logger.warning("%s: backend unavailable (%s); retrying with backoff, keeping at most %d bytes",
                                self.name, result.detail, self._max_bytes)
            delay_s = max(self._backoff.delay_s(self._attempt, self._rng),
                          min(result.retry_after_s, self._backoff.max_s))
            self._attempt += 1
            self._retry_at = time.monotonic() + delay_s

    def _wait_for_retry_time(self, payload: Payload) -> bool:
        """Wait out the outage's backoff; False when ``payload`` was abandoned or shutdown's deadline came first."""
        with self._cond:
            while True:
                if payload.abandoned:
                    return False
                now = time.monotonic()
                if now >= self._retry_at:
                    return True
                if self._closing and now >= self._deadline:
                    self._give_up_on_shutdown(payload)
                    return False
                self._cond.wait((min(self._retry_at, self._deadline) if self._closing else self._retry_at) - now)

    def _give_up_on_shutdown(self, payload: Payload) -> None:
        """Inside the lock: the backend stayed down past shutdown's deadline; count what will never be sent."""
        left = 1 + len(self._waiting)
        payload.abandoned = True
        self._bytes -= payload.size_bytes
        self._bytes -= sum(p.size_bytes for p in self._waiting)
        self._waiting.clear()
        self._drop(left, semconv.Reason.SHUTDOWN)
        _logger.warning("%s: backend still unavailable at shutdown; dropped %d queued payloads", self.name, left)

    def _refused(self, reason: str) -> None:
        """Log a refusal: the first of a spell and each new reason at once, the same reason again at most once a
        REFUSAL_LOG_INTERVAL_S, counted."""
        self._refusals += 1
        self._refusals_unlogged += 1
        now = time.monotonic()
        kind = reason.split(":", 1)[0]  # "HTTP 400 from http", "INVALID_ARGUMENT": the same refusal, other details
        if kind != self._refusal_reason:
            _logger.warning("%s: the backend refused a payload (%s); dropped it%s", self.name, reason,
                            "" if self._refusals > 1 else "; the same refusal is logged again at most every "
                            f"{REFUSAL_LOG_INTERVAL_S:g} s")
        elif now - self._refusal_logged_at >= REFUSAL_LOG_INTERVAL_S:
            _logger.warning("%s: the backend refused %d more payloads in %.0f s (%s); dropped them", self.name,
                            self._refusals_unlogged, now - self._refusal_logged_at, reason)
        else:
            return
        self._refusal_reason, self._refusals_unlogged, self._refusal_logged_at = kind, 0, now

    def _recovered(self) -> None:
        """The backend took a payload: a spell of refusals and an outage end."""
        if self._refusals:
            _logger.info("%s: the backend accepts payloads again after refusing %d", self.name, self._refusals)
            self._refusal_reason, self._refusals, self._refusals_unlogged = "", 0, 0
        self._reachable()

    def _reachable(self) -> None:
        """The backend answered (took or refused a payload): end the outage, if any, and its backoff."""
        with self._cond:
            dropped, self._outage_dropped = self._outage_dropped, 0
        if self._outage_failures:
            _logger.info("%s: backend reachable again after %d failed attempts; %d payloads dropped meanwhile",
                         self.name, self._outage_failures, dropped)
        self._outage_failures = 0
        self._attempt = 0
