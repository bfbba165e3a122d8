# SPDX-License-Identifier: Apache-2.0
"""Load, configure, attach and free one compiled eBPF object (``programs/*.bpf.o``) through libbpf.

The lifecycle is libbpf's: open -> set ``const volatile`` settings (``.rodata``) and map sizes -> load -> attach ->
use maps and ring buffers -> detach and free. :class:`BPFObject` is a context manager; :meth:`BPFObject.close`
destroys every link (which also closes the perf event fds), frees ring buffers and closes the object (programs and
maps), is idempotent and is safe after a failed load or attach.

Usage (the CPU sampler and the GPU-time profiler both use it this way)::

    from otel_gpu.ebpf.loader import BPFObject, program_path

    with BPFObject(program_path("probe_counter"), rodata={"self_tgid": os.getpid()}) as bpf:
        bpf.attach_perf_event("on_cpu_sample", frequency_hz=19)          # software cpu-clock, every online CPU
        bpf.attach_uprobe("count_uprobe", "/usr/lib/libfoo.so", "foo")    # function entry (retprobe=True: return)
        bpf.attach_usdt("count_usdt", "/usr/lib/libfoo.so", "provider", "probe")  # semaphores handled by libbpf
        hits = bpf.map("uprobe_hits")                                     # BPFMap: lookup/update/delete/items
        ring = bpf.ring_buffer("events", lambda data: handle(data))       # RingBuffer.poll(timeout_ms)

``rodata`` and ``max_entries`` are applied between open and load (the constructor does all three). ``pid=-1``
attaches a uprobe or USDT probe in every process that maps the file. Errors raise :class:`BPFError`, whose message
quotes libbpf's last log lines and whose ``errno`` says why (EPERM: privileges, ENOENT: missing symbol/file, ...).
"""

from __future__ import annotations

import ctypes
import errno as errno_codes
import logging
import os
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from otel_gpu.ebpf import _libbpf
from otel_gpu.ebpf import PROGRAMS_DIR, program_path  # noqa: F401  (named in otel_gpu.ebpf, kept here for callers)

if TYPE_CHECKING:
    from typing_extensions import Self

_logger = logging.getLogger(__name__)

_SYS_PERF_EVENT_OPEN = {"x86_64": 298, "aarch64": 241}.get(os.uname().machine, 298)
PERF_TYPE_SOFTWARE = 1
PERF_COUNT_SW_CPU_CLOCK = 0
_PERF_FLAG_FREQ = 1 << 10
_PERF_FLAG_DISABLED = 1 << 0
_PERF_FLAG_FD_CLOEXEC = 1 << 3
_BATCH_BYTES = 96 * 1024  # keys and values a batch lookup-and-delete returns per call: under the mmap threshold


class BPFError(OSError):
    """A libbpf or bpf() failure; the message names the step and quotes libbpf's last log lines (``libbpf_log``),
    ``step`` alone names the step and the error."""

    def __init__(self, code: int, step: str, libbpf_log: tuple[str, ...] = ()) -> None:
        super().__init__(code, step + (("; " + " | ".join(libbpf_log)) if libbpf_log else ""))
        self.step = step
        self.libbpf_log = libbpf_log

    def without_privileges(self) -> bool:
        """The kernel refused for want of privileges (root, or CAP_BPF+CAP_PERFMON): libbpf's log says nothing more."""
        return self.errno in (errno_codes.EPERM, errno_codes.EACCES)


class _PerfEventAttr(ctypes.Structure):
    """struct perf_event_attr up to config2 (PERF_ATTR_SIZE_VER1); flags is the bitfield word."""

    _fields_ = [
        ("type", ctypes.c_uint32),
        ("size", ctypes.c_uint32),
        ("config", ctypes.c_uint64),
        ("sample_freq", ctypes.c_uint64),  # union with sample_period
        ("sample_type", ctypes.c_uint64),
        ("read_format", ctypes.c_uint64),
        ("flags", ctypes.c_uint64),
        ("wakeup_events", ctypes.c_uint32),
        ("bp_type", ctypes.c_uint32),
        ("config1", ctypes.c_uint64),
        ("config2", ctypes.c_uint64),
    ]


