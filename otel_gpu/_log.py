# SPDX-License-Identifier: Apache-2.0
"""Logging set-up and a once-only logger for conditions that must not repeat every cycle."""

from __future__ import annotations

import logging
import sys
import threading

_once_lock = threading.Lock()
_once_seen: set[tuple[str, str]] = set()


def configure(level: str) -> None:
    """One line per record on stderr: time, level, logger, message."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # The SDK logs every failed export attempt with a traceback; our exporters count and summarise instead.
    for noisy in ("opentelemetry.exporter.otlp.proto.grpc.exporter", "opentelemetry.exporter.otlp.proto.http",
                  "opentelemetry.sdk.metrics._internal.export"):
        logging.getLogger(noisy).setLevel(logging.CRITICAL)


def once(logger: logging.Logger, level: int, key: str, message: str, *args: object) -> None:
    """Log ``message`` the first time ``key`` is seen for ``logger``, never again."""
    token = (logger.name, key)
    with _once_lock:
        if token in _once_seen:
            return
        _once_seen.add(token)
    logger.log(level, message, *args)
