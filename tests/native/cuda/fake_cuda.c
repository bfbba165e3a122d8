/* SPDX-License-Identifier: Apache-2.0 */
/*
 * A fake CUDA driver (libcuda.so.1) with a synthetic GPU, for testing the injected library without a GPU.
 *
 * - cuInit loads CUDA_INJECTION64_PATH and calls its InitializeInjection, like the real driver.
 * - Modules are text: cuModuleLoadData("matmul_kernel=2000000\nrelu_kernel=500000\n") defines kernels by name and
 *   GPU duration in nanoseconds; cuModuleGetFunction finds them by name.
 * - Each stream runs its work in order on CUPTI's clock (CLOCK_REALTIME): a kernel starts at max(launch time, end of
 *   the stream's previous work) and lasts its duration. Synchronize calls and blocking copies sleep until the work
 *   they wait for has ended: the wait's length is known from the schedule.
 * - Every call gets a correlation id and goes through the tracer (the fake CUPTI) at entry and exit; every piece of
 *   GPU work is reported to it with its times. The tracer may replace the id at entry (the fake CUPTI gives a call
 *   it does not see through a callback the last id it handed out); the work and the schedule carry the final one.
 *   FAKE_CUDA_CORRELATION_CYCLE=N: the driver's ids repeat 1..N, ids shared even among calls CUPTI sees.
 * - FAKE_CUDA_GRAPH_JITTER=F: each graph node's kernel lasts its duration times a factor drawn uniformly from
 *   [1 - F, 1 + F] at every replay (as replays on a real GPU vary a little); the schedule has the times it ran.
 * - cuDevicePrimaryCtxRelease destroys the (one) context: the tracer hears CONTEXT_DESTROY_STARTING.
 * - FAKE_CUDA_SCHEDULE=<path> writes the ground truth, one line per event:
 *     work <kind> <correlation_id> <name|-> <start_ns> <end_ns> <stream_id> <graph_id> <bytes>
 *     wait <cbid> <correlation_id> <enter_ns> <until_ns> <exit_ns> <begin_ns>
 *   (begin_ns: the call began, before the tracer's entry; enter_ns..exit_ns: the driver's own wait)
 *
 * Several devices and collectives (multi-GPU jobs):
 * - FAKE_CUDA_DEVICES=N (default 1) devices. Each has its primary context; cuCtxSetCurrent makes a device current
 *   for the calling thread, and the streams created then belong to it. GPU work carries its stream's device id (the
 *   legacy stream's work the current device's), as CUPTI's deviceId does. Every call's callbacks name the current
 *   context (device d's has contextUid d + 1), whose device cuptiGetDeviceId gives.
 * - A kernel named like NCCL's (ncclDevKernel_*, ncclKernel_*) is a collective of a job of FAKE_CUDA_RANKS ranks
 *   (processes), this one FAKE_CUDA_RANK, meeting in the file FAKE_CUDA_RENDEZVOUS (in /dev/shm, created by the
 *   job's launcher, zero-filled, at least RENDEZVOUS_BYTES): the n-th collective a rank launches completes only once
 *   every rank has launched its n-th; its kernel spins from its start until then, as NCCL's do. Its launch returns;
 *   its end is settled by the next call that needs the stream's tail (a wait, a copy, an event, or a later launch on
 *   the same stream, which then blocks like a full queue would), which blocks until the last rank has launched.
 *   Without the rendezvous settings a collective is an ordinary kernel. A rank that exits before launching its
 *   share leaves the others waiting (as NCCL does without its timeouts).
 */
#include <dlfcn.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include <cuda.h>
#include <cupti_activity.h>
#include <cupti_driver_cbid.h>

#include "fake_tracer.h"

#define LAUNCH_LATENCY_NS 5000u   /* from the launch call to the earliest start on the GPU */
#define COPY_BYTES_PER_NS 10u     /* 10 GB/s */
#define COPY_SETUP_NS 10000u
#define MAX_KERNELS_PER_MODULE 32
#define MAX_GRAPH_NODES 32
#define LEGACY_STREAM_ID 7u
#define MAX_DEVICES 8
#define MAX_RANKS 8
#define MAX_COLLECTIVES 65536 /* per job: the n-th collective of every rank meets in row n */
#define RENDEZVOUS_BYTES ((size_t)MAX_COLLECTIVES * MAX_RANKS * sizeof(uint64_t))
#define RENDEZVOUS_POLL_NS 20000u

