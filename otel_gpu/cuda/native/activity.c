/* SPDX-License-Identifier: Apache-2.0 */
/*
 * CUPTI activity: a bounded pool of buffers handed to CUPTI, and the completion side that turns kernel, memcpy and
 * memset records of SAMPLED launches into struct otel_gpu_activity batches for the otel_gpu:activity probe.
 * "Sampled" is decided by a hash set of correlation ids filled at launch exit. An entry stays until its GPU work has
 * arrived, however late (a GPU-bound program's queue lags its launches by up to seconds): an eager launch's entry
 * goes with its one record; a graph launch's (every kernel of the graph carries the launch's id) once no kernel of
 * it has arrived for GRAPH_QUIET_NS after the first. An entry whose work has not arrived after the longest lag the
 * caller allows is counted as dropped. While entries are pending the controller keeps the activity kinds on.
 */
#include <pthread.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cupti_activity.h>

#include "inject.h"

/* Buffers: 16 x 512 KiB (a 512 KiB buffer holds ~2000 kernel records); when all are with CUPTI, CUPTI drops records. */
#define BUFFER_BYTES (512u * 1024u)
#define BUFFER_COUNT 16
#define BUFFER_ALIGN 8

static uint8_t *pool[BUFFER_COUNT];
static int pool_free[BUFFER_COUNT];
static int pool_ready;
static pthread_mutex_t pool_lock = PTHREAD_MUTEX_INITIALIZER;

/* Sampled correlation ids: open addressing, linear probing, rebuilt when old windows are forgotten. */
#define FILTER_SLOTS 65536u /* power of two */
#define FILTER_MAX_PROBE 64u
#define FILTER_EMPTY 0u
#define FILTER_TOMBSTONE UINT32_MAX

#define GRAPH_QUIET_NS 20000000ull /* a graph launch's work is complete once none of it arrived for 20 ms */

struct filter_slot {
    uint32_t correlation_id;
    uint8_t is_graph;
    uint8_t arrived;       /* at least one record of the launch's work has arrived */
    uint16_t expected;     /* eager launches sampled with this id whose record has not arrived (ids can repeat) */
    uint64_t window_id;
    uint64_t remembered_ns; /* monotonic: when the launch was sampled */
    uint64_t arrival_ns;    /* monotonic: when its last record arrived */
};

static struct filter_slot filter[FILTER_SLOTS];
static pthread_mutex_t filter_lock = PTHREAD_MUTEX_INITIALIZER;
static uint32_t unarrived;               /* under filter_lock: entries without any record yet */
static uint64_t last_graph_arrival_ns;   /* under filter_lock: monotonic */
static _Atomic uint64_t dropped; /* records lost since last taken: no free buffer, filter full, CUPTI drops */

static const CUpti_ActivityKind activity_kinds[] = {
    CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL,
    CUPTI_ACTIVITY_KIND_MEMCPY,
    CUPTI_ACTIVITY_KIND_MEMSET,
};

static uint32_t hash_id(uint32_t id)
{
    return (id * 2654435761u) & (FILTER_SLOTS - 1);
}

void activity_remember(uint32_t correlation_id, uint64_t window_id, int is_graph)
{
    if (correlation_id == FILTER_EMPTY || correlation_id == FILTER_TOMBSTONE)
        return;
    pthread_mutex_lock(&filter_lock);
    uint32_t at = hash_id(correlation_id);
    for (uint32_t i = 0; i < FILTER_MAX_PROBE; i++, at = (at + 1) & (FILTER_SLOTS - 1)) {
        struct filter_slot *slot = &filter[at];
        if (slot->correlation_id == correlation_id && !slot->is_graph && !is_graph && slot->expected < UINT16_MAX) {
            /* The id is already pending: another launch carries it. Each one's record must pass (and be awaited);
             * overwriting the slot would let only one through and leave `unarrived` unbalanced for ever. */
            slot->expected++;
            unarrived++;
            pthread_mutex_unlock(&filter_lock);
            return;
        }
        if (slot->correlation_id == FILTER_EMPTY || slot->correlation_id == FILTER_TOMBSTONE ||
            slot->correlation_id == correlation_id) {
            if (slot->correlation_id == correlation_id && !slot->arrived)
                unarrived -= slot->is_graph ? 1u : slot->expected; /* replaced: its count goes with it */
            slot->correlation_id = correlation_id;
            slot->expected = 1;
            slot->is_graph = (uint8_t)(is_graph != 0);
            slot->arrived = 0;
            slot->window_id = window_id;
            slot->remembered_ns = monotonic_ns();
            slot->arrival_ns = 0;
            unarrived++;
            pthread_mutex_unlock(&filter_lock);
            return;
        }
    }
    pthread_mutex_unlock(&filter_lock);
    atomic_fetch_add(&dropped, 1);
}

