# SPDX-License-Identifier: Apache-2.0
"""The symbolizer on live processes and on fake /proc trees: PIE bias, shared libraries, deleted and missing
binaries, perf maps, kernel symbols, maps parsing, demangling."""

from __future__ import annotations

import gc
import os
import shutil
import subprocess
import weakref
from pathlib import Path

import pytest

from otel_gpu import selfmetrics, semconv
from otel_gpu.profiles.model import FrameKind
from otel_gpu.symbolize.demangle import Demangler
from otel_gpu.symbolize.elf import ElfSymbols, dynamic_symbol_value
from otel_gpu.symbolize import kallsyms
from otel_gpu.symbolize.kallsyms import KernelSymbols
from otel_gpu.symbolize.maps import MAX_MAPS_BYTES, parse_maps, read_maps, read_maps_capped
from otel_gpu.symbolize.perfmap import MAX_PERF_MAP_BYTES, PerfMap
from otel_gpu.symbolize import symbolizer as symbolizer_module
from otel_gpu.symbolize.symbolizer import Symbolizer
from tests.conftest import NATIVE
from tests.symbolize.elfgen import Symbol, write_elf

WORKLOADS = NATIVE / "workloads"


def _start(binary: Path, *args: str) -> tuple[subprocess.Popen[str], int]:
    process = subprocess.Popen([str(binary), *args], stdout=subprocess.PIPE, text=True)
    assert process.stdout is not None
    return process, int(process.stdout.readline().split()[1])


def _runtime_address(pid: int, path: Path, function: str, offset_into: int = 4) -> int:
    """Where ``function`` (+offset_into) of ``path`` sits in process ``pid``."""
    elf = ElfSymbols(str(path))
    vaddr = next(start for start, name in elf.symbols() if name == function) + offset_into
    segment = next(s for s in elf.segments if s.vaddr <= vaddr < s.vaddr + s.file_size)
    file_offset = vaddr - segment.vaddr + segment.offset
    entries = read_maps(pid) or []
    real = os.path.realpath(path)
    entry = next(e for e in entries if e.path == real and e.offset <= file_offset < e.offset + (e.end - e.start))
    return entry.start + file_offset - entry.offset


@pytest.mark.parametrize("binary", ["cpu_3to1", "cpu_3to1_nopie"])
def test_live_process_frames_remove_the_load_bias(binary: str) -> None:
    path = WORKLOADS / binary
    process, pid = _start(path, "1")
    try:
        symbolizer = Symbolizer()
        assert symbolizer.remember(pid)
        leaf = _runtime_address(pid, path, "leaf_heavy")
        caller = _runtime_address(pid, path, "busy_loop", 12)
        (frames,) = symbolizer.user_stacks(pid, [[leaf, caller]])
    finally:
        process.kill()
        process.wait()
    assert [f.function for f in frames] == ["leaf_heavy", "busy_loop"]
    assert frames[0].address == leaf and frames[0].kind is FrameKind.NATIVE
    assert frames[0].mapping is not None and frames[0].mapping.path == os.path.realpath(path)
    assert frames[0].mapping.build_id == ElfSymbols(str(path)).build_id


def test_frames_in_a_shared_library() -> None:
    process, pid = _start(WORKLOADS / "uprobe_caller", "1", "3000")
    try:
        symbolizer = Symbolizer()
        address = _runtime_address(pid, WORKLOADS / "libuprobe_target.so", "otel_test_target", 1)
        (frames,) = symbolizer.user_stacks(pid, [[address]])
    finally:
        process.kill()
        process.wait()
    assert frames[0].function == "otel_test_target"
    assert frames[0].mapping is not None and frames[0].mapping.path.endswith("libuprobe_target.so")


@pytest.mark.parametrize("debug_dirs", [("/usr/lib/debug",), ()], ids=["with-debug-file", "dynsym-only"])
def test_libc_start_main_is_named_as_exported_not_by_its_local_alias(debug_dirs: tuple[str, ...]) -> None:
    """Every native stack ends in __libc_start_main; libc6-dbg's .symtab lists __libc_start_main_alias_2 and
    __libc_start_main_impl (local) before __libc_start_main@@GLIBC_2.34 (global) at its address."""
    libc = Path("/lib/x86_64-linux-gnu/libc.so.6")
    vaddr = dynamic_symbol_value(str(libc), "__libc_start_main") if libc.exists() else None
    if vaddr is None:
        pytest.skip(f"no glibc exporting __libc_start_main at {libc}")
    elf = ElfSymbols(str(libc))
    if debug_dirs and not Path(debug_dirs[0], ".build-id", elf.build_id[:2], f"{elf.build_id[2:]}.debug").exists():
        pytest.skip("no debug file for libc (install libc6-dbg): only .dynsym's names, which have no local alias")
    file_offset = elf.offset_of(vaddr + 0x40)  # a return address inside it
    assert file_offset is not None
    real = os.path.realpath(libc)
    entry = next(e for e in read_maps(os.getpid()) or [] if e.path == real and
                 e.offset <= file_offset < e.offset + e.end - e.start)  # this test's own process maps libc
    address = entry.start + file_offset - entry.offset
    (frames,) = Symbolizer(debug_dirs=debug_dirs).user_stacks(os.getpid(), [[address]])
    assert frames[0].function == "__libc_start_main"
    assert frames[0].mapping is not None and frames[0].mapping.path == real


