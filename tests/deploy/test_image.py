# SPDX-License-Identifier: Apache-2.0
"""The container image: built from the Dockerfile with Buildah (no daemon, no registry), then the agent run in it
the way the Helm chart runs it (the chart's capability list, not privileged, host PID, /sys/kernel/btf mounted,
the runtime's seccomp profile off) against workloads on the host that run as another user: a C program that
burns CPU and the fake CUDA workload with the injection library the image carries (copied out as the chart's init
container copies it). Profiles come out of both, with symbols. Then each capability of the list is dropped in turn
to show that the agent needs it. The span processor, run by the image's python3, loads its C hooks.

Needs root, Podman, Buildah, runc and debootstrap (scripts/install-system.sh). The base image (debootstrap of
bookworm) is kept in Podman's storage and reused; a cold run builds it first.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.conftest import NATIVE, REPO
from tests.deploy.test_chart import by_kind, render
from tests.profiles import pprof_proto

IMAGE = "localhost/otel-gpu:test"
INSTALLED_CHECK = Path(__file__).with_name("installed_check.py")
CONTAINERS_CONF = REPO / ".cache" / "containers" / "containers.conf"
LIBRARY_IN_IMAGE = "/opt/otel-gpu/lib/libotel_gpu_inject.so"
NOBODY = 65534
AGENT_SECONDS = 6

pytestmark = [
    pytest.mark.root,
    pytest.mark.image,
    pytest.mark.timeout(900),  # the first test pays for a cold build: debootstrap and both stages (131 s measured)
    pytest.mark.skipif(not all(shutil.which(t) for t in ("podman", "buildah", "runc", "debootstrap")),
                       reason="needs podman, buildah, runc and debootstrap (scripts/install-system.sh)"),
]


def chart_capabilities(gpu_time: bool = True) -> list[str]:
    """The capabilities the chart grants by default (values.yaml): the base list, and the GPU-time additions."""
    values = yaml.safe_load((REPO / "helm" / "otel-gpu" / "values.yaml").read_text())["securityContext"]
    return list(values["capabilities"]) + (list(values["gpuTimeCapabilities"]) if gpu_time else [])


def _podman(*args: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, CONTAINERS_CONF=str(CONTAINERS_CONF))
    return subprocess.run(["podman", "--runtime", "runc", *args], env=env, capture_output=True, text=True,
                          check=check, timeout=timeout)


def _place_library(image: str, lib_dir: Path) -> None:
    """Runs the chart's init container (its command, from the rendered chart) with ``lib_dir`` as the node's
    folder."""
    (daemonset,) = by_kind(render([]), "DaemonSet")
    (init,) = daemonset["spec"]["template"]["spec"]["initContainers"]
    mount = {m["name"]: m["mountPath"] for m in init["volumeMounts"]}["injection-library"]
    _podman("run", "--rm", "--network", "none", "--cap-drop", "all", "--read-only", "-v", f"{lib_dir}:{mount}",
            "--entrypoint", init["command"][0], image, *init["command"][1:], *init["args"])


@pytest.fixture(scope="module")
def image() -> str:
    started = time.monotonic()
    done = subprocess.run(["bash", str(REPO / "scripts" / "image.sh"), "build"], env=dict(os.environ, IMAGE=IMAGE),
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    print(f"image built in {time.monotonic() - started:.0f} s: {done.stdout.strip()}")
    return IMAGE


@pytest.fixture(scope="module")
def shared_dir() -> Iterator[Path]:
    """A folder the workloads' user can read: the workloads and the library copied out of the image."""
    folder = Path(tempfile.mkdtemp(prefix="otel-gpu-image-"))
    folder.chmod(0o755)
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="module")
def workloads(image: str, shared_dir: Path) -> Iterator[dict[str, int]]:
    """cpu_3to1 and the injected fake CUDA workload, both running as nobody for the whole module."""
    lib_dir = shared_dir / "lib"
    lib_dir.mkdir(mode=0o755)
    # the chart's init container: copy the library out of the image onto a host folder
    _place_library(image, lib_dir)
    library = lib_dir / "libotel_gpu_inject.so"
    assert library.is_file()
    # cpu_3to1 where only its user may look (a folder and a binary of mode 0700, as in many images)
    private = shared_dir / "private"
    private.mkdir(mode=0o700)
    shutil.copy2(NATIVE / "workloads" / "cpu_3to1", private / "cpu_3to1")
    (private / "cpu_3to1").chmod(0o700)
    for path in (private, private / "cpu_3to1"):
        os.chown(path, NOBODY, NOBODY)
    cuda = shared_dir / "cuda"
    shutil.copytree(NATIVE / "cuda", cuda)
    for path in cuda.rglob("*"):
        path.chmod(0o755)
    as_nobody = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"]
    env = dict(os.environ, CUDA_INJECTION64_PATH=str(library), OTEL_GPU_CUPTI_PATH=str(cuda / "libcupti.so"),
               OTEL_GPU_OVERHEAD_BUDGET="0.05", OTEL_GPU_DEBUG_GRAPH_PROBE_EVERY_MS="10")
    cpu = subprocess.Popen([*as_nobody, str(private / "cpu_3to1"), "600"], stdout=subprocess.DEVNULL, cwd="/")
    gpu = subprocess.Popen([*as_nobody, str(cuda / "workload"), "--steps", "300000"], env=env,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd="/")
    time.sleep(0.5)
    try:
        assert cpu.poll() is None and gpu.poll() is None, "a workload did not start"
        yield {"cpu": cpu.pid, "gpu": gpu.pid}
    finally:
        for process in (cpu, gpu):
            process.kill()
            process.wait()


