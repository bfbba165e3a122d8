# SPDX-License-Identifier: Apache-2.0
"""The bounded retry queue: byte bound, oldest-first drops, counted failures, recovery, shutdown, backoff."""

from __future__ import annotations

import logging
import random
import threading
import time

import pytest

from otel_gpu import selfmetrics, semconv
from otel_gpu.exporters.queue import Backoff, Outcome, Payload, RetryQueue, SendResult

FAST = Backoff(initial_s=0.01, max_s=0.05, jitter=0.2)


class FakeBackend:
    """Answers RETRY while ``down`` is set, else OK (or ``refuse`` -> FAIL); records delivered bodies."""

    def __init__(self) -> None:
        self.down = threading.Event()
        self.refuse = False
        self.delivered: list[bytes] = []
        self.attempts = 0
        self.cond = threading.Condition()

    def send(self, payload: Payload) -> SendResult:
        with self.cond:
            self.attempts += 1
            self.cond.notify_all()
        if self.down.is_set():
            return SendResult(Outcome.RETRY, "connection refused")
        if self.refuse:
            return SendResult(Outcome.FAIL, "HTTP 400")
        with self.cond:
            self.delivered.append(payload.body)
            self.cond.notify_all()
        return SendResult(Outcome.OK)

    def wait(self, predicate, timeout_s: float = 20.0) -> bool:  # type: ignore[no-untyped-def]
        with self.cond:
            return self.cond.wait_for(predicate, timeout_s)


@pytest.fixture(autouse=True)
def _fresh_selfmetrics() -> None:
    selfmetrics.reset()


def _dropped(reason: str) -> float:
    return selfmetrics.total(semconv.SELF_DROPPED.name, otel_gpu__reason=reason)


def test_delivers_in_order() -> None:
    backend = FakeBackend()
    queue = RetryQueue("t", backend.send, max_bytes=1000, backoff=FAST)
    for i in range(5):
        assert queue.put(Payload(bytes([i]) * 10))
    assert backend.wait(lambda: len(backend.delivered) == 5)
    assert backend.delivered == [bytes([i]) * 10 for i in range(5)]
    queue.shutdown(1.0)
    assert queue.queued_bytes == 0 and queue.sent == 5


def test_outage_keeps_the_byte_bound_drops_oldest_and_recovers(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="otel_gpu.exporters.queue")
    backend = FakeBackend()
    backend.down.set()
    queue = RetryQueue("t", backend.send, max_bytes=350, backoff=FAST)
    for i in range(10):
        queue.put(Payload(bytes([i]) * 100))
        assert queue.queued_bytes <= 350
    assert backend.wait(lambda: backend.attempts >= 5)  # several failed attempts while down
    assert queue.queued_bytes == 300 and queue.queued_count == 3
    assert _dropped("queue_full") == 7
    backend.down.clear()
    assert backend.wait(lambda: len(backend.delivered) == 3)
    assert backend.delivered == [bytes([i]) * 100 for i in (7, 8, 9)]  # the newest survive
    failures = selfmetrics.total(semconv.SELF_EXPORT_FAILURES.name, otel_gpu__exporter="t")
    assert failures >= 5
    queue.shutdown(1.0)
    unavailable = [r for r in caplog.records if "backend unavailable" in r.getMessage()]
    recovered = [r for r in caplog.records if "reachable again" in r.getMessage()]
    assert len(unavailable) == 1 and len(recovered) == 1  # one line per outage, not per attempt
    assert "7 payloads dropped" in recovered[0].getMessage()


def test_evicting_the_payload_being_retried_keeps_the_backoff() -> None:
    attempts: list[int] = []

    class RecordingBackoff(Backoff):
        def delay_s(self, attempt: int, rng: random.Random) -> float:
            attempts.append(attempt)
            return 0.01

    backend = FakeBackend()
    backend.down.set()
    queue = RetryQueue("t", backend.send, max_bytes=100, backoff=RecordingBackoff())
    queue.put(Payload(b"a" * 100))
    assert backend.wait(lambda: backend.attempts >= 1)
    for body in (b"b", b"c", b"d"):  # each evicts the one being retried: a full queue during an outage
        queue.put(Payload(body * 100))
        seen = len(attempts)
        assert backend.wait(lambda seen=seen: len(attempts) >= seen + 2)
    queue.shutdown(0.0)
    assert _dropped("queue_full") == 3
    assert attempts == sorted(attempts) and len(set(attempts)) == len(attempts), attempts  # never back to 0


