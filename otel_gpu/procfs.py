# SPDX-License-Identifier: Apache-2.0
"""Process identity from /proc: executable, container id and Kubernetes pod uid (from the cgroup), service name.

Shared by every source that reports per process (GPU process metrics, CPU and GPU-time profiles).
Takes its filesystem root as a parameter so tests can point it at a fake tree. A process that exits
mid-read yields ``None`` (or partial identity), never an exception.

Every process on the node writes part of what is read here (its name, its environment, the cgroup paths it was
put in), so each file is read up to a cap and parsed without trusting it: any bytes, any length. An environment
or cgroup file past its cap is counted in ``otel_gpu.source.errors`` (source ``procfs``, reason ``environ_too_large``
or ``cgroup_too_large``); the worst a process can do is blank its own identity.
"""

from __future__ import annotations

import os
import re
import threading
import time
import urllib.parse
from collections import OrderedDict
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from otel_gpu import selfmetrics, semconv
from otel_gpu.ranks import rank_attributes

if TYPE_CHECKING:
    from otel_gpu.k8s import PodNames

SOURCE = semconv.Source.PROCFS
# caps on what is read of each file (bytes): far above what the kernel writes for any real process
MAX_STAT_BYTES = 4096  # 52 numbers and a name of at most 64 bytes
MAX_COMM_BYTES = 256  # 16 bytes (64 for kernel threads)
MAX_STATUS_BYTES = 64 << 10  # about 1.5 KiB, the per-CPU and per-group lines grow with the machine
MAX_CGROUP_BYTES = 64 << 10  # one line per hierarchy, each path at most PATH_MAX
MAX_ENVIRON_BYTES = 1 << 20  # limited by the stack (a quarter of RLIMIT_STACK: 2 MiB by default), rarely over 64 KiB
MAX_SERVICE_NAME_CHARS = 256  # a longer OTEL_SERVICE_NAME is cut here
MAX_RESOURCE_ATTRIBUTES_BYTES = 16 << 10  # of OTEL_RESOURCE_ATTRIBUTES, searched for service.name
MAX_CMDLINE_BYTES = 16 << 10  # of /proc/PID/cmdline: the arguments kept below fit in far less
MAX_COMMAND_ARGS = 64  # process.command_args keeps the executable and at most this many arguments after it
MAX_COMMAND_ARG_CHARS = 256  # each cut here
_READ_CHUNK_BYTES = 64 << 10

# 64 hex digits: docker, containerd (cri-containerd-<id>.scope, /<id>), cri-o (crio-<id>.scope), podman (libpod-<id>);
# not crio-conmon-<id>.scope or libpod-conmon-<id>.scope: conmon, the runtime's monitor, runs on the host, outside it
_CONTAINER_RE = re.compile(r"(?:^|[/-])(?<!conmon-)([0-9a-f]{64})(?:\.scope)?(?:/|$)")
# a whole path segment: kubepods/burstable/pod<uid>/... (cgroupfs) or kubepods-burstable-pod<uid_underscored>.slice
# (systemd); a static pod's uid is its manifest's hash, 32 hex digits without dashes, and is reported as it is
_POD_RE = re.compile(r"(?:/|-)pod([0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12}"
                     r"|[0-9a-f]{32})(?:\.slice)?(?:/|$)")
# an argument that names a secret (--password=x, -token x, api_key=x): its value is left out of process.command_args
_SECRET_ARG_RE = re.compile(r"(?i)^(-{0,2}[\w.-]*(?:token|key|secret|pass|pwd|auth|credential|session|jwt|bearer)"
                            r"[\w.-]*)(=.*)?$")
_MASK = "***"
# interpreters whose service.name, without OTEL_SERVICE_NAME, is their script's or module's (python train.py: train)
_PYTHON_RE = re.compile(r"^python(?:[23](?:\.\d+)?)?[dmtu]*$")
_PYTHON_VALUE_OPTIONS = frozenset({"-W", "-X", "-Q", "--check-hash-based-pycs"})  # their value is the next argument
_NODE_VALUE_OPTIONS = frozenset({"-r", "--require", "--import", "--loader", "--experimental-loader", "--env-file",
                                 "--conditions", "-C", "--inspect-port", "--title"})
