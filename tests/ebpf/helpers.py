# SPDX-License-Identifier: Apache-2.0
"""Helpers for tests that load real eBPF programs: which programs a test (or a process) loaded and whether they are
still loaded, and the workloads.

A node may run the agent (or another test run) at the same time, so a test never asks "is any program with our
names loaded?": it records the kernel ids of the programs it loaded and asks whether those are still loaded.
"""

from __future__ import annotations

import ctypes
import os
import subprocess
from pathlib import Path

from tests.conftest import NATIVE

WORKLOADS = NATIVE / "workloads"


def _lib() -> ctypes.CDLL:
    from otel_gpu.ebpf import _libbpf

    lib = _libbpf.lib()
    lib.bpf_prog_get_next_id.argtypes = [ctypes.c_uint32, ctypes.POINTER(ctypes.c_uint32)]
    lib.bpf_prog_get_fd_by_id.argtypes = [ctypes.c_uint32]
    return lib


def _name_of(fd: int) -> str | None:
    from otel_gpu.ebpf import _libbpf

    info = _libbpf.ProgInfoHead()
    size = ctypes.c_uint32(ctypes.sizeof(info))
    if _lib().bpf_obj_get_info_by_fd(fd, ctypes.byref(info), ctypes.byref(size)) != 0:
        return None
    return info.name.decode()


def loaded_programs() -> dict[int, str]:
    """Every BPF program loaded in the kernel now, by id (names as the kernel truncates them, 15 characters)."""
    lib = _lib()
    programs: dict[int, str] = {}
    current = ctypes.c_uint32(0)
    following = ctypes.c_uint32(0)
    while lib.bpf_prog_get_next_id(current, ctypes.byref(following)) == 0:
        current = ctypes.c_uint32(following.value)
        fd = lib.bpf_prog_get_fd_by_id(current)
        if fd < 0:
            continue  # unloaded meanwhile
        try:
            name = _name_of(fd)
            if name is not None:
                programs[current.value] = name
        finally:
            os.close(fd)
    return programs


def still_loaded(ids: dict[int, str] | set[int]) -> dict[int, str]:
    """Those of ``ids`` still loaded, with their names (a program id is not reused soon after it is freed)."""
    now = loaded_programs()
    return {i: now[i] for i in ids if i in now}


def held_by(pid: int) -> dict[int, str]:
    """The programs process ``pid`` holds through its file descriptors (program and link fds), by id."""
    ids: set[int] = set()
    fdinfo = Path(f"/proc/{pid}/fdinfo")
    for entry in fdinfo.iterdir() if fdinfo.is_dir() else ():
        try:
            text = entry.read_text()
        except OSError:
            continue  # closed meanwhile
        for line in text.splitlines():
            if line.startswith("prog_id:"):
                ids.add(int(line.split()[1]))
    return still_loaded(ids)


class BPFLoads:
    """Every :class:`otel_gpu.ebpf.loader.BPFObject` a test created (directly or through a source), with the ids
    of its programs recorded at load (the ``bpf_loads`` fixture installs it). A construction that fails has
    nothing recorded; what it might leave behind is what this process newly holds."""

    def __init__(self) -> None:
        self.programs: dict[int, str] = {}
        self._held_before = set(held_by(os.getpid()))

    def record(self, ids: dict[str, int]) -> None:
        self.programs.update({i: name[:15] for name, i in ids.items()})

    def names(self) -> set[str]:
        """Names of the recorded programs that are loaded now."""
        return set(still_loaded(self.programs).values())

    def leaked(self) -> dict[int, str]:
        """The recorded programs still loaded, and programs this process came to hold since the test began (after
        close this must be empty)."""
        held = {i: name for i, name in held_by(os.getpid()).items() if i not in self._held_before}
        return {**still_loaded(self.programs), **held}


def start(binary: str, *args: str) -> tuple[subprocess.Popen[str], int]:
    """Start a workload and wait for its ``ready PID`` line."""
    process = subprocess.Popen([str(WORKLOADS / binary), *args], stdout=subprocess.PIPE, text=True)
    assert process.stdout is not None
    line = process.stdout.readline().split()
    assert line and line[0] == "ready", f"{binary} did not start: {line}"
    return process, int(line[1])