def test_refused_payload_is_dropped_and_counted_without_retry() -> None:
    backend = FakeBackend()
    backend.refuse = True
    queue = RetryQueue("t", backend.send, max_bytes=1000, backoff=FAST)
    queue.put(Payload(b"x" * 10))
    queue.shutdown(2.0)
    assert backend.attempts == 1
    assert _dropped("rejected") == 1
    assert selfmetrics.total(semconv.SELF_EXPORT_FAILURES.name, otel_gpu__exporter="t") == 1


def test_too_large_payload_is_dropped_at_once() -> None:
    backend = FakeBackend()
    queue = RetryQueue("t", backend.send, max_bytes=100, backoff=FAST)
    assert not queue.put(Payload(b"x" * 101))
    assert _dropped("too_large") == 1
    queue.shutdown(1.0)
    assert backend.attempts == 0


def test_shutdown_flushes_what_is_queued() -> None:
    backend = FakeBackend()
    release = threading.Event()

    def slow_send(payload: Payload) -> SendResult:
        release.wait(5)
        return backend.send(payload)

    queue = RetryQueue("t", slow_send, max_bytes=1000, backoff=FAST)
    for i in range(3):
        queue.put(Payload(bytes([i])))
    release.set()
    queue.shutdown(10.0)
    assert len(backend.delivered) == 3
    assert not queue.put(Payload(b"late"))  # closed
    assert _dropped("shutdown") == 1
    queue.shutdown(1.0)  # idempotent


def test_shutdown_with_the_backend_down_gives_up_and_counts() -> None:
    backend = FakeBackend()
    backend.down.set()
    queue = RetryQueue("t", backend.send, max_bytes=1000, backoff=Backoff(initial_s=0.05, max_s=0.1))
    for i in range(4):
        queue.put(Payload(bytes([i]) * 10))
    assert backend.wait(lambda: backend.attempts >= 1)
    queue.shutdown(0.3)
    assert _dropped("shutdown") == 4
    assert queue.queued_bytes == 0
    assert backend.delivered == []


def test_backoff_grows_exponentially_within_jitter_and_cap() -> None:
    backoff = Backoff(initial_s=1.0, max_s=30.0, multiplier=2.0, jitter=0.2)
    rng = random.Random(7)
    for attempt, base in enumerate([1, 2, 4, 8, 16, 30, 30]):
        delays = [backoff.delay_s(attempt, rng) for _ in range(200)]
        assert base * 0.8 <= min(delays) and max(delays) <= base * 1.2
        assert max(delays) - min(delays) > base * 0.2  # jitter really spreads the retries


