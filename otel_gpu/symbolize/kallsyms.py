# SPDX-License-Identifier: Apache-2.0
"""Kernel symbols from /proc/kallsyms (text symbols of the kernel and its modules).

The kernel writes the file, but its path is a setting and module names come from whoever loads modules, so it is
parsed like any outside input: read up to :data:`MAX_KALLSYMS_BYTES`, a line up to :data:`_MAX_LINE_BYTES`, and a
line that is not ``HEX TYPE NAME [MODULE]`` skipped."""

from __future__ import annotations

import bisect
import io
import logging
from array import array
from collections.abc import Iterator

_logger = logging.getLogger(__name__)

MAX_KALLSYMS_BYTES = 128 << 20  # a kernel with many modules shows ~300,000 lines, 15 MiB
_MAX_LINE_BYTES = 4096  # names are at most KSYM_NAME_LEN (512) bytes, modules MODULE_NAME_LEN (56)
_MAX_MODULES = 0xFFFF  # module numbers are kept in 16 bits; symbols of further modules keep no module name
_TEXT_TYPES = frozenset((b"t", b"T", b"w", b"W"))
_HEX_DIGITS = b"0123456789abcdefABCDEF"


class KernelSymbols:
    """Sorted kernel text symbols; :meth:`lookup` maps an address to (name, offset, module).

    Kept compact (about 10 MB for 200,000 symbols): addresses in an array, names and modules in one byte string
    each, decoded only when looked up."""

    def __init__(self, path: str = "/proc/kallsyms", text: bytes | None = None) -> None:
        """Read the file at ``path``, or the in-memory ``text`` (then ``path`` only names it)."""
        self.path = path
        self._starts = array("Q")
        self._name_ends = array("I")
        self._names = b""
        self._module_ids = array("H")
        self._modules: list[str] = [""]
        self.truncated = False  # the file was longer than MAX_KALLSYMS_BYTES: symbols past it are missing
        self._load(text)

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

    def _load(self, text: bytes | None) -> None:
        """Read the file straight into arrays (no per-symbol tuples: the peak stays near the kept size), then
        order by (address, name, module) when the file is not already in that order."""
        starts, name_ends, module_ids, names = array("Q"), array("I"), array("H"), bytearray()
        module_index: dict[str, int] = {"": 0}
        try:
            with io.BytesIO(text) if text is not None else open(self.path, "rb") as handle:
                for line in _lines(handle):
                    parts = line.split()
                    if len(parts) < 3 or parts[1] not in _TEXT_TYPES or not _is_hex64(parts[0]):
                        continue
                    address = int(parts[0], 16)
                    if address:
                        module = parts[3].strip(b"[]").decode("ascii", errors="replace") if len(parts) > 3 else ""
                        if module not in module_index and len(self._modules) < _MAX_MODULES:
                            module_index[module] = len(self._modules)
                            self._modules.append(module)
                        starts.append(address)
                        names += parts[2]
                        name_ends.append(len(names))
                        module_ids.append(module_index.get(module, 0))
                self.truncated = bool(handle.read(1))  # the lines stopped at the cap, not at the end
        except OSError as exc:
            _logger.warning("kernel frames stay unsymbolized: cannot read %s: %s", self.path, exc.strerror)
            return
        if self.truncated:
            _logger.warning("kernel frames past the first %d MiB of %s stay unsymbolized (the file is larger)",
                            MAX_KALLSYMS_BYTES >> 20, self.path)
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


def _lines(handle: io.BufferedIOBase) -> Iterator[bytes]:
    """The lines of ``handle`` in its first :data:`MAX_KALLSYMS_BYTES`, each at most :data:`_MAX_LINE_BYTES` long
    (the rest of a longer line is skipped)."""
    read = 0
    cut = False  # the previous piece was the start of a longer line
    while read < MAX_KALLSYMS_BYTES:
        line = handle.readline(_MAX_LINE_BYTES)
        if not line:
            return
        read += len(line)
        whole = line.endswith(b"\n")
        if not cut:
            yield line
        cut = not whole


def _is_hex64(field: bytes) -> bool:
    """True for 1 to 16 hex digits (int() would also take signs, "_" and "0x")."""
    return 0 < len(field) <= 16 and not field.strip(_HEX_DIGITS)
