# SPDX-License-Identifier: Apache-2.0
"""One fuzz target per parser of outside input, and the seeds each starts from.

A target takes the bytes a hostile process could put in front of the agent and runs the parser the way the agent
does. The only exceptions a parser may raise are the ones its caller handles (``ElfError``
for an ELF file, nothing for the others); anything else, and any broken invariant (an ``AssertionError`` here), is a
crash. Seeds come from real files on this machine where they are safe to copy (ELF binaries, /proc/self/maps,
stat, status, cgroup, /proc/kallsyms) and from small hand-written examples where the real file may hold secrets
(environ).
"""

from __future__ import annotations

import os
import struct
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

from otel_gpu import config as config_module
from otel_gpu import procfs
from otel_gpu.cuda import abi as cuda_abi
from otel_gpu.symbolize import elf as elf_module
from otel_gpu.symbolize import kallsyms, maps, native_symtab, perfmap, symbolizer
from otel_gpu.unwind import cfi, native_table

REPO = Path(__file__).resolve().parents[2]
_HEX = frozenset("0123456789abcdef")
scratch = Path(tempfile.gettempdir())  # where the perf map target writes its file (the runner sets its own)


def elf(data: bytes) -> None:
    """A whole ELF file: headers, load segments, notes (build id), .symtab/.dynsym and their string tables."""
    try:
        symbols = elf_module.ElfSymbols("<fuzz>", image=data)
    except elf_module.ElfError:
        return
    starts = list(symbols._starts)
    assert starts == sorted(starts), "symbols out of order"
    assert len(starts) * elf_module._SYM.size <= 2 * len(data), "more symbols than the file holds"
    assert len(symbols.build_id) <= 2 * elf_module._MAX_BUILD_ID_BYTES and set(symbols.build_id) <= _HEX
    for start in starts[:64]:
        found = symbols.lookup(start)
        assert found is not None and found[1] == 0 and len(found[0]) <= elf_module._MAX_NAME_BYTES
    for segment in symbols.segments[:16]:
        symbols.vaddr_of(segment.offset)
    assert symbols.size_bytes >= 0
    symbols.close()


def symtab(data: bytes) -> None:
    """A whole ELF file's symbol tables read by the native reader the agent uses: exactly the Python reference's
    arrays, never a crash (a native fault ends the fuzzing process: libFuzzer reports it as a crash)."""
    assert native_symtab.available(), "libotel_gpu_symtab.so is not built: run `make build`"
    found = []
    for native in (True, False):
        try:
            symbols = elf_module.ElfSymbols("<fuzz>", image=data, native=native)
        except elf_module.ElfError:
            found.append(None)
            continue
        found.append(tuple((array.typecode, array.tobytes()) for array in (symbols._starts, symbols._sizes,
                                                                          symbols._name_at)))
        symbols.close()
    assert found[0] == found[1], "native and reference symbol tables differ"


def elf_notes(data: bytes) -> None:
    """A block of ELF notes, searched for the GNU build id."""
    found = elf_module._build_id(data)
    assert len(found) <= 2 * elf_module._MAX_BUILD_ID_BYTES and set(found) <= _HEX


def perf_map(data: bytes) -> None:
    """A JIT perf map, read in two steps (what a process writes between two drains is appended), with a small cap so
    the cut at the cap is reached too."""
    path = scratch / f"perf-{os.getpid()}.map"
    half = len(data) // 2
    path.write_bytes(data[:half])
    found = perfmap.PerfMap(str(path), max_bytes=_PERF_MAP_CAP_BYTES)
    with path.open("ab") as handle:
        handle.write(data[half:])
    found.refresh()
    assert found._read_bytes <= found.max_bytes and len(found) <= data.count(b"\n") + 1
    for start, end, name in zip(found._starts[:64], found._ends[:64], found._names[:64], strict=True):
        assert 0 <= start < end <= 2 << 64 and len(name) <= perfmap._MAX_NAME_CHARS
        assert found.lookup(start) is not None


def proc_maps(data: bytes) -> None:
    """/proc/PID/maps (the paths are the process's choice), then the lookups the symbolizer does on it."""
    entries = maps.parse_maps(data.decode("utf-8", errors="surrogateescape"))
    process = symbolizer._Process(1, entries)
    for entry in process.entries[:64]:
        assert "\n" not in entry.path
        found = process.find(entry.start)
        assert found is None or found.start <= entry.start < found.end