_JAVA_VALUE_OPTIONS = frozenset({"-cp", "-classpath", "--class-path", "-p", "--module-path", "--add-modules",
                                 "--add-opens", "--add-exports", "--add-reads", "--patch-module",
                                 "--upgrade-module-path", "--limit-modules", "--enable-native-access"})
_SERVICE_NAME_PREFIX = b"OTEL_SERVICE_NAME="
_RESOURCE_ATTRIBUTES_PREFIX = b"OTEL_RESOURCE_ATTRIBUTES="


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
    ranks: tuple[tuple[str, int], ...] = ()  # distributed.rank, ... when a launcher set them (otel_gpu/ranks.py)
    # process.command_args: argv as /proc/PID/cmdline has it, capped, values of secret-named arguments masked;
    # () when --no-process-command-args
    command_args: tuple[str, ...] = ()
    # from the API server when --k8s-names is on (k8s.K8sNames), "" otherwise
    k8s_pod_name: str = ""
    k8s_namespace_name: str = ""
    k8s_container_name: str = ""


def identity_attributes(info: ProcessInfo) -> list[tuple[str, str | int]]:
    """The process's identity as OTel attributes, the same on every signal (GPU metrics per process, CPU, gpu_time
    and sync_wait profiles): service.name (the process's own, else its script's or module's for an interpreter,
    else its executable's name), process.pid, then
    process.executable.name, container.id, k8s.pod.uid, the k8s names and the distributed.* ranks where known. The
    node's (host.name, k8s.node.name) come from the agent's resource."""
    service = info.service_name or info.executable_name
    pairs: list[tuple[str, str | int]] = [(semconv.SERVICE_NAME, service)] if service else []
    pairs.append((semconv.PROCESS_PID, info.pid))
    pairs += [(key, value) for key, value in (
        (semconv.PROCESS_EXECUTABLE_NAME, info.executable_name), (semconv.CONTAINER_ID, info.container_id),
        (semconv.K8S_POD_UID, info.pod_uid), (semconv.K8S_POD_NAME, info.k8s_pod_name),
        (semconv.K8S_NAMESPACE_NAME, info.k8s_namespace_name),
        (semconv.K8S_CONTAINER_NAME, info.k8s_container_name)) if value]
    pairs += info.ranks
    return pairs


class PodNameLookup(Protocol):
    """What the resolver asks for Kubernetes names (k8s.K8sNames); it must not block."""

    def lookup(self, pod_uid: str, container_id: str = "") -> PodNames | None: ...


def read_capped(path: str | os.PathLike[str], max_bytes: int) -> tuple[bytes, bool]:
    """(at most ``max_bytes`` of the file at ``path``, whether it holds more); raises OSError.

    Read in chunks, so a file of any size (or one that never ends) costs at most ``max_bytes`` of memory; opened
    non-blocking so a FIFO put where a file is expected cannot stall the reader."""
    chunks: list[bytes] = []
    total = 0
    more = False
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
    try:
        while True:
            try:
                chunk = os.read(fd, min(_READ_CHUNK_BYTES, max_bytes - total) or 1)
            except BlockingIOError:
                break
            if not chunk:
                break
            if total == max_bytes:  # one byte past the cap: there is more
                more = True
                break
            chunks.append(chunk)
            total += len(chunk)
    finally:
        os.close(fd)
    return b"".join(chunks), more


def _stat_number(stat: bytes, field: int) -> int:
    """Numeric field ``field`` (1-based, as proc(5) numbers them) of the text of /proc/PID/stat; 0 when it has none.

    Fields are counted after the last ``)``: the name before it is the process's own choice (spaces, parentheses,
    any bytes)."""
    fields = stat[stat.rfind(b")") + 2:].split()
    try:
        return max(0, int(fields[field - 3]))
    except (IndexError, ValueError):
        return 0


def parse_stat_start_time(stat: bytes) -> int:
    """The start time in clock ticks since boot (field 22) in the text of /proc/PID/stat; 0 when it has none."""
    return _stat_number(stat, 22)


