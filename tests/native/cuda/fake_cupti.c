/* SPDX-License-Identifier: Apache-2.0 */
/*
 * A fake CUPTI (libcupti.so) driven by the fake CUDA driver: it calls the subscriber's callback at entry and exit of
 * the driver calls whose callbacks are enabled, with real CUpti_CallbackData (correlation id, correlationData shared
 * between entry and exit), and it turns the driver's synthetic GPU work into activity records of the real CUDA 13
 * layouts (CUpti_ActivityKernel10, CUpti_ActivityMemcpy6, CUpti_ActivityMemset4) while those kinds are enabled,
 * delivered through the registered buffer callbacks on cuptiActivityFlushAll: records of finished work; with
 * CUPTI_ACTIVITY_FLAG_FLUSH_FORCED also the work still running, with a zero end, never delivered again (as CUPTI does). Resource domain: CONTEXT_DESTROY_STARTING only.
 * Disabling a kind loses the records of that kind's work that has not finished yet (counted in records_lost): what
 * an H200 showed when the kinds went off while a GPU-bound program's queue still held sampled launches.
 * Correlation ids, as an H200 with CUDA 13 showed: calls get ids of their own only while the driver-API activity kind
 * (CUPTI_ACTIVITY_KIND_DRIVER) is on; while another kind is on without it, a call keeps the last id handed out (its
 * callbacks see that id too), so GPU work of many launches carries one id, maybe a sampled launch's (counted in
 * stale_ids). While every kind is off such an id could appear in no record, and the call keeps the driver's number.
 * The driver-API kind produces no records here (the real one's are ignored by the library).
 *
 * FAKE_CUPTI_STATS=<path> writes counters at exit ("name value" lines): api_callbacks, resource_callbacks, records_produced,
 * records_delivered, records_dropped, records_lost, enable_calls, subscribes, stale_ids, api_records, finalizes,
 * finalizes_outside_callbacks, finalizes_at_entry, graph_faults, residue_calls. One subscriber at a time, as the
 * real CUPTI; cuptiFinalize drops everything it holds.
 * The residue, as H100s and H200s showed: once GPU work ran while an activity kind was on, every later driver call is
 * slower, kinds off or not, until cuptiFinalize; residue_calls counts the calls made with every kind off on such a
 * CUPTI (what a window costs the program after it, until its finalize).
 * CUDA graphs and cuptiFinalize, as PyTorch's profiler found and an H200 showed (XID 31 in a torch.compile
 * "reduce-overhead" program): a graph whose kernels ran while a kernel activity kind was on is instrumented by that
 * CUPTI; once CUPTI has been finalized and subscribed again, every kernel of that graph that runs counts as a GPU
 * fault (graph_faults), the use of the freed instrumentation the real driver reports as XID 31.
 * FAKE_CUPTI_TRACE_COST_US=<us>: each driver call entered while an activity kind is on spins that long first, as
 * recording costs a real driver's launches (a program that waits every step then runs slower inside windows).
 * FAKE_CUPTI_SUBSCRIBE_US=<us>: each subscribe sleeps that long first (a real CUPTI's subscribe after a finalize
 * takes 8-12 ms of wall time, of which its own CPU is a fraction; 290-390 ms behind a GPU-bound program's queue).
 * FAKE_CUPTI_DELIVERY_DELAY_US=<us>: a finished record is delivered by a non-forced flush only that long after its
 * work ended (a real CUPTI hands records over some milliseconds late), so the library lingers after each window.
 */
#include <dlfcn.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cupti.h>

#include "fake_tracer.h"

#define API __attribute__((visibility("default")))

union any_record {
    CUpti_Activity header;
    CUpti_ActivityKernel10 kernel;
    CUpti_ActivityMemcpy6 memcpy;
    CUpti_ActivityMemset4 memset;
    CUpti_ActivityAPI api;
};