def online_cpus(path: str = "/sys/devices/system/cpu/online") -> list[int]:
    """The online CPU numbers, from a list like ``0-3,5``."""
    cpus: list[int] = []
    for part in Path(path).read_text().strip().split(","):
        if not part:
            continue
        low, _, high = part.partition("-")
        cpus.extend(range(int(low), int(high or low) + 1))
    return cpus


def open_cpu_clock_event(cpu: int, frequency_hz: int) -> int:
    """A disabled software cpu-clock perf event on ``cpu`` for every process, sampling ``frequency_hz`` times a
    second. Returns its fd; raises BPFError (EACCES/EPERM without privileges, ENOENT/ENODEV without the event)."""
    attr = _PerfEventAttr(type=PERF_TYPE_SOFTWARE, size=ctypes.sizeof(_PerfEventAttr), config=PERF_COUNT_SW_CPU_CLOCK,
                          sample_freq=frequency_hz, flags=_PERF_FLAG_FREQ | _PERF_FLAG_DISABLED)
    libc = _libbpf.libc()
    fd = libc.syscall(_SYS_PERF_EVENT_OPEN, ctypes.byref(attr), -1, cpu, -1, _PERF_FLAG_FD_CLOEXEC)
    if fd < 0:
        code = ctypes.get_errno()
        raise BPFError(code, f"perf_event_open(cpu-clock, cpu {cpu}) failed: {os.strerror(code)}")
    return int(fd)


def _raise(step: str, code: int) -> None:
    code = abs(code) or errno_codes.EINVAL
    raise BPFError(code, f"{step}: {os.strerror(code)}", tuple(_libbpf.recent_log()[-4:]))