def test_a_backend_that_keeps_refusing_is_logged_once_then_counted(caplog: pytest.LogCaptureFixture,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """A web server that answers every payload with 501 (not an OTLP endpoint): one warning with the reason, then
    silence (every drop counted) until the interval passes, one line with the count, one when payloads go in again;
    a new kind of refusal is logged at once."""
    from otel_gpu.exporters import queue as queue_module

    details = iter(f"HTTP 501 from http://backend/v1development/profiles: excerpt {i}" for i in range(100))
    answers: list[SendResult] = []
    sent = threading.Semaphore(0)

    def send(payload: Payload) -> SendResult:
        answer = answers.pop(0) if answers else SendResult(Outcome.FAIL, next(details))
        sent.release()
        return answer

    clock = [1000.0]
    monkeypatch.setattr(queue_module.time, "monotonic", lambda: clock[0])
    caplog.set_level(logging.INFO, logger="otel_gpu.exporters.queue")
    queue = RetryQueue("otlp_http", send, max_bytes=1000, backoff=FAST)

    def put(count: int) -> None:
        for _ in range(count):
            queue.put(Payload(b"x"))
            assert sent.acquire(timeout=10)

    def lines(count: int) -> list[str]:
        """The queue's log lines once there are ``count`` (the sender logs a refusal after send returns)."""
        deadline = time.perf_counter() + 10  # monotonic is the test's clock here
        while True:
            got = [r.getMessage() for r in caplog.records if r.name == "otel_gpu.exporters.queue"]
            if len(got) >= count or time.perf_counter() > deadline:
                return got
            time.sleep(0.01)

    try:
        put(5)
        assert _dropped("rejected") == 5
        got = lines(1)
        assert len(got) == 1 and "refused a payload (HTTP 501" in got[0] and "excerpt 0" in got[0], got
        clock[0] += queue_module.REFUSAL_LOG_INTERVAL_S
        put(1)
        got = lines(2)
        assert len(got) == 2 and "refused 5 more payloads in 300 s" in got[1] and "excerpt 5" in got[1], got
        answers.append(SendResult(Outcome.FAIL, "INVALID_ARGUMENT: profile has no sample type"))
        put(1)
        got = lines(3)
        assert len(got) == 3 and "refused a payload (INVALID_ARGUMENT" in got[2], got
        answers.append(SendResult(Outcome.OK))
        put(1)
        got = lines(4)
        assert "accepts payloads again after refusing 7" in got[3], got
        put(1)
        got = lines(5)
        assert len(got) == 5 and "refused a payload (HTTP 501" in got[4], got  # a new spell starts over
    finally:
        queue.shutdown(5.0)
    assert _dropped("rejected") == 8


def test_a_refusal_ends_the_outage_and_its_backoff(caplog: pytest.LogCaptureFixture) -> None:
    """A refusal is an answer: the backend is reachable. The next failure starts a new outage from the first backoff
    step (not 2^5 steps on), and the refused payload is not counted among the outage's drops."""
    attempts: list[int] = []

    class RecordingBackoff(Backoff):
        def delay_s(self, attempt: int, rng: random.Random) -> float:
            attempts.append(attempt)
            return 0.01

    answers = [SendResult(Outcome.RETRY, "connection refused")] * 5 + [SendResult(Outcome.FAIL, "HTTP 400: bad")] + [
        SendResult(Outcome.RETRY, "connection refused"), SendResult(Outcome.OK)]
    done = threading.Event()

    def send(payload: Payload) -> SendResult:
        answer = answers.pop(0)
        if not answers:
            done.set()
        return answer

    caplog.set_level(logging.INFO, logger="otel_gpu.exporters.queue")
    queue = RetryQueue("t", send, max_bytes=1000, backoff=RecordingBackoff())
    queue.put(Payload(b"refused"))
    queue.put(Payload(b"delivered"))
    assert done.wait(10)
    queue.shutdown(5.0)
    assert attempts == [0, 1, 2, 3, 4, 0], attempts
    lines = [r.getMessage() for r in caplog.records if r.name == "otel_gpu.exporters.queue"]
    reachable = [line for line in lines if "reachable again" in line]
    assert reachable == ["t: backend reachable again after 5 failed attempts; 0 payloads dropped meanwhile",
                         "t: backend reachable again after 1 failed attempts; 0 payloads dropped meanwhile"], lines
    assert lines.index(reachable[0]) < next(i for i, line in enumerate(lines) if "refused a payload" in line)
    assert len([line for line in lines if "backend unavailable" in line]) == 2, lines
    assert _dropped("rejected") == 1


def test_payloads_larger_than_the_queue_are_logged_once_then_counted(caplog: pytest.LogCaptureFixture,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    from otel_gpu.exporters import queue as queue_module

    clock = [1000.0]
    monkeypatch.setattr(queue_module.time, "monotonic", lambda: clock[0])
    caplog.set_level(logging.INFO, logger="otel_gpu.exporters.queue")
    queue = RetryQueue("t", FakeBackend().send, max_bytes=100, backoff=FAST)
    try:
        for _ in range(5):
            assert not queue.put(Payload(b"x" * 101))
        lines = [r.getMessage() for r in caplog.records if "larger than the whole queue" in r.getMessage()]
        assert len(lines) == 1 and "dropped a 101-byte payload" in lines[0], lines
        clock[0] += queue_module.REFUSAL_LOG_INTERVAL_S
        assert not queue.put(Payload(b"x" * 150))
        lines = [r.getMessage() for r in caplog.records if "larger than the whole queue" in r.getMessage()]
        assert len(lines) == 2 and "dropped 5 more payloads larger than the whole queue in 300 s" in lines[1], lines
        assert "the last 150 bytes" in lines[1]
    finally:
        queue.shutdown(1.0)
    assert _dropped("too_large") == 6