static CUpti_CallbackFunc callback;
static void *callback_userdata;
static int subscribed;
static char subscriber_name[64];
static _Atomic uint8_t enabled[CUPTI_DRIVER_TRACE_CBID_SIZE];
static _Atomic uint8_t context_destroy_enabled;
static _Atomic int kernel_on, memcpy_on, memset_on, api_on;
static _Atomic int residue;             /* GPU work ran while a kind was on, since the last finalize */
static _Atomic uint64_t residue_calls;  /* driver calls made with every kind off while the residue lasted */
static CUpti_BuffersCallbackRequestFunc buffer_requested;
static CUpti_BuffersCallbackCompleteFunc buffer_completed;

static pthread_mutex_t pending_lock = PTHREAD_MUTEX_INITIALIZER;
static union any_record *pending;
static size_t pending_count, pending_capacity;

static _Atomic uint64_t api_callbacks, resource_callbacks, records_produced, records_delivered, records_dropped,
    records_lost, enable_calls, subscribes, dropped_since_query, stale_ids, api_records, finalizes,
    finalizes_outside_callbacks, finalizes_at_entry, graph_faults;
static _Thread_local int in_api_callback; /* 0: no, 1: an API entry's callback, 2: an exit's */
#define MAX_GRAPHS 1024
static _Atomic uint32_t generation;           /* cuptiFinalize calls so far: each starts a new CUPTI */
static _Atomic uint32_t instrumented[MAX_GRAPHS]; /* graph id -> 1 + the generation that instrumented it, 0: never */
static _Atomic uint32_t last_id; /* the last correlation id handed to a call seen through an enabled callback */

static uint64_t realtime_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_REALTIME, &t);
    return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}

static size_t record_size(CUpti_ActivityKind kind)
{
    switch (kind) {
    case CUPTI_ACTIVITY_KIND_KERNEL:
    case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL:
        return sizeof(CUpti_ActivityKernel10);
    case CUPTI_ACTIVITY_KIND_MEMCPY:
        return sizeof(CUpti_ActivityMemcpy6);
    case CUPTI_ACTIVITY_KIND_MEMSET:
        return sizeof(CUpti_ActivityMemset4);
    case CUPTI_ACTIVITY_KIND_DRIVER:
        return sizeof(CUpti_ActivityAPI);
    default:
        return sizeof(CUpti_Activity);
    }
}

static uint64_t record_end(const union any_record *r)
{
    switch (r->header.kind) {
    case CUPTI_ACTIVITY_KIND_MEMCPY:
        return r->memcpy.end;
    case CUPTI_ACTIVITY_KIND_MEMSET:
        return r->memset.end;
    case CUPTI_ACTIVITY_KIND_DRIVER:
        return r->api.end;
    default:
        return r->kernel.end;
    }
}

/* What a forced flush hands back for work still running: a zero end (and a zero start if it has not started). */
static union any_record unfinished(union any_record r, uint64_t now)
{
    switch (r.header.kind) {
    case CUPTI_ACTIVITY_KIND_DRIVER: /* a call's record is complete when the call returns */
        break;
    case CUPTI_ACTIVITY_KIND_MEMCPY:
        r.memcpy.end = 0;
        r.memcpy.start = r.memcpy.start <= now ? r.memcpy.start : 0;
        break;
    case CUPTI_ACTIVITY_KIND_MEMSET:
        r.memset.end = 0;
        r.memset.start = r.memset.start <= now ? r.memset.start : 0;
        break;
    default:
        r.kernel.end = 0;
        r.kernel.completed = 0;
        r.kernel.start = r.kernel.start <= now ? r.kernel.start : 0;
        break;
    }
    return r;
}

/* --- the tracer the fake driver calls ------------------------------------------------------------------------ */

static void invoke(struct fake_call *call, CUpti_ApiCallbackSite site)
{
    if (callback == NULL || call->cbid >= CUPTI_DRIVER_TRACE_CBID_SIZE || !atomic_load(&enabled[call->cbid]))
        return;
    CUpti_CallbackData data = {
        .callbackSite = site,
        .functionName = call->function_name,
        .functionParams = call->params,
        .functionReturnValue = &call->result,
        .symbolName = call->symbol_name,
        .context = call->context,
        .contextUid = call->context_uid,
        .correlationData = &call->correlation_data,
        .correlationId = call->correlation_id,
    };
    atomic_fetch_add(&api_callbacks, 1);
    in_api_callback = site == CUPTI_API_ENTER ? 1 : 2;
    callback(callback_userdata, CUPTI_CB_DOMAIN_DRIVER_API, call->cbid, &data);
    in_api_callback = 0;
}

