# SPDX-License-Identifier: Apache-2.0
"""Finding injected processes in a fake /proc tree, and ``otel-gpu inject`` running a real command."""

from __future__ import annotations

import fcntl
import io
import os
import pty
import shutil
import signal
import subprocess
import sys
import termios
from pathlib import Path

import pytest

from otel_gpu.cuda import inject
from otel_gpu.cuda.discovery import scan

LINE = "7f0000000000-7f0000010000 r-xp 00001000 fd:01 {inode} {path}\n"


def _process(proc: Path, pid: int, maps: str, files: dict[str, bytes] | None = None) -> None:
    (proc / str(pid)).mkdir(parents=True)
    (proc / str(pid) / "maps").write_text(maps)
    for path, content in (files or {}).items():
        target = proc / str(pid) / "root" / path.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(content)


def test_scan_finds_each_library_file_once_across_mount_namespaces(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    lib = "/opt/otel-gpu/libotel_gpu_inject.so"
    _process(proc, 100, LINE.format(inode=1, path="/usr/lib/libc.so.6") + LINE.format(inode=2, path=lib),
             {lib: b"ELF-A"})
    # pid 101 sees the same file (a hard link = same inode) under another path in its own mount namespace
    other = proc / "101" / "root" / "usr" / "local" / "lib"
    other.mkdir(parents=True)
    os.link(proc / "100" / "root" / lib.lstrip("/"), other / "libotel_gpu_inject.so")
    (proc / "101" / "maps").write_text(LINE.format(inode=2, path="/usr/local/lib/libotel_gpu_inject.so"))
    # pid 102: a different copy, replaced on disk after being mapped: its path names a new file now, the one it runs
    # is reached through map_files
    _process(proc, 102, LINE.format(inode=3, path=lib + " (deleted)"), {lib: b"ELF-NEW"})
    (proc / "102" / "map_files").mkdir()
    (proc / "102" / "map_files" / "7f0000000000-7f0000010000").write_bytes(b"ELF-B")
    _process(proc, 103, LINE.format(inode=1, path="/usr/lib/libc.so.6"))
    _process(proc, 104, LINE.format(inode=2, path=lib), {lib: b"ELF-C"})  # the agent itself: excluded
    (proc / "self").mkdir()
    (proc / "105").mkdir()  # exited between listdir and open: no maps

    libraries, pids = scan(str(proc), exclude_pids=frozenset({104}))
    assert pids == {100, 101, 102}
    assert len(libraries) == 2
    by_pid = {library.pid: library for library in libraries.values()}
    first = by_pid.get(100) or by_pid[101]
    assert first.path in (lib, "/usr/local/lib/libotel_gpu_inject.so")
    assert Path(first.host_path).read_bytes() == b"ELF-A"
    assert by_pid[102].path == lib and Path(by_pid[102].host_path).read_bytes() == b"ELF-B"
    assert by_pid[102].replaced and not first.replaced


def test_scan_of_a_missing_proc_is_empty(tmp_path: Path) -> None:
    assert scan(str(tmp_path / "nothing")) == ({}, set())


@pytest.fixture()
def packaged(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    library = tmp_path / "libotel_gpu_inject.so"
    library.write_bytes(b"\x7fELF")
    monkeypatch.setattr(inject, "PACKAGED_LIBRARY", library)
    return library


def test_inject_runs_the_command_with_the_variable(packaged: Path, tmp_path: Path) -> None:
    out = tmp_path / "seen"
    err = io.StringIO()
    script = f"import os, sys; open({str(out)!r}, 'w').write(os.environ['CUDA_INJECTION64_PATH']); sys.exit(7)"
    code = inject.run_injected(["--", sys.executable, "-c", script], environ={"PATH": os.environ.get("PATH", "")},
                               stderr=err)
    assert code == 7
    assert out.read_text() == str(packaged)
    assert err.getvalue().splitlines() == [  # one line in a job's log, not the set-up help
        f"otel-gpu: injecting {packaged} through CUDA_INJECTION64_PATH (`otel-gpu inject --help`: the same in "
        f"containers and pods)"]


def test_inject_help_explains_the_set_up_in_a_shell_a_container_and_a_pod() -> None:
    done = subprocess.run([sys.executable, "-m", "otel_gpu", "inject", "--help"], capture_output=True, text=True,
                          check=True)
    assert f"export CUDA_INJECTION64_PATH={inject.PACKAGED_LIBRARY}" in done.stdout
    assert "docker run" in done.stdout and "name: CUDA_INJECTION64_PATH" in done.stdout


def test_inject_reports_a_signal_like_a_shell(packaged: Path) -> None:
    code = inject.run_injected([sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGTERM)"],
                               stderr=io.StringIO())
    assert code == 128 + 15


def test_inject_errors(packaged: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    err = io.StringIO()
    assert inject.run_injected(["--"], stderr=err) == 2 and "usage" in err.getvalue()
    # as a shell: 127 for a command not found (and no instructions printed for a run that never starts), 126 for a
    # file that is not executable
    err = io.StringIO()
    assert inject.run_injected(["/nonexistent/command"], stderr=err) == 127
    assert err.getvalue() == "otel-gpu: cannot run /nonexistent/command: command not found\n"
    assert inject.run_injected(["no-such-command-here"], stderr=io.StringIO()) == 127
    (plain := tmp_path / "data.txt").write_text("not a program")
    err = io.StringIO()
    assert inject.run_injected([str(plain)], stderr=err) == 126 and f"cannot run {plain}" in err.getvalue()
    monkeypatch.setattr(inject, "PACKAGED_LIBRARY", tmp_path / "missing.so")
    err = io.StringIO()
    assert inject.run_injected(["true"], stderr=err) == 1 and "make build" in err.getvalue()


def test_probes_reread_a_process_only_every_full_rescan(tmp_path: Path) -> None:
    from otel_gpu.cuda.probes import GPUTimeProbes

    proc = tmp_path / "proc"
    _process(proc, 200, LINE.format(inode=1, path="/usr/lib/libc.so.6"))
    found: set[int] = set()
    now = [0.0]
    probes = GPUTimeProbes(lambda record: None, found.update, proc_root=str(proc), full_rescan_s=10,
                           clock=lambda: now[0])
    probes.rescan()  # pid 200 read once: not injected
    lib = "/opt/libotel_gpu_inject.so"
    (proc / "200" / "maps").write_text(LINE.format(inode=2, path=lib))  # it initialises CUDA later
    _process(proc, 201, LINE.format(inode=2, path=lib), {lib: b"ELF"})  # a new process
    now[0] = 7.0
    probes.rescan()  # listed
    assert not found
    now[0] = 9.0
    probes.rescan()  # read, since it still runs
    assert 201 in found and 200 not in found
    now[0] = 10.0  # once the full period has passed, pid 200 is read again
    probes.rescan()
    assert 200 in found


def test_probes_read_a_process_without_the_library_ever_less_often(tmp_path: Path) -> None:
    """10 s, then 20, 40 and 80 s (RECHECK_BACKOFF) between reads of a process that never shows the library."""
    from otel_gpu.cuda.probes import RECHECK_BACKOFF, GPUTimeProbes

    proc = tmp_path / "proc"
    _process(proc, 300, LINE.format(inode=1, path="/usr/lib/libc.so.6"))
    found: set[int] = set()
    now = [0.0]
    probes = GPUTimeProbes(lambda record: None, found.update, proc_root=str(proc), full_rescan_s=10,
                           clock=lambda: now[0])
    lib = "/opt/libotel_gpu_inject.so"
    reads = []
    maps = proc / "300" / "maps"
    for second in range(0, 400, 2):  # a scan every 2 s; a read shows as the pid reported, the maps reset after
        now[0] = float(second)
        maps.write_text(LINE.format(inode=2, path=lib))
        (proc / "300" / "root" / "opt").mkdir(parents=True, exist_ok=True)
        (proc / "300" / "root" / "opt" / "libotel_gpu_inject.so").write_bytes(b"ELF")
        probes.rescan()
        if 300 in found:
            reads.append(second)
            found.clear()
    assert reads[:6] == [0, 10, 30, 70, 150, 230]
    assert RECHECK_BACKOFF == 8  # the 80 s cap above


def test_probes_read_a_new_process_at_the_scan_after_it_is_listed(tmp_path: Path) -> None:
    """Between two reads of the old processes, a scan reads only the new processes that outlived the previous scan;
    the first scan reads every process."""
    from otel_gpu.cuda.probes import GPUTimeProbes

    proc = tmp_path / "proc"
    lib = "/opt/libotel_gpu_inject.so"
    for pid in range(400, 410):
        _process(proc, pid, LINE.format(inode=1, path="/usr/lib/libc.so.6"))
    found: set[int] = set()
    now = [0.0]
    probes = GPUTimeProbes(lambda record: None, found.update, proc_root=str(proc), full_rescan_s=10,
                           clock=lambda: now[0])
    probes.rescan()
    for pid in range(400, 410):  # they all load a copy now: not seen until they are due again
        (proc / str(pid) / "maps").write_text(LINE.format(inode=2, path=lib))
    _process(proc, 410, LINE.format(inode=2, path=lib), {lib: b"ELF"})
    _process(proc, 411, LINE.format(inode=2, path=lib), {lib: b"ELF"})
    now[0] = 2.0
    probes.rescan()  # 410 and 411 are listed, not read: most new processes of a churning node exit before the next
    assert not found
    shutil.rmtree(proc / "411")  # a short-lived process: never read
    now[0] = 4.0
    probes.rescan()
    assert found == {410}
    assert 411 not in probes._checked  # forgotten once it left /proc


def test_inject_passes_the_overhead_budget_to_the_library(packaged: Path, tmp_path: Path) -> None:
    """`otel-gpu inject --overhead-budget 0.5 -- CMD`: the library reads the fraction from OTEL_GPU_OVERHEAD_BUDGET."""
    out = tmp_path / "seen"
    script = f"import os; open({str(out)!r}, 'w').write(os.environ['OTEL_GPU_OVERHEAD_BUDGET'])"
    done = subprocess.run([sys.executable, "-m", "otel_gpu", "inject", "--overhead-budget", "0.5", "--",
                           sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert out.read_text() == "0.005"
    assert "OTEL_GPU_OVERHEAD_BUDGET=0.005" in done.stderr


@pytest.mark.parametrize("value", ["0", "150", "two"])
def test_inject_rejects_a_bad_overhead_budget_naming_the_flag(value: str) -> None:
    done = subprocess.run([sys.executable, "-m", "otel_gpu", "inject", "--overhead-budget", value, "--", "true"],
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 2
    assert "--overhead-budget" in done.stderr and value in done.stderr


def test_inject_leaves_another_tools_injection_in_place(packaged: Path, tmp_path: Path) -> None:
    """Nsight Systems injects its own library through the same variable: the driver loads one, so theirs stays."""
    out = tmp_path / "seen"
    nsys = "/opt/nvidia/nsight-systems/target-linux-x64/libToolsInjection64.so"
    script = f"import os; open({str(out)!r}, 'w').write(os.environ['CUDA_INJECTION64_PATH'])"
    err = io.StringIO()
    code = inject.run_injected([sys.executable, "-c", script], stderr=err,
                               environ={"PATH": os.environ.get("PATH", ""), "CUDA_INJECTION64_PATH": nsys})
    assert code == 0 and out.read_text() == nsys
    assert "GPU-time profiling is off for this command" in err.getvalue()
    # our own library named already (a nested `otel-gpu inject`) is simply kept
    code = inject.run_injected([sys.executable, "-c", script], stderr=io.StringIO(),
                               environ={"PATH": os.environ.get("PATH", ""), "CUDA_INJECTION64_PATH": str(packaged)})
    assert code == 0 and out.read_text() == str(packaged)
    # with an overhead budget too: the workload runs without ours (the budget did not exist: KeyError, no workload)
    code = inject.run_injected([sys.executable, "-c", script], stderr=io.StringIO(), overhead_budget=0.01,
                               environ={"PATH": os.environ.get("PATH", ""), "CUDA_INJECTION64_PATH": nsys})
    assert code == 0 and out.read_text() == nsys


_TRAPPING = """
import signal, sys, time
seen = []
for signum in (signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1):
    signal.signal(signum, lambda n, _f: seen.append(n))
print("ready", flush=True)
deadline = time.monotonic() + 30
while not seen and time.monotonic() < deadline:
    time.sleep(0.01)
sys.exit(40 + (seen[0] if seen else 0))
"""


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1])
def test_inject_forwards_a_job_runners_signals_to_the_workload_and_exits_with_its_status(signum: int) -> None:
    """`docker stop`, Kubernetes, Slurm and systemd signal the command they started: `otel-gpu inject` died of it and
    left the workload running, orphaned, its status lost."""
    wrapper = subprocess.Popen([sys.executable, "-m", "otel_gpu", "inject", "--", sys.executable, "-c", _TRAPPING],
                               stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, start_new_session=True)
    try:
        assert wrapper.stdout is not None and wrapper.stdout.readline() == "ready\n"
        wrapper.send_signal(signum)
        assert wrapper.wait(timeout=30) == 40 + signum
    finally:
        if wrapper.poll() is None:
            os.killpg(wrapper.pid, signal.SIGKILL)


_COUNTING_INTS = """
import signal, sys, time
seen = []
signal.signal(signal.SIGINT, lambda n, _f: seen.append(time.monotonic()))
print("ready", flush=True)
deadline = time.monotonic() + 30
while not seen and time.monotonic() < deadline:
    time.sleep(0.01)
time.sleep(1.0)  # a second copy of the same signal would come within this
sys.exit(40 + len(seen))
"""


def _in_its_own_terminal() -> None:
    """preexec_fn: the new session's controlling terminal is the pty on stdin, so its group is the foreground one."""
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)


@pytest.mark.parametrize("how", ["kill", "terminal"])
def test_inject_in_a_terminals_foreground_delivers_an_interrupt_once(how: str) -> None:
    """In a terminal's foreground group (`docker run -it`, an interactive shell) a ^C reaches the wrapper and the
    workload both, so the wrapper must not send it again; but a `kill -INT` (`docker kill --signal=INT`) reaches the
    wrapper alone and was dropped: the workload never stopped."""
    master, slave = pty.openpty()
    try:
        wrapper = subprocess.Popen([sys.executable, "-m", "otel_gpu", "inject", "--", sys.executable, "-c",
                                    _COUNTING_INTS], stdin=slave, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                   text=True, start_new_session=True,
                                   preexec_fn=_in_its_own_terminal)
        try:
            assert wrapper.stdout is not None and wrapper.stdout.readline() == "ready\n"
            if how == "kill":
                wrapper.send_signal(signal.SIGINT)
            else:
                os.write(master, b"\x03")  # the terminal's intr character: SIGINT to its foreground group
            assert wrapper.wait(timeout=30) == 41
        finally:
            if wrapper.poll() is None:
                os.killpg(wrapper.pid, signal.SIGKILL)
    finally:
        os.close(master)
        os.close(slave)
