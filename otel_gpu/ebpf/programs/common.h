/* SPDX-License-Identifier: GPL-2.0 OR BSD-2-Clause */
/*
 * What every otel-gpu eBPF program shares with user space, whichever program it is: included by each program's own
 * header (cpu_profiler.h, gpu_time.h) and mirrored in otel_gpu/ebpf/abi.py; tests/ebpf/test_abi.py checks both.
 */
#ifndef OTEL_GPU_COMMON_H
#define OTEL_GPU_COMMON_H

/* Bytes of a task's comm (TASK_COMM_LEN), as bpf_get_current_comm writes it. */
#define OTEL_GPU_COMM_LEN 16

#endif /* OTEL_GPU_COMMON_H */