static int any_activity_on(void)
{
    return atomic_load(&kernel_on) || atomic_load(&memcpy_on) || atomic_load(&memset_on);
}

/* A setting in microseconds (environment variable name), in ns, read once into *cached (-1: not yet; 0: unset). */
static uint64_t setting_us_as_ns(const char *name, _Atomic int64_t *cached)
{
    int64_t ns = atomic_load(cached);
    if (ns < 0) {
        const char *v = getenv(name);
        ns = v && v[0] ? (int64_t)(strtod(v, NULL) * 1000.0) : 0;
        atomic_store(cached, ns);
    }
    return (uint64_t)ns;
}

static uint64_t trace_cost_ns(void)
{
    static _Atomic int64_t cost = -1;
    return setting_us_as_ns("FAKE_CUPTI_TRACE_COST_US", &cost);
}

static void on_enter(struct fake_call *call)
{
    uint64_t cost = trace_cost_ns();
    int recording = any_activity_on();
    if (atomic_load(&residue) && !recording)
        atomic_fetch_add(&residue_calls, 1);
    if (cost != 0 && recording) {
        uint64_t until = realtime_ns() + cost;
        while (realtime_ns() < until) {
        }
    }
    if (atomic_load(&api_on) || !any_activity_on()) {
        atomic_store(&last_id, call->correlation_id);
    } else if (atomic_load(&last_id) != 0) {
        call->correlation_id = atomic_load(&last_id); /* the call's GPU work is recorded under a stale id */
        atomic_fetch_add(&stale_ids, 1);
    }
    invoke(call, CUPTI_API_ENTER);
}

static void push(const union any_record *r);

/* With the driver-API kind on, every call leaves a record (the library discards them). */
static void on_exit_(struct fake_call *call)
{
    invoke(call, CUPTI_API_EXIT);
    if (!atomic_load(&api_on))
        return;
    union any_record r;
    memset(&r, 0, sizeof(r));
    r.api.kind = CUPTI_ACTIVITY_KIND_DRIVER;
    r.api.cbid = call->cbid;
    r.api.start = r.api.end = realtime_ns();
    r.api.correlationId = call->correlation_id;
    push(&r);
    atomic_fetch_add(&api_records, 1);
}

static void on_work(const struct fake_work *w)
{
    if (any_activity_on())
        atomic_store(&residue, 1);
    if (w->kind == FAKE_WORK_KERNEL && w->graph_id != 0 && w->graph_id < MAX_GRAPHS) {
        uint32_t by = atomic_load(&instrumented[w->graph_id]), now = atomic_load(&generation) + 1;
        if (by != 0 && by != now && subscribed)
            atomic_fetch_add(&graph_faults, 1);
        else if (by == 0 && atomic_load(&kernel_on))
            atomic_store(&instrumented[w->graph_id], now);
    }
    union any_record r;
    memset(&r, 0, sizeof(r));
    switch (w->kind) {
    case FAKE_WORK_KERNEL:
        if (!atomic_load(&kernel_on))
            return;
        r.kernel.kind = CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL;
        r.kernel.start = w->start_ns;
        r.kernel.end = w->end_ns;
        r.kernel.completed = w->end_ns;
        r.kernel.deviceId = w->device_id;
        r.kernel.contextId = 1;
        r.kernel.streamId = w->stream_id;
        r.kernel.gridX = r.kernel.gridY = r.kernel.gridZ = 1;
        r.kernel.blockX = 128;
        r.kernel.blockY = r.kernel.blockZ = 1;
        r.kernel.correlationId = w->correlation_id;
        r.kernel.name = w->name;
        r.kernel.graphId = w->graph_id;
        r.kernel.graphNodeId = w->graph_node_id;
        break;
    case FAKE_WORK_MEMCPY:
        if (!atomic_load(&memcpy_on))
            return;
        r.memcpy.kind = CUPTI_ACTIVITY_KIND_MEMCPY;
        r.memcpy.copyKind = w->copy_kind;
        r.memcpy.srcKind = w->src_kind;
        r.memcpy.dstKind = w->dst_kind;
        r.memcpy.bytes = w->bytes;
        r.memcpy.start = w->start_ns;
        r.memcpy.end = w->end_ns;
        r.memcpy.deviceId = w->device_id;
        r.memcpy.contextId = 1;
        r.memcpy.streamId = w->stream_id;
        r.memcpy.correlationId = w->correlation_id;
        r.memcpy.graphId = w->graph_id;
        break;
    case FAKE_WORK_MEMSET:
        if (!atomic_load(&memset_on))
            return;
        r.memset.kind = CUPTI_ACTIVITY_KIND_MEMSET;
        r.memset.bytes = w->bytes;
        r.memset.start = w->start_ns;
        r.memset.end = w->end_ns;
        r.memset.deviceId = w->device_id;
        r.memset.contextId = 1;
        r.memset.streamId = w->stream_id;
        r.memset.correlationId = w->correlation_id;
        r.memset.memoryKind = w->dst_kind;
        r.memset.graphId = w->graph_id;
        break;
    }
    push(&r);
}

