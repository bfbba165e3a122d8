# SPDX-License-Identifier: Apache-2.0
"""Finds processes that have the injected library (libotel_gpu_inject.so) mapped, and the distinct library files.

Scans /proc/*/maps; a library path is opened through /proc/PID/root so libraries inside containers (other mount
namespaces) are found. Files are told apart by (device, inode) so each is attached once however many processes map
it, and whatever path it has in each container.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

LIBRARY_NAME = "libotel_gpu_inject.so"


@dataclass(frozen=True, slots=True)
class InjectedLibrary:
    """One library file: its identity, a path the agent can open, and a pid that maps it."""

    device: int
    inode: int
    host_path: str  # e.g. /proc/1234/root/opt/otel-gpu/libotel_gpu_inject.so
    path: str  # the path inside the process's mount namespace
    pid: int  # 0: a file the agent attached to before any process mapped it (GPUTimeProbes.library_paths)


def scan(proc_root: str = "/proc", library_name: str = LIBRARY_NAME, exclude_pids: frozenset[int] = frozenset(),
         checked: set[int] | None = None) -> tuple[dict[tuple[int, int], InjectedLibrary], set[int]]:
    """(libraries by (device, inode), pids that map one). Processes that exit mid-scan are skipped.

    ``exclude_pids`` are not read at all; every pid whose maps were read is added to ``checked`` when given.
    """
    libraries: dict[tuple[int, int], InjectedLibrary] = {}
    pids: set[int] = set()
    try:
        entries = os.listdir(proc_root)
    except OSError:
        return libraries, pids
    for entry in entries:
        if not entry.isdigit() or int(entry) in exclude_pids:
            continue
        pid = int(entry)
        if checked is not None:
            checked.add(pid)
        path = _mapped_library(f"{proc_root}/{entry}/maps", library_name)
        if path is None:
            continue
        pids.add(pid)
        host_path = f"{proc_root}/{entry}/root{path}"
        try:
            st = os.stat(host_path)
        except OSError:
            continue
        key = (st.st_dev, st.st_ino)
        if key not in libraries:
            libraries[key] = InjectedLibrary(st.st_dev, st.st_ino, host_path, path, pid)
    return libraries, pids


def _mapped_library(maps_path: str, library_name: str) -> str | None:
    try:
        with open(maps_path, encoding="utf-8", errors="replace") as maps:
            for line in maps:
                if library_name not in line:
                    continue
                parts = line.split(None, 5)
                if len(parts) == 6 and os.path.basename(parts[5].strip()).startswith(library_name):
                    path = parts[5].strip()
                    return path.removesuffix(" (deleted)")
    except OSError:
        return None
    return None
