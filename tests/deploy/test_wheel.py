# SPDX-License-Identifier: Apache-2.0
"""The package's wheel, built as the README says (`make build`, then `pip wheel .`): a platform wheel that carries
every native part `make build` compiled, installed into a fresh virtual environment where, from outside the
repository, the span processor runs its C hooks over the span context table and the agent loads its BPF programs.
Built before `make build`, the wheel fails to build and names what is missing.

The wheel is built without build isolation from a copy of the package's sources and built parts (an in-tree build
leaves build/ behind, whose stale files would go into later wheels); the fresh environment gets its dependencies from
this interpreter's site-packages through a .pth file."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from importlib import metadata
from pathlib import Path

import pytest

from tests.conftest import REPO

CHECK = Path(__file__).with_name("installed_check.py")
NATIVE_SUFFIXES = (".so", ".bpf.o")
SOURCES = ("pyproject.toml", "README.md", "LICENSE", "setup.py", "otel_gpu")


BUILD_SETUPTOOLS = (77, 0)  # pyproject.toml's build system: the first setuptools that takes an SPDX `license`


def _setuptools_version() -> tuple[int, ...] | None:
    """This environment's setuptools, which builds the wheel here (no build isolation); None when there is none."""
    try:
        return tuple(int(part) for part in metadata.version("setuptools").split(".")[:2])
    except metadata.PackageNotFoundError:
        return None


_found = _setuptools_version()
pytestmark = pytest.mark.skipif(
    _found is None or _found < BUILD_SETUPTOOLS,
    reason=f"builds the wheel with this environment's setuptools, which must be 77 or later (the test extras); "
           f"found {'none' if _found is None else '.'.join(map(str, _found))}")


def built_native_parts() -> list[str]:
    """The native parts `make build` left in the package tree, relative to the repository."""
    return sorted(str(p.relative_to(REPO)) for p in (REPO / "otel_gpu").rglob("*")
                  if p.name.endswith(NATIVE_SUFFIXES) and p.is_file())


def copy_sources(to: Path) -> Path:
    """The package's sources with whatever `make build` left among them (vmlinux.h too: the wheel must leave it out)."""
    to.mkdir(exist_ok=True)
    for name in SOURCES:
        source = REPO / name
        if source.is_dir():
            shutil.copytree(source, to / name, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
        else:
            shutil.copy2(source, to / name)
    return to


def build_wheel(sources: Path, dist: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                           "--no-index", "-w", str(dist), str(sources)],
                          cwd=sources, capture_output=True, text=True, timeout=180)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    sources = copy_sources(tmp_path_factory.mktemp("sources"))
    dist = tmp_path_factory.mktemp("dist")
    built = build_wheel(sources, dist)
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    (path,) = dist.glob("*.whl")
    return path


@pytest.fixture(scope="module")
def venv(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A fresh virtual environment with the wheel installed: its interpreter and its site-packages."""
    root = tmp_path_factory.mktemp("venv")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True, timeout=60)
    python = root / "bin" / "python"
    site = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('platlib'))"],
                               capture_output=True, text=True, check=True, timeout=30).stdout.strip())
    installed = subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps",
                                "--no-index", str(wheel)], capture_output=True, text=True, timeout=120)
    assert installed.returncode == 0, installed.stderr[-3000:]
    # the dependencies: this interpreter's site-packages, after the venv's own (whose otel_gpu comes first)
    (site / "otel_gpu_test_dependencies.pth").write_text(sysconfig.get_path("purelib") + "\n")
    return {"python": python, "bin": root / "bin", "site": site}


def installed_env() -> dict[str, str]:
    """The environment to run the installed package in: nothing on PYTHONPATH (the repository is on it in tests)."""
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}


def test_the_wheel_is_tagged_for_the_platform_and_carries_every_native_part(wheel: Path) -> None:
    platform = sysconfig.get_platform().replace("-", "_").replace(".", "_")
    assert wheel.name.startswith("otel_gpu-") and wheel.name.endswith(f"-cp310-abi3-{platform}.whl"), wheel.name
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        (info,) = [n for n in names if n.endswith(".dist-info/WHEEL")]
        fields = archive.read(info).decode().splitlines()
        metadata = archive.read(info.replace("/WHEEL", "/METADATA")).decode().splitlines()
    assert "Root-Is-Purelib: false" in fields and f"Tag: cp310-abi3-{platform}" in fields, fields
    assert "License-Expression: Apache-2.0" in metadata and "License-File: LICENSE" in metadata, metadata[:20]
    assert [n for n in names if n.endswith(".dist-info/licenses/LICENSE")], sorted(names)[-10:]
    assert [part for part in built_native_parts() if part not in names] == []
    assert [n for n in names if n.endswith("vmlinux.h")] == []


def test_a_wheel_without_the_native_parts_does_not_build(tmp_path: Path) -> None:
    sources = copy_sources(tmp_path / "sources")
    for removed in ("otel_gpu/ebpf/programs/gpu_time.bpf.o", "otel_gpu/instrumentation/_hooks.abi3.so"):
        (sources / removed).unlink(missing_ok=True)
    built = build_wheel(sources, tmp_path / "dist")
    assert built.returncode != 0 and not list((tmp_path / "dist").glob("*.whl"))
    assert ("native parts not built: otel_gpu/ebpf/programs/gpu_time.bpf.o, otel_gpu/instrumentation/_hooks.abi3.so; "
            "run `make build` first") in built.stdout + built.stderr, built.stderr[-3000:]


def test_the_installed_span_processor_runs_its_c_hooks_and_finds_every_native_part(venv: dict[str, Path],
                                                                                   tmp_path: Path) -> None:
    ran = subprocess.run([str(venv["python"]), "-c", CHECK.read_text()], cwd=tmp_path, env=installed_env(),
                         capture_output=True, text=True, timeout=60)
    assert ran.returncode == 0, ran.stderr[-3000:]
    found = json.loads(ran.stdout)
    package = venv["site"] / "otel_gpu"
    assert found["package"] == str(package / "__init__.py")
    assert found["hooks"] == str(package / "instrumentation" / "_hooks.abi3.so")
    assert found["table"] == str(package / "instrumentation" / "native" / "libotel_gpu_context.so")
    assert found["c_hooks"] and found["published"], found
    programs = sorted(p.name for p in (REPO / "otel_gpu" / "ebpf" / "programs").glob("*.bpf.c"))
    assert found["bpf_objects"] == [str(package / "ebpf" / "programs" / p.replace(".c", ".o")) for p in programs]
    assert found["inject"] == str(package / "cuda" / "native" / "libotel_gpu_inject.so")
    assert found["unwind"] and found["symtab"], found


@pytest.mark.root
def test_the_installed_agent_loads_its_bpf_programs(venv: dict[str, Path], tmp_path: Path) -> None:
    agent = subprocess.run([str(venv["bin"] / "otel-gpu"), "run", "--duration", "1", "--no-gpu-metrics",
                            "--local-files", "on", "--output-dir", str(tmp_path / "out")],
                           cwd=tmp_path, env=installed_env(), capture_output=True, text=True, timeout=60)
    assert agent.returncode == 0, agent.stderr[-3000:]
    assert "cpu profiling on, gpu-time profiling on" in agent.stderr, agent.stderr[-3000:]