static void push(const union any_record *r)
{
    pthread_mutex_lock(&pending_lock);
    if (pending_count == pending_capacity) {
        size_t capacity = pending_capacity ? pending_capacity * 2 : 1024;
        union any_record *grown = realloc(pending, capacity * sizeof(*grown));
        if (grown == NULL) {
            pthread_mutex_unlock(&pending_lock);
            atomic_fetch_add(&records_dropped, 1);
            return;
        }
        pending = grown;
        pending_capacity = capacity;
    }
    pending[pending_count++] = *r;
    pthread_mutex_unlock(&pending_lock);
    atomic_fetch_add(&records_produced, 1);
}

static void on_context_destroy(void)
{
    if (callback == NULL || !atomic_load(&context_destroy_enabled))
        return;
    CUpti_ResourceData data = {.context = NULL, .resourceHandle = {NULL}, .resourceDescriptor = NULL};
    atomic_fetch_add(&resource_callbacks, 1);
    callback(callback_userdata, CUPTI_CB_DOMAIN_RESOURCE, CUPTI_CBID_RESOURCE_CONTEXT_DESTROY_STARTING, &data);
}

static const struct fake_tracer the_tracer = {on_enter, on_exit_, on_work, on_context_destroy};

/* --- callback API -------------------------------------------------------------------------------------------- */

static CUptiResult subscribe(CUpti_SubscriberHandle *subscriber, CUpti_CallbackFunc fn, void *userdata,
                             const char *name)
{
    if (subscribed)
        return CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED;
    static _Atomic int64_t subscribe_ns = -1;
    uint64_t wait_ns = setting_us_as_ns("FAKE_CUPTI_SUBSCRIBE_US", &subscribe_ns);
    if (wait_ns != 0) {
        struct timespec ts = {(time_t)(wait_ns / 1000000000ull), (long)(wait_ns % 1000000000ull)};
        while (nanosleep(&ts, &ts) != 0) {
        }
    }
    void *driver = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    fake_cuda_set_tracer_fn set = (fake_cuda_set_tracer_fn)dlsym(driver ? driver : RTLD_DEFAULT, FAKE_CUDA_SET_TRACER);
    if (set == NULL)
        return CUPTI_ERROR_NOT_INITIALIZED;
    callback = fn;
    callback_userdata = userdata;
    subscribed = 1;
    snprintf(subscriber_name, sizeof(subscriber_name), "CUPTI for %s", name ? name : "an unnamed tool");
    atomic_fetch_add(&subscribes, 1);
    *subscriber = (CUpti_SubscriberHandle)(uintptr_t)1;
    set(&the_tracer);
    return CUPTI_SUCCESS;
}

