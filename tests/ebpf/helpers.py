# SPDX-License-Identifier: Apache-2.0
"""Helpers for tests that load real eBPF programs: which of our programs are loaded now, and the workloads."""

from __future__ import annotations

import ctypes
import os
import subprocess

from tests.conftest import NATIVE

WORKLOADS = NATIVE / "workloads"

# Program names as the kernel truncates them (BPF_OBJ_NAME_LEN = 16, so 15 characters).
OUR_PROGRAMS = frozenset(name[:15] for name in ("on_cpu_sample", "count_uprobe", "count_usdt"))


class _ProgInfo(ctypes.Structure):
    """The head of struct bpf_prog_info, up to the name."""

    _fields_ = [("type", ctypes.c_uint32), ("id", ctypes.c_uint32), ("tag", ctypes.c_uint8 * 8),
                ("jited_prog_len", ctypes.c_uint32), ("xlated_prog_len", ctypes.c_uint32),
                ("jited_prog_insns", ctypes.c_uint64), ("xlated_prog_insns", ctypes.c_uint64),
                ("load_time", ctypes.c_uint64), ("created_by_uid", ctypes.c_uint32),
                ("nr_map_ids", ctypes.c_uint32), ("map_ids", ctypes.c_uint64), ("name", ctypes.c_char * 16)]


def loaded_program_names() -> list[str]:
    """Names of every BPF program loaded in the kernel now, through the bpf() syscall (via libbpf)."""
    from otel_gpu.ebpf import _libbpf

    lib = _libbpf.lib()
    lib.bpf_prog_get_next_id.argtypes = [ctypes.c_uint32, ctypes.POINTER(ctypes.c_uint32)]
    lib.bpf_prog_get_fd_by_id.argtypes = [ctypes.c_uint32]
    lib.bpf_obj_get_info_by_fd.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.POINTER(ctypes.c_uint32)]
    names = []
    current = ctypes.c_uint32(0)
    following = ctypes.c_uint32(0)
    while lib.bpf_prog_get_next_id(current, ctypes.byref(following)) == 0:
        current = ctypes.c_uint32(following.value)
        fd = lib.bpf_prog_get_fd_by_id(current)
        if fd < 0:
            continue  # unloaded meanwhile
        try:
            info = _ProgInfo()
            size = ctypes.c_uint32(ctypes.sizeof(info))
            if lib.bpf_obj_get_info_by_fd(fd, ctypes.byref(info), ctypes.byref(size)) == 0:
                names.append(info.name.decode())
        finally:
            os.close(fd)
    return names


def ours_loaded() -> list[str]:
    return [name for name in loaded_program_names() if name in OUR_PROGRAMS]


def start(binary: str, *args: str) -> tuple[subprocess.Popen[str], int]:
    """Start a workload and wait for its ``ready PID`` line."""
    process = subprocess.Popen([str(WORKLOADS / binary), *args], stdout=subprocess.PIPE, text=True)
    assert process.stdout is not None
    line = process.stdout.readline().split()
    assert line and line[0] == "ready", f"{binary} did not start: {line}"
    return process, int(line[1])
