# SPDX-License-Identifier: Apache-2.0
"""Kernel symbols from /proc/kallsyms (text symbols of the kernel and its modules)."""

from __future__ import annotations

import bisect
import logging
from array import array

_logger = logging.getLogger(__name__)

_TEXT_TYPES = frozenset("tTwW")


class KernelSymbols:
    """Sorted kernel text symbols; :meth:`lookup` maps an address to (name, offset, module).

    Kept compact (about 10 MB for 200,000 symbols): addresses in an array, names and modules in one byte string
    each, decoded only when looked up."""

    def __init__(self, path: str = "/proc/kallsyms") -> None:
        self.path = path
        self._starts = array("Q")
        self._name_ends = array("I")
        self._names = b""
        self._module_ids = array("H")
        self._modules: list[str] = [""]
        self._load()

    @property
    def available(self) -> bool:
        """False when the file was unreadable or every address was hidden (kptr_restrict without privileges)."""
        return bool(self._starts)

    def lookup(self, address: int) -> tuple[str, int, str] | None:
        """(function, offset into it, module or "") of the kernel text symbol at or below ``address``."""
        index = bisect.bisect_right(self._starts, address) - 1
        if index < 0:
            return None
        begin = self._name_ends[index - 1] if index else 0
        name = self._names[begin:self._name_ends[index]].decode(errors="replace")
        return name, address - self._starts[index], self._modules[self._module_ids[index]]

    def _load(self) -> None:
        entries: list[tuple[int, str, str]] = []
        try:
            with open(self.path, encoding="ascii", errors="replace") as handle:
                for line in handle:
                    parts = line.split()
                    if len(parts) < 3 or parts[1] not in _TEXT_TYPES:
                        continue
                    address = int(parts[0], 16)
                    if address:
                        module = parts[3].strip("[]") if len(parts) > 3 else ""
                        entries.append((address, parts[2], module))
        except OSError as exc:
            _logger.warning("kernel frames stay unsymbolized: cannot read %s: %s", self.path, exc.strerror)
            return
        if not entries:
            _logger.warning("kernel frames stay unsymbolized: %s shows no addresses (needs root or "
                            "kernel.kptr_restrict=0)", self.path)
            return
        entries.sort()
        module_index: dict[str, int] = {"": 0}
        names = bytearray()
        for address, name, module in entries:
            self._starts.append(address)
            names += name.encode()
            self._name_ends.append(len(names))
            if module not in module_index:
                module_index[module] = len(self._modules)
                self._modules.append(module)
            self._module_ids.append(module_index[module])
        self._names = bytes(names)
