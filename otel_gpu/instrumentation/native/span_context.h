/* SPDX-License-Identifier: Apache-2.0 */
/* The span context record, version 1: what an instrumented process publishes so that the agent's BPF sampler and the
 * injected CUDA library can tell which span a thread is in. The layout is a contract (docs/span-context.md): fields are
 * only ever appended, and any other change bumps OTEL_GPU_SPAN_CONTEXT_VERSION.
 *
 * One process-wide table, found by its exported symbol, rather than thread-local storage: BPF reads it at
 * <symbol address> + slot offset without knowing the TLS model or the thread pointer. A thread's slot is
 * tid & (slot_count - 1), probing forward up to max_probe slots when another thread holds it. */
#ifndef OTEL_GPU_SPAN_CONTEXT_H
#define OTEL_GPU_SPAN_CONTEXT_H

#include <stdint.h>

#define OTEL_GPU_SPAN_CONTEXT_SYMBOL "otel_gpu_span_context_table"
#define OTEL_GPU_SPAN_CONTEXT_MAGIC 0x4353474fu /* "OGSC" little-endian */
#define OTEL_GPU_SPAN_CONTEXT_VERSION 1
#define OTEL_GPU_SPAN_CONTEXT_SLOTS 4096       /* a power of two */
#define OTEL_GPU_SPAN_CONTEXT_MAX_PROBE 8

/* Beside the table, not in it (the slot layout stays version 1): one 64-bit mask per slot, at the same index, of the
 * CUDA devices (bit n: ordinal n, as cuda.device on gpu_time samples) of the sampled launches the slot's thread made
 * since its local root started. The injected CUDA library sets bits, only from the owning thread and only inside a
 * span; the processor clears the mask when a local root starts and reads it when that root ends. */
#define OTEL_GPU_SPAN_DEVICES_SYMBOL "otel_gpu_span_devices"

struct otel_gpu_span_slot {
    uint32_t tid;                   /* owning thread (kernel tid), 0 when free */
    uint32_t seq;                   /* odd while the owner writes; readers drop a slot read with an odd value */
    uint8_t trace_id[16];           /* W3C byte order; all zero outside any span */
    uint8_t span_id[8];             /* the thread's active span */
    uint8_t local_root_span_id[8];  /* the active span's local root (what pyroscope.profile.id names) */
};

struct otel_gpu_span_table {
    uint32_t magic;                 /* OTEL_GPU_SPAN_CONTEXT_MAGIC */
    uint16_t version;               /* OTEL_GPU_SPAN_CONTEXT_VERSION */
    uint16_t slot_size;             /* sizeof(struct otel_gpu_span_slot) == 40 */
    uint32_t slot_count;            /* OTEL_GPU_SPAN_CONTEXT_SLOTS */
    uint32_t max_probe;             /* OTEL_GPU_SPAN_CONTEXT_MAX_PROBE */
    struct otel_gpu_span_slot slots[OTEL_GPU_SPAN_CONTEXT_SLOTS];
};

#endif
