# SPDX-License-Identifier: Apache-2.0
"""Why a backend gave no usable answer, in words; shared by the profile exporters and the metrics pipeline.

A reason names the address and what to check: connection refused (nothing listens), an unknown host, no answer, a
connection closed without an answer, or an endpoint that answers but not in the protocol expected (an HTTP request
to a gRPC port gets an HTTP/2 frame back). Text that came from the network (an exception's message) is escaped, so
raw bytes never reach a log line. Stdlib only: importing this module costs nothing.
"""

from __future__ import annotations

import socket
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator

GRPC_PORT_HINT = "a gRPC port? try --otlp-protocol grpc"
_PROBE_S = 2.0  # at most this long for the one TCP connection a probe makes
_PEEK_S = 0.2  # how long a probe waits for what a server sends unasked (a gRPC server's SETTINGS, or a close)
_HTTP2_SETTINGS = 4  # frame type of the SETTINGS frame an HTTP/2 (gRPC) server sends first
# A verdict is kept this long after the first probe of an outage, then twice as long after each further one, up to
# the longest: as often as a failure line repeats its reason (the metrics pipeline's FAILURE_LOG_INTERVAL_S), so a
# long outage costs one probe per such line and a cause that changes is seen within that time.
PROBE_BACKOFF_INITIAL_S = 10.0
PROBE_BACKOFF_MAX_S = 300.0


def escaped(text: str, limit: int = 200) -> str:
    """``text`` cut to ``limit`` characters, unprintable characters written as escapes (``\\x00``)."""
    printable = "".join(c if c.isprintable() else repr(c)[1:-1] for c in text[:limit]).strip()
    return printable + (f" ... ({len(text)} characters)" if len(text) > limit else "")


def address(url: str) -> tuple[str, int | None]:
    """(host, port) of ``url``; the port is the scheme's default when the URL has none, None when it is invalid."""
    parsed = urllib.parse.urlparse(url if "://" in url else f"//{url}")
    try:
        return parsed.hostname or "", parsed.port or (443 if parsed.scheme == "https" else 80)
    except ValueError:
        return parsed.hostname or "", None


def refused(host: str, port: int) -> str:
    return f"connection refused by {host}:{port}: nothing listens there"


def unresolvable(host: str, exc: socket.gaierror) -> str:
    return f"cannot resolve the host name {host!r}: {exc.strerror or exc}"


def silent(host: str, port: int, waited_s: float) -> str:
    return f"no answer from {host}:{port} within {waited_s:g} s"


def closed(host: str, port: int, expects: str) -> str:
    return f"{host}:{port} takes connections but closes them without an answer; check that it takes {expects}"


def not_speaking(host: str, port: int, expects: str, hint: str) -> str:
    return f"{host}:{port} answers, but not as {expects} ({hint})"


def describe_exception(exc: BaseException, url: str, *, expects: str = "OTLP/HTTP", hint: str = GRPC_PORT_HINT,
                       timeout_s: float = 10.0) -> str:
    """Why an HTTP request to ``url`` got no status line, from what urllib or requests raised (the cause is looked
    for down the chain of wrapped exceptions); ``expects`` and ``hint`` word a server that answers in another
    protocol."""
    import http.client  # already imported by whichever HTTP client raised ``exc``

    host, port = address(url)
    for cause in _causes(exc):
        if port is None:
            break
        if isinstance(cause, (http.client.RemoteDisconnected, ConnectionResetError, ConnectionAbortedError,
                              BrokenPipeError)):
            return closed(host, port, expects)
        if isinstance(cause, http.client.BadStatusLine):  # an answer that is no HTTP/1 status line: often HTTP/2
            return not_speaking(host, port, expects, hint)
        if isinstance(cause, ConnectionRefusedError):
            return refused(host, port)
        if isinstance(cause, socket.gaierror):
            return unresolvable(host, cause)
        if isinstance(cause, TimeoutError):
            return silent(host, port, timeout_s)
    reason = getattr(exc, "reason", None) or exc
    return escaped(f"{url}: {reason}")


