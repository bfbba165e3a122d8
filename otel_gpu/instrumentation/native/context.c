/* SPDX-License-Identifier: Apache-2.0 */
/* libotel_gpu_context.so: owns the span context table (span_context.h). otel_gpu.instrumentation calls
 * otel_gpu_span_context_slot once per thread and writes its slot on span start and end; each thread claims one slot on
 * first use and frees it at exit (or, in a forked child, at the fork). */
#include "span_context.h"

#include <pthread.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#define EXPORT __attribute__((visibility("default")))

EXPORT struct otel_gpu_span_table otel_gpu_span_context_table = {
    .magic = OTEL_GPU_SPAN_CONTEXT_MAGIC,
    .version = OTEL_GPU_SPAN_CONTEXT_VERSION,
    .slot_size = sizeof(struct otel_gpu_span_slot),
    .slot_count = OTEL_GPU_SPAN_CONTEXT_SLOTS,
    .max_probe = OTEL_GPU_SPAN_CONTEXT_MAX_PROBE,
};

/* otel_gpu_span_devices[i]: the devices of slot i's thread's sampled launches since its local root started. */
EXPORT uint64_t otel_gpu_span_devices[OTEL_GPU_SPAN_CONTEXT_SLOTS];

_Static_assert(sizeof(struct otel_gpu_span_slot) == 40, "slot layout is part of the v1 contract");
_Static_assert((OTEL_GPU_SPAN_CONTEXT_SLOTS & (OTEL_GPU_SPAN_CONTEXT_SLOTS - 1)) == 0, "slot count is a power of 2");

static __thread struct otel_gpu_span_slot *my_slot;
static __thread int no_slot; /* every probed slot was taken: this thread publishes nothing */
static pthread_key_t release_key;
static pthread_once_t release_once = PTHREAD_ONCE_INIT;
static unsigned long dropped_threads;

static void release(void *slot_ptr) {
    struct otel_gpu_span_slot *slot = slot_ptr;
    __atomic_store_n(&slot->seq, slot->seq + 1, __ATOMIC_RELEASE);
    memset(slot->trace_id, 0, sizeof(slot->trace_id) + sizeof(slot->span_id) + sizeof(slot->local_root_span_id));
    otel_gpu_span_devices[slot - otel_gpu_span_context_table.slots] = 0;
    __atomic_store_n(&slot->seq, slot->seq + 1, __ATOMIC_RELEASE);
    __atomic_store_n(&slot->tid, 0, __ATOMIC_RELEASE);
}

static void make_key(void) { pthread_key_create(&release_key, release); }

/* A forked child's only thread has a new tid but inherited the forking thread's slot pointer: free that slot (its
 * owner does not exist here) so the child's thread claims one under its own tid on its next write. */
static void forked_child(void) {
    if (my_slot) {
        release(my_slot);
        pthread_setspecific(release_key, NULL); /* or this thread's exit would free the slot again, maybe another's */
    }
    my_slot = NULL;
    no_slot = 0;
}

__attribute__((constructor)) static void register_fork_handler(void) { pthread_atfork(NULL, NULL, forked_child); }

static struct otel_gpu_span_slot *claim(void) {
    uint32_t tid = (uint32_t)syscall(SYS_gettid);
    for (uint32_t i = 0; i < OTEL_GPU_SPAN_CONTEXT_MAX_PROBE; i++) {
        struct otel_gpu_span_slot *slot =
            &otel_gpu_span_context_table.slots[(tid + i) & (OTEL_GPU_SPAN_CONTEXT_SLOTS - 1)];
        uint32_t expected = 0;
        if (__atomic_compare_exchange_n(&slot->tid, &expected, tid, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE) ||
            expected == tid) {
            pthread_once(&release_once, make_key);
            pthread_setspecific(release_key, slot);
            return slot;
        }
    }
    __atomic_fetch_add(&dropped_threads, 1, __ATOMIC_RELAXED);
    no_slot = 1;
    return NULL;
}

/* The calling thread's slot (claimed on first call), or NULL when none is free. Writers that do not call
 * otel_gpu_span_context_set (the Python processor writes through a memoryview) follow the same seq protocol. */
EXPORT struct otel_gpu_span_slot *otel_gpu_span_context_slot(void) {
    if (!my_slot && !no_slot)
        my_slot = claim();
    return my_slot;
}

/* Publishes the calling thread's active span; all zero ids mean "in no span". */
EXPORT void otel_gpu_span_context_set(uint64_t trace_hi, uint64_t trace_lo, uint64_t span_id,
                                      uint64_t local_root_span_id) {
    struct otel_gpu_span_slot *slot = my_slot;
    if (!slot) {
        if (no_slot || !(slot = my_slot = claim()))
            return;
    }
    otel_gpu_span_slot_write(slot, trace_hi, trace_lo, span_id, local_root_span_id);
}

/* Threads that found no free slot (the table is full around their tid): their samples carry no span. */
EXPORT unsigned long otel_gpu_span_context_dropped_threads(void) {
    return __atomic_load_n(&dropped_threads, __ATOMIC_RELAXED);
}
