/* SPDX-License-Identifier: Apache-2.0 OR GPL-2.0-only */
/*
 * Records the GPU-time eBPF program (gpu_time.bpf.c) writes into its ring buffer, read by otel_gpu/cuda/abi.py
 * (tests/ebpf/test_abi.py checks the ctypes mirror against this header).
 *
 * Every record starts with struct otel_gpu_event. Launch and sync records then carry the kernel-side user stack of
 * the probing thread (a fallback for when the injected library's own unwind is empty) and the library's record;
 * activity and window records carry the library's record only:
 *
 *   LAUNCH:   otel_gpu_event | otel_gpu_kstack | otel_gpu_launch (payload_len bytes)
 *   SYNC:     otel_gpu_event | otel_gpu_kstack | otel_gpu_sync   (payload_len bytes)
 *   ACTIVITY: otel_gpu_event | otel_gpu_activity                 (one per record of the library's batch)
 *   WINDOW:   otel_gpu_event | otel_gpu_window
 */
#ifndef OTEL_GPU_TIME_H
#define OTEL_GPU_TIME_H

#include "common.h"
/* The injected library's records: that header is the C library's own ABI, so it stays with the library. */
#include "../../cuda/native/otel_gpu_probes.h"

#define OTEL_GPU_KSTACK_DEPTH 64

enum otel_gpu_event_type {
    OTEL_GPU_EVENT_LAUNCH = 1,
    OTEL_GPU_EVENT_ACTIVITY = 2,
    OTEL_GPU_EVENT_SYNC = 3,
    OTEL_GPU_EVENT_WINDOW = 4,
};

/* Indexes of the drop counters (per-CPU array "drops"). */
enum otel_gpu_drop_reason {
    OTEL_GPU_DROP_RINGBUF_FULL = 0, /* bpf_ringbuf_reserve failed */
    OTEL_GPU_DROP_READ_FAILED = 1,  /* bpf_probe_read_user of the library's record failed */
    OTEL_GPU_DROP_BAD_LENGTH = 2,   /* rec_len / count out of the ABI's bounds */
    OTEL_GPU_DROP_REASONS = 3,
};

struct otel_gpu_event {
    otel_u32 type;        /* enum otel_gpu_event_type */
    otel_u32 pid;         /* thread group id, in the agent's pid namespace */
    otel_u32 tid;
    otel_u32 payload_len; /* bytes of the library's record that follow */
    otel_u64 ktime_ns;    /* bpf_ktime_get_ns() at the probe */
    char comm[OTEL_GPU_COMM_LEN];
};

struct otel_gpu_kstack {
    otel_s32 bytes;      /* bpf_get_stack's result: bytes of pcs used, or a negative errno */
    otel_u32 reserved;
    otel_u64 pcs[OTEL_GPU_KSTACK_DEPTH];
};

#endif /* OTEL_GPU_TIME_H */
