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
 * - cuDevicePrimaryCtxRelease destroys the (one) context: the tracer hears CONTEXT_DESTROY_STARTING.
 * - FAKE_CUDA_SCHEDULE=<path> writes the ground truth, one line per event:
 *     work <kind> <correlation_id> <name|-> <start_ns> <end_ns> <stream_id> <graph_id> <bytes>
 *     wait <cbid> <correlation_id> <enter_ns> <until_ns> <exit_ns> <begin_ns>
 *   (begin_ns: the call began, before the tracer's entry; enter_ns..exit_ns: the driver's own wait)
 */
#include <dlfcn.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

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

struct CUfunc_st {
    char name[128];
    uint64_t duration_ns;
};
struct CUmod_st {
    int count;
    struct CUfunc_st functions[MAX_KERNELS_PER_MODULE];
};
struct CUstream_st {
    uint32_t id;
    uint64_t tail_ns; /* when the last work queued on this stream ends */
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
struct CUctx_st {
    int unused;
};

static const struct fake_tracer *tracer;
static pthread_mutex_t gpu_lock = PTHREAD_MUTEX_INITIALIZER;
static struct CUstream_st legacy_stream = {LEGACY_STREAM_ID, 0};
static struct CUstream_st *streams[64];
static int stream_count;
static uint32_t next_stream_id = 13;
static uint32_t next_graph_id = 1;
static _Atomic uint32_t next_correlation_id = 1;
static uint32_t correlation_cycle; /* FAKE_CUDA_CORRELATION_CYCLE=N: ids repeat 1..N, as CUDA 13's CUPTI reuses ids */
static struct CUctx_st the_context;
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

/* Queues work on a stream (gpu_lock held); returns its end. */
static uint64_t queue_work(struct CUstream_st *s, enum fake_work_kind kind, uint32_t correlation_id, const char *name,
                           uint64_t duration_ns, uint32_t graph_id, uint64_t bytes, uint8_t copy_kind,
                           uint8_t src_kind, uint8_t dst_kind)
{
    uint64_t earliest = realtime_ns() + LAUNCH_LATENCY_NS;
    struct fake_work w = {
        .kind = kind,
        .correlation_id = correlation_id,
        .name = name,
        .start_ns = s->tail_ns > earliest ? s->tail_ns : earliest,
        .device_id = 0,
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

static struct CUstream_st *stream_of(CUstream s)
{
    return s ? s : &legacy_stream;
}

static uint64_t all_streams_tail(void)
{
    uint64_t tail = legacy_stream.tail_ns;
    for (int i = 0; i < stream_count; i++)
        if (streams[i]->tail_ns > tail)
            tail = streams[i]->tail_ns;
    return tail;
}

/* A blocking wait: sleeps until until_ns and writes the ground truth. */
static void wait_until(const struct fake_call *call, uint64_t until_ns)
{
    uint64_t enter = realtime_ns();
    sleep_until(until_ns);
    uint64_t exit_ns = realtime_ns();
    schedule_line("wait %u %u %llu %llu %llu %llu\n", call->cbid, call->correlation_id, (unsigned long long)enter,
                  (unsigned long long)until_ns, (unsigned long long)exit_ns, (unsigned long long)call->begin_ns);
}

/* --- initialisation, contexts, modules ----------------------------------------------------------------------- */

CUresult CUDAAPI cuInit(unsigned int flags)
{
    (void)flags;
    static int done;
    if (done)
        return CUDA_SUCCESS;
    done = 1;
    const char *cycle = getenv("FAKE_CUDA_CORRELATION_CYCLE");
    if (cycle && cycle[0])
        correlation_cycle = (uint32_t)strtoul(cycle, NULL, 10);
    const char *path = getenv("FAKE_CUDA_SCHEDULE");
    if (path && path[0])
        schedule = fopen(path, "w");
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
    return ordinal == 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_DEVICE;
}

CUresult CUDAAPI cuDevicePrimaryCtxRetain(CUcontext *ctx, CUdevice dev)
{
    (void)dev;
    *ctx = &the_context;
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
    (void)ctx;
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
    queue_work(stream_of(stream), FAKE_WORK_KERNEL, call.correlation_id, f->name, f->duration_ns, 0, 0, 0, 0, 0);
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
    /* Every kernel of the graph carries the launch's correlation id, as with the real CUPTI. */
    for (int i = 0; i < exec->graph.count; i++) {
        CUfunction f = exec->graph.nodes[i];
        queue_work(stream_of(stream), FAKE_WORK_KERNEL, call.correlation_id, f->name, f->duration_ns, exec->id, 0, 0,
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
    pthread_mutex_lock(&gpu_lock);
    uint64_t until = stream_of(stream)->tail_ns;
    pthread_mutex_unlock(&gpu_lock);
    wait_until(&call, until);
    return end(&call, CUDA_SUCCESS);
}

CUresult CUDAAPI cuCtxSynchronize(void)
{
    struct fake_call call;
    begin(&call, CUPTI_DRIVER_TRACE_CBID_cuCtxSynchronize, "cuCtxSynchronize", NULL, NULL);
    pthread_mutex_lock(&gpu_lock);
    uint64_t until = all_streams_tail();
    pthread_mutex_unlock(&gpu_lock);
    wait_until(&call, until);
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