def stat(data: bytes) -> None:
    """/proc/PID/stat (the name in it is the process's choice: any 16 bytes, parentheses included)."""
    assert procfs.parse_stat_start_time(data) >= 0


def status(data: bytes) -> None:
    """/proc/PID/status, searched for the pid in the process's own pid namespace."""
    found = procfs.parse_namespace_pid(data)
    assert found is None or found >= 0


def cgroup(data: bytes) -> None:
    """/proc/PID/cgroup, searched for a container id and a Kubernetes pod uid."""
    container_id, pod_uid = procfs.parse_cgroup(data.decode(errors="replace"))
    assert container_id == "" or (len(container_id) == 64 and set(container_id) <= _HEX)
    # a pod's uid with dashes, or a static pod's (its manifest's hash: 32 hex digits)
    assert pod_uid == "" or (len(pod_uid) == 36 and set(pod_uid) <= _HEX | {"-"}) \
        or (len(pod_uid) == 32 and set(pod_uid) <= _HEX)


def environ(data: bytes) -> None:
    """/proc/PID/environ, searched for OTEL_SERVICE_NAME."""
    assert len(procfs.parse_service_name(data)) <= procfs.MAX_SERVICE_NAME_CHARS


def kernel_symbols(data: bytes) -> None:
    """/proc/kallsyms (or the file the setting points at)."""
    symbols = kallsyms.KernelSymbols("<fuzz>", text=data)
    starts = list(symbols._starts)
    assert starts == sorted(starts), "kernel symbols out of order"
    for address in starts[:64]:
        found = symbols.lookup(address)
        assert found is not None and found[1] == 0


def gpu_record(data: bytes) -> None:
    """A GPU-time ring-buffer record (a launch, sync, activity or window record). The injected library writes them
    inside the profiled process, so that process can write anything into its own: decoding raises DecodeError (the
    source counts it) or gives a record within the struct's bounds."""
    try:
        record = cuda_abi.decode_event(data)
    except cuda_abi.DecodeError:
        return
    stack = getattr(record, "stack", None)
    if stack is not None:
        assert len(stack.native) <= cuda_abi.MAX_NATIVE_FRAMES and len(stack.python) <= cuda_abi.MAX_PYTHON_FRAMES
        assert len(stack.kernel_native) <= cuda_abi.KSTACK_DEPTH
        for frame in stack.python:
            assert len(frame.name) + len(frame.filename) <= 2 * cuda_abi.MAX_STRINGS and 0 <= frame.line < 1 << 32
    if isinstance(record, cuda_abi.Window):
        assert len(record.graph_replays) <= cuda_abi.GRAPH_SLOTS
    if isinstance(record, cuda_abi.Activity):
        assert len(record.name) < cuda_abi.MAX_NAME


def cfi_table(data: bytes) -> None:
    """A frame section (the first byte's low bit: .eh_frame or .debug_frame) built into an unwind table by the native
    builder the agent uses: exactly the reference interpreter's table, never a crash (a native fault ends the
    fuzzing process: libFuzzer reports it as a crash)."""
    is_eh = not data[:1] or bool(data[0] & 1)
    section = data[1:]
    pcs, rules = native_table.build_rows(section, _CFI_VADDR, is_eh)
    reference = cfi.table_from_fdes(cfi.parse_frames(section, _CFI_VADDR, is_eh), "")
    assert len(pcs) == len(rules) and len(pcs) <= len(section)
    assert (pcs, rules) == (reference.pcs, reference.rules), "native and reference tables differ"


_CFI_VADDR = 0x5000


def config_file(data: bytes) -> None:
    """A YAML configuration file as someone may write it (or a file put where the agent reads its configuration):
    either a valid configuration or a ConfigError naming the problems, never another exception, never a hang."""
    path = scratch / f"otel-gpu-config-{os.getpid()}.yaml"
    path.write_bytes(data)
    _load_config({"OTEL_GPU_CONFIG_FILE": str(path)})


def config_environment(data: bytes) -> None:
    """The agent's environment: NUL-separated NAME=value pairs, the names steered toward the agent's own variables."""
    environ: dict[str, str] = {}
    for pair in data.split(b"\0")[:64]:
        name, _, value = pair.partition(b"=")
        text = name.decode("utf-8", "replace")
        if not text.startswith("OTEL_"):
            text = (_CONFIG_NAMES[len(name) % len(_CONFIG_NAMES)] + text)[:64]
        environ[text] = value.decode("utf-8", "surrogateescape")
    _load_config(environ)


