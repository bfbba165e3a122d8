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
        """Read the file straight into arrays (no per-symbol tuples: the peak stays near the kept size), then
        order by (address, name, module) when the file is not already in that order."""
        starts, name_ends, module_ids, names = array("Q"), array("I"), array("H"), bytearray()
        module_index: dict[str, int] = {"": 0}
        try:
            with open(self.path, encoding="ascii", errors="replace") as handle:
                for line in handle:
                    parts = line.split()
                    if len(parts) < 3 or parts[1] not in _TEXT_TYPES:
                        continue
                    address = int(parts[0], 16)
                    if address:
                        module = parts[3].strip("[]") if len(parts) > 3 else ""
                        if module not in module_index:
                            module_index[module] = len(self._modules)
                            self._modules.append(module)
                        starts.append(address)
                        names += parts[2].encode()
                        name_ends.append(len(names))
                        module_ids.append(module_index[module])
        except OSError as exc:
            _logger.warning("kernel frames stay unsymbolized: cannot read %s: %s", self.path, exc.strerror)
            return
        if not starts:
            _logger.warning("kernel frames stay unsymbolized: %s shows no addresses (needs root or "
                            "kernel.kptr_restrict=0)", self.path)
            return

        def name_of(index: int) -> bytes:
            return bytes(names[name_ends[index - 1] if index else 0:name_ends[index]])

        def tie_key(index: int) -> tuple[bytes, str]:
            return name_of(index), self._modules[module_ids[index]]

        order = sorted(range(len(starts)), key=starts.__getitem__)
        begin = 0
        while begin < len(order):  # at one address the entries go by (name, module), as a tuple sort would put them
            end = begin + 1
            while end < len(order) and starts[order[end]] == starts[order[begin]]:
                end += 1
            if end - begin > 1:
                order[begin:end] = sorted(order[begin:end], key=tie_key)
            begin = end
        if all(order[i] == i for i in range(len(order))):
            self._starts, self._name_ends, self._names, self._module_ids = starts, name_ends, bytes(names), module_ids
            return
        sorted_names = bytearray()
        for index in order:
            self._starts.append(starts[index])
            sorted_names += name_of(index)
            self._name_ends.append(len(sorted_names))
            self._module_ids.append(module_ids[index])
        self._names = bytes(sorted_names)