struct CUfunc_st {
    char name[128];
    uint64_t duration_ns;
};
struct CUmod_st {
    int count;
    struct CUfunc_st functions[MAX_KERNELS_PER_MODULE];
};
struct pending_collective { /* a collective launched, its start not known until every rank has launched it */
    uint32_t sequence;        /* the n-th collective of this rank */
    uint32_t correlation_id;
    const char *name;
    uint64_t duration_ns;
    uint64_t launched_ns;
};
struct CUstream_st {
    uint32_t id;
    uint64_t tail_ns; /* when the last work queued on this stream ends */
    int device;
    int pending_count;
    struct pending_collective pending[64];
};
struct CUevent_st {
    uint64_t at_ns;
};
struct CUgraph_st {
    int count;
    CUfunction nodes[MAX_GRAPH_NODES];
};
struct CUgraphExec_st {
    uint32_t id;
    struct CUgraph_st graph;
};
static const struct fake_tracer *tracer;
static pthread_mutex_t gpu_lock = PTHREAD_MUTEX_INITIALIZER;
static struct CUstream_st legacy_stream = {.id = LEGACY_STREAM_ID};
static struct CUstream_st *streams[64];
static int stream_count;
static uint32_t next_stream_id = 13;
static uint32_t next_graph_id = 1;
static double graph_jitter;          /* FAKE_CUDA_GRAPH_JITTER */
static uint64_t jitter_state = 88172645463325252ull; /* xorshift64, under gpu_lock */
static _Atomic uint32_t next_correlation_id = 1;
static uint32_t correlation_cycle; /* FAKE_CUDA_CORRELATION_CYCLE=N: ids repeat 1..N, as CUDA 13's CUPTI reuses ids */
static struct CUctx_st contexts[MAX_DEVICES] = {{0}, {1}, {2}, {3}, {4}, {5}, {6}, {7}};
static int device_count = 1;             /* FAKE_CUDA_DEVICES */
static _Thread_local int current_device; /* set by cuCtxSetCurrent */
static int rank = -1, rank_count;        /* FAKE_CUDA_RANK, FAKE_CUDA_RANKS: -1 while not part of a job */
static _Atomic uint64_t *rendezvous;     /* [MAX_COLLECTIVES][MAX_RANKS] launch times (ns, 0: not yet) */
static uint32_t collectives_launched;
static FILE *schedule;
static pthread_mutex_t schedule_lock = PTHREAD_MUTEX_INITIALIZER;

__attribute__((visibility("default"))) void fake_cuda_set_tracer(const struct fake_tracer *t)
{
    tracer = t;
}

static uint64_t realtime_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_REALTIME, &t);
    return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}

static void sleep_until(uint64_t until_ns)
{
    struct timespec t = {(time_t)(until_ns / 1000000000u), (long)(until_ns % 1000000000u)};
    while (clock_nanosleep(CLOCK_REALTIME, TIMER_ABSTIME, &t, NULL) != 0) {
    }
}

