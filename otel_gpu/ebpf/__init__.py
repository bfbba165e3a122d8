# SPDX-License-Identifier: Apache-2.0
"""eBPF support shared by the CPU sampler and the GPU-time profiler: a ctypes binding over the system libbpf.so.1
(:mod:`otel_gpu.ebpf._libbpf`), the object loader (:mod:`otel_gpu.ebpf.loader`), ctypes mirrors of the structs in
``programs/otel_gpu_bpf.h`` (:mod:`otel_gpu.ebpf.abi`), and the compiled programs under ``programs/``."""
