# SPDX-License-Identifier: Apache-2.0
"""GPU-time profiling: which code launched each CUDA kernel, weighted by its GPU time, and where CPU threads wait.

The injected library (``native/``, loaded with ``CUDA_INJECTION64_PATH``) fires USDT probes; the eBPF program
(``ebpf/programs/gpu_time.bpf.c``) copies their records into a ring buffer; :class:`~otel_gpu.cuda.source.GPUTimeSource`
holds its two parts: :mod:`~otel_gpu.cuda.probes` attaches and decodes (:mod:`~otel_gpu.cuda.abi`),
:mod:`~otel_gpu.cuda.accounting` joins launches with GPU activity (:mod:`~otel_gpu.cuda.join`) and builds gpu_time
and sync_wait profiles (:mod:`~otel_gpu.cuda.builder`).
"""
