/* SPDX-License-Identifier: GPL-2.0 OR BSD-2-Clause */
/*
 * Reading the span context table (docs/span-context.md, otel_gpu/instrumentation/native/span_context.h) of the
 * sampled process at sample time. User space finds the table's address in processes that loaded
 * libotel_gpu_context.so and puts it in span_tables; a process without an entry costs one hash lookup.
 */
#ifndef OTEL_GPU_SPAN_CONTEXT_BPF_H
#define OTEL_GPU_SPAN_CONTEXT_BPF_H

#ifndef __BPF__
#include <linux/types.h>
#endif

#include "common.h"

#define OTEL_GPU_SPAN_SLOTS 4096      /* span_context.h: OTEL_GPU_SPAN_CONTEXT_SLOTS (user space checks the header) */
#define OTEL_GPU_SPAN_MAX_PROBE 8
#define OTEL_GPU_SPAN_HEADER 16
#define OTEL_GPU_SPAN_SLOT_SIZE 40

/* The trace a sample was taken in and the span it is labelled with: the local root of the thread's active span (the
 * span that carries pyroscope.profile.id, which Grafana's traces-to-profiles selects samples by), or the active span
 * itself where the thread knows no local root (a child whose root is on another thread). All zero outside any span. */
struct otel_gpu_span_ids {
    __u8 trace_id[16];
    __u8 span_id[8];
};

struct otel_gpu_span_slot_v1 {
    __u32 tid;
    __u32 seq;
    __u8 trace_id[16];
    __u8 span_id[8];
    __u8 local_root_span_id[8];
};

#ifdef __BPF__ /* the map and the reader are the BPF side's; user space shares only the structs above */
struct {
    __uint(type, BPF_MAP_TYPE_HASH);
    __uint(max_entries, 4096);
    __type(key, __u32);   /* tgid */
    __type(value, __u64); /* address of otel_gpu_span_context_table in that process */
} span_tables SEC(".maps");

static __always_inline void read_span_ids(__u32 pid, __u32 tid, struct otel_gpu_span_ids *out) {
    __u64 *table = bpf_map_lookup_elem(&span_tables, &pid);
    if (!table)
        return;
    struct otel_gpu_span_slot_v1 slot;
#pragma unroll
    for (__u32 i = 0; i < OTEL_GPU_SPAN_MAX_PROBE; i++) {
        __u64 index = (tid + i) & (OTEL_GPU_SPAN_SLOTS - 1);
        __u64 at = *table + OTEL_GPU_SPAN_HEADER + index * OTEL_GPU_SPAN_SLOT_SIZE;
        if (bpf_probe_read_user(&slot, sizeof(slot), (const void *)at))
            return;
        if (slot.tid != tid)
            continue;
        if (slot.seq & 1) /* interrupted while writing its slot: no span rather than a torn one */
            return;
        __builtin_memcpy(out->trace_id, slot.trace_id, sizeof(out->trace_id));
        __u64 root;
        __builtin_memcpy(&root, slot.local_root_span_id, sizeof(root));
        if (root)
            __builtin_memcpy(out->span_id, slot.local_root_span_id, sizeof(out->span_id));
        else
            __builtin_memcpy(out->span_id, slot.span_id, sizeof(out->span_id));
        return;
    }
}
#endif /* __BPF__ */

#endif
