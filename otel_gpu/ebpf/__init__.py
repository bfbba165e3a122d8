# SPDX-License-Identifier: Apache-2.0
"""eBPF support shared by the CPU sampler and the GPU-time profiler: a ctypes binding over the system libbpf.so.1
(:mod:`otel_gpu.ebpf._libbpf`), the object loader (:mod:`otel_gpu.ebpf.loader`), and the one tree of programs under
``programs/``: each ``x.bpf.c`` with its header ``x.h`` (what it shares with user space), ``common.h`` for what
they all share, one Makefile. The ctypes mirrors are :mod:`otel_gpu.ebpf.abi` (common.h, cpu_profiler.h) and
:mod:`otel_gpu.cuda.abi` (gpu_time.h and the injected library's otel_gpu_probes.h).

This module names where the compiled objects are and imports nothing else, so naming a path never loads libbpf."""

from __future__ import annotations

from pathlib import Path

PROGRAMS_DIR = Path(__file__).resolve().parent / "programs"


def program_path(name: str) -> Path:
    """The compiled object ``programs/<name>.bpf.o`` shipped with the package."""
    return PROGRAMS_DIR / f"{name}.bpf.o"
