# SPDX-License-Identifier: Apache-2.0
"""The package's native libraries (built by ``make build``), each loaded with ctypes once, on first use."""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

Signature = tuple[Sequence[type], type | None]
"""A C function's (argument types, result type) in ctypes types; None: returns void."""


class NativeLibrary:
    """One library whose functions get their ``signatures`` (name: (argument types, result type)) once it loads. A
    library that does not load is tried once; :attr:`error` then says why (and ``on_missing``, when given, is told
    once)."""

    def __init__(self, path: Path, signatures: Mapping[str, Signature],
                 on_missing: Callable[[str], None] | None = None) -> None:
        self.path = path
        self.error: str | None = None
        self._signatures = signatures
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
                    for name, (argtypes, restype) in self._signatures.items():
                        function = getattr(lib, name)
                        function.argtypes = list(argtypes)
                        function.restype = restype
                    self._lib = lib
            return self._lib