def run_agent(image: str, out_dir: Path, capabilities: list[str], pids: list[int],
              gpu_time: bool = True) -> subprocess.CompletedProcess[str]:
    """The agent in the image as the chart runs it, with ``capabilities`` only, writing files into ``out_dir``."""
    out_dir.mkdir(exist_ok=True)
    caps = ["--cap-add", ",".join(capabilities)] if capabilities else []
    pid_args = [arg for pid in pids for arg in ("--pid", str(pid))]
    return _podman("run", "--rm", "--network", "none", "--pid", "host", "--cap-drop", "all", *caps,
                   "--security-opt", "seccomp=unconfined", "--security-opt", "no-new-privileges", "--read-only",
                   "-v", "/sys/kernel/btf:/sys/kernel/btf:ro", "-v", f"{out_dir}:/var/lib/otel-gpu",
                   image, "run", "--duration", str(AGENT_SECONDS), "--no-gpu-metrics", "--local-files", "on",
                   "--profiling-interval", "2", "--profiling-frequency-hz", "99", *pid_args,
                   *([] if gpu_time else ["--no-gpu-time-profiling"]),
                   check=False, timeout=120)


def functions_by_pid(out_dir: Path, kind: str) -> dict[int, set[str]]:
    """Function names in the ``kind`` profile files (cpu, gpu_time), by the pid label of their samples."""
    out: dict[int, set[str]] = {}
    for path in sorted(out_dir.glob(f"profile-{kind}-*.pb.gz")):
        profile = pprof_proto.decode(path.read_bytes())
        strings = profile.string_table
        names = {f.id: strings[f.name] for f in profile.function}
        locations = {loc.id: {names[line.function_id] for line in loc.line} for loc in profile.location}
        for sample in profile.sample:
            pid = next((label.num for label in sample.label if strings[label.key] == "pid"), 0)
            for location in sample.location_id:
                out.setdefault(pid, set()).update(locations[location])
    return out


def missing(out_dir: Path, pids: dict[str, int], stderr: str, gpu_time: bool = True) -> list[str]:
    """What the chart promises that a run left out: CPU stacks of cpu_3to1 with its symbols, kernel symbols, and
    (``gpu_time``) GPU time of the CUDA workload under its kernels' names."""
    out = []
    if "leaf_heavy" not in functions_by_pid(out_dir, "cpu").get(pids["cpu"], set()):
        out.append("cpu: leaf_heavy of cpu_3to1")
    if "kernel frames stay unsymbolized" in stderr:
        out.append("kernel symbols")
    if gpu_time and "matmul_kernel" not in functions_by_pid(out_dir, "gpu_time").get(pids["gpu"], set()):
        out.append("gpu_time: matmul_kernel of the CUDA workload")
    return out


def test_image_runs_the_agent_with_the_chart_capabilities(image: str, workloads: dict[str, int],
                                                          tmp_path: Path) -> None:
    agent = run_agent(image, tmp_path / "out", chart_capabilities(), list(workloads.values()))
    assert agent.returncode == 0, agent.stderr[-4000:]
    assert "cpu profiling on, gpu-time profiling on" in agent.stderr, agent.stderr[-4000:]
    assert missing(tmp_path / "out", workloads, agent.stderr) == [], agent.stderr[-4000:]


