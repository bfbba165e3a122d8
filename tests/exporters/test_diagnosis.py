# SPDX-License-Identifier: Apache-2.0
"""Reasons in words for a backend that gave no usable answer: from what urllib and requests raise, and from a probe,
against real servers on 127.0.0.1 (none, one that closes connections at once, a gRPC server, an HTTP server)."""

from __future__ import annotations

import http.client
import urllib.request
from collections.abc import Callable

import pytest
import requests

from otel_gpu.exporters.diagnosis import describe_exception, escaped, probe
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
