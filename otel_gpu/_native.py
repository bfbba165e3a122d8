# SPDX-License-Identifier: Apache-2.0
"""The package's native libraries (built by ``make build``), each loaded with ctypes once, on first use."""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Callable
from pathlib import Path


class NativeLibrary:
    """One library: ``declare`` sets its functions' argument and result types once it loads. A library that does not
    load is tried once; :attr:`error` then says why (and ``on_missing``, when given, is told once)."""

    def __init__(self, path: Path, declare: Callable[[ctypes.CDLL], None],
                 on_missing: Callable[[str], None] | None = None) -> None:
        self.path = path
        self.error: str | None = None
        self._declare = declare
        self._on_missing = on_missing
        self._lock = threading.Lock()
        self._lib: ctypes.CDLL | None = None

    def get(self) -> ctypes.CDLL | None:
        """The loaded library, or None when it does not load."""
        with self._lock:
            if self._lib is None and self.error is None:
                try:
                    lib = ctypes.CDLL(str(self.path))
                except OSError as exc:
                    self.error = f"{self.path} does not load ({exc}); run `make build`"
                    if self._on_missing is not None:
                        self._on_missing(self.error)
                else:
                    self._declare(lib)
                    self._lib = lib
            return self._lib