/* Whether correlation_id was sampled; an eager launch is forgotten once its record arrives, a graph's is kept. */
static int filter_take(uint32_t correlation_id)
{
    int found = 0;
    pthread_mutex_lock(&filter_lock);
    uint32_t at = hash_id(correlation_id);
    for (uint32_t i = 0; i < FILTER_MAX_PROBE; i++, at = (at + 1) & (FILTER_SLOTS - 1)) {
        struct filter_slot *slot = &filter[at];
        if (slot->correlation_id == FILTER_EMPTY)
            break;
        if (slot->correlation_id == correlation_id) {
            found = 1;
            if (!slot->is_graph) {
                unarrived--;
                if (--slot->expected == 0)
                    slot->correlation_id = FILTER_TOMBSTONE;
            } else {
                if (!slot->arrived)
                    unarrived--;
                slot->arrived = 1;
                slot->arrival_ns = last_graph_arrival_ns = monotonic_ns();
            }
            break;
        }
    }
    pthread_mutex_unlock(&filter_lock);
    return found;
}

/* Whether a slot still waits for GPU work at now_mono: an eager launch until its record, a graph launch until
 * GRAPH_QUIET_NS after its last kernel arrived. */
static int slot_pending(const struct filter_slot *slot, uint64_t now_mono)
{
    if (slot->correlation_id == FILTER_EMPTY || slot->correlation_id == FILTER_TOMBSTONE)
        return 0;
    return !slot->arrived || now_mono - slot->arrival_ns < GRAPH_QUIET_NS;
}

/*
 * Drops entries whose work is complete, and entries still without any work max_lag_ns after they were sampled
 * (counted as dropped: their GPU work is lost to the profile); clears tombstones. Returns the entries still pending.
 */
uint32_t activity_expire(uint64_t max_lag_ns)
{
    static struct filter_slot keep[FILTER_SLOTS];
    uint32_t kept = 0, timed_out = 0;
    uint64_t now_mono = monotonic_ns();
    pthread_mutex_lock(&filter_lock);
    for (uint32_t i = 0; i < FILTER_SLOTS; i++) {
        struct filter_slot *slot = &filter[i];
        if (!slot_pending(slot, now_mono))
            continue;
        if (!slot->arrived && now_mono - slot->remembered_ns > max_lag_ns) {
            uint32_t lost = slot->is_graph ? 1u : slot->expected;
            timed_out += lost;
            unarrived -= lost;
        }
        else
            keep[kept++] = *slot;
    }
    memset(filter, 0, sizeof(filter));
    for (uint32_t k = 0; k < kept; k++) {
        uint32_t at = hash_id(keep[k].correlation_id);
        while (filter[at].correlation_id != FILTER_EMPTY)
            at = (at + 1) & (FILTER_SLOTS - 1);
        filter[at] = keep[k];
    }
    pthread_mutex_unlock(&filter_lock);
    if (timed_out > 0)
        atomic_fetch_add(&dropped, timed_out);
    return kept;
}

/* Sampled launches whose GPU work has not (completely) arrived yet: cheap, for frequent polling. */
uint32_t activity_outstanding(void)
{
    pthread_mutex_lock(&filter_lock);
    uint32_t count = unarrived;
    if (count == 0 && last_graph_arrival_ns != 0 && monotonic_ns() - last_graph_arrival_ns < GRAPH_QUIET_NS)
        count = 1; /* a graph launch's later kernels may still come */
    pthread_mutex_unlock(&filter_lock);
    return count;
}

