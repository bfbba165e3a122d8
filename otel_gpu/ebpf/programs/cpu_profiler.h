/* SPDX-License-Identifier: GPL-2.0 OR BSD-2-Clause */
/*
 * What the CPU sampler (cpu_profiler.bpf.c) shares with user space: its map keys and values, ring-buffer records
 * and statistics. otel_gpu/ebpf/abi.py mirrors it with ctypes; tests/ebpf/test_abi.py compiles a C program that
 * prints the sizes and offsets below and compares them with the mirror.
 */
#ifndef OTEL_GPU_CPU_PROFILER_H
#define OTEL_GPU_CPU_PROFILER_H

#ifdef __BPF__
/* vmlinux.h provides __u32/__s32/__u64 */
#else
#include <linux/types.h>
#endif

#include "common.h"

#define OTEL_GPU_MAX_STACK_DEPTH 127

/* The CPU sampler's statistics (a per-CPU array indexed by this enum). */
enum otel_gpu_cpu_stat {
    OTEL_GPU_STAT_SAMPLES = 0,          /* samples taken (after filters) */
    OTEL_GPU_STAT_FILTERED = 1,         /* samples skipped by the pid filter or the agent's own tgid */
    OTEL_GPU_STAT_USER_COLLISION = 2,   /* bpf_get_stackid -EEXIST on the user stack: stack lost */
    OTEL_GPU_STAT_KERNEL_COLLISION = 3, /* same for the kernel stack */
    OTEL_GPU_STAT_STACK_ERROR = 4,      /* bpf_get_stackid failed otherwise (-ENOMEM, ...), user or kernel */
    OTEL_GPU_STAT_COUNTS_FULL = 5,      /* the counts map was full: sample dropped */
    OTEL_GPU_STAT_EVENTS_FULL = 6,      /* the process-event ring buffer was full: new-process event dropped */
    OTEL_GPU_STAT_RAW_SENT = 7,         /* samples sent whole through raw_samples because a stack id collided */
    OTEL_GPU_STAT_RAW_FULL = 8,         /* raw_samples was full: a collided sample lost its stacks */
    OTEL_GPU_STAT_COUNT = 9,
};

/* Key of the aggregated counts: one entry per distinct (process, thread, user stack, kernel stack). */
struct otel_gpu_sample_key {
    __u32 pid;             /* tgid */
    __u32 tid;
    __s32 user_stack_id;   /* id in the generation's stack map, < 0 when there is none (error code) */
    __s32 kernel_stack_id; /* id in the generation's stack map, < 0 when the sample was taken in user mode */
    __u8 trace_id[16];     /* the span the thread was in (span_context.h), all zero outside one */
    __u8 span_id[8];
};

struct otel_gpu_sample_value {
    __u64 count;
    char comm[OTEL_GPU_COMM_LEN]; /* the thread's name when the entry was created */
};

/* Sent through the process_events ring buffer the first time a process is sampled, so user space can read
 * /proc/PID/maps while the process still lives. */
struct otel_gpu_process_event {
    __u32 pid;
    __u32 tid;
    __u64 time_ns; /* bpf_ktime_get_ns() */
    char comm[OTEL_GPU_COMM_LEN];
};

/* A whole sample with its stacks (bpf_get_stack), sent through the raw_samples ring buffer instead of the counts
 * when bpf_get_stackid reports a stack-map collision (-EEXIST), so that a collision costs no sample. */
struct otel_gpu_raw_sample {
    __u32 pid;
    __u32 tid;
    __s32 user_bytes;   /* bytes written into user (bpf_get_stack), < 0: error */
    __s32 kernel_bytes; /* bytes written into kernel, < 0: error (-EFAULT in user mode) */
    char comm[OTEL_GPU_COMM_LEN];
    __u64 user[OTEL_GPU_MAX_STACK_DEPTH];
    __u64 kernel[OTEL_GPU_MAX_STACK_DEPTH];
    __u8 trace_id[16];  /* as in otel_gpu_sample_key */
    __u8 span_id[8];
};

/* Single entry of the control array: which generation of counts/stack maps the sampler writes to (0 or 1).
 * User space flips it before draining the other generation, so no sample is lost while draining. */
struct otel_gpu_control {
    __u32 generation;
    __u32 reserved;
};

#endif /* OTEL_GPU_CPU_PROFILER_H */
