# SPDX-License-Identifier: Apache-2.0
"""``otel-gpu inject -- COMMAND ...``: run a workload with the GPU-time library injected into its CUDA driver.

The CUDA driver loads the library named by ``CUDA_INJECTION64_PATH`` into every process that initialises CUDA; the
agent then finds the process by itself. The library does nothing until an agent attaches (its USDT semaphores stay
0). The same variable works in containers and pods, which :func:`container_instructions` explains (``otel-gpu inject
--help``); a run prints one line naming the library.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import TextIO

from otel_gpu.cuda.discovery import LIBRARY_NAME

INJECTION_VARIABLE = "CUDA_INJECTION64_PATH"
BUDGET_VARIABLE = "OTEL_GPU_OVERHEAD_BUDGET"  # read by the library: the allowed slowdown as a fraction
PACKAGED_LIBRARY = Path(__file__).resolve().parent / "native" / LIBRARY_NAME


def library_path() -> Path | None:
    """The packaged libotel_gpu_inject.so, or None when it has not been built (``make build``)."""
    return PACKAGED_LIBRARY if PACKAGED_LIBRARY.is_file() else None


def container_instructions(path: Path) -> str:
    """How to inject the same library into containers and Kubernetes pods (``otel-gpu inject --help``)."""
    return (
        f"To profile GPU time without this wrapper, set {INJECTION_VARIABLE} where the workload starts:\n"
        f"  shell:      export {INJECTION_VARIABLE}={path}\n"
        f"  docker:     docker run -v {path}:/opt/otel-gpu/{LIBRARY_NAME}:ro "
        f"-e {INJECTION_VARIABLE}=/opt/otel-gpu/{LIBRARY_NAME} IMAGE ...\n"
        f"  kubernetes: mount the library (hostPath {path.parent}, or an init container that copies it) at\n"
        f"              /opt/otel-gpu and add to the container spec:\n"
        f"                env:\n"
        f"                - name: {INJECTION_VARIABLE}\n"
        f"                  value: /opt/otel-gpu/{LIBRARY_NAME}\n"
        f"The agent (otel-gpu run, as root) finds injected processes by itself.\n"
    )


def injected_environment(environ: Mapping[str, str], path: Path,
                         overhead_budget: float | None = None) -> dict[str, str]:
    """``environ`` with ``CUDA_INJECTION64_PATH`` pointing at ``path`` (and the library's overhead budget, a
    fraction, when given)."""
    env = dict(environ)
    env[INJECTION_VARIABLE] = str(path)
    if overhead_budget is not None:
        env[BUDGET_VARIABLE] = f"{overhead_budget:g}"
    return env


def run_injected(command: Sequence[str], environ: Mapping[str, str] | None = None, stderr: TextIO | None = None,
                 overhead_budget: float | None = None) -> int:
    """Run ``command`` with the library injected and return its exit status (the cli's ``inject`` subcommand).

    Returns 2 (usage) without a command, 1 when the library is not built, 127 when the command is not found and 126
    when it cannot be run (as shells do), else the command's own status (128 + N when it was killed by signal N, as
    shells report it).
    """
    err = stderr or sys.stderr
    argv = list(command)
    if argv and argv[0] == "--":
        argv = argv[1:]
    if not argv:
        err.write("usage: otel-gpu inject -- COMMAND [ARGS ...]\n")
        return 2
    path = library_path()
    if path is None:
        err.write(f"otel-gpu: {PACKAGED_LIBRARY} is missing; build it with `make build`\n")
        return 1
    base = os.environ if environ is None else environ
    if shutil.which(argv[0], path=base.get("PATH", os.defpath)) is None:  # before the instructions: nothing will run
        found = "/" in argv[0] and Path(argv[0]).exists()
        err.write(f"otel-gpu: cannot run {argv[0]}: {'not an executable file' if found else 'command not found'}\n")
        return 126 if found else 127
    other = base.get(INJECTION_VARIABLE, "")
    if other and Path(other).name != LIBRARY_NAME:
        # Nsight Systems (and other CUPTI tools) inject themselves the same way; the driver loads one library, so
        # taking the variable would take their tool away: theirs stays, and this command runs without GPU-time data.
        err.write(f"otel-gpu: {INJECTION_VARIABLE} already names {other} (Nsight Systems or another CUDA tool); "
                  f"leaving it: GPU-time profiling is off for this command\n")
        env = dict(base)
    else:
        env = injected_environment(base, path, overhead_budget)
        err.write(f"otel-gpu: injecting {path} through {INJECTION_VARIABLE} "
                  f"(`otel-gpu inject --help`: the same in containers and pods)\n")
        if overhead_budget is not None:
            err.write(f"otel-gpu: overhead budget {overhead_budget * 100:g} % (elsewhere: set "
                      f"{BUDGET_VARIABLE}={env[BUDGET_VARIABLE]} where the workload starts)\n")
    err.flush()
    try:
        process = subprocess.Popen(argv, env=env)
    except OSError as exc:
        err.write(f"otel-gpu: cannot run {argv[0]}: {exc.strerror or exc}\n")
        return 127 if isinstance(exc, FileNotFoundError) else 126
    with _forwarding_signals(process):
        code = _wait_forwarding(process)
    return 128 - code if code < 0 else code


FORWARDED_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)


_SI_KERNEL = 0x80  # si_code of a signal the kernel sent: a terminal's ^C, ^\\ and hang-up to its foreground group


@contextlib.contextmanager
def _forwarding_signals(process: subprocess.Popen[bytes]) -> Iterator[None]:
    """While the workload runs, the signals a job runner sends (``docker stop``, Kubernetes, Slurm, systemd: TERM;
    a terminal: INT, QUIT; HUP, USR1, USR2) go to it, and this process waits for it to finish and exits with its
    status. These handlers forward what arrives outside :func:`_wait_forwarding` (which takes the signals itself)."""

    def forward(signum: int, _frame: object) -> None:
        with contextlib.suppress(ProcessLookupError):
            process.send_signal(signum)

    previous = {signum: signal.signal(signum, forward) for signum in FORWARDED_SIGNALS}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def _wait_forwarding(process: subprocess.Popen[bytes]) -> int:
    """Wait for the workload, forwarding every signal of :data:`FORWARDED_SIGNALS` sent to this process, except those
    the terminal sent to its whole foreground group while this process is in it: the workload got that one too."""
    watched = {*FORWARDED_SIGNALS, signal.SIGCHLD}
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, watched)
    try:
        while process.poll() is None:  # a SIGCHLD after this is held pending until sigwaitinfo takes it
            info = signal.sigwaitinfo(watched)
            if info.si_signo == signal.SIGCHLD:
                continue
            if info.si_code == _SI_KERNEL and _same_foreground_group():
                continue
            with contextlib.suppress(ProcessLookupError):
                process.send_signal(info.si_signo)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
    return process.returncode


def _same_foreground_group() -> bool:
    """Whether this process is in the terminal's foreground group (then the terminal signalled the workload too)."""
    try:
        return os.tcgetpgrp(sys.stdin.fileno()) == os.getpgrp()
    except (OSError, ValueError):
        return False
