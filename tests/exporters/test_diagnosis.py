# SPDX-License-Identifier: Apache-2.0
"""Reasons in words for a backend that gave no usable answer: from what urllib and requests raise, and from a probe,
against real servers on 127.0.0.1 (none, one that closes connections at once, a gRPC server, an HTTP server); how
often an outage is probed, against a clock of the test's own."""

from __future__ import annotations

import http.client
import threading
import urllib.request
from collections.abc import Callable

import pytest
import requests

from otel_gpu.exporters.diagnosis import OutageProbe, describe_exception, escaped, probe
from tests.exporters.receivers import ClosingServer, GrpcProfilesReceiver, HttpReceiver, free_port


def _urllib_post(url: str) -> None:
    urllib.request.urlopen(urllib.request.Request(url, data=b"x", method="POST"), timeout=5)


def _requests_post(url: str) -> None:
    requests.post(url, data=b"x", timeout=5)


@pytest.mark.parametrize("post", [_urllib_post, _requests_post], ids=["urllib", "requests"])
def test_what_http_clients_raise_is_described_in_words(post: Callable[[str], None]) -> None:
    grpc_server, closing = GrpcProfilesReceiver().start(), ClosingServer()
    nothing = free_port()
    try:
        described = {}
        for name, port in (("grpc", grpc_server.port), ("closing", closing.port), ("nothing", nothing)):
            url = f"http://127.0.0.1:{port}/v1development/profiles"
            with pytest.raises(Exception) as raised:  # noqa: PT011 - each client raises its own kinds
                post(url)
            described[name] = describe_exception(raised.value, url)
    finally:
        grpc_server.stop()
        closing.stop()
    assert described == {
        "grpc": f"127.0.0.1:{grpc_server.port} answers, but not as OTLP/HTTP (a gRPC port? try --otlp-protocol grpc)",
        "closing": f"127.0.0.1:{closing.port} takes connections but closes them without an answer; check that it "
                   "takes OTLP/HTTP",
        "nothing": f"connection refused by 127.0.0.1:{nothing}: nothing listens there",
    }


def test_an_unknown_failure_is_escaped() -> None:
    described = describe_exception(http.client.HTTPException("\x00\x00\x18\x04 odd"), "http://h:1/p")
    assert described == "http://h:1/p: \\x00\\x00\\x18\\x04 odd"
    assert escaped("a\x00" * 150, 10) == "a\\x00a\\x00a\\x00a\\x00a\\x00 ... (300 characters)"


def test_a_probe_tells_what_it_finds() -> None:
    grpc_server, closing, http_server = GrpcProfilesReceiver().start(), ClosingServer(), HttpReceiver().start()
    nothing = free_port()
    try:
        found = {name: probe(f"http://127.0.0.1:{port}", "OTLP HTTP/protobuf") for name, port in (
            ("grpc", grpc_server.port), ("closing", closing.port), ("nothing", nothing), ("http", http_server.port))}
        assert probe(f"127.0.0.1:{grpc_server.port}", "OTLP gRPC", grpc=True) == ""
    finally:
        grpc_server.stop()
        closing.stop()
        http_server.stop()
    assert found == {
        "grpc": f"127.0.0.1:{grpc_server.port} answers, but not as OTLP HTTP/protobuf (a gRPC port? try "
                "--otlp-protocol grpc)",
        "closing": f"127.0.0.1:{closing.port} takes connections but closes them without an answer; check that it "
                   "takes OTLP HTTP/protobuf",
        "nothing": f"connection refused by 127.0.0.1:{nothing}: nothing listens there",
        "http": "",
    }
    assert probe("http://127.0.0.1:99999", "OTLP gRPC") == "http://127.0.0.1:99999 has no usable port"


def test_an_outage_probe_keeps_its_verdict_for_a_period_that_doubles_up_to_the_longest() -> None:
    clock, probed_at = [0.0], []

    def counted() -> str:
        probed_at.append(int(clock[0]))
        return f"verdict {len(probed_at)}"

    outage = OutageProbe(counted, initial_s=10, max_s=300, clock=lambda: clock[0])
    for second in range(1200):  # a failed export every second
        clock[0] = float(second)
        assert outage() == f"verdict {len(probed_at)}"
    assert probed_at == [0, 10, 30, 70, 150, 310, 610, 910] and outage.runs == 8
    outage.reset()  # the backend answered: the next outage is probed at once
    assert outage() == "verdict 9" and probed_at[-1] == 1199


def test_an_outage_probe_is_made_once_for_callers_that_come_together_and_reset_never_waits() -> None:
    started, release = threading.Event(), threading.Event()

    def slow() -> str:
        started.set()
        assert release.wait(30)
        return "refused"

    outage = OutageProbe(slow)
    verdicts: list[str] = []
    callers = [threading.Thread(target=lambda: verdicts.append(outage())) for _ in range(3)]
    for caller in callers:
        caller.start()
    assert started.wait(30)
    resetting = threading.Thread(target=outage.reset)  # while the probe is under way (up to 2.2 s): no waiting
    resetting.start()
    resetting.join(30)
    reset_waited = resetting.is_alive()
    release.set()
    for caller in callers:
        caller.join(30)
    # the first caller's probe spanned the reset: its verdict is not kept into the new outage, so one more
    # caller probes again; never one probe per caller
    assert not reset_waited, "reset waited for the probe under way"
    assert verdicts == ["refused"] * 3 and outage.runs == 2
    assert outage() == "refused" and outage.runs == 2  # the second probe's verdict is kept