API CUptiResult CUPTIAPI cuptiSubscribe(CUpti_SubscriberHandle *subscriber, CUpti_CallbackFunc fn, void *userdata)
{
    return subscribe(subscriber, fn, userdata, NULL);
}

API CUptiResult CUPTIAPI cuptiSubscribe_v2(CUpti_SubscriberHandle *subscriber, CUpti_CallbackFunc fn, void *userdata,
                                           CUpti_SubscriberParams *params)
{
    CUptiResult rc = subscribe(subscriber, fn, userdata, params ? params->subscriberName : NULL);
    if (rc == CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED && params && params->oldSubscriberName &&
        params->oldSubscriberSize > 0)
        snprintf(params->oldSubscriberName, params->oldSubscriberSize, "%s", subscriber_name);
    return rc;
}

API CUptiResult CUPTIAPI cuptiUnsubscribe(CUpti_SubscriberHandle subscriber)
{
    (void)subscriber;
    callback = NULL;
    subscribed = 0;
    /* A new subscriber starts with every callback off. */
    for (uint32_t i = 0; i < CUPTI_DRIVER_TRACE_CBID_SIZE; i++)
        atomic_store(&enabled[i], 0);
    atomic_store(&context_destroy_enabled, 0);
    return CUPTI_SUCCESS;
}

/* Everything CUPTI holds is gone: the subscriber and its callbacks, the activity kinds, the buffer callbacks, and
 * the records not yet handed over (counted in records_lost). CUPTI's documentation asks for the call from an API
 * callback's exit when other threads may be in CUDA; calls from anywhere else count in finalizes_outside_callbacks,
 * and those from an entry's callback in finalizes_at_entry too: the driver goes on into the call with CUPTI's state
 * gone (an H100 segfaulted in torch.cuda.graph's capture_begin, 2 runs in 20, when the library finalized at
 * cuStreamBeginCapture's entry). */
API CUptiResult CUPTIAPI cuptiFinalize(void)
{
    atomic_fetch_add(&finalizes, 1);
    atomic_fetch_add(&generation, 1);
    if (in_api_callback != 2)
        atomic_fetch_add(&finalizes_outside_callbacks, 1);
    if (in_api_callback == 1)
        atomic_fetch_add(&finalizes_at_entry, 1);
    cuptiUnsubscribe(NULL);
    atomic_store(&kernel_on, 0);
    atomic_store(&memcpy_on, 0);
    atomic_store(&memset_on, 0);
    atomic_store(&api_on, 0);
    atomic_store(&residue, 0);
    pthread_mutex_lock(&pending_lock);
    atomic_fetch_add(&records_lost, pending_count);
    pending_count = 0;
    pthread_mutex_unlock(&pending_lock);
    buffer_requested = NULL;
    buffer_completed = NULL;
    return CUPTI_SUCCESS;
}

API CUptiResult CUPTIAPI cuptiEnableCallback(uint32_t enable, CUpti_SubscriberHandle subscriber,
                                             CUpti_CallbackDomain domain, CUpti_CallbackId cbid)
{
    (void)subscriber;
    if (domain == CUPTI_CB_DOMAIN_RESOURCE && cbid == CUPTI_CBID_RESOURCE_CONTEXT_DESTROY_STARTING) {
        atomic_store(&context_destroy_enabled, enable ? 1 : 0);
        return CUPTI_SUCCESS;
    }
    if (domain != CUPTI_CB_DOMAIN_DRIVER_API || cbid >= CUPTI_DRIVER_TRACE_CBID_SIZE)
        return CUPTI_ERROR_INVALID_PARAMETER;
    atomic_store(&enabled[cbid], enable ? 1 : 0);
    atomic_fetch_add(&enable_calls, 1);
    return CUPTI_SUCCESS;
}

