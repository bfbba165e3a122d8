# SPDX-License-Identifier: Apache-2.0
"""C++ (Itanium ABI) demangling through libstdc++'s ``__cxa_demangle``, without c++filt; names it cannot demangle
(C kernels, truncated names, a missing libstdc++) come back unchanged."""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import logging
from typing import Any

_logger = logging.getLogger(__name__)


@functools.cache
def _cxa_demangle() -> tuple[Any, Any] | None:  # (__cxa_demangle, free) as ctypes functions
    for name in ("libstdc++.so.6", ctypes.util.find_library("stdc++")):
        if not name:
            continue
        try:
            lib = ctypes.CDLL(name)
            libc = ctypes.CDLL(None)
        except OSError:
            continue
        demangle = lib.__cxa_demangle
        demangle.restype = ctypes.c_void_p
        demangle.argtypes = [ctypes.c_char_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.POINTER(ctypes.c_int)]
        free = libc.free
        free.argtypes = [ctypes.c_void_p]
        free.restype = None
        return demangle, free
    _logger.info("libstdc++ not found: CUDA kernel names stay mangled")
    return None


@functools.lru_cache(maxsize=16384)
def demangle(name: str) -> str:
    """The demangled form of ``name`` (e.g. ``_Z6matmulPfS_i`` -> ``matmul(float*, float*, int)``), else ``name``."""
    if not name.startswith("_Z"):
        return name
    funcs = _cxa_demangle()
    if funcs is None:
        return name
    demangle_fn, free = funcs
    status = ctypes.c_int(0)
    result = demangle_fn(name.encode(), None, None, ctypes.byref(status))
    if not result:
        return name
    try:
        return ctypes.string_at(result).decode("utf-8", "replace") if status.value == 0 else name
    finally:
        free(result)
