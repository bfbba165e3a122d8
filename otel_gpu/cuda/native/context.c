/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The span the calling thread is in, read from the span context table that otel_gpu.instrumentation publishes
 * (otel_gpu/instrumentation/native/span_context.h, docs/span-context.md). The table lives in libotel_gpu_context.so,
 * which the application loads RTLD_GLOBAL, possibly after CUDA started: until it is found the lookup is repeated, at
 * most once a second, so a process that never loads it pays one clock read per record.
 *
 * Beside the table the same library keeps each slot's device mask (span_context.h): a sampled launch made inside a
 * span sets its device's bit there, so the processor can put the devices on the local-root span when it ends. A
 * library built before the masks existed has no such symbol: then no device is noted.
 */
#include <dlfcn.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "inject.h"
#include "../../instrumentation/native/span_context.h"

static const struct otel_gpu_span_table *table;
static uint64_t *device_masks; /* set before table is published; NULL when the library has none */
static _Atomic uint64_t next_lookup_ns;
static _Thread_local uint32_t my_tid;
static _Thread_local int32_t my_index = -1; /* the slot of the last span_context_read, if it found the thread in a span */

static const struct otel_gpu_span_table *find_table(void)
{
    const struct otel_gpu_span_table *t = __atomic_load_n(&table, __ATOMIC_ACQUIRE);
    if (t != NULL)
        return t;
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
    uint64_t now = (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
    if (now < atomic_load_explicit(&next_lookup_ns, memory_order_relaxed))
        return NULL;
    atomic_store_explicit(&next_lookup_ns, now + 1000000000ull, memory_order_relaxed);
    t = dlsym(RTLD_DEFAULT, OTEL_GPU_SPAN_CONTEXT_SYMBOL);
    if (t == NULL || t->magic != OTEL_GPU_SPAN_CONTEXT_MAGIC || t->version != OTEL_GPU_SPAN_CONTEXT_VERSION ||
        t->slot_size != sizeof(struct otel_gpu_span_slot) || t->slot_count != OTEL_GPU_SPAN_CONTEXT_SLOTS)
        return NULL;
    device_masks = dlsym(RTLD_DEFAULT, OTEL_GPU_SPAN_DEVICES_SYMBOL);
    __atomic_store_n(&table, t, __ATOMIC_RELEASE);
    return t;
}

/* Returns 1 when the thread is in a span (the slot names a local root): span_context_note_device may add to it. */
int span_context_read(struct otel_gpu_span *out)
{
    memset(out, 0, sizeof(*out));
    my_index = -1;
    const struct otel_gpu_span_table *t = find_table();
    if (t == NULL)
        return 0;
    if (my_tid == 0)
        my_tid = (uint32_t)syscall(SYS_gettid);
    for (uint32_t i = 0; i < t->max_probe && i < OTEL_GPU_SPAN_CONTEXT_MAX_PROBE; i++) {
        const struct otel_gpu_span_slot *slot = &t->slots[(my_tid + i) & (OTEL_GPU_SPAN_CONTEXT_SLOTS - 1)];
        if (__atomic_load_n(&slot->tid, __ATOMIC_ACQUIRE) != my_tid)
            continue;
        /* only this thread writes its slot, and it is here: the read cannot tear */
        memcpy(out->trace_id, slot->trace_id, sizeof(out->trace_id));
        memcpy(out->span_id, slot->span_id, sizeof(out->span_id));
        memcpy(out->local_root_span_id, slot->local_root_span_id, sizeof(out->local_root_span_id));
        static const uint8_t no_root[sizeof(out->local_root_span_id)];
        if (memcmp(out->local_root_span_id, no_root, sizeof(no_root)) == 0)
            return 0;
        my_index = (int32_t)((my_tid + i) & (OTEL_GPU_SPAN_CONTEXT_SLOTS - 1));
        return 1;
    }
    return 0;
}

void span_context_note_device(int device)
{
    if (my_index < 0 || device_masks == NULL || device < 0 || device >= 64)
        return;
    /* only this thread writes or clears its mask (the processor runs on it too): a plain read-modify-write */
    device_masks[my_index] |= 1ull << device;
}
