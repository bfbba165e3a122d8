# SPDX-License-Identifier: Apache-2.0
"""The agent's own health counters, kept in plain Python so sources and exporters need no OTel SDK.

Hot paths call :func:`count` or :func:`set_duration`; the metrics pipeline reads :func:`snapshot` from an
observable callback and reports the values under the ``otel_gpu.*`` names in :mod:`otel_gpu.semconv`.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping

Key = tuple[str, tuple[tuple[str, str], ...]]

_lock = threading.Lock()
_counters: dict[Key, float] = {}
_gauges: dict[Key, float] = {}


def _key(name: str, attributes: Mapping[str, str]) -> Key:
    return name, tuple(sorted(attributes.items()))


def count(name: str, amount: float = 1, **attributes: str) -> None:
    """Add ``amount`` to the monotonic counter ``name`` with ``attributes`` (keys use ``_`` for ``.``)."""
    key = _key(name, {k.replace("__", "."): str(v) for k, v in attributes.items()})
    with _lock:
        _counters[key] = _counters.get(key, 0) + amount


def set_gauge(name: str, value: float, **attributes: str) -> None:
    """Set the gauge ``name`` to ``value``."""
    key = _key(name, {k.replace("__", "."): str(v) for k, v in attributes.items()})
    with _lock:
        _gauges[key] = value


def snapshot() -> tuple[dict[Key, float], dict[Key, float]]:
    """(counters, gauges): copies of every value recorded so far."""
    with _lock:
        return dict(_counters), dict(_gauges)


def total(name: str, **attributes: str) -> float:
    """Sum of counter ``name`` over every series whose attributes include ``attributes`` (for tests and logs)."""
    wanted = {k.replace("__", "."): v for k, v in attributes.items()}
    with _lock:
        return sum(v for (n, attrs), v in _counters.items()
                   if n == name and all(dict(attrs).get(k) == val for k, val in wanted.items()))


def reset() -> None:
    """Forget every value (tests only)."""
    with _lock:
        _counters.clear()
        _gauges.clear()
