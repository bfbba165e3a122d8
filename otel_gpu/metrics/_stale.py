# SPDX-License-Identifier: Apache-2.0
"""Forget the attribute sets of observable instruments that the callbacks stopped reporting.

The OpenTelemetry Python SDK (1.45) keeps one aggregation per attribute set an instrument ever saw. For
observable instruments, a set that a callback no longer yields exports nothing (so an exited process leaves no
stale series), but its aggregation is kept forever and counts against the stream's cardinality limit (2000): after
2000 distinct processes over the agent's life, every new process would land in one ``otel.metric.overflow``
series, and memory would grow with every pid ever seen. Per-process GPU metrics on a busy node reach that.

An observable instrument's cumulative value is exactly what its callback reports, so an aggregation that produced
no point in a collection holds nothing worth keeping. :func:`install` wraps the SDK's per-stream ``collect`` to drop
those, once per process. Synchronous instruments are left untouched (their aggregations carry state).
"""

from __future__ import annotations

import threading
from typing import Any

from opentelemetry.sdk.metrics._internal import _view_instrument_match as _vim
from opentelemetry.sdk.metrics._internal.instrument import (
    _ObservableCounter,
    _ObservableGauge,
    _ObservableUpDownCounter,
)

_OBSERVABLE = (_ObservableCounter, _ObservableGauge, _ObservableUpDownCounter)
_installed = False
_install_lock = threading.Lock()


def install() -> None:
    """Make every observable stream forget attribute sets that reported nothing in a collection (idempotent)."""
    global _installed
    with _install_lock:
        if _installed:
            return
        original = _vim._ViewInstrumentMatch.collect

        def collect(self: Any, temporality: Any, collection_start_nanos: int) -> Any:
            if not isinstance(self._instrument, _OBSERVABLE):
                return original(self, temporality, collection_start_nanos)
            with self._lock:
                aggregations = self._attributes_aggregation
                points = []
                stale = []
                for key, aggregation in aggregations.items():
                    point = aggregation.collect(temporality, collection_start_nanos)
                    if point is None:
                        stale.append(key)
                    else:
                        points.append(point)
                for key in stale:
                    del aggregations[key]
            return points or None

        _vim._ViewInstrumentMatch.collect = collect  # type: ignore[method-assign]
        _installed = True