def _load_config(environ: dict[str, str]) -> None:
    try:
        loaded = config_module.load(None, environ)
    except config_module.ConfigError as exc:
        assert exc.args and all(isinstance(problem, str) for problem in exc.args[0])
        return
    config_module.effective(loaded)  # what `otel-gpu config` prints


_CONFIG_NAMES = sorted({name for option in config_module.OPTIONS for name in option.env} | {
    "OTEL_GPU_CONFIG_FILE", "OTEL_METRIC_EXPORT_INTERVAL", "OTEL_GPU_"})


# the slowest first, so that a run of a fixed number of inputs each, a few at a time, ends soonest
TARGETS: dict[str, Callable[[bytes], None]] = {
    "kallsyms": kernel_symbols, "proc_maps": proc_maps, "perf_map": perf_map, "elf": elf, "symtab": symtab,
    "cfi": cfi_table, "gpu_record": gpu_record, "cgroup": cgroup,
    "environ": environ, "elf_notes": elf_notes, "status": status, "stat": stat, "config_file": config_file,
    "config_environment": config_environment,
}
# libFuzzer's -max_len per target: room for many lines or a small binary, small enough to stay fast (the parsers
# work line by line or table by table, so length adds time, not new paths)
MAX_LEN = {"elf": 64 << 10, "symtab": 64 << 10, "proc_maps": 16 << 10}
DEFAULT_MAX_LEN = 8 << 10
_PERF_MAP_CAP_BYTES = 4 << 10  # below MAX_LEN: the cut at the cap is reached too


# --- seeds -----------------------------------------------------------------------------------------------------------

def seeds(target: str) -> Iterator[bytes]:
    """Starting inputs for ``target``: real files of this machine where safe, hand-written examples otherwise."""
    yield from _SEEDS[target]()


def _read(path: str, limit: int) -> bytes:
    try:
        return procfs.read_capped(path, limit)[0]
    except OSError:
        return b""


def _elf_seeds() -> Iterator[bytes]:
    candidates = [REPO / "tests/native/workloads" / name for name in ("cpu_3to1", "cpu_3to1_stripped",
                                                                       "libuprobe_target.so")]
    for folder in ("/usr/bin", "/usr/lib/x86_64-linux-gnu"):
        try:
            candidates += sorted(Path(folder).iterdir())[:400]
        except OSError:
            continue
    small = []
    for path in candidates:
        try:
            size = path.stat().st_size
            if path.is_file() and 0 < size <= MAX_LEN["elf"] and path.read_bytes()[:6] == b"\x7fELF\x02\x01":
                small.append((size, path))
        except OSError:
            continue
    for _, path in sorted(small)[:12]:
        yield path.read_bytes()
    yield _synthetic_elf()


def _synthetic_elf() -> bytes:
    from tests.symbolize.elfgen import Symbol, write_elf
    path = Path(tempfile.mkdtemp()) / "synthetic"
    aliases = [("_alias_2", 0), (".cold", 2), (".isra.0", 1), ("..cold..f", 0)]  # (suffix, binding): names to choose
    write_elf(path, [Symbol(f"function_{i}", 0x1000 + 0x40 * i, 0x40) for i in range(16)]
              + [Symbol(f"function_{i}{suffix}", 0x1000 + 0x40 * i, 0x40, binding=binding)
                 for i, (suffix, binding) in enumerate(aliases)]
              + [Symbol("data", 0x9000, 8, kind=1), Symbol("undefined", 0, 0, shndx=0)])
    data = path.read_bytes()
    path.unlink()
    path.parent.rmdir()
    return data


def _note(name: bytes, kind: int, desc: bytes) -> bytes:
    def padded(value: bytes) -> bytes:
        return value + b"\0" * (-len(value) % 4)
    return struct.pack("<III", len(name), len(desc), kind) + padded(name) + padded(desc)


def _note_seeds() -> Iterator[bytes]:
    yield _note(b"GNU\0", 3, bytes(range(20)))
    yield _note(b"GNU\0", 1, bytes(16)) + _note(b"GNU\0", 3, bytes(range(8)))  # ABI tag first, as in most binaries
    yield _note(b"Go\0", 4, b"go-build-id") + _note(b"GNU\0", 3, bytes(range(16)))