def _causes(exc: BaseException) -> Iterator[BaseException]:
    """``exc`` and what it wraps, outermost first: ``reason`` (urllib, urllib3), exceptions among ``args``
    (requests, urllib3's ProtocolError), ``__cause__`` and ``__context__``."""
    pending, seen = [exc], set()
    while pending and len(seen) < 32:
        current = pending.pop(0)
        if id(current) in seen:
            continue
        seen.add(id(current))
        yield current
        wrapped = [getattr(current, "reason", None), *current.args, current.__cause__, current.__context__]
        pending.extend(item for item in wrapped if isinstance(item, BaseException))


def probe(url: str, expects: str, hint: str = GRPC_PORT_HINT, *, grpc: bool = False, connect_s: float = _PROBE_S,
          ) -> str:
    """What one TCP connection to ``url``'s address finds wrong, in words, or "" when it connects and the server
    then waits for a request (or, with ``grpc``, sends the HTTP/2 SETTINGS frame a gRPC server sends first).

    At most ``connect_s`` to connect and ``_PEEK_S`` more to see whether the server closes the connection at once or
    speaks first; for the exporters that report only "failure" (the SDK's)."""
    host, port = address(url)
    if port is None:
        return f"{url} has no usable port"
    try:
        with socket.create_connection((host, port), timeout=connect_s) as connection:
            connection.settimeout(_PEEK_S)
            try:
                first = connection.recv(64)
            except TimeoutError:
                return ""  # the server waits for a request, as an HTTP/1 server does
            except (ConnectionResetError, ConnectionAbortedError):
                first = b""
    except ConnectionRefusedError:
        return refused(host, port)
    except socket.gaierror as exc:
        return unresolvable(host, exc)
    except TimeoutError:
        return silent(host, port, connect_s)
    except OSError as exc:
        return f"cannot connect to {host}:{port}: {exc.strerror or exc}"
    if not first:
        return closed(host, port, expects)
    if len(first) >= 4 and first[3] == _HTTP2_SETTINGS:
        return "" if grpc else not_speaking(host, port, expects, hint)
    # neither an HTTP/1 server (it waits for the request) nor an HTTP/2 one
    return not_speaking(host, port, expects, f"it speaks first: {escaped(first.decode('latin-1'), 40)}")


class OutageProbe:
    """A probe (``probe``: what is wrong at an address, in words, "" when nothing) made at most once per backoff
    period of an outage, its verdict kept meanwhile: failed exports in a row each want a reason, and a probe can
    take ``_PROBE_S`` + ``_PEEK_S``. The period starts when a probe ends: ``initial_s``, doubled after each probe up
    to ``max_s``; :meth:`reset` (the backend answered) ends the outage, so the next failure probes at once.

    Thread-safe: a caller that comes while a probe is under way waits for that probe's verdict instead of making
    another one; :meth:`reset` never waits for a probe."""

    def __init__(self, probe: Callable[[], str], *, initial_s: float = PROBE_BACKOFF_INITIAL_S,
                 max_s: float = PROBE_BACKOFF_MAX_S, clock: Callable[[], float] = time.monotonic) -> None:
        self._probe = probe
        self._initial_s = initial_s
        self._max_s = max_s
        self._clock = clock
        self._running = threading.Lock()  # held while a probe runs
        self._state = threading.Lock()  # held only to read or write the fields below
        self._verdict = ""
        self._until: float | None = None  # clock time the verdict is kept until; None: none kept
        self._probes = 0  # probes in this outage: the backoff's exponent
        self._outage = 0  # bumped by reset, so a probe that spans it does not keep its verdict into the next outage
        self.runs = 0  # probes made in all (tests, and how much an outage cost)

    def __call__(self) -> str:
        with self._running:
            with self._state:
                if self._until is not None and self._clock() < self._until:
                    return self._verdict
                outage = self._outage
            verdict = self._probe()
            with self._state:
                self.runs += 1
                if outage == self._outage:
                    self._verdict = verdict
                    self._until = self._clock() + min(self._max_s, self._initial_s * 2.0 ** self._probes)
                    self._probes += 1
            return verdict

    def reset(self) -> None:
        """The backend answered: forget the verdict and start the next outage's backoff from ``initial_s``."""
        with self._state:
            self._verdict, self._until, self._probes = "", None, 0
            self._outage += 1