def parse_stat_arg_start(stat: bytes) -> int:
    """Where the process's argument strings begin (field 48, ``arg_start``) in the text of /proc/PID/stat; 0 when the
    kernel does not show it (no access, no memory) or the text has none. Each exec places them anew (the stack is
    randomized), so the value tells one program a pid runs from the next."""
    return _stat_number(stat, 48)


def process_age_s(pid: int | str = "self", proc_root: str = "/proc") -> float:
    """Seconds since ``pid`` started (its start time in /proc/PID/stat against CLOCK_BOOTTIME); 0 when unknown."""
    try:
        ticks = parse_stat_start_time(read_capped(f"{proc_root}/{pid}/stat", MAX_STAT_BYTES)[0])
    except OSError:
        return 0.0
    if ticks <= 0:
        return 0.0
    return max(0.0, time.clock_gettime(time.CLOCK_BOOTTIME) - ticks / os.sysconf("SC_CLK_TCK"))


def parse_namespace_pid(status: bytes) -> int | None:
    """The pid inside the process's innermost pid namespace (last number of ``NSpid:``) in /proc/PID/status."""
    for line in status.splitlines():
        if line.startswith(b"NSpid:"):
            numbers = line[6:].split()
            try:
                return int(numbers[-1]) if numbers and numbers[-1].isdigit() else None
            except ValueError:
                return None
    return None


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


def parse_command_args(cmdline: bytes) -> tuple[str, ...]:
    """argv from the NUL-separated text of /proc/PID/cmdline: at most :data:`MAX_COMMAND_ARGS` arguments after the
    executable, each cut to :data:`MAX_COMMAND_ARG_CHARS` characters, the value of an argument named like a secret
    (``--password=x``, ``--token x``, ``API_KEY=x``) masked as ``***``."""
    parts = cmdline.split(b"\0", MAX_COMMAND_ARGS + 1)[:MAX_COMMAND_ARGS + 1]
    if parts and not parts[-1]:
        parts.pop()  # the NUL that ends the last argument
    args: list[str] = []
    mask_next = False
    for part in parts:
        arg = _text(part[:4 * MAX_COMMAND_ARG_CHARS])[:MAX_COMMAND_ARG_CHARS]
        if mask_next and not arg.startswith("-"):
            args.append(_MASK)
            mask_next = False
            continue
        match = _SECRET_ARG_RE.match(arg) if args else None  # not the executable's own name
        mask_next = bool(match) and match is not None and match.group(2) is None and arg.startswith("-")
        args.append(f"{match.group(1)}={_MASK}" if match and match.group(2) is not None else arg)
    return tuple(args)


def script_service_name(executable_name: str, args: tuple[str, ...]) -> str:
    """The service.name of an interpreter's process from what it runs: its script (``python train.py``: ``train``),
    its module (``python -m pkg.serve``: ``pkg.serve``), its jar, module or main class (java), else "" (not an
    interpreter, code given inline as with ``python -c``, or nothing to run)."""
    if _PYTHON_RE.match(executable_name):
        return _runs(args[1:], _PYTHON_VALUE_OPTIONS, module="-m", inline=("-c", "-"), suffixes=(".py", ".pyc", ".pyz"))
    if executable_name in ("node", "nodejs", "bun"):
        return _runs(args[1:], _NODE_VALUE_OPTIONS, inline=("-e", "--eval", "-p", "--print", "-"),
                     suffixes=(".js", ".mjs", ".cjs", ".ts"))
    if executable_name == "java":
        rest = iter(args[1:])
        for arg in rest:
            if arg == "-jar":
                return os.path.basename(next(rest, "")).removesuffix(".jar")
            if arg in ("-m", "--module"):
                return next(rest, "").partition("/")[0]
            if not arg.startswith("-"):
                return arg  # the main class
            if arg in _JAVA_VALUE_OPTIONS:
                next(rest, None)
    return ""


