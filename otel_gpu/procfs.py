# SPDX-License-Identifier: Apache-2.0
"""Process identity from /proc: executable, container id and Kubernetes pod uid (from the cgroup), service name.

Shared by every source that reports per process (GPU process metrics, CPU and GPU-time profiles).
Takes its filesystem root as a parameter so tests can point it at a fake tree. A process that exits
mid-read yields ``None`` (or partial identity), never an exception.
"""

from __future__ import annotations

import os
import re
import threading
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

# 64 hex digits: docker, containerd (cri-containerd-<id>.scope, /<id>), cri-o (crio-<id>.scope), podman (libpod-<id>)
_CONTAINER_RE = re.compile(r"(?:^|[/-])([0-9a-f]{64})(?:\.scope)?(?:/|$)")
# kubepods/burstable/pod<uid>/... (cgroupfs) or kubepods-burstable-pod<uid_with_underscores>.slice (systemd)
_POD_RE = re.compile(r"pod([0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12})")


@dataclass(frozen=True, slots=True)
class ProcessInfo:
    """Who a process is, as far as /proc tells."""

    pid: int
    executable_name: str
    executable_path: str = ""
    container_id: str = ""
    pod_uid: str = ""
    service_name: str = ""
    start_time_ticks: int = 0


def parse_cgroup(text: str) -> tuple[str, str]:
    """(container id, pod uid) found in the text of /proc/PID/cgroup; empty strings when absent."""
    container_id = ""
    pod_uid = ""
    for line in text.splitlines():
        path = line.split(":", 2)[-1]
        if not container_id:
            match = _CONTAINER_RE.search(path)
            if match:
                container_id = match.group(1)
        if not pod_uid:
            match = _POD_RE.search(path)
            if match:
                pod_uid = match.group(1).replace("_", "-")
    return container_id, pod_uid


class ProcessResolver:
    """Resolves pids to :class:`ProcessInfo`, cached per (pid, start time) so reused pids are not confused."""

    def __init__(self, proc_root: str = "/proc", max_entries: int = 8192) -> None:
        self._root = Path(proc_root)
        self._max = max_entries
        self._cache: OrderedDict[int, ProcessInfo] = OrderedDict()
        self._lock = threading.Lock()

    def info(self, pid: int) -> ProcessInfo | None:
        """Identity of ``pid``; None when the process does not exist (or exited while being read)."""
        start = self._start_time(pid)
        if start is None:
            return None
        with self._lock:
            cached = self._cache.get(pid)
            if cached is not None and cached.start_time_ticks == start:
                self._cache.move_to_end(pid)
                return cached
        info = self._read(pid, start)
        if info is None:
            return None
        with self._lock:
            self._cache[pid] = info
            self._cache.move_to_end(pid)
            while len(self._cache) > self._max:
                self._cache.popitem(last=False)
        return info

    def cached(self, pid: int) -> ProcessInfo | None:
        """The last identity seen for ``pid`` even if it has exited since (for short-lived processes)."""
        with self._lock:
            return self._cache.get(pid)

    def thread_name(self, pid: int, tid: int) -> str:
        """The name of thread ``tid`` of ``pid``, or "" when it is gone."""
        try:
            return (self._root / str(pid) / "task" / str(tid) / "comm").read_text().strip()
        except OSError:
            return ""

    def _start_time(self, pid: int) -> int | None:
        try:
            stat = (self._root / str(pid) / "stat").read_text()
        except OSError:
            return None
        # field 22 (starttime), counted after the parenthesised comm which may hold spaces
        fields = stat[stat.rfind(")") + 2:].split()
        try:
            return int(fields[19])
        except (IndexError, ValueError):
            return 0

    def _read(self, pid: int, start: int) -> ProcessInfo | None:
        base = self._root / str(pid)
        try:
            comm = (base / "comm").read_text().strip()
        except OSError:
            return None
        try:
            exe_path = os.readlink(base / "exe")
        except OSError:
            exe_path = ""
        exe_path = exe_path.removesuffix(" (deleted)")
        name = os.path.basename(exe_path) if exe_path else comm
        try:
            container_id, pod_uid = parse_cgroup((base / "cgroup").read_text())
        except OSError:
            container_id, pod_uid = "", ""
        service = self._service_name(base) or name
        return ProcessInfo(pid=pid, executable_name=name, executable_path=exe_path, container_id=container_id,
                           pod_uid=pod_uid, service_name=service, start_time_ticks=start)

    @staticmethod
    def _service_name(base: Path) -> str:
        try:
            environ = (base / "environ").read_bytes()
        except OSError:
            return ""
        for entry in environ.split(b"\0"):
            if entry.startswith(b"OTEL_SERVICE_NAME="):
                return entry.split(b"=", 1)[1].decode(errors="replace")
        return ""