@pytest.mark.parametrize("dropped", chart_capabilities(gpu_time=False))
def test_each_capability_is_needed_for_cpu_profiling(image: str, workloads: dict[str, int], tmp_path: Path,
                                                     dropped: str) -> None:
    fewer = [c for c in chart_capabilities(gpu_time=False) if c != dropped]
    agent = run_agent(image, tmp_path / "out", fewer, list(workloads.values()), gpu_time=False)
    assert agent.returncode == 0, agent.stderr[-4000:]
    lost = missing(tmp_path / "out", workloads, agent.stderr, gpu_time=False)
    assert lost, f"CPU profiling works without CAP_{dropped}: take it off the chart's list"
    print(f"without CAP_{dropped}: {lost}")


@pytest.mark.parametrize("dropped", [c for c in chart_capabilities() if c not in chart_capabilities(gpu_time=False)])
def test_each_gpu_time_capability_is_needed(image: str, workloads: dict[str, int], tmp_path: Path,
                                            dropped: str) -> None:
    fewer = [c for c in chart_capabilities() if c != dropped]
    agent = run_agent(image, tmp_path / "out", fewer, list(workloads.values()))
    assert agent.returncode == 0, agent.stderr[-4000:]
    lost = missing(tmp_path / "out", workloads, agent.stderr)
    assert "gpu_time: matmul_kernel of the CUDA workload" in lost, \
        f"GPU time works without CAP_{dropped}: take it off gpuTimeCapabilities"


def test_image_holds_only_the_runtime(image: str) -> None:
    listed = _podman("run", "--rm", "--network", "none", "--entrypoint", "/bin/sh", image, "-c",
                     "command -v clang gcc bpftool pip make || true; dpkg-query -W -f '${Package}\\n' libbpf1 "
                     "libelf1 python3 binutils; test -f " + LIBRARY_IN_IMAGE + " && echo library; "
                     "echo _ZNSt6vectorIiSaIiEE9push_backERKi | c++filt -i; "
                     "python3 -c 'from otel_gpu.unwind import native_table; print(native_table.available())'; "
                     "python3 -c 'import importlib.util as u; print([m for m in (\"pip\", \"setuptools\", \"wheel\") "
                     "if u.find_spec(m)])'")
    lines = listed.stdout.splitlines()
    assert lines == ["binutils", "libbpf1", "libelf1", "python3", "library",  # dpkg-query lists by name
                     "std::vector<int, std::allocator<int> >::push_back(int const&)",
                     "True",  # the unwind-table builder (else frame pointers only)
                     "[]"], listed.stdout + listed.stderr  # no build tools in the agent's environment
    size = int(_podman("image", "inspect", "--format", "{{.Size}}", image).stdout)
    print(f"image size: {size / 1e6:.0f} MB")


def test_the_span_processor_runs_its_c_hooks_in_the_image(image: str) -> None:
    """The image's package carries the span context table and the C hooks, and the hooks load in its python3."""
    ran = _podman("run", "--rm", "--network", "none", "--read-only", "--entrypoint", "python3", image,
                  "-c", INSTALLED_CHECK.read_text(), check=False)
    assert ran.returncode == 0, ran.stderr[-3000:]
    found = json.loads(ran.stdout)
    package = Path(found["package"]).parent
    assert package.is_relative_to("/opt/otel-gpu/venv"), found
    assert found["hooks"] == str(package / "instrumentation" / "_hooks.abi3.so"), found
    assert found["table"] == str(package / "instrumentation" / "native" / "libotel_gpu_context.so"), found
    assert found["c_hooks"] and found["published"], found


def test_the_init_container_keeps_an_unchanged_library_and_replaces_another_by_rename(image: str,
                                                                                   tmp_path: Path) -> None:
    """A restarted pod leaves the node's copy alone (running workloads map that inode: the agent's probes on it stay
    valid); another version is replaced by rename, so a process that has the old file open or mapped keeps it."""
    lib_dir = tmp_path / "lib"
    lib_dir.mkdir()
    library = lib_dir / "libotel_gpu_inject.so"
    library.write_bytes(b"an older version")
    held = os.open(library, os.O_RDONLY)  # as a running workload holds its copy
    try:
        _place_library(image, lib_dir)
        placed = library.stat()
        assert library.read_bytes()[:4] == b"\x7fELF" and placed.st_mode & 0o777 == 0o755
        assert os.pread(held, 64, 0) == b"an older version"
    finally:
        os.close(held)
    _place_library(image, lib_dir)  # the pod again, same image
    again = library.stat()
    assert (again.st_ino, again.st_mtime_ns) == (placed.st_ino, placed.st_mtime_ns)
    assert sorted(p.name for p in lib_dir.iterdir()) == ["libotel_gpu_inject.so"]