def _runs(args: tuple[str, ...], value_options: frozenset[str], *, module: str = "", inline: tuple[str, ...] = (),
          suffixes: tuple[str, ...]) -> str:
    """What an interpreter's arguments (after its own name) say it runs: the value of the ``module`` option, else
    the first argument that is not an option (a path: its file name less ``suffixes``); "" at an option in
    ``inline`` (code given on the command line or on stdin) or when there is none."""
    rest = iter(args)
    for arg in rest:
        if arg in inline:
            return ""
        if module and arg == module:
            return next(rest, "")
        if arg.startswith("-"):
            if arg in value_options:
                next(rest, None)
            continue
        name = os.path.basename(arg)
        for suffix in suffixes:
            name = name.removesuffix(suffix)
        return "" if name == "__main__" else name
    return ""


def parse_service_name(environ: bytes) -> str:
    """The process's own ``service.name`` from the NUL-separated text of /proc/PID/environ, as the OpenTelemetry SDK
    in that process would set it: ``OTEL_SERVICE_NAME``, else ``service.name`` in ``OTEL_RESOURCE_ATTRIBUTES``
    (percent-decoded); "" when neither says. Cut to :data:`MAX_SERVICE_NAME_CHARS` characters."""
    value = _environ_value(environ, _SERVICE_NAME_PREFIX, 4 * MAX_SERVICE_NAME_CHARS)
    if not value:
        attributes = _environ_value(environ, _RESOURCE_ATTRIBUTES_PREFIX, MAX_RESOURCE_ATTRIBUTES_BYTES)
        if len(attributes) == MAX_RESOURCE_ATTRIBUTES_BYTES:  # cut at the cap: its last pair may be cut too
            attributes = attributes[:attributes.rfind(b",") + 1]
        value = _resource_attribute(attributes, b"service.name") if attributes else b""
    return value.decode(errors="replace")[:MAX_SERVICE_NAME_CHARS]


def _environ_value(environ: bytes, prefix: bytes, max_bytes: int) -> bytes:
    """The value of the variable ``prefix`` (``NAME=``) in an environ block, at most ``max_bytes``; b"" when unset.
    Found in place: the environment is not copied."""
    if environ.startswith(prefix):
        start = len(prefix)
    else:
        start = environ.find(b"\0" + prefix)
        if start < 0:
            return b""
        start += 1 + len(prefix)
    end = environ.find(b"\0", start, start + max_bytes)
    return environ[start:end if end >= 0 else start + max_bytes]


def _resource_attribute(attributes: bytes, key: bytes) -> bytes:
    """The percent-decoded value of ``key`` in an ``OTEL_RESOURCE_ATTRIBUTES`` value (``k1=v1,k2=v2``); the last
    one wins, as in the SDK; b"" when absent."""
    found = b""
    for pair in attributes.split(b","):
        name, sep, value = pair.partition(b"=")
        if sep and name.strip() == key:
            found = urllib.parse.unquote_to_bytes(value.strip())
    return found


def _wants_names(info: ProcessInfo, names: PodNameLookup | None) -> bool:
    """Whether the k8s names of ``info`` are still to be looked up: it is in a pod and the pod (or its container,
    when it has one) is not named yet."""
    return names is not None and bool(info.pod_uid) and (
        not info.k8s_pod_name or (bool(info.container_id) and not info.k8s_container_name))


def _text(data: bytes) -> str:
    """/proc text as str: names are bytes chosen by the process (any encoding), never an error."""
    return data.decode(errors="replace")