def _cfi_seeds() -> Iterator[bytes]:
    """The head of libc's .eh_frame and of a .debug_frame, and sections drawn opcode by opcode."""
    import random

    from otel_gpu.unwind.table import frame_sections
    from tests.unwind.cfigen import synthetic_section
    for path in ("/lib/x86_64-linux-gnu/libc.so.6", str(REPO / "tests/native/workloads/cpu_3to1")):
        try:
            found = frame_sections(path)
        except (OSError, ValueError):
            continue
        if found is not None:
            yield bytes([found[0] == ".eh_frame"]) + found[2][:DEFAULT_MAX_LEN - 1]
    generator = random.Random(5)
    for _ in range(16):
        yield b"\x01" + synthetic_section(generator, _CFI_VADDR)


def _perf_map_seeds() -> Iterator[bytes]:
    yield b"7f0000001000 100 py::compute:/app/model.py\n7f0000002000 80 LazyCompile:*render app.js:3\n"
    yield "".join(f"{0x7F0000000000 + 0x40 * i:x} 40 jitted_{i} with spaces\n" for i in range(150)).encode()
    yield b"0x1000 0x10 a\r\n2000 0 zero-size\n1000 10 overlaps a\nnot a line\n"


def _proc_seeds(name: str) -> Callable[[], Iterator[bytes]]:
    def found() -> Iterator[bytes]:
        for pid in ("self", "1"):
            data = _read(f"/proc/{pid}/{name}", MAX_LEN.get(f"proc_{name}", DEFAULT_MAX_LEN))
            if data:
                yield data
    return found


def _maps_seeds() -> Iterator[bytes]:
    yield from _proc_seeds("maps")()
    yield (b"00400000-00452000 r-xp 00000000 08:02 173521 /usr/bin/dbus daemon\n"
           b"7f1c-7f1d r-xp 00001000 08:02 17 /tmp/x (deleted)\n7ffd-7ffe rw-p 00000000 00:00 0 [stack]\n"
           b"7f00-7f01 r-xp 00000000 00:00 0 /memfd:jit\\012x (deleted)\n")


def _stat_seeds() -> Iterator[bytes]:
    yield from _proc_seeds("stat")()
    yield b"4242 (a) b) (c) S 1 4242 4242 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 987654 1000 10 0 0 0 0 0\n"


def _status_seeds() -> Iterator[bytes]:
    yield from _proc_seeds("status")()
    yield b"Name:\tpython\nTgid:\t4242\nPid:\t4242\nNSpid:\t4242\t17\t1\nNSsid:\t1\n"


def _cgroup_seeds() -> Iterator[bytes]:
    yield from _proc_seeds("cgroup")()
    container = "3f" * 32
    yield f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1a2b3c4d_0000_1111_2222_333344445555" \
          f".slice/cri-containerd-{container}.scope\n".encode()
    yield f"12:cpu,cpuacct:/kubepods/besteffort/pod1a2b3c4d-0000-1111-2222-333344445555/{container}\n" \
          f"0::/system.slice/docker-{container}.scope\n".encode()


def _environ_seeds() -> Iterator[bytes]:
    yield b"PATH=/usr/bin:/bin\0HOME=/root\0OTEL_SERVICE_NAME=trainer\0LANG=C.UTF-8\0"
    yield b"OTEL_SERVICE_NAME=\xff\xfeodd bytes\0OTEL_SERVICE_NAME=second\0"
    yield b"A=" + b"x" * 2000 + b"\0OTEL_SERVICE_NAME=" + b"y" * 600


def _kallsyms_seeds() -> Iterator[bytes]:
    data = _read("/proc/kallsyms", 256 << 10)
    lines = data.splitlines(keepends=True)
    if lines:
        yield b"".join(lines[:150])
        yield b"".join(line for line in lines if b"[" in line)[:DEFAULT_MAX_LEN]
    yield (b"ffffffff81000000 T _stext\nffffffff81000100 t helper\nffffffff81000200 D some_data\n"
           b"ffffffffc0000000 t mod_fn\t[mymod]\nffffffff81000000 T srso_alias\n0000000000000000 T hidden\n")