API CUptiResult CUPTIAPI cuptiEnableDomain(uint32_t enable, CUpti_SubscriberHandle subscriber,
                                           CUpti_CallbackDomain domain)
{
    (void)subscriber;
    if (domain != CUPTI_CB_DOMAIN_DRIVER_API)
        return CUPTI_SUCCESS;
    for (uint32_t i = 0; i < CUPTI_DRIVER_TRACE_CBID_SIZE; i++)
        atomic_store(&enabled[i], enable ? 1 : 0);
    atomic_fetch_add(&enable_calls, 1);
    return CUPTI_SUCCESS;
}

/* The fake driver's contexts know their device; NULL (the real one's "current context") is not supported here. */
API CUptiResult CUPTIAPI cuptiGetDeviceId(CUcontext context, uint32_t *device_id)
{
    if (context == NULL || device_id == NULL)
        return CUPTI_ERROR_INVALID_PARAMETER;
    *device_id = (uint32_t)context->device;
    return CUPTI_SUCCESS;
}

API CUptiResult CUPTIAPI cuptiGetTimestamp(uint64_t *timestamp)
{
    *timestamp = realtime_ns();
    return CUPTI_SUCCESS;
}

API CUptiResult CUPTIAPI cuptiGetResultString(CUptiResult result, const char **str)
{
    *str = result == CUPTI_SUCCESS ? "CUPTI_SUCCESS" : "CUPTI_ERROR (fake)";
    return CUPTI_SUCCESS;
}

/* --- activity API -------------------------------------------------------------------------------------------- */

static _Atomic int *kind_flag(CUpti_ActivityKind kind)
{
    switch (kind) {
    case CUPTI_ACTIVITY_KIND_KERNEL:
    case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL:
        return &kernel_on;
    case CUPTI_ACTIVITY_KIND_MEMCPY:
        return &memcpy_on;
    case CUPTI_ACTIVITY_KIND_MEMSET:
        return &memset_on;
    case CUPTI_ACTIVITY_KIND_DRIVER:
        return &api_on;
    default:
        return NULL;
    }
}

API CUptiResult CUPTIAPI cuptiActivityEnable(CUpti_ActivityKind kind)
{
    _Atomic int *flag = kind_flag(kind);
    if (flag == NULL)
        return CUPTI_ERROR_NOT_COMPATIBLE;
    atomic_store(flag, 1);
    atomic_fetch_add(&enable_calls, 1);
    return CUPTI_SUCCESS;
}

/* Drops pending records of unfinished work of the kind that flag switches. */
static void lose_unfinished(_Atomic int *flag)
{
    uint64_t now = realtime_ns();
    pthread_mutex_lock(&pending_lock);
    size_t kept = 0;
    for (size_t i = 0; i < pending_count; i++) {
        if (kind_flag(pending[i].header.kind) == flag && record_end(&pending[i]) > now)
            atomic_fetch_add(&records_lost, 1);
        else
            pending[kept++] = pending[i];
    }
    pending_count = kept;
    pthread_mutex_unlock(&pending_lock);
}

API CUptiResult CUPTIAPI cuptiActivityDisable(CUpti_ActivityKind kind)
{
    _Atomic int *flag = kind_flag(kind);
    if (flag == NULL)
        return CUPTI_ERROR_NOT_COMPATIBLE;
    atomic_store(flag, 0);
    lose_unfinished(flag);
    atomic_fetch_add(&enable_calls, 1);
    return CUPTI_SUCCESS;
}

API CUptiResult CUPTIAPI cuptiActivityRegisterCallbacks(CUpti_BuffersCallbackRequestFunc requested,
                                                        CUpti_BuffersCallbackCompleteFunc completed)
{
    if (requested == NULL || completed == NULL)
        return CUPTI_ERROR_INVALID_PARAMETER;
    buffer_requested = requested;
    buffer_completed = completed;
    return CUPTI_SUCCESS;
}

API CUptiResult CUPTIAPI cuptiActivityGetNextRecord(uint8_t *buffer, size_t valid_bytes, CUpti_Activity **record)
{
    uint8_t *at = *record == NULL ? buffer : (uint8_t *)*record + record_size((*record)->kind);
    if (at + sizeof(CUpti_Activity) > buffer + valid_bytes)
        return CUPTI_ERROR_MAX_LIMIT_REACHED;
    *record = (CUpti_Activity *)at;
    return CUPTI_SUCCESS;
}

