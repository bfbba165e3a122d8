# SPDX-License-Identifier: Apache-2.0
"""Reading another process's memory (/proc/PID/mem) for its Python frames: an address no read can reach is
unreadable, not an error that ends the drain (a torn pointer read while a process execs came back as 2**63 and up,
and os.pread raised OverflowError through the CPU source's drain)."""

from __future__ import annotations

import ctypes
import os

from otel_gpu.cpu.python import ProcessMemory


def test_reads_what_is_mapped_and_nothing_where_no_read_can_reach() -> None:
    value = ctypes.c_uint64(0x1122334455667788)
    memory = ProcessMemory(os.getpid())
    assert memory.read(ctypes.addressof(value), 8) == bytes(value)
    for address in (0, 1 << 47, (1 << 63) - 8, 1 << 63, (1 << 64) - 8):
        assert memory.read(address, 8) == b"", hex(address)