def test_stripped_binary_gives_mapping_named_frames_with_build_id() -> None:
    path = WORKLOADS / "cpu_3to1_stripped"
    full = WORKLOADS / "cpu_3to1"
    process, pid = _start(path, "1")
    try:
        # same code as cpu_3to1, so its symbol offsets apply
        elf = ElfSymbols(str(full))
        vaddr = next(start for start, name in elf.symbols() if name == "leaf_heavy") + 4
        segment = next(s for s in elf.segments if s.vaddr <= vaddr < s.vaddr + s.file_size)
        file_offset = vaddr - segment.vaddr + segment.offset
        entry = next(e for e in read_maps(pid) or [] if e.path.endswith("cpu_3to1_stripped") and
                     e.offset <= file_offset < e.offset + e.end - e.start)
        address = entry.start + file_offset - entry.offset
        (frames,) = Symbolizer().user_stacks(pid, [[address]])
    finally:
        process.kill()
        process.wait()
    # named by the start of its function (4 bytes before: .eh_frame_hdr has it), the frame keeping its own address
    assert frames[0].function == f"cpu_3to1_stripped+0x{file_offset - 4:x}"
    assert frames[0].address == address and frames[0].system_name == ""
    assert frames[0].mapping is not None and frames[0].mapping.build_id == elf.build_id


def test_deleted_binary_is_still_symbolized_once_remembered(tmp_path: Path) -> None:
    copy = tmp_path / "doomed_3to1"
    shutil.copy2(WORKLOADS / "cpu_3to1", copy)
    process, pid = _start(copy, "2")
    try:
        leaf = _runtime_address(pid, copy, "leaf_light")
        symbolizer = Symbolizer()
        assert symbolizer.remember(pid)  # first sight: the file still exists
        copy.unlink()
        (frames,) = symbolizer.user_stacks(pid, [[leaf]])
        late = Symbolizer()  # first sight after deletion: read through /proc/PID/map_files (root) or not at all
        (late_frames,) = late.user_stacks(pid, [[leaf]])
    finally:
        process.kill()
        process.wait()
    assert frames[0].function == "leaf_light"
    assert late_frames[0].address == leaf and late_frames[0].mapping is not None
    expected = "leaf_light" if os.geteuid() == 0 else late_frames[0].mapping.path.rsplit("/", 1)[-1] + "+0x"
    assert late_frames[0].function.startswith(expected)


