# SPDX-License-Identifier: Apache-2.0
"""C++ and Rust symbol demangling through ``c++filt`` (binutils), batched, cached; names stay raw without it."""

from __future__ import annotations

import logging
import shutil
import subprocess
from collections.abc import Iterable

_logger = logging.getLogger(__name__)


class Demangler:
    """Demangles ``_Z...`` names in batches (one ``c++filt`` run per batch of new names)."""

    def __init__(self, max_entries: int = 200_000, max_bytes: int = 16 * 1024 * 1024) -> None:
        """Keeps up to ``max_entries`` names and ``max_bytes`` of name text (C++ names run to kilobytes); past
        either bound the cache starts over."""
        self._tool = shutil.which("c++filt")
        self._cache: dict[str, str] = {}
        self._max = max_entries
        self._max_bytes = max_bytes
        self._bytes = 0
        self._warned = False

    @staticmethod
    def is_mangled(name: str) -> bool:
        return name.startswith(("_Z", "_R"))

    def prepare(self, names: Iterable[str]) -> None:
        """Demangle every mangled name in ``names`` not seen before, in one batch."""
        todo = sorted({n for n in names if self.is_mangled(n) and n not in self._cache and "\n" not in n})
        if not todo:
            return
        results = self._run(todo)
        added = sum(len(raw) + len(pretty) for raw, pretty in zip(todo, results, strict=False))
        if len(self._cache) + len(todo) > self._max or self._bytes + added > self._max_bytes:
            self._cache.clear()
            self._bytes = 0
        for raw, pretty in zip(todo, results, strict=False):
            self._cache[raw] = pretty or raw
        self._bytes += added

    def demangle(self, name: str) -> str:
        """The demangled name, or ``name`` itself when it is not mangled or was not prepared."""
        if not self.is_mangled(name):
            return name
        if name not in self._cache:
            self.prepare([name])
        return self._cache.get(name, name)

    def _run(self, names: list[str]) -> list[str]:
        if self._tool is None:
            if not self._warned:
                _logger.info("c++filt not found: C++ function names stay mangled")
                self._warned = True
            return names
        try:
            done = subprocess.run([self._tool], input="\n".join(names) + "\n", capture_output=True, text=True,
                                  timeout=10, check=False)
        except (OSError, subprocess.SubprocessError) as exc:
            if not self._warned:
                _logger.warning("c++filt failed (%s): C++ function names stay mangled", exc)
                self._warned = True
            return names
        lines = done.stdout.splitlines()
        return lines if len(lines) == len(names) else names