static void schedule_line(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void schedule_line(const char *fmt, ...)
{
    if (schedule == NULL)
        return;
    va_list ap;
    va_start(ap, fmt);
    pthread_mutex_lock(&schedule_lock);
    vfprintf(schedule, fmt, ap);
    fflush(schedule);
    pthread_mutex_unlock(&schedule_lock);
    va_end(ap);
}

static void begin(struct fake_call *call, uint32_t cbid, const char *function, const char *symbol, const void *params)
{
    memset(call, 0, sizeof(*call));
    call->cbid = cbid;
    call->correlation_id = atomic_fetch_add(&next_correlation_id, 1);
    if (correlation_cycle > 0)
        call->correlation_id = (call->correlation_id - 1) % correlation_cycle + 1;
    call->function_name = function;
    call->symbol_name = symbol;
    call->params = params;
    call->begin_ns = realtime_ns();
    call->context = &contexts[current_device];
    call->context_uid = (uint32_t)current_device + 1;
    if (tracer)
        tracer->api_enter(call);
}

static CUresult end(struct fake_call *call, CUresult result)
{
    call->result = (int)result;
    if (tracer)
        tracer->api_exit(call);
    return result;
}

/* Queues work on a stream, to start at earliest or once the stream's earlier work has ended (gpu_lock held); returns
 * its end. */
static uint64_t queue_work_at(struct CUstream_st *s, uint64_t earliest, enum fake_work_kind kind,
                              uint32_t correlation_id, const char *name, uint64_t duration_ns, uint32_t graph_id,
                              uint64_t bytes, uint8_t copy_kind, uint8_t src_kind, uint8_t dst_kind)
{
    struct fake_work w = {
        .kind = kind,
        .correlation_id = correlation_id,
        .name = name,
        .start_ns = s->tail_ns > earliest ? s->tail_ns : earliest,
        .device_id = (uint32_t)(s == &legacy_stream ? current_device : s->device),
        .stream_id = s->id,
        .graph_id = graph_id,
        .bytes = bytes,
        .copy_kind = copy_kind,
        .src_kind = src_kind,
        .dst_kind = dst_kind,
    };
    w.end_ns = w.start_ns + duration_ns;
    s->tail_ns = w.end_ns;
    if (tracer)
        tracer->gpu_work(&w);
    schedule_line("work %d %u %s %llu %llu %u %u %llu\n", (int)kind, correlation_id, name ? name : "-",
                  (unsigned long long)w.start_ns, (unsigned long long)w.end_ns, w.stream_id, graph_id,
                  (unsigned long long)bytes);
    return w.end_ns;
}

/* Queues work on a stream, to start as soon as the launch reaches the GPU (gpu_lock held); returns its end. */
static uint64_t queue_work(struct CUstream_st *s, enum fake_work_kind kind, uint32_t correlation_id, const char *name,
                           uint64_t duration_ns, uint32_t graph_id, uint64_t bytes, uint8_t copy_kind,
                           uint8_t src_kind, uint8_t dst_kind)
{
    return queue_work_at(s, realtime_ns() + LAUNCH_LATENCY_NS, kind, correlation_id, name, duration_ns, graph_id,
                         bytes, copy_kind, src_kind, dst_kind);
}

static int is_collective(const char *name)
{
    return rendezvous != NULL && (strncmp(name, "ncclDevKernel_", 14) == 0 || strncmp(name, "ncclKernel_", 11) == 0);
}

/* The last launch of collective `sequence` among the ranks, once every rank has launched it (blocks until then). */
static uint64_t last_arrival(uint32_t sequence)
{
    _Atomic uint64_t *row = rendezvous + (size_t)(sequence % MAX_COLLECTIVES) * MAX_RANKS;
    for (;;) {
        uint64_t last = 0;
        int arrived = 0;
        for (int r = 0; r < rank_count; r++) {
            uint64_t at = atomic_load(&row[r]);
            arrived += at != 0;
            last = at > last ? at : last;
        }
        if (arrived == rank_count)
            return last;
        struct timespec pause = {0, RENDEZVOUS_POLL_NS};
        nanosleep(&pause, NULL);
    }
}

/* Queues the stream's collectives (gpu_lock held; it is let go while waiting for the other ranks, so this process's
 * other threads and streams go on). Like NCCL's, a collective's kernel starts when its stream reaches it and spins
 * until the last rank has launched it, then runs its duration: a rank that arrives early spends the wait on the GPU
 * too. */
static void settle(struct CUstream_st *s)
{
    while (s->pending_count > 0) {
        struct pending_collective c = s->pending[0];
        pthread_mutex_unlock(&gpu_lock);
        uint64_t last = last_arrival(c.sequence) + LAUNCH_LATENCY_NS;
        pthread_mutex_lock(&gpu_lock);
        if (s->pending_count == 0 || s->pending[0].sequence != c.sequence)
            continue; /* another thread waiting on the same stream queued it meanwhile */
        uint64_t start = c.launched_ns + LAUNCH_LATENCY_NS > s->tail_ns ? c.launched_ns + LAUNCH_LATENCY_NS : s->tail_ns;
        uint64_t spin = last > start ? last - start : 0;
        s->pending_count--;
        memmove(&s->pending[0], &s->pending[1], (size_t)s->pending_count * sizeof(s->pending[0]));
        queue_work_at(s, start, FAKE_WORK_KERNEL, c.correlation_id, c.name, spin + c.duration_ns, 0, 0, 0, 0, 0);
    }
}

static struct CUstream_st *stream_of(CUstream s)
{
    return s ? s : &legacy_stream;
}

static uint64_t all_streams_tail(void)
{
    settle(&legacy_stream);
    for (int i = 0; i < stream_count; i++)
        settle(streams[i]);
    uint64_t tail = legacy_stream.tail_ns;
    for (int i = 0; i < stream_count; i++)
        if (streams[i]->tail_ns > tail)
            tail = streams[i]->tail_ns;
    return tail;
}

/* A blocking wait entered at enter (before any wait for other ranks): sleeps until until_ns, writes the truth. */
static void wait_from(const struct fake_call *call, uint64_t enter, uint64_t until_ns)
{
    sleep_until(until_ns);
    uint64_t exit_ns = realtime_ns();
    schedule_line("wait %u %u %llu %llu %llu %llu\n", call->cbid, call->correlation_id, (unsigned long long)enter,
                  (unsigned long long)until_ns, (unsigned long long)exit_ns, (unsigned long long)call->begin_ns);
}

static void wait_until(const struct fake_call *call, uint64_t until_ns)
{
    wait_from(call, realtime_ns(), until_ns);
}

/* --- initialisation, contexts, modules ----------------------------------------------------------------------- */

CUresult CUDAAPI cuInit(unsigned int flags)
{
    (void)flags;
    static int done;
    if (done)
        return CUDA_SUCCESS;
    done = 1;
    const char *jitter = getenv("FAKE_CUDA_GRAPH_JITTER");
    if (jitter && jitter[0])
        graph_jitter = strtod(jitter, NULL);
    const char *cycle = getenv("FAKE_CUDA_CORRELATION_CYCLE");
    if (cycle && cycle[0])
        correlation_cycle = (uint32_t)strtoul(cycle, NULL, 10);
    const char *path = getenv("FAKE_CUDA_SCHEDULE");
    if (path && path[0])
        schedule = fopen(path, "w");
    const char *devices = getenv("FAKE_CUDA_DEVICES");
    if (devices && devices[0])
        device_count = atoi(devices) < 1 ? 1 : atoi(devices) > MAX_DEVICES ? MAX_DEVICES : atoi(devices);
    const char *meeting = getenv("FAKE_CUDA_RENDEZVOUS"), *ranks = getenv("FAKE_CUDA_RANKS"),
               *me = getenv("FAKE_CUDA_RANK");
    if (meeting && meeting[0] && ranks && me) {
        rank_count = atoi(ranks);
        rank = atoi(me);
        int fd = open(meeting, O_RDWR);
        void *map = fd >= 0 ? mmap(NULL, RENDEZVOUS_BYTES, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0) : MAP_FAILED;
        if (fd >= 0)
            close(fd);
        if (map == MAP_FAILED || rank_count < 1 || rank_count > MAX_RANKS || rank < 0 || rank >= rank_count)
            fprintf(stderr, "fake-cuda: no rendezvous (%s, rank %d of %d): collectives run alone\n", meeting, rank,
                    rank_count);
        else
            rendezvous = map;
    }
    const char *inject = getenv("CUDA_INJECTION64_PATH");
    if (inject && inject[0]) {
        void *lib = dlopen(inject, RTLD_NOW | RTLD_LOCAL);
        int (*init)(void) = lib ? (int (*)(void))dlsym(lib, "InitializeInjection") : NULL;
        if (init == NULL)
            fprintf(stderr, "fake-cuda: cannot load the injection library %s: %s\n", inject, dlerror());
        else
            init();
    }
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDeviceGet(CUdevice *device, int ordinal)
{
    *device = ordinal;
    return ordinal >= 0 && ordinal < device_count ? CUDA_SUCCESS : CUDA_ERROR_INVALID_DEVICE;
}

CUresult CUDAAPI cuDeviceGetCount(int *count)
{
    *count = device_count;
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDevicePrimaryCtxRetain(CUcontext *ctx, CUdevice dev)
{
    if (dev < 0 || dev >= device_count)
        return CUDA_ERROR_INVALID_DEVICE;
    *ctx = &contexts[dev];
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDevicePrimaryCtxRelease(CUdevice dev)
{
    (void)dev;
    if (tracer)
        tracer->context_destroy_starting();
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuCtxSetCurrent(CUcontext ctx)
{
    current_device = ctx ? ctx->device : 0;
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuModuleLoadData(CUmodule *module, const void *image)
{
    struct CUmod_st *m = calloc(1, sizeof(*m));
    if (m == NULL)
        return CUDA_ERROR_OUT_OF_MEMORY;
    const char *p = image;
    while (*p && m->count < MAX_KERNELS_PER_MODULE) {
        struct CUfunc_st *f = &m->functions[m->count];
        unsigned long long ns = 0;
        int used = 0;
        if (sscanf(p, "%127[^=\n]=%llu%n", f->name, &ns, &used) != 2)
            break;
        f->duration_ns = ns;
        m->count++;
        p += used;
        while (*p == '\n' || *p == ';')
            p++;
    }
    *module = m;
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuModuleGetFunction(CUfunction *function, CUmodule module, const char *name)
{
    for (int i = 0; i < module->count; i++) {
        if (strcmp(module->functions[i].name, name) == 0) {
            *function = &module->functions[i];
            return CUDA_SUCCESS;
        }
    }
    return CUDA_ERROR_NOT_FOUND;
}

CUresult CUDAAPI cuStreamCreate(CUstream *stream, unsigned int flags)
{
    (void)flags;
    struct CUstream_st *s = calloc(1, sizeof(*s));
    if (s == NULL || stream_count == 64)
        return CUDA_ERROR_OUT_OF_MEMORY;
    pthread_mutex_lock(&gpu_lock);
    s->id = next_stream_id++;
    s->device = current_device;
    streams[stream_count++] = s;
    pthread_mutex_unlock(&gpu_lock);
    *stream = s;
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuEventCreate(CUevent *event, unsigned int flags)
{
    (void)flags;
    *event = calloc(1, sizeof(**event));
    return *event ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}

CUresult CUDAAPI cuEventRecord(CUevent event, CUstream stream)
{
    pthread_mutex_lock(&gpu_lock);
    settle(stream_of(stream));
    event->at_ns = stream_of(stream)->tail_ns;
    pthread_mutex_unlock(&gpu_lock);
    return CUDA_SUCCESS;
}

/* --- launches ------------------------------------------------------------------------------------------------ */

struct launch_kernel_params { /* cuLaunchKernel_params */
    CUfunction f;
    unsigned int grid_x, grid_y, grid_z, block_x, block_y, block_z, shared_bytes;
    CUstream stream;
    void **kernel_params;
    void **extra;
};

static CUresult launch(uint32_t cbid, const char *api, CUfunction f, CUstream stream, const void *params)
{
    struct fake_call call;
    begin(&call, cbid, api, f ? f->name : NULL, params);
    if (f == NULL)
        return end(&call, CUDA_ERROR_INVALID_HANDLE);
    pthread_mutex_lock(&gpu_lock);
    struct CUstream_st *s = stream_of(stream);
    if (is_collective(f->name) && s->pending_count < 64) {
        uint32_t sequence = collectives_launched++;
        uint64_t now = realtime_ns();
        atomic_store(&rendezvous[(size_t)(sequence % MAX_COLLECTIVES) * MAX_RANKS + rank], now);
        s->pending[s->pending_count++] =
            (struct pending_collective){sequence, call.correlation_id, f->name, f->duration_ns, now};
    } else {
        settle(s);
        queue_work(s, FAKE_WORK_KERNEL, call.correlation_id, f->name, f->duration_ns, 0, 0, 0, 0, 0);
    }
    pthread_mutex_unlock(&gpu_lock);
    return end(&call, CUDA_SUCCESS);
}

CUresult CUDAAPI cuLaunchKernel(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz, unsigned int bx,
                                unsigned int by, unsigned int bz, unsigned int shared_bytes, CUstream stream,
                                void **kernel_params, void **extra)
{
    struct launch_kernel_params p = {f, gx, gy, gz, bx, by, bz, shared_bytes, stream, kernel_params, extra};
    return launch(CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel, "cuLaunchKernel", f, stream, &p);
}

CUresult CUDAAPI cuLaunchKernelEx(const CUlaunchConfig *config, CUfunction f, void **kernel_params, void **extra)
{
    struct {
        const CUlaunchConfig *config;
        CUfunction f;
        void **kernel_params;
        void **extra;
    } p = {config, f, kernel_params, extra};
    return launch(CUPTI_DRIVER_TRACE_CBID_cuLaunchKernelEx, "cuLaunchKernelEx", f, config->hStream, &p);
}

CUresult CUDAAPI cuGraphCreate(CUgraph *graph, unsigned int flags)
{
    (void)flags;
    *graph = calloc(1, sizeof(**graph));
    return *graph ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}

CUresult CUDAAPI cuGraphAddKernelNode(CUgraphNode *node, CUgraph graph, const CUgraphNode *deps, size_t deps_count,
                                      const CUDA_KERNEL_NODE_PARAMS *params)
{
    (void)deps;
    (void)deps_count;
    if (graph->count == MAX_GRAPH_NODES)
        return CUDA_ERROR_OUT_OF_MEMORY;
    graph->nodes[graph->count] = params->func;
    *node = (CUgraphNode)(uintptr_t)(graph->count + 1);
    graph->count++;
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuGraphInstantiate(CUgraphExec *exec, CUgraph graph, unsigned long long flags)
{
    struct {
        CUgraphExec *exec;
        CUgraph graph;
        unsigned long long flags;
    } p = {exec, graph, flags};
    struct fake_call call;
    begin(&call, CUPTI_DRIVER_TRACE_CBID_cuGraphInstantiateWithFlags, "cuGraphInstantiateWithFlags", NULL, &p);
    struct CUgraphExec_st *e = calloc(1, sizeof(*e));
    if (e == NULL)
        return end(&call, CUDA_ERROR_OUT_OF_MEMORY);
    pthread_mutex_lock(&gpu_lock);
    e->id = next_graph_id++;
    pthread_mutex_unlock(&gpu_lock);
    e->graph = *graph;
    *exec = e;
    return end(&call, CUDA_SUCCESS);
}

CUresult CUDAAPI cuGraphLaunch(CUgraphExec exec, CUstream stream)
{
    struct {
        CUgraphExec exec;
        CUstream stream;
    } p = {exec, stream};
    struct fake_call call;
    begin(&call, CUPTI_DRIVER_TRACE_CBID_cuGraphLaunch, "cuGraphLaunch", NULL, &p);
    pthread_mutex_lock(&gpu_lock);
    settle(stream_of(stream));
    /* Every kernel of the graph carries the launch's correlation id, as with the real CUPTI. */
    for (int i = 0; i < exec->graph.count; i++) {
        CUfunction f = exec->graph.nodes[i];
        uint64_t duration_ns = f->duration_ns;
        if (graph_jitter > 0) {
            jitter_state ^= jitter_state << 13;
            jitter_state ^= jitter_state >> 7;
            jitter_state ^= jitter_state << 17;
            double u = (double)(jitter_state >> 11) / (double)(1ull << 53);
            duration_ns = (uint64_t)((double)duration_ns * (1.0 + graph_jitter * (2.0 * u - 1.0)));
        }
        queue_work(stream_of(stream), FAKE_WORK_KERNEL, call.correlation_id, f->name, duration_ns, exec->id, 0, 0,
                   0, 0);
    }
    pthread_mutex_unlock(&gpu_lock);
    return end(&call, CUDA_SUCCESS);
}

/* --- memory -------------------------------------------------------------------------------------------------- */

CUresult CUDAAPI cuMemAlloc(CUdeviceptr *ptr, size_t bytes)
{
    void *p = malloc(bytes ? bytes : 1);
    *ptr = (CUdeviceptr)(uintptr_t)p;
    return p ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}

CUresult CUDAAPI cuMemFree(CUdeviceptr ptr)
{
    free((void *)(uintptr_t)ptr);
    return CUDA_SUCCESS;
}

static uint64_t copy_ns(size_t bytes)
{
    return COPY_SETUP_NS + bytes / COPY_BYTES_PER_NS;
}

CUresult CUDAAPI cuMemcpyHtoD(CUdeviceptr dst, const void *src, size_t bytes)
{
    struct fake_call call;
    begin(&call, CUPTI_DRIVER_TRACE_CBID_cuMemcpyHtoD_v2, "cuMemcpyHtoD_v2", NULL, NULL);
    pthread_mutex_lock(&gpu_lock);
    legacy_stream.tail_ns = all_streams_tail();
    uint64_t done = queue_work(&legacy_stream, FAKE_WORK_MEMCPY, call.correlation_id, NULL, copy_ns(bytes), 0, bytes,
                               CUPTI_ACTIVITY_MEMCPY_KIND_HTOD, CUPTI_ACTIVITY_MEMORY_KIND_PAGEABLE,
                               CUPTI_ACTIVITY_MEMORY_KIND_DEVICE);
    pthread_mutex_unlock(&gpu_lock);
    memcpy((void *)(uintptr_t)dst, src, bytes);
    sleep_until(done); /* a copy from pageable memory returns once the data has been staged */
    return end(&call, CUDA_SUCCESS);
}

CUresult CUDAAPI cuMemcpyDtoH(void *dst, CUdeviceptr src, size_t bytes)
{
    struct fake_call call;
    begin(&call, CUPTI_DRIVER_TRACE_CBID_cuMemcpyDtoH_v2, "cuMemcpyDtoH_v2", NULL, NULL);
    pthread_mutex_lock(&gpu_lock);
    legacy_stream.tail_ns = all_streams_tail(); /* the legacy stream waits for every other stream */
    uint64_t done = queue_work(&legacy_stream, FAKE_WORK_MEMCPY, call.correlation_id, NULL, copy_ns(bytes), 0, bytes,
                               CUPTI_ACTIVITY_MEMCPY_KIND_DTOH, CUPTI_ACTIVITY_MEMORY_KIND_DEVICE,
                               CUPTI_ACTIVITY_MEMORY_KIND_PAGEABLE);
    pthread_mutex_unlock(&gpu_lock);
    memcpy(dst, (const void *)(uintptr_t)src, bytes);
    wait_until(&call, done);
    return end(&call, CUDA_SUCCESS);
}

CUresult CUDAAPI cuMemsetD32Async(CUdeviceptr dst, unsigned int value, size_t count, CUstream stream)
{
    struct fake_call call;
    begin(&call, CUPTI_DRIVER_TRACE_CBID_cuMemsetD32Async, "cuMemsetD32Async", NULL, NULL);
    uint32_t *p = (uint32_t *)(uintptr_t)dst;
    for (size_t i = 0; i < count; i++)
        p[i] = value;
    pthread_mutex_lock(&gpu_lock);
    settle(stream_of(stream));
    queue_work(stream_of(stream), FAKE_WORK_MEMSET, call.correlation_id, NULL, copy_ns(count * 4) / 4, 0, count * 4,
               0, 0, CUPTI_ACTIVITY_MEMORY_KIND_DEVICE);
    pthread_mutex_unlock(&gpu_lock);
    return end(&call, CUDA_SUCCESS);
}

/* --- waits --------------------------------------------------------------------------------------------------- */

CUresult CUDAAPI cuStreamSynchronize(CUstream stream)
{
    struct {
        CUstream stream;
    } p = {stream};
    struct fake_call call;
    begin(&call, CUPTI_DRIVER_TRACE_CBID_cuStreamSynchronize, "cuStreamSynchronize", NULL, &p);
    uint64_t enter = realtime_ns();
    pthread_mutex_lock(&gpu_lock);
    settle(stream_of(stream));
    uint64_t until = stream_of(stream)->tail_ns;
    pthread_mutex_unlock(&gpu_lock);
    wait_from(&call, enter, until);
    return end(&call, CUDA_SUCCESS);
}

CUresult CUDAAPI cuCtxSynchronize(void)
{
    struct fake_call call;
    begin(&call, CUPTI_DRIVER_TRACE_CBID_cuCtxSynchronize, "cuCtxSynchronize", NULL, NULL);
    uint64_t enter = realtime_ns();
    pthread_mutex_lock(&gpu_lock);
    uint64_t until = all_streams_tail();
    pthread_mutex_unlock(&gpu_lock);
    wait_from(&call, enter, until);
    return end(&call, CUDA_SUCCESS);
}

CUresult CUDAAPI cuEventSynchronize(CUevent event)
{
    struct {
        CUevent event;
    } p = {event};
    struct fake_call call;
    begin(&call, CUPTI_DRIVER_TRACE_CBID_cuEventSynchronize, "cuEventSynchronize", NULL, &p);
    wait_until(&call, event->at_ns);
    return end(&call, CUDA_SUCCESS);
}

CUresult CUDAAPI cuGetErrorString(CUresult error, const char **text)
{
    *text = error == CUDA_SUCCESS ? "no error" : "fake-cuda error";
    return CUDA_SUCCESS;
}