def test_missing_binary_and_unknown_memory_never_raise(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    (proc / "4242").mkdir(parents=True)
    (proc / "4242" / "maps").write_text(
        "555555554000-555555556000 r-xp 00001000 fd:01 999999 /nonexistent/app (deleted)\n"
        "7f0000000000-7f0000001000 r-xp 00000000 00:00 0 \n")
    symbolizer = Symbolizer(proc_root=str(proc))
    (gone, anon, outside) = symbolizer.user_stacks(4242, [[0x555555554010], [0x7F0000000010], [0x10]])
    assert gone[0].function == "app+0x1010" and gone[0].mapping is not None
    assert gone[0].mapping.path == "/nonexistent/app" and gone[0].mapping.file_offset == 0x1000
    assert anon[0].function == "[unknown] 0x7f0000000010" and anon[0].mapping is None
    assert outside[0].address == 0x10
    # a process never seen and already gone
    (never,) = symbolizer.user_stacks(777, [[0x1234]])
    assert never[0].address == 0x1234


def test_perf_map_names_jit_frames(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    pid = 900001  # not a real pid: the symbolizer falls back to /tmp/perf-PID.map
    (proc / str(pid)).mkdir(parents=True)
    (proc / str(pid) / "maps").write_text("7f0000000000-7f0000100000 rwxp 00000000 00:00 0 \n")
    perf_map = Path(f"/tmp/perf-{pid}.map")
    perf_map.write_text("7f0000001000 100 py::compute:/app/model.py\n7f0000002000 80 LazyCompile:*render app.js:3\n")
    try:
        symbolizer = Symbolizer(proc_root=str(proc))
        (frames,) = symbolizer.user_stacks(pid, [[0x7F0000001010, 0x7F0000002050, 0x7F0000003000]])
    finally:
        perf_map.unlink()
    assert frames[0].function == "py::compute:/app/model.py" and frames[0].kind is FrameKind.PYTHON
    assert frames[1].function == "LazyCompile:*render app.js:3" and frames[1].kind is FrameKind.NATIVE
    assert frames[2].address == 0x7F0000003000 and "0x7f0000003000" in frames[2].function


def test_perf_map_reads_only_what_was_appended(tmp_path: Path) -> None:
    path = tmp_path / "perf-2.map"
    path.write_text("1000 10 a\n2000 10 b\n3000 10 half-writ")  # the last line is still being written
    perf_map = PerfMap(str(path))
    assert len(perf_map) == 2 and perf_map.lookup(0x3005) is None
    read_before = perf_map._read_bytes
    with path.open("a") as handle:
        handle.write("ten\n0500 10 earlier\n")
    assert perf_map.refresh() and len(perf_map) == 4
    assert perf_map.lookup(0x3005) == "half-written" and perf_map.lookup(0x505) == "earlier"
    assert perf_map._read_bytes - read_before == len("3000 10 half-written\n0500 10 earlier\n")
    assert not perf_map.refresh()  # nothing new: nothing read
    path.unlink()
    path.write_text("4000 10 replaced\n")  # a new file of the same name (a new process with the same pid)
    assert perf_map.refresh() and len(perf_map) == 1 and perf_map.lookup(0x1005) is None


def test_perf_map_is_read_up_to_its_cap(tmp_path: Path) -> None:
    """Any process chooses its perf map's size: 50,000 lines (1.4 MB) read with a 64 KiB cap."""
    path = tmp_path / "perf-3.map"
    path.write_text("".join(f"{0x10000 + 16 * i:x} 10 jitted_function_{i}\n" for i in range(50_000)))
    perf_map = PerfMap(str(path), max_bytes=64 << 10)
    assert perf_map.truncated and 0 < len(perf_map) < 3000
    assert perf_map.lookup(0x10005) == "jitted_function_0"
    assert perf_map.lookup(0x10000 + 16 * 49_999) is None  # past the cap: unnamed
    assert not perf_map.refresh()
    garbage = tmp_path / "perf-4.map"
    garbage.write_bytes(b"x" * (200 << 10))  # no newline at all
    assert len(PerfMap(str(garbage), max_bytes=1 << 20)) == 0


def test_perf_map_parser(tmp_path: Path) -> None:
    path = tmp_path / "perf-1.map"
    path.write_text("1000 10 a\nnot a line\n2000 0 b with spaces\n")
    perf_map = PerfMap(str(path))
    assert len(perf_map) == 2
    assert perf_map.lookup(0x1005) == "a" and perf_map.lookup(0x1010) is None
    assert perf_map.lookup(0x2000) == "b with spaces"


def test_kernel_symbols_from_a_kallsyms_file(tmp_path: Path) -> None:
    path = tmp_path / "kallsyms"
    path.write_text("ffffffff81000000 T _stext\nffffffff81000100 t helper\nffffffff81000200 D some_data\n"
                    "ffffffffc0000000 t mod_fn\t[mymod]\n")
    symbols = KernelSymbols(str(path))
    assert symbols.lookup(0xFFFFFFFF81000105) == ("helper", 5, "")
    assert symbols.lookup(0xFFFFFFFFC0000010) == ("mod_fn", 0x10, "mymod")
    symbolizer = Symbolizer(kallsyms_path=str(path))
    frames = symbolizer.kernel_stack([0xFFFFFFFF81000100, 0xFFFFFFFF81000101])
    # the leaf is looked up as is, callers at return address - 1
    assert [f.function for f in frames] == ["helper", "helper"]
    assert all(f.kind is FrameKind.KERNEL for f in frames)
    hidden = tmp_path / "hidden"
    hidden.write_text("0000000000000000 T _stext\n")
    assert not KernelSymbols(str(hidden)).available
    assert Symbolizer(kallsyms_path=str(hidden)).kernel_stack([0xFFFFFFFF81000000])[0].function.startswith("[kernel]")


@pytest.mark.root
def test_real_kallsyms_has_the_syscall_entry() -> None:
    symbols = KernelSymbols()
    assert symbols.available
    with open("/proc/kallsyms") as handle:
        entry = next(line.split()[0] for line in handle if line.split()[2] == "do_syscall_64")
    assert symbols.lookup(int(entry, 16) + 3) == ("do_syscall_64", 3, "")


def test_maps_parser_handles_deleted_anonymous_and_spaces() -> None:
    entries = parse_maps(
        "00400000-00452000 r-xp 00000000 08:02 173521 /usr/bin/dbus daemon\n"
        "7f1c-7f1d r-xp 00001000 08:02 17 /tmp/x (deleted)\n"
        "7ffd-7ffe rw-p 00000000 00:00 0 [stack]\n")
    assert entries[0].path == "/usr/bin/dbus daemon" and entries[0].executable and entries[0].file_backed
    assert entries[1].deleted and entries[1].path == "/tmp/x" and entries[1].offset == 0x1000
    assert not entries[2].file_backed and not entries[2].executable


def test_demangler_keeps_raw_names_apart() -> None:
    demangler = Demangler()
    if demangler._tool is None:
        pytest.skip("c++filt (binutils) not installed")
    demangler.prepare(["_ZN3foo3barEv", "main", "_ZNSt6vectorIiSaIiEE9push_backERKi"])
    assert demangler.demangle("_ZN3foo3barEv") == "foo::bar()"
    assert demangler.demangle("main") == "main"
    assert demangler.demangle("_ZNSt6vectorIiSaIiEE9push_backERKi").startswith("std::vector<int")


def test_prune_forgets_exited_processes() -> None:
    process, pid = _start(WORKLOADS / "short_lived", "50")
    symbolizer = Symbolizer()
    assert symbolizer.remember(pid)
    process.wait()
    assert symbolizer.prune(keep=[pid]) == 0 and symbolizer.knows(pid)
    assert symbolizer.prune(keep=[]) == 1 and not symbolizer.knows(pid)


def test_a_reused_pid_gets_a_fresh_snapshot(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    (proc / "50").mkdir(parents=True)
    maps = proc / "50" / "maps"
    stat = proc / "50" / "stat"
    maps.write_text("555555554000-555555556000 r-xp 00000000 fd:01 1 /nonexistent/first\n")
    stat.write_text("50 (first) S " + " ".join(["0"] * 18) + " 1000 0 0\n")
    symbolizer = Symbolizer(proc_root=str(proc))
    assert symbolizer.remember(50)
    (before,) = symbolizer.user_stacks(50, [[0x555555554010]])
    maps.write_text("555555554000-555555556000 r-xp 00000000 fd:01 2 /nonexistent/second\n")
    assert symbolizer.remember(50)  # same process again: cached frames stay
    assert symbolizer.user_stacks(50, [[0x555555554010]])[0][0].function == before[0].function == "first+0x10"
    stat.write_text("50 (second) S " + " ".join(["0"] * 18) + " 2000 0 0\n")  # another start time: reused pid
    assert symbolizer.remember(50)
    assert symbolizer.user_stacks(50, [[0x555555554010]])[0][0].function == "second+0x10"


def test_stripped_binary_takes_symbols_from_its_debug_file_by_build_id(tmp_path: Path) -> None:
    objcopy = shutil.which("objcopy") or shutil.which("llvm-objcopy")
    if objcopy is None:
        pytest.skip("objcopy (binutils) not installed")
    full = ElfSymbols(str(WORKLOADS / "cpu_3to1"))
    debug_dir = tmp_path / "debug" / ".build-id" / full.build_id[:2]
    debug_dir.mkdir(parents=True)
    subprocess.run([objcopy, "--only-keep-debug", str(WORKLOADS / "cpu_3to1"),
                    str(debug_dir / f"{full.build_id[2:]}.debug")], check=True)
    path = WORKLOADS / "cpu_3to1_stripped"
    process, pid = _start(path, "1")
    try:
        vaddr = next(start for start, name in full.symbols() if name == "leaf_light") + 4
        segment = next(s for s in full.segments if s.vaddr <= vaddr < s.vaddr + s.file_size)
        file_offset = vaddr - segment.vaddr + segment.offset
        entry = next(e for e in read_maps(pid) or [] if e.path.endswith("cpu_3to1_stripped") and
                     e.offset <= file_offset < e.offset + e.end - e.start)
        symbolizer = Symbolizer(debug_dirs=[str(tmp_path / "debug")])
        (frames,) = symbolizer.user_stacks(pid, [[entry.start + file_offset - entry.offset]])
    finally:
        process.kill()
        process.wait()
    assert frames[0].function == "leaf_light"
    assert frames[0].mapping is not None and frames[0].mapping.path.endswith("cpu_3to1_stripped")


def test_vdso_frames_are_named_from_the_kernels_image() -> None:
    entry = next(e for e in read_maps(os.getpid()) or [] if e.path == "[vdso]")
    with open("/proc/self/mem", "rb") as memory:
        memory.seek(entry.start)
        image = ElfSymbols("[vdso]", memory.read(entry.end - entry.start))
    start = next(address for address, name in image.symbols() if "clock_gettime" in name)
    (frames,) = Symbolizer().user_stacks(os.getpid(), [[entry.start + start + 2]])
    assert "clock_gettime" in frames[0].function
    assert frames[0].mapping is not None and frames[0].mapping.path == "[vdso]"


def test_evicted_files_are_freed_and_read_again_when_needed() -> None:
    process, pid = _start(WORKLOADS / "uprobe_caller", "1", "3000")
    try:
        symbolizer = Symbolizer(max_files=1)  # every new file evicts the previous one
        library = WORKLOADS / "libuprobe_target.so"
        (first,) = symbolizer.user_stacks(pid, [[_runtime_address(pid, library, "otel_test_target", 1)]])
        (held,) = [elf for elf in symbolizer._files.values() if elf is not None]
        gone = weakref.ref(held)
        del held
        (caller,) = symbolizer.user_stacks(pid, [[_runtime_address(pid, WORKLOADS / "uprobe_caller", "main", 1)]])
        gc.collect()
        evicted = gone() is None  # nothing else holds the library's symbols (nor its file descriptor) now
        (again,) = symbolizer.user_stacks(pid, [[_runtime_address(pid, library, "otel_test_target", 2)]])
    finally:
        process.kill()
        process.wait()
    assert first[0].function == again[0].function == "otel_test_target" and caller[0].function == "main"
    assert evicted and len(symbolizer._files) == 1
    assert again[0].mapping is not None and first[0].mapping is not None
    assert again[0].mapping.build_id == first[0].mapping.build_id != ""
    assert symbolizer.evictions == 2  # the library, then the executable


def test_the_cache_is_bounded_by_bytes_of_symbols_and_counts_evictions() -> None:
    """Two files whose tables together pass max_symbol_bytes: the older goes, counted in the self-metric."""
    process, pid = _start(WORKLOADS / "uprobe_caller", "1", "3000")
    library = WORKLOADS / "libuprobe_target.so"
    executable = WORKLOADS / "uprobe_caller"
    one_file = max(ElfSymbols(str(library)).size_bytes, ElfSymbols(str(executable)).size_bytes)
    before = selfmetrics.total(semconv.SELF_ERRORS.name, otel_gpu__reason=semconv.Reason.SYMBOL_FILE_EVICTED)
    try:
        symbolizer = Symbolizer(max_symbol_bytes=one_file)  # room for either file, never both
        (first,) = symbolizer.user_stacks(pid, [[_runtime_address(pid, library, "otel_test_target", 1)]])
        held_one = symbolizer._symbol_bytes
        (second,) = symbolizer.user_stacks(pid, [[_runtime_address(pid, executable, "main", 1)]])
    finally:
        process.kill()
        process.wait()
    assert first[0].function == "otel_test_target" and second[0].function == "main"
    assert len(symbolizer._files) == 1 and symbolizer._symbol_bytes <= one_file and held_one <= one_file
    assert symbolizer.evictions == 1
    assert selfmetrics.total(semconv.SELF_ERRORS.name,
                             otel_gpu__reason=semconv.Reason.SYMBOL_FILE_EVICTED) == before + 1


def test_past_the_deadline_no_new_file_is_read_and_frames_keep_file_and_offset() -> None:
    """A deadline already passed: a frame in a file not yet read is named file+0xOFFSET with its mapping, counted,
    and not remembered (a later call with time names it); a file already read is still used."""
    process, pid = _start(WORKLOADS / "uprobe_caller", "1", "3000")
    library = WORKLOADS / "libuprobe_target.so"
    before = selfmetrics.total(semconv.SELF_ERRORS.name, otel_gpu__reason=semconv.Reason.SYMBOLS_DEFERRED)
    try:
        symbolizer = Symbolizer()
        main = _runtime_address(pid, WORKLOADS / "uprobe_caller", "main", 1)
        target = _runtime_address(pid, library, "otel_test_target", 1)
        (read,) = symbolizer.user_stacks(pid, [[main]])  # the executable's table is read (no deadline)
        (late,) = symbolizer.user_stacks(pid, [[target, main]], deadline=0.0)
        files_after_late = len(symbolizer._files)
        (named,) = symbolizer.user_stacks(pid, [[target, main]])
    finally:
        process.kill()
        process.wait()
    assert read[0].function == "main"
    assert late[0].function.startswith("libuprobe_target.so+0x") and late[0].address == target
    assert late[0].mapping is not None and late[0].mapping.path == os.path.realpath(library)
    assert late[0].mapping.build_id == ElfSymbols(str(library)).build_id != ""  # symbolizable off the node
    assert late[1].function == "main"  # its file was already read: the deadline does not cost it its name
    assert files_after_late == 1  # the library was not read
    assert named[0].function == "otel_test_target" and named[0].mapping is not None
    assert named[0].mapping.build_id != ""
    assert selfmetrics.total(semconv.SELF_ERRORS.name,
                             otel_gpu__reason=semconv.Reason.SYMBOLS_DEFERRED) == before + 1


def test_demangler_cache_is_bounded_by_bytes() -> None:
    demangler = Demangler(max_bytes=200)
    names = [f"_ZN3foo{len(str(i)) + 3}bar{i}Ev" for i in range(20)]  # foo::barN(), about 30 bytes each
    for name in names:
        demangler.prepare([name])
        assert demangler._bytes <= 200 and len(demangler._cache) <= 200 // len(name)
    if demangler._tool is not None:
        assert demangler.demangle(names[0]) == "foo::bar0()"  # dropped from the cache, demangled again


def test_kernel_symbols_out_of_order_and_at_one_address(tmp_path: Path) -> None:
    path = tmp_path / "kallsyms"
    path.write_text("ffffffffc0000100 t mod_b\t[mymod]\nffffffff81000000 T srso_alias\nffffffff81000000 T _stext\n"
                    "ffffffffc0000000 t mod_a\t[mymod]\nffffffff81000000 T _text\nffffffff81000200 t later\n")
    symbols = KernelSymbols(str(path))
    assert list(symbols._starts) == sorted(symbols._starts)
    assert symbols.lookup(0xFFFFFFFF81000010) == ("srso_alias", 0x10, "")  # the last of (address, name) order
    assert symbols.lookup(0xFFFFFFFF81000201) == ("later", 1, "")
    assert symbols.lookup(0xFFFFFFFFC0000005) == ("mod_a", 5, "mymod")
    assert symbols.lookup(0xFFFFFFFFC0000105) == ("mod_b", 5, "mymod")


def _errors(reason: str) -> float:
    return selfmetrics.total(semconv.SELF_ERRORS.name, otel_gpu__source="symbolizer", otel_gpu__reason=reason)


def _jit_process(tmp_path: Path, pid: int) -> tuple[Path, Path]:
    """A fake /proc with one process whose only mapping is anonymous executable memory (JIT code), and where its
    perf map goes (the copy of /tmp seen through its root)."""
    proc = tmp_path / "proc"
    (proc / str(pid) / "root" / "tmp").mkdir(parents=True)
    (proc / str(pid) / "maps").write_text("7f0000000000-7f0100000000 rwxp 00000000 00:00 0 \n")
    return proc, proc / str(pid) / "root" / "tmp" / f"perf-{pid}.map"


def test_a_perf_map_past_the_cap_is_read_up_to_it_and_counted_once(tmp_path: Path) -> None:
    proc, perf_map = _jit_process(tmp_path, 900003)
    line_bytes = len(f"{0x7F0000000000:x} 10 jitted_0000000\n")
    lines = MAX_PERF_MAP_BYTES // line_bytes + 1000
    perf_map.write_text("".join(f"{0x7F0000000000 + 16 * i:x} 10 jitted_{i:07}\n" for i in range(lines)))
    first, last = 0x7F0000000000 + 5, 0x7F0000000000 + 16 * (lines - 1) + 5
    before = _errors("perf_map_too_large")
    symbolizer = Symbolizer(proc_root=str(proc))
    (frames,) = symbolizer.user_stacks(900003, [[first, last]])
    assert frames[0].function == "jitted_0000000"
    assert frames[1].function == f"[unknown] 0x{last:x}"  # past the cap: unnamed, as any unknown JIT frame
    assert _errors("perf_map_too_large") - before == 1
    symbolizer.user_stacks(900003, [[first + 16]])  # looked at again on the next drain: not counted again
    assert _errors("perf_map_too_large") - before == 1


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", ["symlink", "fifo"])
def test_a_perf_map_that_is_not_a_regular_file_is_not_read(tmp_path: Path, kind: str) -> None:
    """The process names its perf map: a symbolic link to a file only root may read would put that file's lines in
    the profiles, a FIFO would make the drain wait for a writer forever (here: the test's timeout)."""
    proc, perf_map = _jit_process(tmp_path, 900004)
    secret = tmp_path / "root-only"
    secret.write_text("7f0000001000 100 secret_from_another_file\n")
    if kind == "symlink":
        perf_map.symlink_to(secret)
    else:
        os.mkfifo(perf_map)
    (frames,) = Symbolizer(proc_root=str(proc)).user_stacks(900004, [[0x7F0000001010]])
    assert frames[0].function == "[unknown] 0x7f0000001010"


def test_a_maps_file_past_the_cap_is_read_up_to_it_and_counted_once(tmp_path: Path) -> None:
    """A process chooses how many mappings it has and how long their paths are (65,530 of PATH_MAX: 268 MB)."""
    proc = tmp_path / "proc"
    (proc / "900005").mkdir(parents=True)
    line = "7f0000000000-7f0000001000 r-xp 00000000 fd:01 12345 /" + "x" * 4000 + "\n"
    (proc / "900005" / "maps").write_text(line * (MAX_MAPS_BYTES // len(line) + 10))
    found = read_maps_capped(900005, str(proc))
    assert found is not None and found[1] and len(found[0]) == MAX_MAPS_BYTES // len(line)  # whole lines only
    before = _errors("maps_too_large")
    symbolizer = Symbolizer(proc_root=str(proc))
    assert symbolizer.remember(900005)
    symbolizer.user_stacks(900005, [[0x10]])  # not in any mapping: the maps are read again, not counted again
    assert _errors("maps_too_large") - before == 1


def test_maps_lines_end_at_newlines_only() -> None:
    """A path may hold any byte but "\\n" (the kernel writes it as \\012): a form feed in a file name must not start a
    made-up mapping."""
    entries = parse_maps("7f00-7f01 r-xp 00000000 08:02 17 /tmp/a\x0c7f00-ffff r-xp 00000000 08:02 18 /usr/lib/x.so\n"
                         "7f02-7f03 r-xp 00000000 08:02 19 /tmp/b\u2028c\n")
    assert [(e.start, e.path) for e in entries] == [
        (0x7F00, "/tmp/a\x0c7f00-ffff r-xp 00000000 08:02 18 /usr/lib/x.so"), (0x7F02, "/tmp/b\u2028c")]


def test_kallsyms_lines_that_are_not_symbols_are_skipped(tmp_path: Path) -> None:
    """int() raised on a bad address and array() on one past 64 bits: kernel frames for every process were lost."""
    path = tmp_path / "kallsyms"
    path.write_bytes(b"zz T not_hex\n-10 T negative\n1_0 T underscore\n1ffffffffffffffff T past_64_bits\n"
                     b"ffffffff81000100 T good\t[mod\xff]\n" + b"ffffffff81000200 T " + b"n" * 100_000 + b"\n"
                     b"ffffffff81000300 t after_a_long_line\n")
    symbols = KernelSymbols(str(path))
    assert symbols.lookup(0xFFFFFFFF81000105) == ("good", 5, "mod\ufffd")
    assert symbols.lookup(0xFFFFFFFF81000301) == ("after_a_long_line", 1, "")
    name, _, _ = symbols.lookup(0xFFFFFFFF81000201) or ("", 0, "")
    assert set(name) == {"n"} and len(name) < 5000  # a line is read up to a bound
    frames = Symbolizer(kallsyms_path=str(path)).kernel_stack([0xFFFFFFFF81000105])
    assert frames[0].function == "good"


def test_a_kallsyms_file_past_the_cap_is_read_up_to_it_and_counted_once(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "kallsyms"
    line = b"ffffffff81000000 T first\n"
    path.write_bytes(line + b"".join(b"ffffffff%08x T later_%06d\n" % (0x81001000 + i, i) for i in range(100)))
    monkeypatch.setattr(kallsyms, "MAX_KALLSYMS_BYTES", len(line) * 3)
    before = _errors("kallsyms_too_large")
    symbolizer = Symbolizer(kallsyms_path=str(path))
    assert symbolizer.load_kernel_symbols()
    assert symbolizer.kernel_stack([0xFFFFFFFF81000005])[0].function == "first"
    assert symbolizer.kernel_stack([0xFFFFFFFF81001063])[0].function != "later_000099"  # past the cap
    assert _errors("kallsyms_too_large") - before == 1
    monkeypatch.setattr(kallsyms, "MAX_KALLSYMS_BYTES", path.stat().st_size)  # exactly the whole file: not capped
    assert not KernelSymbols(str(path)).truncated


def test_a_parser_failure_costs_that_file_its_symbols_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 10: an OverflowError from one process's mapped file ended every drain. Any parser failure now costs
    that file's names (counted as unreadable_elf); the next process's frames, in the same call, are named."""
    hostile = tmp_path / "hostile"
    hostile.write_bytes(b"\x7fELF\x02\x01\x01" + bytes(1000))
    real = WORKLOADS / "cpu_3to1"
    elf = ElfSymbols(str(real))
    vaddr = next(start for start, name in elf.symbols() if name == "leaf_heavy") + 4
    segment = next(s for s in elf.segments if s.vaddr <= vaddr < s.vaddr + s.file_size)
    proc = tmp_path / "proc"
    for pid, path, offset in ((900020, hostile, 0), (900021, real, segment.offset)):
        (proc / str(pid)).mkdir(parents=True)
        (proc / str(pid) / "maps").write_text(
            f"555555554000-555555600000 r-xp {offset:08x} fd:01 {path.stat().st_ino} {path}\n")
    parse = ElfSymbols._parse

    def failing_parse(self: ElfSymbols) -> None:
        if self.path.endswith("hostile"):
            raise OverflowError("Python int too large to convert to C ssize_t")  # what pread raised
        parse(self)
    monkeypatch.setattr(ElfSymbols, "_parse", failing_parse)
    before = _errors("unreadable_elf")
    symbolizer = Symbolizer(proc_root=str(proc))
    (bad,) = symbolizer.user_stacks(900020, [[0x555555554010]])
    (good,) = symbolizer.user_stacks(900021, [[0x555555554000 + vaddr - segment.vaddr]])
    assert bad[0].function == "hostile+0x10" and bad[0].mapping is not None
    assert good[0].function == "leaf_heavy"
    assert _errors("unreadable_elf") - before == 1


def test_a_file_with_a_stolen_build_id_does_not_name_another_process_s_frames(tmp_path: Path) -> None:
    """Any process can write an ELF file that claims another binary's build id and map it. Its names must stay its
    own: the real binary's frames in other processes keep the real names, whichever of the two is read first."""
    stolen = bytes(range(100, 120))
    real, fake = tmp_path / "libreal.so", tmp_path / "libfake.so"
    write_elf(real, [Symbol("real_function", 0x80, 0x40)], build_id=stolen)  # within the file's loaded bytes
    write_elf(fake, [Symbol("poisoned_name", 0x80, 0x40)], build_id=stolen)
    proc = tmp_path / "proc"
    for pid, path in ((900030, fake), (900031, real), (900032, fake)):
        (proc / str(pid)).mkdir(parents=True)
        (proc / str(pid) / "maps").write_text(f"7f0000000000-7f0000100000 r-xp 00000000 fd:01 {path.stat().st_ino} "
                                              f"{path}\n")
    symbolizer = Symbolizer(proc_root=str(proc))
    names = [symbolizer.user_stacks(pid, [[0x7F0000000090]])[0][0].function for pid in (900030, 900031, 900032)]
    assert names == ["poisoned_name", "real_function", "poisoned_name"]
    assert symbolizer.user_stacks(900031, [[0x7F0000000090]])[0][0].mapping.build_id == stolen.hex()


def test_paths_that_are_not_utf8_are_exported_readable(tmp_path: Path) -> None:
    """A mapped file's name may hold any byte but "/" and NUL: the frame and mapping keep it readable (U+FFFD), never
    as lone surrogates that the OTLP encoder refuses (for the whole batch)."""
    proc = tmp_path / "proc"
    (proc / "900022").mkdir(parents=True)
    (proc / "900022" / "maps").write_bytes(b"555555554000-555555600000 r-xp 00001000 fd:01 99 /gone/app-\xff\n"
                                           b"7f0000000000-7f0000001000 r-xp 00000000 00:00 0 [anon:jit-\xfe]\n")
    (file_frame, anon_frame) = Symbolizer(proc_root=str(proc)).user_stacks(900022, [[0x555555554010],
                                                                                       [0x7F0000000010]])
    assert file_frame[0].function == "app-\ufffd+0x1010"
    assert file_frame[0].mapping is not None and file_frame[0].mapping.path == "/gone/app-\ufffd"
    assert anon_frame[0].function == "[anon:jit-\ufffd] 0x7f0000000010"


def test_a_call_past_the_stack_cache_bound_names_every_stack(monkeypatch: pytest.MonkeyPatch) -> None:
    """A process with more distinct stacks than the cache keeps: the cache is emptied, and the stacks of the call
    that were remembered before are built again, not lost."""
    monkeypatch.setattr(symbolizer_module, "_STACK_CACHE_ENTRIES", 2)
    path = WORKLOADS / "cpu_3to1"
    process, pid = _start(path, "1")
    try:
        symbolizer = Symbolizer()
        assert symbolizer.remember(pid)
        leaf = _runtime_address(pid, path, "leaf_heavy")
        light = _runtime_address(pid, path, "leaf_light")
        caller = _runtime_address(pid, path, "busy_loop", 12)
        first = symbolizer.user_stacks(pid, [[leaf, caller], [light, caller]])  # fills the cache
        both = symbolizer.user_stacks(pid, [[leaf, caller], [caller]])  # one known, one new: past the bound
    finally:
        process.kill()
        process.wait()
    assert [[f.function for f in frames] for frames in first] == [["leaf_heavy", "busy_loop"],
                                                                  ["leaf_light", "busy_loop"]]
    assert [[f.function for f in frames] for frames in both] == [["leaf_heavy", "busy_loop"], ["busy_loop"]]


def test_the_program_an_exec_replaced_keeps_its_snapshot_apart() -> None:
    """remember(pid, image) before and after an exec: each program's addresses are named from its own mappings, the
    replaced one's never from /proc again, and an image never remembered gets no names at all."""
    process, pid = _start(WORKLOADS / "exec_after", "300", str(WORKLOADS / "cpu_3to1"), "5")
    try:
        before = _runtime_address(pid, WORKLOADS / "exec_after", "spin_before_exec")
        symbolizer = Symbolizer()
        assert symbolizer.remember(pid, image=1)
        assert process.stdout is not None and process.stdout.readline().startswith("ready")  # cpu_3to1's own
        after = _runtime_address(pid, WORKLOADS / "cpu_3to1", "leaf_heavy")
        assert symbolizer.remember(pid, image=2)
        assert symbolizer.knows(pid, 1) and symbolizer.knows(pid, 2) and not symbolizer.knows(pid, 3)

        def name(address: int, image: int) -> str:
            return symbolizer.user_stacks(pid, [[address]], image=image)[0][0].function

        assert name(before, 1) == "spin_before_exec" and name(after, 2) == "leaf_heavy"
        assert name(after, 1) == f"[unknown] 0x{after:x}"  # not looked up in /proc: that is cpu_3to1 now
        assert name(before, 3) == f"[unknown] 0x{before:x}"
        symbolizer.forget_image(pid, 1)
        assert not symbolizer.knows(pid, 1) and name(before, 1) == f"[unknown] 0x{before:x}"
        assert name(after, 2) == "leaf_heavy"
    finally:
        process.kill()
        process.wait()
