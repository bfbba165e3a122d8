# SPDX-License-Identifier: Apache-2.0
"""The agent's one demangler: C++ and Rust names through ``c++filt`` (binutils), batched, cached, bounded.

Symbol names come from files any process on the node may write, so a name is hostile input. ``c++filt`` demangles
them in a process of its own: a name crafted to recurse deeply or to expand to megabytes costs that process, never
the agent (libstdc++'s ``__cxa_demangle`` would run the same libiberty code inside the agent). Its output is read
line by line up to :data:`MAX_DEMANGLED_BYTES` per name, and a batch that runs past :data:`TIMEOUT_S` is stopped;
the names it had not answered yet stay mangled that time and are asked again next time, the one it was stuck on
stays mangled for good. ``-i`` keeps the library's short names (``std::string``, not the ``basic_string<...>``
they stand for), as ``__cxa_demangle`` writes them. Without ``c++filt`` names stay mangled (logged once).
"""

from __future__ import annotations

import logging
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Iterable

_logger = logging.getLogger(__name__)

MAX_DEMANGLED_BYTES = 16 * 1024  # longer C++ names exist (deep templates) but are unreadable; the rest is cut
TIMEOUT_S = 5.0  # one batch of a few thousand names takes ~35 ms
_ELLIPSIS = "..."


class Demangler:
    """Demangles ``_Z...`` (C++) and ``_R...`` (Rust) names in batches (one ``c++filt`` run per batch of new names);
    thread-safe."""

    def __init__(self, max_entries: int = 200_000, max_bytes: int = 16 * 1024 * 1024) -> None:
        """Keeps up to ``max_entries`` names and ``max_bytes`` of name text (C++ names run to kilobytes); past
        either bound the cache starts over."""
        self._tool = shutil.which("c++filt")
        self._cache: dict[str, str] = {}
        self._max = max_entries
        self._max_bytes = max_bytes
        self._bytes = 0
        self._warned = False
        self._lock = threading.Lock()

    @staticmethod
    def is_mangled(name: str) -> bool:
        return name.startswith(("_Z", "_R"))

    def prepare(self, names: Iterable[str]) -> None:
        """Demangle every mangled name in ``names`` not seen before, in one batch."""
        with self._lock:
            todo = sorted({n for n in names if self.is_mangled(n) and n not in self._cache and "\n" not in n})
            if not todo:
                return
            results = self._run(todo)
            added = sum(len(raw) + len(pretty) for raw, pretty in results.items())
            if len(self._cache) + len(results) > self._max or self._bytes + added > self._max_bytes:
                self._cache.clear()
                self._bytes = 0
            self._cache.update(results)
            self._bytes += added

    def demangle(self, name: str) -> str:
        """The demangled name, or ``name`` itself when it is not mangled or cannot be demangled."""
        if not self.is_mangled(name):
            return name
        found = self._cache.get(name)
        if found is None:
            self.prepare([name])
            found = self._cache.get(name, name)
        return found

    def _run(self, names: list[str]) -> dict[str, str]:
        """Raw name -> demangled name (the raw name where c++filt gave none) for the names answered in time."""
        if self._tool is None:
            self._warn_once(logging.INFO, "c++filt not found: C++ function names stay mangled")
            return {name: name for name in names}
        out: dict[str, str] = {}
        try:
            with tempfile.TemporaryFile() as given:  # from a file: c++filt's output never waits on our input
                given.write("".join(f"{name}\n" for name in names).encode("utf-8", "replace"))
                given.seek(0)
                with subprocess.Popen([self._tool, "-i"], stdin=given, stdout=subprocess.PIPE,
                                      stderr=subprocess.DEVNULL) as process:
                    timer = threading.Timer(TIMEOUT_S, process.kill)
                    timer.start()
                    try:
                        assert process.stdout is not None
                        for name in names:
                            line = _read_line(process.stdout)
                            if line is None:
                                break
                            out[name] = line or name
                    finally:
                        timer.cancel()
                        process.kill()
        except OSError as exc:
            self._warn_once(logging.WARNING, f"c++filt failed ({exc}): C++ function names stay mangled")
            return {name: name for name in names}
        if len(out) < len(names):
            stuck = names[len(out)]
            _logger.debug("c++filt stopped at a name after %d of %d (%.100s...); it stays mangled", len(out),
                          len(names), stuck)
            out[stuck] = stuck
        return out

    def _warn_once(self, level: int, message: str) -> None:
        if not self._warned:
            _logger.log(level, "%s", message)
            self._warned = True


def _read_line(stream) -> str | None:  # type: ignore[no-untyped-def]  # a binary file object
    """The next line of ``stream`` without its newline, cut to :data:`MAX_DEMANGLED_BYTES` (the rest read and
    dropped); None at the end of the stream."""
    line = stream.readline(MAX_DEMANGLED_BYTES + 1)
    if not line:
        return None
    if line.endswith(b"\n"):
        return line[:-1].decode("utf-8", "replace")
    if len(line) <= MAX_DEMANGLED_BYTES:
        return None  # the stream ended inside a line: killed while writing it
    while True:  # drop the rest of the long line, a bounded piece at a time
        rest = stream.readline(1 << 16)
        if not rest:
            return None
        if rest.endswith(b"\n"):
            break
    return line[:MAX_DEMANGLED_BYTES].decode("utf-8", "ignore") + _ELLIPSIS


_shared = Demangler()


def demangle(name: str) -> str:
    """``name`` demangled by the process-wide :class:`Demangler` (kernel names: one cache for every source)."""
    return _shared.demangle(name)