/*
 * Hands over everything CUPTI holds before the process (or a context) goes away. A plain flush returns only buffers
 * whose records are all complete, a forced one also returns running kernels with a zero end (never delivered again),
 * so: plain flushes until the sampled launches' work has arrived or max_wait_ns has passed, then a forced one.
 */
void activity_drain(uint64_t max_wait_ns)
{
    uint64_t deadline = monotonic_ns() + max_wait_ns;
    for (;;) {
        g_cupti.activity_flush_all(0);
        if (activity_outstanding() == 0 || monotonic_ns() >= deadline)
            break;
        struct timespec pause = {0, 2000000}; /* 2 ms */
        nanosleep(&pause, NULL);
    }
    g_cupti.activity_flush_all(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
}

uint64_t activity_take_dropped(void)
{
    return atomic_exchange(&dropped, 0);
}

static void CUPTIAPI on_buffer_requested(uint8_t **buffer, size_t *size, size_t *max_records)
{
    *buffer = NULL;
    *size = 0;
    *max_records = 0;
    pthread_mutex_lock(&pool_lock);
    for (int i = 0; i < BUFFER_COUNT; i++) {
        if (pool_free[i]) {
            pool_free[i] = 0;
            *buffer = pool[i];
            *size = BUFFER_BYTES;
            break;
        }
    }
    pthread_mutex_unlock(&pool_lock);
    if (*buffer == NULL)
        atomic_fetch_add(&dropped, 1); /* CUPTI drops what it cannot store; counted once per refused buffer */
}

static void release_buffer(uint8_t *buffer)
{
    pthread_mutex_lock(&pool_lock);
    for (int i = 0; i < BUFFER_COUNT; i++)
        if (pool[i] == buffer)
            pool_free[i] = 1;
    pthread_mutex_unlock(&pool_lock);
}

static void copy_name(struct otel_gpu_activity *out, const char *name)
{
    size_t len = name ? strnlen(name, OTEL_GPU_MAX_NAME) : 0;
    if (len >= OTEL_GPU_MAX_NAME) {
        len = OTEL_GPU_MAX_NAME - 1;
        atomic_fetch_add(&dropped, 1);
    }
    memcpy(out->name, name ? name : "", len);
    out->name[len] = '\0';
    out->name_len = (uint32_t)len;
}

/* A forced flush hands back work still running with a zero end; a sampled record without valid times is lost. */
static int valid_times(uint64_t start, uint64_t end)
{
    if (start != 0 && end >= start)
        return 1;
    atomic_fetch_add(&dropped, 1);
    return 0;
}

/* Converts one CUPTI record; returns 0 when it is not one the agent wants. */
static int convert(const CUpti_Activity *record, struct otel_gpu_activity *out)
{
    memset(out, 0, offsetof(struct otel_gpu_activity, name));
    out->name[0] = '\0';
    switch (record->kind) {
    case CUPTI_ACTIVITY_KIND_KERNEL:
    case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL: {
        const CUpti_ActivityKernel10 *k = (const CUpti_ActivityKernel10 *)record;
        if (!filter_take(k->correlationId) || !valid_times(k->start, k->end))
            return 0;
        out->kind = OTEL_GPU_ACTIVITY_KERNEL;
        out->correlation_id = k->correlationId;
        out->start_ns = k->start;
        out->end_ns = k->end;
        out->device_id = k->deviceId;
        out->stream_id = k->streamId;
        out->graph_id = k->graphId;
        copy_name(out, k->name);
        return 1;
    }
    case CUPTI_ACTIVITY_KIND_MEMCPY: {
        const CUpti_ActivityMemcpy6 *m = (const CUpti_ActivityMemcpy6 *)record;
        if (!filter_take(m->correlationId) || !valid_times(m->start, m->end))
            return 0;
        out->kind = OTEL_GPU_ACTIVITY_MEMCPY;
        out->correlation_id = m->correlationId;
        out->start_ns = m->start;
        out->end_ns = m->end;
        out->device_id = m->deviceId;
        out->stream_id = m->streamId;
        out->graph_id = m->graphId;
        out->bytes = m->bytes;
        out->copy_kind = m->copyKind;
        out->src_kind = m->srcKind;
        out->dst_kind = m->dstKind;
        out->name_len = 0;
        return 1;
    }
    case CUPTI_ACTIVITY_KIND_MEMSET: {
        const CUpti_ActivityMemset4 *s = (const CUpti_ActivityMemset4 *)record;
        if (!filter_take(s->correlationId) || !valid_times(s->start, s->end))
            return 0;
        out->kind = OTEL_GPU_ACTIVITY_MEMSET;
        out->correlation_id = s->correlationId;
        out->start_ns = s->start;
        out->end_ns = s->end;
        out->device_id = s->deviceId;
        out->stream_id = s->streamId;
        out->graph_id = s->graphId;
        out->bytes = s->bytes;
        out->dst_kind = (uint8_t)s->memoryKind;
        out->name_len = 0;
        return 1;
    }
    default:
        return 0;
    }
}

static void CUPTIAPI on_buffer_completed(CUcontext ctx, uint32_t stream_id, uint8_t *buffer, size_t size,
                                         size_t valid_size)
{
    (void)size;
    uint64_t t0 = monotonic_ns();
    struct otel_gpu_activity batch[OTEL_GPU_ACTIVITY_BATCH];
    uint32_t count = 0;
    CUpti_Activity *record = NULL;
    while (valid_size > 0 && g_cupti.activity_get_next_record(buffer, valid_size, &record) == CUPTI_SUCCESS) {
        if (!convert(record, &batch[count]))
            continue;
        if (++count == OTEL_GPU_ACTIVITY_BATCH) {
            emit_activity(batch, count);
            count = 0;
        }
    }
    emit_activity(batch, count);
    release_buffer(buffer);
    size_t cupti_dropped = 0; /* records CUPTI itself lost for want of a buffer */
    if (g_cupti.activity_get_num_dropped != NULL &&
        g_cupti.activity_get_num_dropped(ctx, stream_id, &cupti_dropped) == CUPTI_SUCCESS && cupti_dropped > 0)
        atomic_fetch_add(&dropped, cupti_dropped);
    atomic_fetch_add(&g_state.overhead_ns, monotonic_ns() - t0);
}

/* Allocates the buffer pool (once) and registers the buffer callbacks with CUPTI (at every call). */
int activity_init(void)
{
    pthread_mutex_lock(&pool_lock);
    for (int i = 0; i < BUFFER_COUNT && !pool_ready; i++) {
        pool[i] = aligned_alloc(BUFFER_ALIGN, BUFFER_BYTES);
        if (pool[i] == NULL) {
            pthread_mutex_unlock(&pool_lock);
            return -1;
        }
        pool_free[i] = 1;
    }
    pool_ready = 1; /* allocated once, at the first attach, and kept for the life of the process */
    pthread_mutex_unlock(&pool_lock);
    return g_cupti.activity_register_callbacks(on_buffer_requested, on_buffer_completed) == CUPTI_SUCCESS ? 0 : -1;
}

/* Turns the activity kinds the windows record on or off; returns the number of kinds that failed. */
int activity_enable(int enable)
{
    int failed = 0;
    for (size_t i = 0; i < sizeof(activity_kinds) / sizeof(activity_kinds[0]); i++) {
        CUptiResult rc = enable ? g_cupti.activity_enable(activity_kinds[i]) : g_cupti.activity_disable(activity_kinds[i]);
        if (rc != CUPTI_SUCCESS)
            failed++;
    }
    if (g_settings.api_activity &&
        (enable ? g_cupti.activity_enable(CUPTI_ACTIVITY_KIND_DRIVER) : g_cupti.activity_disable(CUPTI_ACTIVITY_KIND_DRIVER))
            != CUPTI_SUCCESS)
        failed++;
    return failed;
}