def _gpu_record_seeds() -> Iterator[bytes]:
    """One record of each kind, as the library and the eBPF program write them."""
    import ctypes

    def event(kind: int, payload: bytes, with_kstack: bool) -> bytes:
        header = cuda_abi.EventC(type=kind, pid=7, tid=8, payload_len=len(payload), ktime_ns=5, comm=b"train")
        kstack = cuda_abi.KStackC(bytes=16)
        kstack.pcs[0], kstack.pcs[1] = 0xAAAA, 0xBBBB
        return bytes(header) + (bytes(kstack) if with_kstack else b"") + payload

    launch = cuda_abi.LaunchC(abi_version=cuda_abi.ABI_VERSION, kind=cuda_abi.LAUNCH_KERNEL, correlation_id=77,
                              cbid=307, window_id=3, timestamp_ns=1000)
    launch.stack.native_count = 2
    launch.stack.native[0], launch.stack.native[1] = 0x1111, 0x2222
    strings = b"model.forward\0/srv/model.py\0"
    ctypes.memmove(ctypes.addressof(launch) + cuda_abi.LaunchC.stack.offset + cuda_abi.StackC.strings.offset, strings,
                   len(strings))
    launch.stack.strings_len, launch.stack.python_count = len(strings), 1
    launch.stack.python[0] = cuda_abi.PythonFrameC(line=42, name_offset=0, filename_offset=14, first_line=40)
    used = cuda_abi.LaunchC.stack.offset + cuda_abi.StackC.strings.offset + len(strings)
    yield event(cuda_abi.EVENT_LAUNCH, bytes(launch)[:used], True)
    sync = cuda_abi.SyncC(abi_version=cuda_abi.ABI_VERSION, kind=cuda_abi.SYNC_STREAM, cbid=126, start_ns=10,
                          end_ns=50, weight=3)
    yield event(cuda_abi.EVENT_SYNC, bytes(sync)[:cuda_abi.SyncC.stack.offset + 64], True)
    activity = cuda_abi.ActivityC(kind=1, correlation_id=77, start_ns=1000, end_ns=2000, name_len=5)
    activity.name = b"gemm"
    yield event(cuda_abi.EVENT_ACTIVITY, bytes(activity)[:cuda_abi.ActivityC.name.offset + 8], False)
    window = cuda_abi.WindowC(abi_version=cuda_abi.ABI_VERSION, window_id=3, covered_ns=100, elapsed_ns=1000,
                              graph_count=1)
    window.graphs[0] = cuda_abi.GraphReplaysC(exec=0x55, replays=4)
    yield event(cuda_abi.EVENT_WINDOW, bytes(window), False)


_SEEDS: dict[str, Callable[[], Iterator[bytes]]] = {
    "elf": _elf_seeds, "symtab": _elf_seeds, "elf_notes": _note_seeds, "cfi": _cfi_seeds,
    "gpu_record": _gpu_record_seeds, "perf_map": _perf_map_seeds,
    "proc_maps": _maps_seeds,
    "stat": _stat_seeds, "status": _status_seeds, "cgroup": _cgroup_seeds, "environ": _environ_seeds,
    "kallsyms": _kallsyms_seeds, "config_file": lambda: iter(_CONFIG_FILE_SEEDS),
    "config_environment": lambda: iter(_CONFIG_ENV_SEEDS),
}

_CONFIG_FILE_SEEDS = (
    b"otlp:\n  endpoint: http://collector:4317\n  protocol: grpc\n  headers: {authorization: Bearer x}\n"
    b"metrics:\n  export_interval_s: 10\n  prometheus_port: 9400\nprofiling:\n  interval_s: 60\n",
    b"output:\n  dir: /tmp/out\nprofiling:\n  pids: [1, 2]\n  sample_frequency_hz: 19\n",
    b"a: &a [*a, *a]\nb: [&b x, *b]\n",
    b"otlp: {endpoint: 'http://[::1]:99999'}\n\xff\xfe",
)
_CONFIG_ENV_SEEDS = (
    b"OTEL_EXPORTER_OTLP_ENDPOINT=http://u:p@host:4317\0OTEL_EXPORTER_OTLP_HEADERS=a=b,c\0OTEL_GPU_PID=-4",
    b"OTEL_METRIC_EXPORT_INTERVAL=abc\0OTEL_GPU_PROFILING_INTERVAL=inf\0OTEL_GPU_OUTPUT_DIR=/proc/x",
    b"OTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf\0OTEL_GPU_METRICS_PROMETHEUS_PORT=0\0OTEL_GPU_VERBSE=1",
)
