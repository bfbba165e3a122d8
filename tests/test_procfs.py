# SPDX-License-Identifier: Apache-2.0
"""Process identity from /proc, with what a process controls in it made hostile: a name that is not UTF-8, an
environment past the read cap, FIFOs where files should be, names with parentheses and spaces."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path

import pytest

from otel_gpu import procfs, selfmetrics, semconv
from otel_gpu.procfs import ProcessResolver

_STAT_TAIL = "S 1 4242 4242 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 987654 1000 10\n"


def _fake_process(root: Path, pid: int = 4242, **files: bytes) -> Path:
    base = root / str(pid)
    base.mkdir(parents=True)
    contents = {"stat": f"{pid} (worker) {_STAT_TAIL}".encode(), "comm": b"worker\n", "cgroup": b"0::/\n",
                "environ": b"PATH=/bin\0"} | files
    for name, data in contents.items():
        (base / name).write_bytes(data)
    return base


def _errors(reason: str) -> float:
    return selfmetrics.total(semconv.SELF_ERRORS.name, otel_gpu__source=procfs.SOURCE, otel_gpu__reason=reason)


def test_a_name_that_is_not_utf8_costs_nothing() -> None:
    """Any process may name itself with any 15 bytes (prctl PR_SET_NAME): /proc/PID/stat and comm then hold bytes
    that are not UTF-8. Reading them as UTF-8 raised, and with it every drain of the CPU profiler."""
    script = ("import ctypes, sys; ctypes.CDLL(None).prctl(15, b'bad\\xff\\xfe(x) y', 0, 0, 0); "
              "print('ready', flush=True); sys.stdin.read()")
    process = subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert process.stdout is not None and process.stdout.readline() == b"ready\n"
        resolver = ProcessResolver()
        info = resolver.info(process.pid)
        thread = resolver.thread_name(process.pid, process.pid)
    finally:
        process.kill()
        process.wait()
    assert info is not None and info.start_time_ticks > 0
    assert thread == "bad\ufffd\ufffd(x) y"


def test_fake_tree_identity(tmp_path: Path) -> None:
    container = "ab" * 32
    _fake_process(tmp_path, stat=f"4242 (a) b) (c) {_STAT_TAIL}".encode(), comm=b"\xff\xfe\n",
                  cgroup=f"0::/system.slice/docker-{container}.scope\n".encode(),
                  environ=b"A=1\0OTEL_SERVICE_NAME=trainer\xff\0B=2\0")
    info = ProcessResolver(str(tmp_path)).info(4242)
    assert info is not None
    assert info.start_time_ticks == 987654  # counted after the last ")": the name is the process's choice
    assert info.executable_name == "\ufffd\ufffd" and info.container_id == container
    assert info.service_name == "trainer\ufffd"


def test_environ_is_read_up_to_its_cap(tmp_path: Path) -> None:
    """The environment is as large as the process makes it; only the first MAX_ENVIRON_BYTES are read, in bounded
    memory, and a larger one is counted."""
    big = b"OTEL_SERVICE_NAME=" + b"s" * 1000 + b"\0" + b"X=" + b"x" * (8 << 20) + b"\0"
    _fake_process(tmp_path, environ=big)
    before = _errors("environ_too_large")
    tracemalloc.start()
    try:
        info = ProcessResolver(str(tmp_path)).info(4242)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert info is not None and info.service_name == "s" * procfs.MAX_SERVICE_NAME_CHARS
    assert peak < 3 * procfs.MAX_ENVIRON_BYTES  # the cap read and joined, not the 8 MiB the process wrote
    assert _errors("environ_too_large") - before == 1


def test_a_service_name_past_the_cap_is_not_seen(tmp_path: Path) -> None:
    _fake_process(tmp_path, environ=b"X=" + b"x" * procfs.MAX_ENVIRON_BYTES + b"\0OTEL_SERVICE_NAME=late\0")
    info = ProcessResolver(str(tmp_path)).info(4242)
    assert info is not None and info.service_name == "worker"  # the executable's name, as when it is unset


def test_cgroup_is_read_up_to_its_cap(tmp_path: Path) -> None:
    container = "cd" * 32
    _fake_process(tmp_path, cgroup=f"0::/docker/{container}\n".encode() + b"1:x:/" + b"y" * (1 << 20) + b"\n")
    before = _errors("cgroup_too_large")
    info = ProcessResolver(str(tmp_path)).info(4242)
    assert info is not None and info.container_id == container
    assert _errors("cgroup_too_large") - before == 1


@pytest.mark.timeout(60)
def test_fifos_in_place_of_proc_files_never_block(tmp_path: Path) -> None:
    """The fake tree stands for any path a process could swap: opening a FIFO for reading would wait for a writer
    forever (here: the test's timeout)."""
    base = _fake_process(tmp_path)
    for name in ("environ", "cgroup"):
        (base / name).unlink()
        os.mkfifo(base / name)
    info = ProcessResolver(str(tmp_path)).info(4242)
    assert info is not None and info.service_name == "worker" and info.container_id == ""
    data, more = procfs.read_capped(base / "environ", 100)
    assert data == b"" and not more


def test_read_capped(tmp_path: Path) -> None:
    path = tmp_path / "file"
    path.write_bytes(b"x" * 200_000)
    assert procfs.read_capped(path, 200_000) == (b"x" * 200_000, False)
    assert procfs.read_capped(path, 150_000) == (b"x" * 150_000, True)
    with pytest.raises(OSError):
        procfs.read_capped(tmp_path / "missing", 10)


@pytest.mark.parametrize(("stat", "start"), [
    (b"1 (init) S 0 1 1 0 -1 4194560 1 0 0 0 0 0 0 0 20 0 1 0 42 100 1\n", 42),
    (b"1 () ) S 0 1 1 0 -1 4194560 1 0 0 0 0 0 0 0 20 0 1 0 43 100 1\n", 43),  # ")" inside the name
    (b"1 (x) S 0 1 1 0 -1 4194560 1 0 0 0 0 0 0 0 20 0 1 0 -5 100 1\n", 0),
    (b"1 (x) S 0 1 1 0 -1 4194560 1 0 0 0 0 0 0 0 20 0 1 0 " + b"9" * 5000 + b"\n", 0),  # int() refuses >4300 digits
    (b"1 (x) S", 0),
    (b"", 0),
])
def test_parse_stat_start_time(stat: bytes, start: int) -> None:
    assert procfs.parse_stat_start_time(stat) == start


def test_parse_stat_arg_start() -> None:
    """Field 48: where this process's argv strings begin, which /proc/self/cmdline's first bytes are read from."""
    arg_start = procfs.parse_stat_arg_start(Path("/proc/self/stat").read_bytes())
    cmdline = Path("/proc/self/cmdline").read_bytes()[:64]
    with open("/proc/self/mem", "rb") as mem:
        mem.seek(arg_start)
        assert arg_start > 0 and mem.read(len(cmdline)) == cmdline
    fields = [str(n).encode() for n in range(3, 53)]  # field n holds n, after a name with ") (" in it
    assert procfs.parse_stat_arg_start(b"1 (a) (b) " + b" ".join(fields)) == 48
    assert procfs.parse_stat_arg_start(b"1 (x) S 0 1") == 0


@pytest.mark.parametrize(("status", "pid"), [
    (b"Name:\tx\nNSpid:\t4242\t17\t1\n", 1),
    (b"Name:\tx\nNSpid:\t4242\n", 4242),
    (b"NSpid:\n", None),
    (b"NSpid:\t-3\n", None),
    (b"NSpid:\t" + b"9" * 5000 + b"\n", None),
    (b"Name:\tx\n", None),
])
def test_parse_namespace_pid(status: bytes, pid: int | None) -> None:
    assert procfs.parse_namespace_pid(status) == pid


def test_parse_cgroup_finds_container_and_pod() -> None:
    container = "3f" * 32
    text = (f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1a2b3c4d_0000_1111_2222_333344445555"
            f".slice/cri-containerd-{container}.scope\n")
    assert procfs.parse_cgroup(text) == (container, "1a2b3c4d-0000-1111-2222-333344445555")
    assert procfs.parse_cgroup("0::/" + "a" * 65 + "\n") == ("", "")  # 65 hex digits are no container id


STATIC_UID = "0123456789abcdef0123456789abcdef"  # a static pod's uid: the hash of its manifest, no dashes
UID = "1a2b3c4d-0000-1111-2222-333344445555"


@pytest.mark.parametrize(("path", "found"), [
    (f"/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{STATIC_UID}.slice/crio-{'ab' * 32}.scope",
     ("ab" * 32, STATIC_UID)),
    (f"/kubepods/burstable/pod{STATIC_UID}/{'ab' * 32}", ("ab" * 32, STATIC_UID)),
    (f"/kubepods/pod{UID}/{'ab' * 32}", ("ab" * 32, UID)),
    (f"/kubepods.slice/kubepods-pod{UID.replace('-', '_')}.slice", ("", UID)),
    # "pod" inside a name, or a uid followed by more of a name, is no pod segment
    (f"/data/mypod{UID}dir/x", ("", "")),
    (f"/data/mypod{UID}/x", ("", "")),
    (f"/kubepods/burstable/pod{UID}x/y", ("", "")),
    # conmon, the runtime's monitor on the host, is named after its container but is not in it
    (f"/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{UID.replace('-', '_')}.slice"
     f"/crio-conmon-{'cd' * 32}.scope", ("", UID)),
    (f"/machine.slice/libpod-conmon-{'cd' * 32}.scope", ("", "")),
    (f"/machine.slice/libpod-{'cd' * 32}.scope/container", ("cd" * 32, "")),
])
def test_parse_cgroup_pod_segments_static_pods_and_conmon(path: str, found: tuple[str, str]) -> None:
    assert procfs.parse_cgroup(f"0::{path}\n") == found


def test_an_executable_path_that_is_not_utf8_is_exported_readable(tmp_path: Path) -> None:
    """A file name may hold any byte but "/" and NUL; the path as os.readlink gives it (lone surrogates for bytes that
    are not UTF-8) made the OTLP encoder raise for the whole batch."""
    binary = os.fsdecode(bytes(tmp_path) + b"/sleep-\xff")
    Path(binary).write_bytes(Path("/bin/sleep").read_bytes())
    os.chmod(binary, 0o755)
    process = subprocess.Popen([binary, "30"])
    try:
        info = ProcessResolver().info(process.pid)
    finally:
        process.kill()
        process.wait()
    assert info is not None and info.executable_name == "sleep-\ufffd"
    assert info.executable_path.encode() == bytes(tmp_path) + b"/sleep-\xef\xbf\xbd"


def test_process_age_is_counted_from_the_start_time_in_stat(tmp_path: Path) -> None:
    ticks_per_s = os.sysconf("SC_CLK_TCK")
    started = int((time.clock_gettime(time.CLOCK_BOOTTIME) - 100.0) * ticks_per_s)  # 100 s ago
    stat = f"4242 (worker) S 1 4242 4242 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 {started} 1000 10\n".encode()
    _fake_process(tmp_path, stat=stat)
    assert 99.0 <= procfs.process_age_s(4242, str(tmp_path)) <= 200.0
    assert procfs.process_age_s(4343, str(tmp_path)) == 0.0  # no such process
    assert 0.0 < procfs.process_age_s() < time.clock_gettime(time.CLOCK_BOOTTIME)  # this test's own process


@pytest.mark.parametrize(("environ", "service"), [
    (b"OTEL_RESOURCE_ATTRIBUTES=team=ml,service.name=trainer\0", "trainer"),
    (b"A=1\0OTEL_RESOURCE_ATTRIBUTES= service.name = tr%C3%A4iner%2C1 ,x=y\0", "tr\u00e4iner,1"),  # percent-decoded
    (b"OTEL_RESOURCE_ATTRIBUTES=service.name=a,service.name=b\0", "b"),  # the last wins, as in the SDK
    (b"OTEL_RESOURCE_ATTRIBUTES=service.name=ignored\0OTEL_SERVICE_NAME=own\0", "own"),  # the variable wins
    (b"OTEL_SERVICE_NAME=\0OTEL_RESOURCE_ATTRIBUTES=service.name=fallback\0", "fallback"),  # empty is unset
    (b"OTEL_RESOURCE_ATTRIBUTES=service.namespace=x,my.service.name=y\0", ""),
    # a value past the cap: the pair cut there is not read as a shorter name
    (b"OTEL_RESOURCE_ATTRIBUTES=" + b"a=1," * (procfs.MAX_RESOURCE_ATTRIBUTES_BYTES // 4 - 4)
     + b"service.name=trainer\0", ""),  # the cap falls after "service.name=tra"
])
def test_service_name_as_the_process_sdk_sets_it(environ: bytes, service: str) -> None:
    assert procfs.parse_service_name(environ) == service


def test_an_identity_is_read_again_after_an_exec_and_kept_while_the_process_exits(tmp_path: Path) -> None:
    """An exec keeps the pid and the start time: the cached identity (a shell's, say) must not outlive it. A process
    whose executable can no longer be read (a zombie) keeps the identity it had."""
    base = _fake_process(tmp_path, comm=b"sh\n", environ=b"PATH=/bin\0")
    (base / "exe").symlink_to("/usr/bin/dash")
    resolver = ProcessResolver(str(tmp_path))
    first = resolver.info(4242)
    assert first is not None and (first.executable_name, first.service_name) == ("dash", "dash")
    (base / "exe").unlink()
    (base / "exe").symlink_to("/opt/python/bin/python3.12")
    (base / "comm").write_bytes(b"python3.12\n")
    (base / "environ").write_bytes(b"OTEL_SERVICE_NAME=trainer\0")
    after = resolver.info(4242)
    assert after is not None and after.start_time_ticks == first.start_time_ticks
    assert (after.executable_name, after.executable_path, after.service_name) == (
        "python3.12", "/opt/python/bin/python3.12", "trainer")
    (base / "exe").unlink()  # exiting: the link is gone, the rest still reads
    (base / "comm").write_bytes(b"python3.12\n")
    assert resolver.info(4242) == after == resolver.cached(4242)


@pytest.mark.parametrize(("cmdline", "args"), [
    (b"/usr/bin/python3.11\0-u\0train.py\0--lr\0" b"0.1\0", ("/usr/bin/python3.11", "-u", "train.py", "--lr", "0.1")),
    (b"serve\0--password\0hunter2\0--api-key=abc\0DB_TOKEN=x\0--auth-file=/a\0--keys\0-v\0",
     ("serve", "--password", "***", "--api-key=***", "DB_TOKEN=***", "--auth-file=***", "--keys", "-v")),
    (b"a\0" + b"x" * 1000 + b"\0", ("a", "x" * procfs.MAX_COMMAND_ARG_CHARS)),
    (b"a" + b"\0b" * 1000, ("a", *["b"] * procfs.MAX_COMMAND_ARGS)),
    (b"", ()),
])
def test_command_args_are_capped_and_secret_values_masked(cmdline: bytes, args: tuple[str, ...]) -> None:
    assert procfs.parse_command_args(cmdline) == args


@pytest.mark.parametrize(("executable", "argv", "service"), [
    ("python3.11", ("python", "train.py"), "train"),
    ("python3", ("python3", "-u", "-X", "dev", "/app/serve.py", "--port", "80"), "serve"),
    ("python3.12", ("python", "-m", "pkg.serve", "--x"), "pkg.serve"),
    ("python", ("python", "-W", "ignore", "-m", "torch.distributed.run", "train.py"), "torch.distributed.run"),
    ("python3.11", ("python", "-c", "import x"), ""),
    ("python3.11", ("python",), ""),
    ("python3.11", ("python", "__main__.py"), ""),
    ("node", ("node", "-r", "ts-node/register", "server.js"), "server"),
    ("node", ("node", "-e", "1"), ""),
    ("java", ("java", "-Xmx1g", "-cp", "a.jar:b.jar", "com.example.Main"), "com.example.Main"),
    ("java", ("java", "-jar", "/opt/app/scorer.jar"), "scorer"),
    ("java", ("java", "-m", "app.core/app.Main"), "app.core"),
    ("trainer", ("trainer", "train.py"), ""),  # not an interpreter: its executable's name stays
])
def test_an_interpreters_service_name_is_its_scripts(executable: str, argv: tuple[str, ...], service: str) -> None:
    assert procfs.script_service_name(executable, argv) == service


@pytest.mark.parametrize("command_args", [True, False])
def test_the_resolver_names_a_python_process_after_its_script(tmp_path: Path, command_args: bool) -> None:
    base = tmp_path / "77"
    base.mkdir()
    (base / "stat").write_bytes(b"77 (python3.11) S 1 1 1 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 555 0 0\n")
    (base / "comm").write_bytes(b"python3.11\n")
    (base / "cmdline").write_bytes(b"python\0train.py\0--token\0s3cret\0")
    info = ProcessResolver(str(tmp_path), command_args=command_args).info(77)
    assert info is not None and info.service_name == "train"
    assert info.command_args == (("python", "train.py", "--token", "***") if command_args else ())
    (base / "environ").write_bytes(b"OTEL_SERVICE_NAME=trainer\0")
    info = ProcessResolver(str(tmp_path)).info(77)
    assert info is not None and info.service_name == "trainer"  # the process's own wins
