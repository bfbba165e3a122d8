# SPDX-License-Identifier: Apache-2.0
"""A minimal ctypes binding to the system's libbpf.so.1 for the GPU-time program: open, size the ring buffer, load,
attach USDT probes system-wide, poll the ring buffer, read per-CPU counters, detach and close.

Kept inside otel_gpu.cuda so the GPU-time source does not wait on the shared loader (otel_gpu.ebpf); it uses only
libbpf's stable 1.x API. Errors raise :class:`BPFError` carrying the errno and what failed.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
from collections.abc import Callable

_SAMPLE_CB = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t)


class BPFError(OSError):
    """A libbpf call failed; ``errno`` is set, the message names the call and its object."""


def _load_library() -> ctypes.CDLL:
    name = ctypes.util.find_library("bpf") or "libbpf.so.1"
    try:
        lib = ctypes.CDLL("libbpf.so.1", use_errno=True)
    except OSError:
        lib = ctypes.CDLL(name, use_errno=True)
    vp, cp, ci = ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int
    signatures: dict[str, tuple[type | None, list[type]]] = {
        "bpf_object__open_file": (vp, [cp, vp]),
        "bpf_object__load": (ci, [vp]),
        "bpf_object__close": (None, [vp]),
        "bpf_object__find_program_by_name": (vp, [vp, cp]),
        "bpf_object__find_map_by_name": (vp, [vp, cp]),
        "bpf_map__set_max_entries": (ci, [vp, ctypes.c_uint32]),
        "bpf_map__fd": (ci, [vp]),
        "bpf_program__attach_usdt": (vp, [vp, ci, cp, cp, cp, vp]),
        "bpf_link__destroy": (ci, [vp]),
        "bpf_map_lookup_elem": (ci, [ci, vp, vp]),
        "ring_buffer__new": (vp, [ci, _SAMPLE_CB, vp, vp]),
        "ring_buffer__poll": (ci, [vp, ci]),
        "ring_buffer__consume": (ci, [vp]),
        "ring_buffer__free": (None, [vp]),
        "libbpf_num_possible_cpus": (ci, []),
    }
    for func, (restype, argtypes) in signatures.items():
        fn = getattr(lib, func)
        fn.restype = restype
        fn.argtypes = argtypes
    return lib


_lib: ctypes.CDLL | None = None


def libbpf() -> ctypes.CDLL:
    """The loaded libbpf.so.1; raises OSError when it is not installed."""
    global _lib
    if _lib is None:
        _lib = _load_library()
    return _lib


def _fail(what: str, code: int | None = None) -> BPFError:
    err = abs(code) if code else ctypes.get_errno() or errno.EINVAL
    return BPFError(err, f"{what}: {os.strerror(err)}")


class BPFObject:
    """One opened BPF object file: ``load()`` it, attach its programs, then ``close()`` (detaches every link)."""

    def __init__(self, path: str) -> None:
        self._lib = libbpf()
        self.path = path
        self._obj = self._lib.bpf_object__open_file(path.encode(), None)
        if not self._obj:
            raise _fail(f"opening {path}")
        self._links: list[int] = []
        self._rings: list[RingBuffer] = []

    def set_map_max_entries(self, map_name: str, max_entries: int) -> None:
        """Resize map ``map_name`` before load (for a ring buffer: its size in bytes, a power-of-two page multiple)."""
        rc = self._lib.bpf_map__set_max_entries(self._map(map_name), max_entries)
        if rc < 0:
            raise _fail(f"resizing map {map_name}", rc)

    def load(self) -> None:
        rc = self._lib.bpf_object__load(self._obj)
        if rc < 0:
            raise _fail(f"loading {self.path} (run as root on a kernel with BTF)", rc)

    def attach_usdt(self, program: str, binary_path: str, provider: str, name: str, pid: int = -1) -> int:
        """Attach ``program`` to USDT ``provider:name`` of ``binary_path`` (pid -1: every process); returns a link id.

        libbpf passes the probe's semaphore to the kernel (ref_ctr_offset), which raises it in every process that
        maps the file while the link exists.
        """
        prog = self._lib.bpf_object__find_program_by_name(self._obj, program.encode())
        if not prog:
            raise BPFError(errno.ENOENT, f"no program {program} in {self.path}")
        link = self._lib.bpf_program__attach_usdt(prog, pid, binary_path.encode(), provider.encode(), name.encode(),
                                                  None)
        if not link:
            raise _fail(f"attaching {program} to USDT {provider}:{name} in {binary_path}")
        self._links.append(link)
        return link

    def detach(self, link: int) -> None:
        if link in self._links:
            self._links.remove(link)
            self._lib.bpf_link__destroy(link)

    def ring_buffer(self, map_name: str, on_record: Callable[[bytes], None]) -> RingBuffer:
        """A poller for ring buffer ``map_name`` calling ``on_record(bytes)`` for each record."""
        ring = RingBuffer(self._lib, self._lib.bpf_map__fd(self._map(map_name)), on_record)
        self._rings.append(ring)
        return ring

    def percpu_u64_sum(self, map_name: str, key: int) -> int:
        """Sum over CPUs of the u64 at ``key`` of a per-CPU array."""
        cpus = self._lib.libbpf_num_possible_cpus()
        values = (ctypes.c_uint64 * max(cpus, 1))()
        k = ctypes.c_uint32(key)
        rc = self._lib.bpf_map_lookup_elem(self._lib.bpf_map__fd(self._map(map_name)), ctypes.byref(k), values)
        if rc < 0:
            raise _fail(f"reading {map_name}[{key}]")
        return sum(values)

    def close(self) -> None:
        """Free the ring buffers, destroy every link and close the object (idempotent)."""
        for ring in self._rings:
            ring.free()
        self._rings.clear()
        for link in self._links:
            self._lib.bpf_link__destroy(link)
        self._links.clear()
        if self._obj:
            self._lib.bpf_object__close(self._obj)
            self._obj = None

    def _map(self, name: str) -> int:
        bpf_map = self._lib.bpf_object__find_map_by_name(self._obj, name.encode())
        if not bpf_map:
            raise BPFError(errno.ENOENT, f"no map {name} in {self.path}")
        return int(bpf_map)


class RingBuffer:
    """libbpf's ring_buffer over one map; ``poll(timeout_ms)`` hands each record to the callback as bytes."""

    def __init__(self, lib: ctypes.CDLL, map_fd: int, on_record: Callable[[bytes], None]) -> None:
        self._lib = lib

        def sample(_ctx: int | None, data: int | None, size: int) -> int:
            on_record(ctypes.string_at(data, size))
            return 0

        self._callback = _SAMPLE_CB(sample)  # keep a reference while libbpf holds the pointer
        self._rb = lib.ring_buffer__new(map_fd, self._callback, None, None)
        if not self._rb:
            raise _fail("creating the ring buffer poller")

    def poll(self, timeout_ms: int) -> int:
        """Wait up to ``timeout_ms`` for records and consume them; returns how many were consumed."""
        if not self._rb:
            return 0
        rc = self._lib.ring_buffer__poll(self._rb, timeout_ms)
        if rc < 0 and rc != -errno.EINTR:
            raise _fail("polling the ring buffer", rc)
        return max(rc, 0)

    def consume(self) -> int:
        """Consume every record available now without waiting."""
        if not self._rb:
            return 0
        rc = self._lib.ring_buffer__consume(self._rb)
        return max(rc, 0)

    def free(self) -> None:
        if self._rb:
            self._lib.ring_buffer__free(self._rb)
            self._rb = None