class ProcessResolver:
    """Resolves pids to :class:`ProcessInfo`, cached per (pid, start time) so reused pids are not confused, and read
    again when the process runs another executable (an exec keeps the pid and start time, and changes the rest)."""

    def __init__(self, proc_root: str = "/proc", max_entries: int = 8192, names: PodNameLookup | None = None, *,
                 command_args: bool = True) -> None:
        self._root = Path(proc_root)
        self._names = names
        self._command_args = command_args  # keep process.command_args (the service.name from a script is kept anyway)
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
        if cached is not None and (cached.start_time_ticks != start or self._executable(pid) not in (
                "", cached.executable_path)):  # "": exiting (a zombie has no exe), not exec'd
            cached = None
        if cached is not None:
            with self._lock:
                self._cache.move_to_end(pid)
            if not _wants_names(cached, self._names):
                return cached
        info = cached or self._read(pid, start)
        if info is None:
            return None
        info = self.with_names(info)
        with self._lock:
            self._cache[pid] = info
            self._cache.move_to_end(pid)
            while len(self._cache) > self._max:
                self._cache.popitem(last=False)
        return info

    def with_names(self, info: ProcessInfo) -> ProcessInfo:
        """``info`` with its pod's k8s names when --k8s-names knows them now (from the last list: never waits on the
        API); ``info`` itself when it has them, has no pod, or the lookup is off. Sources that keep an identity from a
        process's first record use it again before they report, since a new pod is named by a later list. Looked up
        again while the container is unnamed: a restarted container, or the main one after the init ones, has an id
        that a list of its pod may not have yet."""
        if not _wants_names(info, self._names):
            return info
        names = self._names.lookup(info.pod_uid, info.container_id)
        if names is None:
            return info
        return replace(info, k8s_pod_name=names.pod_name, k8s_namespace_name=names.namespace_name,
                       k8s_container_name=names.container_name)

    def cached(self, pid: int) -> ProcessInfo | None:
        """The last identity seen for ``pid`` even if it has exited since (for short-lived processes)."""
        with self._lock:
            return self._cache.get(pid)

    def thread_name(self, pid: int, tid: int) -> str:
        """The name of thread ``tid`` of ``pid``, or "" when it is gone."""
        try:
            return _text(read_capped(self._root / str(pid) / "task" / str(tid) / "comm", MAX_COMM_BYTES)[0]).strip()
        except OSError:
            return ""

    def arg_start(self, pid: int) -> int | None:
        """Where ``pid``'s argument strings begin (:func:`parse_stat_arg_start`): 0 when not shown, None when gone."""
        stat = self._stat(pid)
        return parse_stat_arg_start(stat) if stat is not None else None

    def _start_time(self, pid: int) -> int | None:
        stat = self._stat(pid)
        return parse_stat_start_time(stat) if stat is not None else None

    def _stat(self, pid: int) -> bytes | None:
        try:
            return read_capped(self._root / str(pid) / "stat", MAX_STAT_BYTES)[0]
        except OSError:
            return None

    def _read(self, pid: int, start: int) -> ProcessInfo | None:
        base = self._root / str(pid)
        try:
            comm = _text(read_capped(base / "comm", MAX_COMM_BYTES)[0]).strip()
        except OSError:
            return None
        exe_path = self._executable(pid)
        name = os.path.basename(exe_path) if exe_path else comm
        cgroup = self._capped(base / "cgroup", MAX_CGROUP_BYTES, semconv.Reason.CGROUP_TOO_LARGE)
        container_id, pod_uid = parse_cgroup(_text(cgroup))
        environ = self._capped(base / "environ", MAX_ENVIRON_BYTES, semconv.Reason.ENVIRON_TOO_LARGE)
        try:
            args = parse_command_args(read_capped(base / "cmdline", MAX_CMDLINE_BYTES)[0])
        except OSError:
            args = ()
        service = parse_service_name(environ) or script_service_name(name, args) or name
        return ProcessInfo(pid=pid, executable_name=name, executable_path=exe_path, container_id=container_id,
                           pod_uid=pod_uid, service_name=service, start_time_ticks=start,
                           ranks=rank_attributes(environ), command_args=args if self._command_args else ())

    def _executable(self, pid: int) -> str:
        """The path of the process's executable ("" when unreadable: gone, or a kernel thread)."""
        try:
            exe_path = _text(os.readlink(os.fsencode(self._root / str(pid) / "exe")))  # any bytes: made valid UTF-8
        except OSError:
            return ""
        return exe_path.removesuffix(" (deleted)")

    @staticmethod
    def _capped(path: Path, max_bytes: int, too_large: semconv.Reason) -> bytes:
        """Up to ``max_bytes`` of ``path`` (b"" when unreadable); a longer file is counted as ``too_large``."""
        try:
            data, more = read_capped(path, max_bytes)
        except OSError:
            return b""
        if more:
            selfmetrics.count(semconv.SELF_ERRORS.name, otel_gpu__source=SOURCE, otel_gpu__reason=too_large)
        return data
