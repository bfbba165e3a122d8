# SPDX-License-Identifier: Apache-2.0
"""Finds processes that have the injected library (libotel_gpu_inject.so) mapped, and the distinct library files.

Scans /proc/*/maps; a library path is opened through /proc/PID/root so libraries inside containers (other mount
namespaces) are found. Files are told apart by (device, inode) so each is attached once however many processes map
it, and whatever path it has in each container. A maps file is searched as bytes for the library's name and only a
line that holds it is parsed: a scan of a node's processes reads a few MB of maps, nearly all without the library.

A mapped file that was deleted or replaced on disk since the process loaded it (the DaemonSet's init container puts a
new copy in place by rename whenever the agent's pod starts again; maps says "(deleted)") is opened through
/proc/PID/map_files/RANGE instead: its path now names another file, or none, and the process still runs the old one.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass

LIBRARY_NAME = "libotel_gpu_inject.so"
MAX_MAPS_BYTES = 16 << 20  # as the symbolizer's cap: 65,530 mappings of 250 bytes each
DELETED = " (deleted)"  # what maps appends to the path of a mapped file that was unlinked


@dataclass(frozen=True, slots=True)
class InjectedLibrary:
    """One library file: its identity, a path the agent can open, and a pid that maps it."""

    device: int
    inode: int
    host_path: str  # e.g. /proc/1234/root/opt/otel-gpu/libotel_gpu_inject.so
    path: str  # the path inside the process's mount namespace
    pid: int  # 0: a file the agent attached to before any process mapped it (GPUTimeProbes.library_paths)
    replaced: bool = False  # deleted or replaced on disk since ``pid`` mapped it (host_path is then a map_files link)


def list_pids(proc_root: str = "/proc") -> set[int]:
    """The pids of the processes that exist now (empty when ``proc_root`` cannot be listed)."""
    try:
        return {int(entry) for entry in os.listdir(proc_root) if entry.isdigit()}
    except OSError:
        return set()


def scan(proc_root: str = "/proc", library_name: str = LIBRARY_NAME, exclude_pids: frozenset[int] = frozenset(),
         checked: set[int] | None = None,
         only: Iterable[int] | None = None) -> tuple[dict[tuple[int, int], InjectedLibrary], set[int]]:
    """(libraries by (device, inode), pids that map one). Processes that exit mid-scan are skipped.

    ``only``: read just these pids (default: every process in ``proc_root``); ``exclude_pids`` are not read at all;
    every pid whose maps were read is added to ``checked`` when given.
    """
    libraries: dict[tuple[int, int], InjectedLibrary] = {}
    pids: set[int] = set()
    for pid in sorted(list_pids(proc_root) if only is None else set(only)):
        if pid in exclude_pids:
            continue
        if checked is not None:
            checked.add(pid)
        mapped = _mapped_library(f"{proc_root}/{pid}/maps", library_name)
        if mapped is None:
            continue
        path, replaced_range = mapped
        pids.add(pid)
        host_path = (f"{proc_root}/{pid}/map_files/{replaced_range}" if replaced_range
                     else f"{proc_root}/{pid}/root{path}")
        try:
            st = os.stat(host_path)
        except OSError:
            continue
        key = (st.st_dev, st.st_ino)
        if key not in libraries:
            libraries[key] = InjectedLibrary(st.st_dev, st.st_ino, host_path, path, pid, bool(replaced_range))
    return libraries, pids


def _mapped_library(maps_path: str, library_name: str) -> tuple[str, str] | None:
    """(path, address range) of the first mapping of a file named ``library_name*`` in a maps file, the range empty
    unless the file was deleted or replaced since it was mapped; None when none or gone."""
    try:
        with open(maps_path, "rb") as maps:
            data = maps.read(MAX_MAPS_BYTES)
    except OSError:
        return None
    needle = library_name.encode()
    at = data.find(needle)
    while at >= 0:
        begin = data.rfind(b"\n", 0, at) + 1
        end = data.find(b"\n", at)
        end = len(data) if end < 0 else end
        parts = data[begin:end].split(None, 5)
        if len(parts) == 6:
            named = parts[5].strip().decode("utf-8", "surrogateescape")
            path = named.removesuffix(DELETED)
            if os.path.basename(path).startswith(library_name):
                return path, (parts[0].decode("ascii", "replace") if path != named else "")
        at = data.find(needle, end)
    return None
