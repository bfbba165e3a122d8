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
#include <string.h>

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

/* Publishes ids in a slot (all zero: "in no span"), for its owning thread only: seq odd while writing, even after;
 * the ids in W3C byte order. The sampler interrupts the writer on its own CPU, so program order is all it needs. */
static inline void otel_gpu_span_slot_write(struct otel_gpu_span_slot *slot, uint64_t trace_hi, uint64_t trace_lo,
                                            uint64_t span_id, uint64_t local_root_span_id) {
    uint64_t big[4] = {__builtin_bswap64(trace_hi), __builtin_bswap64(trace_lo), __builtin_bswap64(span_id),
                       __builtin_bswap64(local_root_span_id)};
    uint32_t seq = slot->seq;
    __atomic_store_n(&slot->seq, seq + 1, __ATOMIC_RELEASE);
    __atomic_signal_fence(__ATOMIC_SEQ_CST);
    memcpy(slot->trace_id, &big[0], 16);
    memcpy(slot->span_id, &big[2], 8);
    memcpy(slot->local_root_span_id, &big[3], 8);
    __atomic_store_n(&slot->seq, seq + 2, __ATOMIC_RELEASE);
}

#endif
