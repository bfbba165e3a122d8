# SPDX-License-Identifier: Apache-2.0
"""The span context table in this process: libotel_gpu_context.so loaded once, its writer and a reader for tests."""

from __future__ import annotations

import ctypes
import struct
import threading
from dataclasses import dataclass
from pathlib import Path

LIBRARY_PATH = Path(__file__).parent / "native" / "libotel_gpu_context.so"
SYMBOL = "otel_gpu_span_context_table"
DEVICES_SYMBOL = "otel_gpu_span_devices"  # one u64 device mask per slot, beside the table (span_context.h)
MAGIC = 0x4353474F
VERSION = 1
SLOT_SIZE = 40
HEADER_SIZE = 16


@dataclass(frozen=True)
class SlotReading:
    """One thread's published context; ids are 0 when the thread is in no span."""

    tid: int
    trace_id: int
    span_id: int
    local_root_span_id: int


class SpanContextTable:
    """The process's table. Loaded RTLD_GLOBAL so the injected CUDA library finds the symbol with dlsym."""

    _lock = threading.Lock()
    _instance: SpanContextTable | None = None

    def __init__(self, library_path: Path = LIBRARY_PATH) -> None:
        self._lib = ctypes.CDLL(str(library_path), mode=ctypes.RTLD_GLOBAL)
        setter = self._lib.otel_gpu_span_context_set
        setter.argtypes = [ctypes.c_uint64] * 4
        setter.restype = None
        self.set = setter
        """set(trace_hi, trace_lo, span_id, local_root_span_id) for the calling thread; all zero clears it."""
        self._lib.otel_gpu_span_context_dropped_threads.restype = ctypes.c_ulong
        self._lib.otel_gpu_span_context_slot.restype = ctypes.c_void_p
        self.slot_function_address: int = ctypes.cast(self._lib.otel_gpu_span_context_slot, ctypes.c_void_p).value or 0
        """Where otel_gpu_span_context_slot is: the C hooks (_hooks.abi3.so) claim each thread's slot through it."""
        self.address = ctypes.addressof(ctypes.c_uint8.in_dll(self._lib, SYMBOL))
        self.devices_address = ctypes.addressof(ctypes.c_uint64.in_dll(self._lib, DEVICES_SYMBOL))
        header = (ctypes.c_uint32 * 4).from_address(self.address)
        self.slot_count = header[2]
        self.max_probe = header[3]
        if header[0] != MAGIC or header[1] & 0xFFFF != VERSION:
            raise RuntimeError(f"{library_path}: span context table is not version {VERSION}")

    @classmethod
    def shared(cls) -> SpanContextTable:
        """The one table of this process (loading the library the first time)."""
        with cls._lock:
            if cls._instance is None:
                cls._instance = cls()
            return cls._instance

    def thread_writer(self) -> SlotWriter | None:
        """The calling thread's slot as a writer (claiming it); None when no slot is free for this thread."""
        address = self._lib.otel_gpu_span_context_slot()
        if not address:
            return None
        index = (address - self.address - HEADER_SIZE) // SLOT_SIZE
        return SlotWriter(address, self.devices_address + 8 * index)

    def dropped_threads(self) -> int:
        """Threads that found no free slot, so publish nothing."""
        return int(self._lib.otel_gpu_span_context_dropped_threads())

    def read(self, tid: int) -> SlotReading | None:
        """What thread `tid` published, probing as a reader does; None when it holds no slot."""
        for i in range(self.max_probe):
            index = (tid + i) & (self.slot_count - 1)
            raw = ctypes.string_at(self.address + HEADER_SIZE + index * SLOT_SIZE, SLOT_SIZE)
            if int.from_bytes(raw[0:4], "little") == tid:
                return SlotReading(
                    tid=tid,
                    trace_id=int.from_bytes(raw[8:24], "big"),
                    span_id=int.from_bytes(raw[24:32], "big"),
                    local_root_span_id=int.from_bytes(raw[32:40], "big"),
                )
        return None


# seq then the ids, in one pack: seq is packed big-endian as 0x01000000, which a little-endian u32 reader sees as 1
# (odd: being written); the ids follow in W3C byte order (trace id, span id, local root span id). The trace id and
# the local root come as bytes: the caller converts each once per trace and per root, not at every write.
_WRITING = struct.Struct(">I16sQ8s").pack_into
_SEQ_WRITING = 0x01000000
NO_TRACE = bytes(16)
NO_ROOT = bytes(8)


class SlotWriter:
    """Writes one thread's slot in place, without a foreign call: one pack and one store.

    The sampler interrupts the writing thread on its own CPU, so program order suffices: seq odd (1), ids, seq even
    (2). Readers look only at seq's parity (a reader on another CPU is not part of the contract).
    """

    __slots__ = ("_seq", "_view", "devices")

    def __init__(self, address: int, devices_address: int) -> None:
        self._view = memoryview((ctypes.c_uint8 * SLOT_SIZE).from_address(address)).cast("B")
        self._seq = self._view[0:8].cast("I")
        self.devices = memoryview((ctypes.c_uint8 * 8).from_address(devices_address)).cast("B").cast("Q")
        """devices[0]: the slot's device mask (bit n: CUDA device n), set by the injected library at sampled launches
        inside a span; the processor clears it at a local root's start and reads it at that root's end."""

    def write(self, trace_id: bytes, span_id: int, local_root_span_id: bytes) -> None:
        """Publishes ids: the trace id and local root as their 16 and 8 big-endian bytes; NO_TRACE, 0, NO_ROOT means
        "in no span"."""
        _WRITING(self._view, 4, _SEQ_WRITING, trace_id, span_id, local_root_span_id)
        self._seq[1] = 2
