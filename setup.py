# SPDX-License-Identifier: Apache-2.0
"""What pyproject.toml cannot say with the setuptools versions that build the package (77 and up): the wheel carries
native parts that `make build` compiles (BPF objects, ctypes libraries, and one CPython extension built against the
limited API of 3.10), so it is a platform wheel tagged cp310-abi3, and a wheel built without them fails, naming
what is missing, instead of installing an agent that finds none of its BPF programs.

Setuptools compiles none of these parts; it only has to know that the wheel is not pure Python (the distribution
says it has extension modules) and to check that they are there before it copies the package."""

from __future__ import annotations

from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.dist import Distribution
from setuptools.errors import FileError

ROOT = Path(__file__).resolve().parent
LIBRARIES = (
    "otel_gpu/cuda/native/libotel_gpu_inject.so",
    "otel_gpu/instrumentation/native/libotel_gpu_context.so",
    "otel_gpu/instrumentation/_hooks.abi3.so",
    "otel_gpu/unwind/native/libotel_gpu_cfi.so",
    "otel_gpu/symbolize/native/libotel_gpu_symtab.so",
)


def native_parts() -> list[str]:
    """What `make build` puts into the package: one BPF object per program source, and the libraries."""
    programs = sorted(ROOT.glob("otel_gpu/ebpf/programs/*.bpf.c"))
    return [str(p.relative_to(ROOT).with_suffix(".o")) for p in programs] + list(LIBRARIES)


class PlatformDistribution(Distribution):
    def has_ext_modules(self) -> bool:
        return True


class BuildWithNativeParts(build_py):
    def run(self) -> None:
        if not self.editable_mode:  # an editable install uses the tree as it is, built or not
            missing = [part for part in native_parts() if not (ROOT / part).is_file()]
            if missing:
                raise FileError(f"native parts not built: {', '.join(missing)}; run `make build` first")
        super().run()


setup(
    distclass=PlatformDistribution,
    cmdclass={"build_py": BuildWithNativeParts},
    options={"bdist_wheel": {"py_limited_api": "cp310"}},  # the one extension's API; the rest are ctypes libraries
)