class BPFMap:
    """One map of a loaded object: raw-bytes access through the bpf() syscall wrappers.

    Keys and values are ``bytes`` (or any object supporting the buffer protocol of the right size, e.g. a ctypes
    structure from :mod:`otel_gpu.ebpf.abi`). Per-CPU maps return one value per possible CPU, concatenated, each
    padded to 8 bytes.
    """

    def __init__(self, handle: int, name: str) -> None:
        lib = _libbpf.lib()
        self.name = name
        self.fd = lib.bpf_map__fd(handle)
        self.key_size = int(lib.bpf_map__key_size(handle))
        self.value_size = int(lib.bpf_map__value_size(handle))
        self.max_entries = int(lib.bpf_map__max_entries(handle))
        self.per_cpu = lib.bpf_map__type(handle) in _libbpf.PERCPU_MAP_TYPES
        if self.per_cpu:
            self.value_size = ((self.value_size + 7) // 8 * 8) * lib.libbpf_num_possible_cpus()
        self._lib = lib

    def lookup(self, key: bytes | ctypes.Structure | ctypes._SimpleCData) -> bytes | None:
        """The value stored under ``key``, or None when absent."""
        value = ctypes.create_string_buffer(self.value_size)
        err = self._lib.bpf_map_lookup_elem(self.fd, _buffer(key), value)
        if err == -errno_codes.ENOENT:
            return None
        if err:
            _raise(f"lookup in map {self.name}", err)
        return value.raw

    def update(self, key: bytes | ctypes.Structure | ctypes._SimpleCData,
               value: bytes | ctypes.Structure | ctypes._SimpleCData, flags: int = 0) -> None:
        """Store ``value`` under ``key`` (flags: 0 any, 1 only new, 2 only existing)."""
        err = self._lib.bpf_map_update_elem(self.fd, _buffer(key), _buffer(value), flags)
        if err:
            _raise(f"update of map {self.name}", err)

    def delete(self, key: bytes | ctypes.Structure | ctypes._SimpleCData) -> bool:
        """Delete ``key``; False when it was absent."""
        err = self._lib.bpf_map_delete_elem(self.fd, _buffer(key))
        if err == -errno_codes.ENOENT:
            return False
        if err:
            _raise(f"delete in map {self.name}", err)
        return True

    def keys(self) -> Iterator[bytes]:
        """Every key, in the kernel's iteration order (entries added meanwhile may or may not appear)."""
        previous: ctypes.Array[ctypes.c_char] | None = None
        current = ctypes.create_string_buffer(self.key_size)
        while True:
            err = self._lib.bpf_map_get_next_key(self.fd, previous, current)
            if err == -errno_codes.ENOENT:
                return
            if err:
                _raise(f"iterating map {self.name}", err)
            yield current.raw
            previous, current = current, ctypes.create_string_buffer(self.key_size)

    def items(self) -> Iterator[tuple[bytes, bytes]]:
        """Every (key, value); keys deleted while iterating are skipped."""
        for key in list(self.keys()):
            value = self.lookup(key)
            if value is not None:
                yield key, value

    def clear(self) -> int:
        """Delete every entry; returns how many were deleted."""
        return sum(1 for key in list(self.keys()) if self.delete(key))

    def pop_all(self) -> list[tuple[bytes, bytes]]:
        """Read and delete every entry. Uses the kernel's batch lookup-and-delete (atomic per hash bucket, so an
        entry updated concurrently is either returned or kept, never lost); falls back to per-key lookup and
        delete where batches are not supported."""
        try:
            return self._pop_batch()
        except BPFError as exc:
            if exc.errno not in (errno_codes.EINVAL, errno_codes.ENOTSUP, errno_codes.EOPNOTSUPP, 524):
                raise
        out = []
        for key in list(self.keys()):
            value = self.lookup(key)
            if value is not None and self.delete(key):
                out.append((key, value))
        return out

    def _pop_batch(self) -> list[tuple[bytes, bytes]]:
        # entries per call: buffers of at most _BATCH_BYTES (a walked stack's value is ~1 KiB: 4,096 of them were a
        # 4 MiB buffer zeroed, mapped and copied whole at every drain), more calls for a fuller map
        capacity = max(1, min(self.max_entries, 4096, _BATCH_BYTES // max(1, self.key_size + self.value_size)))
        keys = ctypes.create_string_buffer(self.key_size * capacity)
        values = ctypes.create_string_buffer(self.value_size * capacity)
        token = ctypes.create_string_buffer(max(self.key_size, 8))
        opts = _libbpf.MapBatchOpts(sz=ctypes.sizeof(_libbpf.MapBatchOpts))
        out: list[tuple[bytes, bytes]] = []
        first = True
        while True:
            count = ctypes.c_uint32(capacity)
            err = self._lib.bpf_map_lookup_and_delete_batch(self.fd, None if first else token, token, keys, values,
                                                            ctypes.byref(count), ctypes.byref(opts))
            if err and err != -errno_codes.ENOENT:
                if err == -errno_codes.ENOSPC and capacity < self.max_entries:  # a bucket larger than the buffer
                    capacity = min(self.max_entries, capacity * 4)
                    keys = ctypes.create_string_buffer(self.key_size * capacity)
                    values = ctypes.create_string_buffer(self.value_size * capacity)
                    continue
                _raise(f"batch drain of map {self.name}", err)
            first = False
            ks, vs = self.key_size, self.value_size
            key_raw, value_raw = ctypes.string_at(keys, count.value * ks), ctypes.string_at(values, count.value * vs)
            out.extend((key_raw[i * ks:(i + 1) * ks], value_raw[i * vs:(i + 1) * vs]) for i in range(count.value))
            if err == -errno_codes.ENOENT:
                return out


def _record_bytes(address: int, size: int) -> bytes:
    """A copy of the record libbpf hands a callback (half the cost of ctypes.string_at, a foreign call itself)."""
    return (ctypes.c_char * size).from_address(address).raw


class RingBuffer:
    """A BPF ring buffer map with a callback for each record (``callback(data: bytes)``)."""

    def __init__(self, map_fd: int, name: str, callback: Callable[[bytes], None]) -> None:
        self.name = name
        self._lib = _libbpf.lib()
        self._callback = callback
        self._errors = 0

        def on_sample(ctx: int | None, data: int, size: int) -> int:
            try:
                callback(_record_bytes(data, size))
            except Exception:  # loop boundary inside a C callback: an exception must not cross into libbpf
                self._errors += 1
                if self._errors == 1:
                    _logger.exception("ring buffer %s callback failed (further failures are only counted)", name)
            return 0

        self._fns = [_libbpf.RING_BUFFER_SAMPLE_FN(on_sample)]
        self._handle: int | None = self._lib.ring_buffer__new(map_fd, self._fns[0], None, None)
        if not self._handle:
            _raise(f"ring_buffer__new({name})", _libbpf.errno())

    def add(self, map_fd: int, name: str, callback: Callable[[bytes], None]) -> None:
        """Also watch the ring buffer map ``map_fd``: one :meth:`poll` then waits on both."""

        def on_sample(ctx: int | None, data: int, size: int) -> int:
            try:
                callback(_record_bytes(data, size))
            except Exception:  # loop boundary inside a C callback
                self._errors += 1
                if self._errors == 1:
                    _logger.exception("ring buffer %s callback failed (further failures are only counted)", name)
            return 0

        fn = _libbpf.RING_BUFFER_SAMPLE_FN(on_sample)
        err = self._lib.ring_buffer__add(self._handle, map_fd, fn, None)
        if err:
            _raise(f"ring_buffer__add({name})", err)
        self._fns.append(fn)

    @property
    def callback_errors(self) -> int:
        """How many records the callback failed on."""
        return self._errors

    def poll(self, timeout_ms: int) -> int:
        """Wait up to ``timeout_ms`` for records and handle them; returns how many were handled (EINTR: 0)."""
        if self._handle is None:
            return 0
        n = self._lib.ring_buffer__poll(self._handle, timeout_ms)
        if n == -errno_codes.EINTR:
            return 0
        if n < 0:
            _raise(f"polling ring buffer {self.name}", n)
        return int(n)

    @property
    def epoll_fd(self) -> int:
        """The descriptor that becomes readable when a record is there to handle (to wait on it with others)."""
        if self._handle is None:
            return -1
        return int(self._lib.ring_buffer__epoll_fd(self._handle))

    def consume(self) -> int:
        """Handle every record available now without waiting."""
        if self._handle is None:
            return 0
        n = self._lib.ring_buffer__consume(self._handle)
        if n < 0:
            _raise(f"consuming ring buffer {self.name}", n)
        return int(n)

    def free(self) -> None:
        """Release the ring buffer (idempotent). Not while another thread is inside :meth:`poll`."""
        if self._handle is not None:
            self._lib.ring_buffer__free(self._handle)
            self._handle = None


class BPFObject:
    """One opened, configured and loaded eBPF object with its attachments; a context manager."""

    def __init__(self, path: str | os.PathLike[str], rodata: Mapping[str, int | bytes] | None = None,
                 max_entries: Mapping[str, int] | None = None, reuse_maps: Mapping[str, int] | None = None) -> None:
        """``reuse_maps``: map name -> fd of a map another object loaded, used instead of creating one (its
        definition must match)."""
        self.path = Path(path)
        self._lib = _libbpf.lib()
        self._obj: int | None = None
        self._links: list[int] = []
        self._rings: list[RingBuffer] = []
        self._maps: dict[str, BPFMap] = {}
        if not self.path.is_file():
            raise BPFError(errno_codes.ENOENT, f"BPF object {self.path} not found (run make build)")
        _libbpf.clear_log()
        obj = self._lib.bpf_object__open_file(os.fsencode(self.path), None)
        if not obj:
            _raise(f"opening {self.path.name}", _libbpf.errno())
        self._obj = obj
        try:
            for name, entries in (max_entries or {}).items():
                err = self._lib.bpf_map__set_max_entries(self._map_handle(name), entries)
                if err:
                    _raise(f"setting max_entries of map {name}", err)
            for name, fd in (reuse_maps or {}).items():
                err = self._lib.bpf_map__reuse_fd(self._map_handle(name), fd)
                if err:
                    _raise(f"reusing map {name}", err)
            if rodata:
                self._set_rodata(rodata)
            err = self._lib.bpf_object__load(obj)
            if err:
                _raise(f"loading {self.path.name}", err)
        except BaseException:
            self.close()
            raise

    # --- attach ----------------------------------------------------------------------------------------------------

    def attach_perf_event(self, program: str, frequency_hz: int, cpus: list[int] | None = None) -> int:
        """Attach ``program`` to a software cpu-clock event sampling at ``frequency_hz`` on each of ``cpus``
        (default: every online CPU). Returns the number of CPUs attached."""
        handle = self._program_handle(program)
        targets = online_cpus() if cpus is None else cpus
        for cpu in targets:
            fd = open_cpu_clock_event(cpu, frequency_hz)
            link = self._lib.bpf_program__attach_perf_event(handle, fd)
            if not link:
                code = _libbpf.errno()
                os.close(fd)
                _raise(f"attaching {program} to the perf event of cpu {cpu}", code)
            self._links.append(link)  # destroying the link disables and closes the perf fd
        return len(targets)

    def attach_uprobe(self, program: str, binary: str, function: str = "", offset: int = 0, pid: int = -1,
                      retprobe: bool = False, ref_ctr_offset: int = 0, cookie: int = 0) -> None:
        """Attach ``program`` at the entry (or return) of ``function`` in ``binary`` (an executable or library path),
        in process ``pid`` or every process (-1). Without ``function``, ``offset`` is a file offset."""
        opts = _libbpf.UprobeOpts(sz=ctypes.sizeof(_libbpf.UprobeOpts), ref_ctr_offset=ref_ctr_offset,
                                  bpf_cookie=cookie, retprobe=retprobe,
                                  func_name=function.encode() if function else None)
        _libbpf.clear_log()
        link = self._lib.bpf_program__attach_uprobe_opts(self._program_handle(program), pid, os.fsencode(binary),
                                                         offset, ctypes.byref(opts))
        if not link:
            _raise(f"attaching uprobe {program} to {binary}:{function or hex(offset)}", _libbpf.errno())
        self._links.append(link)

    def attach_usdt(self, program: str, binary: str, provider: str, name: str, pid: int = -1,
                    cookie: int = 0) -> None:
        """Attach ``program`` to the USDT probe ``provider:name`` of ``binary`` in process ``pid`` or every process
        (-1). Probes guarded by a semaphore are enabled through the kernel's reference counter while attached."""
        opts = _libbpf.UsdtOpts(sz=ctypes.sizeof(_libbpf.UsdtOpts), usdt_cookie=cookie)
        _libbpf.clear_log()
        link = self._lib.bpf_program__attach_usdt(self._program_handle(program), pid, os.fsencode(binary),
                                                  provider.encode(), name.encode(), ctypes.byref(opts))
        if not link:
            _raise(f"attaching USDT {program} to {binary}:{provider}:{name}", _libbpf.errno())
        self._links.append(link)

    # --- maps ------------------------------------------------------------------------------------------------------

    def map(self, name: str) -> BPFMap:
        """The map called ``name``."""
        if name not in self._maps:
            self._maps[name] = BPFMap(self._map_handle(name), name)
        return self._maps[name]

    def ring_buffer(self, name: str, callback: Callable[[bytes], None],
                    more: Mapping[str, Callable[[bytes], None]] | None = None) -> RingBuffer:
        """A :class:`RingBuffer` over the ring buffer map ``name`` (and the maps in ``more``, each with its own
        callback, polled together); freed by :meth:`close`."""
        ring = RingBuffer(self.map(name).fd, name, callback)
        self._rings.append(ring)
        for other, other_callback in (more or {}).items():
            ring.add(self.map(other).fd, other, other_callback)
        return ring

    # --- lifecycle -------------------------------------------------------------------------------------------------

    def detach(self) -> None:
        """Destroy every link (perf events, uprobes, USDT probes); the object stays loaded."""
        while self._links:
            self._lib.bpf_link__destroy(self._links.pop())

    def close(self) -> None:
        """Detach everything, free ring buffers, unload programs and maps. Idempotent."""
        self.detach()
        while self._rings:
            self._rings.pop().free()
        self._maps.clear()
        if self._obj is not None:
            self._lib.bpf_object__close(self._obj)
            self._obj = None

    def program_ids(self) -> dict[str, int]:
        """The kernel's id of each loaded program of this object, by program name (what ``bpftool prog`` lists);
        empty once closed. Ids are not reused soon, so they tell this object's programs from another agent's."""
        ids: dict[str, int] = {}
        if self._obj is None:
            return ids
        program = self._lib.bpf_object__next_program(self._obj, None)
        while program:
            fd = self._lib.bpf_program__fd(program)
            if fd >= 0:
                info = _libbpf.ProgInfoHead()
                size = ctypes.c_uint32(ctypes.sizeof(info))
                err = self._lib.bpf_obj_get_info_by_fd(fd, ctypes.byref(info), ctypes.byref(size))
                if err:
                    _raise(f"reading the id of a program of {self.path.name}", err)
                ids[self._lib.bpf_program__name(program).decode()] = int(info.id)
            program = self._lib.bpf_object__next_program(self._obj, program)
        return ids

    @property
    def closed(self) -> bool:
        return self._obj is None

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- internals -------------------------------------------------------------------------------------------------

    def _map_handle(self, name: str) -> int:
        if self._obj is None:
            raise BPFError(errno_codes.EBADF, f"{self.path.name} is closed")
        handle = self._lib.bpf_object__find_map_by_name(self._obj, name.encode())
        if not handle:
            raise BPFError(errno_codes.ENOENT, f"{self.path.name} has no map {name!r}")
        return int(handle)

    def _program_handle(self, name: str) -> int:
        if self._obj is None:
            raise BPFError(errno_codes.EBADF, f"{self.path.name} is closed")
        handle = self._lib.bpf_object__find_program_by_name(self._obj, name.encode())
        if not handle:
            raise BPFError(errno_codes.ENOENT, f"{self.path.name} has no program {name!r}")
        return int(handle)

    def _set_rodata(self, values: Mapping[str, int | bytes]) -> None:
        """Write ``const volatile`` globals by name into .rodata, using the object's BTF for offsets and sizes."""
        rodata = self._map_handle(".rodata")
        size = ctypes.c_size_t()
        base = self._lib.bpf_map__initial_value(rodata, ctypes.byref(size))
        if not base:
            _raise("reading .rodata", errno_codes.ENOENT)
        layout = self._datasec_layout(".rodata")
        for name, value in values.items():
            if name not in layout:
                raise BPFError(errno_codes.ENOENT, f"{self.path.name} has no const volatile {name!r}")
            offset, width = layout[name]
            raw = value if isinstance(value, bytes) else int(value).to_bytes(width, "little", signed=int(value) < 0)
            if len(raw) > width or offset + width > size.value:
                raise BPFError(errno_codes.EINVAL, f"{name!r} takes {width} bytes, got {len(raw)}")
            ctypes.memmove(base + offset, raw.ljust(width, b"\0"), width)

    def _datasec_layout(self, section: str) -> dict[str, tuple[int, int]]:
        btf = self._lib.bpf_object__btf(self._obj)
        if not btf:
            raise BPFError(errno_codes.ENOENT, f"{self.path.name} has no BTF (compile with -g)")
        type_id = self._lib.btf__find_by_name_kind(btf, section.encode(), _libbpf.BTF_KIND_DATASEC)
        if type_id < 0:
            raise BPFError(errno_codes.ENOENT, f"{self.path.name} has no {section} section")
        datasec = self._lib.btf__type_by_id(btf, type_id)
        vlen = datasec.contents.info & 0xFFFF
        secinfos = ctypes.cast(ctypes.addressof(datasec.contents) + ctypes.sizeof(_libbpf.BtfType),
                               ctypes.POINTER(_libbpf.BtfVarSecinfo))
        layout: dict[str, tuple[int, int]] = {}
        for i in range(vlen):
            info = secinfos[i]
            var = self._lib.btf__type_by_id(btf, info.type)
            name = self._lib.btf__name_by_offset(btf, var.contents.name_off)
            layout[name.decode()] = (info.offset, info.size)
        return layout


def _buffer(value: bytes | ctypes.Structure | ctypes._SimpleCData) -> ctypes.Array[ctypes.c_char] | object:
    if isinstance(value, bytes | bytearray):
        return ctypes.create_string_buffer(bytes(value), len(value))
    return ctypes.byref(value)