/* Hands the chosen records to the client in as many buffers as it takes. */
static void deliver(union any_record *records, size_t count)
{
    size_t next = 0;
    while (next < count) {
        uint8_t *buffer = NULL;
        size_t size = 0, max_records = 0;
        buffer_requested(&buffer, &size, &max_records);
        if (buffer == NULL || size < sizeof(union any_record)) {
            atomic_fetch_add(&records_dropped, count - next);
            atomic_fetch_add(&dropped_since_query, count - next);
            return;
        }
        size_t used = 0;
        while (next < count) {
            size_t rs = record_size(records[next].header.kind);
            if (used + rs > size)
                break;
            memcpy(buffer + used, &records[next], rs);
            used += rs;
            next++;
            atomic_fetch_add(&records_delivered, 1);
        }
        buffer_completed(NULL, 0, buffer, size, used);
    }
}

static uint64_t delivery_delay_ns(void)
{
    static _Atomic int64_t delay = -1;
    return setting_us_as_ns("FAKE_CUPTI_DELIVERY_DELAY_US", &delay);
}

API CUptiResult CUPTIAPI cuptiActivityFlushAll(uint32_t flag)
{
    if (buffer_requested == NULL)
        return CUPTI_SUCCESS;
    uint64_t now = realtime_ns(), delay = delivery_delay_ns();
    int forced = (flag & CUPTI_ACTIVITY_FLAG_FLUSH_FORCED) != 0;
    pthread_mutex_lock(&pending_lock);
    union any_record *ready = malloc((pending_count ? pending_count : 1) * sizeof(*ready));
    size_t ready_count = 0, kept = 0;
    for (size_t i = 0; ready && i < pending_count; i++) {
        if (record_end(&pending[i]) + (forced ? 0 : delay) <= now)
            ready[ready_count++] = pending[i];
        else if (forced)
            ready[ready_count++] = unfinished(pending[i], now); /* handed back once, never again */
        else
            pending[kept++] = pending[i];
    }
    if (ready)
        pending_count = kept;
    pthread_mutex_unlock(&pending_lock);
    if (ready == NULL)
        return CUPTI_ERROR_OUT_OF_MEMORY;
    deliver(ready, ready_count);
    free(ready);
    return CUPTI_SUCCESS;
}

API CUptiResult CUPTIAPI cuptiActivityGetNumDroppedRecords(CUcontext context, uint32_t stream, size_t *dropped)
{
    (void)context;
    (void)stream;
    *dropped = (size_t)atomic_exchange(&dropped_since_query, 0); /* reset by each call, as documented */
    return CUPTI_SUCCESS;
}

__attribute__((destructor)) static void write_stats(void)
{
    const char *path = getenv("FAKE_CUPTI_STATS");
    FILE *f = path && path[0] ? fopen(path, "w") : NULL;
    if (f == NULL)
        return;
    fprintf(f, "api_callbacks %llu\nresource_callbacks %llu\nrecords_produced %llu\nrecords_delivered %llu\n"
               "records_dropped %llu\nrecords_lost %llu\nenable_calls %llu\nsubscribes %llu\nstale_ids %llu\n"
            "api_records %llu\nfinalizes %llu\nfinalizes_outside_callbacks %llu\nfinalizes_at_entry %llu\n"
            "graph_faults %llu\nresidue_calls %llu\n",
            (unsigned long long)api_callbacks, (unsigned long long)resource_callbacks,
            (unsigned long long)records_produced,
            (unsigned long long)records_delivered, (unsigned long long)records_dropped,
            (unsigned long long)records_lost, (unsigned long long)enable_calls, (unsigned long long)subscribes,
            (unsigned long long)stale_ids, (unsigned long long)api_records, (unsigned long long)finalizes,
            (unsigned long long)finalizes_outside_callbacks, (unsigned long long)finalizes_at_entry,
            (unsigned long long)graph_faults, (unsigned long long)residue_calls);
    fclose(f);
}
