/* SPDX-License-Identifier: Apache-2.0 */
/*
 * A CUDA workload with a known structure, built with full frame pointers and no inlining so that every function
 * below appears in the launching stacks:
 *
 *   main -> train_step -> forward -> launch_matmul (cuLaunchKernel   "matmul_kernel", 2 ms)
 *                                 -> launch_relu   (cuLaunchKernelEx "relu_kernel", 0.5 ms)
 *                      -> launch_graph  (cuGraphLaunch: "graph_a_kernel" 0.3 ms, "graph_b_kernel" 0.2 ms,
 *                                        "graph_c_kernel" 0.1 ms), every --graph-every steps
 *                      -> fill_buffer   (cuMemsetD32Async) and copy_out (cuMemcpyDtoH, blocking), every 10 steps
 *                      -> sync_point    (cuStreamSynchronize: waits for the step's kernels)
 *                      -> event_wait    (cuEventRecord + cuEventSynchronize), every 25 steps
 *   main -> drain (cuCtxSynchronize) and cuDevicePrimaryCtxRelease at the end
 *
 * usage: workload [--steps N] [--graph-every K] [--idle-ms MS] [--exit-at STEP] [--no-init] [--tiny N] [--skip-exit-handlers]
 *                 [--lagged-pace-us US] (launch a step every US microseconds, never wait: the GPU queue lags)
 *   --skip-exit-handlers ends with _exit() right after releasing the context: only the context-destruction
 *   callback can hand over the last records.
 *   --fork-children forks a child every 5 steps that returns from a function and exit()s at once (running exit
 *   handlers in a copy of the process whose sampling thread does not exist); the parent waits for each.
 *   --take-cupti subscribes to CUPTI (OTEL_GPU_CUPTI_PATH) itself before cuInit, like a profiler would, and prints
 *   "took_cupti <CUptiResult>".
 *   --graph-from STEP instantiates the graph only at step STEP and launches it every 2 steps from then on.
 *   --profiler-lib PATH loads PATH (libfake_profiler.so: a profiler linked against CUPTI, like torch.profiler) before
 *   cuInit; with --profile-at STEP it runs a profiling session over steps STEP .. STEP + --profile-steps (10) - 1,
 *   repeated every --profile-every steps (0: once), printing "profiler_start <CUptiResult>" and
 *   "profiler_kernels <recorded> expected <launched>" per session.
 *   --side-stream runs relu_kernel on a stream of its own and launches it before matmul_kernel in forward: with
 *   --lagged-pace-us only the main stream lags, the side stream keeps up (as a copy or communication stream does).
 *   --graph-phases N replaces the training loop by clustered work, as a program that replays a captured graph in one
 *   function and launches eagerly in another: N blocks of equal GPU time (30 ms) taking turns, one of 50
 *   launch_graph calls (0.6 ms of kernels each), the next of 60 launch_relu calls (0.5 ms), each call followed by
 *   sync_point (blocks last longer than a sampling window: a window sees one kind of work or the other);
 *   --graph-execs K replays K execs of the graph in turn (each instantiated once).
 *   --mixed N replaces the training loop by N iterations of a launch-bound program that replays a graph and launches
 *   eagerly in turn (as scripts/h200/graphs.py on a GPU): 4 launch_graph calls (2.4 ms of kernels), then 1200
 *   launch_tiny calls (100 ns kernels, each after --mixed-cpu-us (10) of the program's own CPU time), then sync_point.
 *   --idle-before-graph-ms MS: with --graph-from, the program makes no CUDA call for MS before it instantiates the
 *   graph (CPU work, a data loader's stall), so the graph call is the first call the library sees after it.
 *   --idle-ms MS: after each training step the program makes no CUDA call for MS (asleep: a server between requests).
 *   --tiny N replaces the training loop by a launch-bound one: N launches of "tiny_kernel" (100 ns), waiting every 1000
 *   (--tiny-wait-every K: every K; 0: only at the end, a loop that never synchronizes).
 *   --exit-at STEP exits in the middle of step STEP (after its launches, before any wait): a crash-free exit
 *   mid-stream. --no-init never calls cuInit (the library is never loaded).
 * At the end it prints the schedule it ran: "site <function> <kernel> <count> <total_ns>" per call site and kernel,
 * and "symbol_base libcuda <address>" (where the fake driver is loaded) for the tests.
 */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cuda.h>
#include <cupti.h>

#define NOINLINE __attribute__((noinline))

static const char MODULE_TEXT[] = "matmul_kernel=2000000\nrelu_kernel=500000\n"
                                  "graph_a_kernel=300000\ngraph_b_kernel=200000\ngraph_c_kernel=100000\n"
                                  "tiny_kernel=100\n";

struct site_count {
    const char *site;
    const char *kernel;
    unsigned long long duration_ns;
    unsigned long long count;
};

static struct site_count sites[] = {
    {"launch_matmul", "matmul_kernel", 2000000, 0},
    {"launch_relu", "relu_kernel", 500000, 0},
    {"launch_graph", "graph_a_kernel", 300000, 0},
    {"launch_graph", "graph_b_kernel", 200000, 0},
    {"launch_graph", "graph_c_kernel", 100000, 0},
};

static CUstream stream, relu_stream; /* relu_stream: stream, or a second one with --side-stream */
static int side_stream;
static CUfunction matmul, relu, tiny;
static CUgraphExec graph_exec;
static CUdeviceptr device_buffer;
static CUevent event;
static char host_buffer[1 << 20];

#define CHECK(call)                                                                                                   \
    do {                                                                                                              \
        CUresult rc_ = (call);                                                                                        \
        if (rc_ != CUDA_SUCCESS) {                                                                                    \
            fprintf(stderr, "workload: %s failed: %d\n", #call, (int)rc_);                                            \
            exit(1);                                                                                                  \
        }                                                                                                             \
    } while (0)

NOINLINE void launch_matmul(void)
{
    CHECK(cuLaunchKernel(matmul, 64, 64, 1, 128, 1, 1, 0, stream, NULL, NULL));
    sites[0].count++;
}

NOINLINE void launch_relu(void)
{
    CUlaunchConfig config;
    memset(&config, 0, sizeof(config));
    config.gridDimX = 64;
    config.gridDimY = config.gridDimZ = 1;
    config.blockDimX = 128;
    config.blockDimY = config.blockDimZ = 1;
    config.hStream = relu_stream;
    CHECK(cuLaunchKernelEx(&config, relu, NULL, NULL));
    sites[1].count++;
}

NOINLINE void forward(void)
{
    if (side_stream) {
        launch_relu();
        launch_matmul();
        return;
    }
    launch_matmul();
    launch_relu();
}

NOINLINE void launch_graph(void)
{
    CHECK(cuGraphLaunch(graph_exec, stream));
    sites[2].count++;
    sites[3].count++;
    sites[4].count++;
}

NOINLINE void fill_buffer(void)
{
    CHECK(cuMemsetD32Async(device_buffer, 7, sizeof(host_buffer) / 4, stream));
}

NOINLINE void copy_out(void)
{
    CHECK(cuMemcpyDtoH(host_buffer, device_buffer, sizeof(host_buffer)));
}

NOINLINE void sync_point(void)
{
    CHECK(cuStreamSynchronize(stream));
}

NOINLINE void event_wait(void)
{
    CHECK(cuEventRecord(event, stream));
    CHECK(cuEventSynchronize(event));
}

NOINLINE void drain(void)
{
    CHECK(cuCtxSynchronize());
}

NOINLINE void launch_bound_loop(long launches, long wait_every)
{
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (long i = 0; i < launches; i++) {
        CHECK(cuLaunchKernel(tiny, 1, 1, 1, 32, 1, 1, 0, stream, NULL, NULL));
        if (wait_every > 0 && i % wait_every == wait_every - 1)
            sync_point();
    }
    sync_point();
    clock_gettime(CLOCK_MONOTONIC, &t1);
    printf("tiny_launches %ld seconds %.6f\n", launches,
           (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9);
}

#define MAX_PHASE_EXECS 256
static int phase_execs = 1; /* --graph-execs K: the graph blocks replay K execs of the graph in turn */

NOINLINE void graph_phases_loop(int blocks, CUgraph graph)
{
    static CUgraphExec execs[MAX_PHASE_EXECS];
    execs[0] = graph_exec;
    for (int e = 1; e < phase_execs; e++)
        CHECK(cuGraphInstantiate(&execs[e], graph, 0));
    int replay = 0;
    for (int b = 0; b < blocks; b++) {
        for (int i = 0; i < (b % 2 == 0 ? 50 : 60); i++) {
            if (b % 2 == 0) {
                graph_exec = execs[replay++ % phase_execs];
                launch_graph();
            } else
                launch_relu();
            sync_point();
        }
    }
}

static long mixed_cpu_ns = 10000; /* --mixed-cpu-us: the program's own CPU time before each eager launch */

static void spin_ns(long ns)
{
    struct timespec t0, t;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    do
        clock_gettime(CLOCK_MONOTONIC, &t);
    while ((t.tv_sec - t0.tv_sec) * 1000000000L + (t.tv_nsec - t0.tv_nsec) < ns);
}

NOINLINE void launch_tiny(void)
{
    spin_ns(mixed_cpu_ns);
    CHECK(cuLaunchKernel(tiny, 1, 1, 1, 32, 1, 1, 0, stream, NULL, NULL));
}

NOINLINE void mixed_loop(int iterations)
{
    for (int i = 0; i < iterations; i++) {
        for (int g = 0; g < 4; g++)
            launch_graph();
        for (int e = 0; e < 1200; e++)
            launch_tiny();
        sync_point();
    }
}

/* A GPU-bound program: launches come every pace_us, faster than the GPU runs them (2.5 ms a step), and nothing waits
 * until the end, so the queue lags the launches by more and more (hundreds of ms after a few hundred steps). */
NOINLINE void lagged_loop(int steps, int graph_every, long pace_us)
{
    for (int step = 0; step < steps; step++) {
        forward();
        if (graph_every > 0 && step % graph_every == 0)
            launch_graph();
        if (step % 10 == 0)
            fill_buffer();
        struct timespec pause = {pace_us / 1000000, (pace_us % 1000000) * 1000};
        nanosleep(&pause, NULL);
    }
}

NOINLINE void train_step(int step, int graph_every, int exit_at)
{
    forward();
    if (graph_every > 0 && step % graph_every == 0)
        launch_graph();
    if (step == exit_at) {
        printf("exiting mid-stream at step %d\n", step);
        fflush(stdout);
        exit(0);
    }
    if (step % 10 == 0) {
        fill_buffer();
        copy_out();
    }
    sync_point();
    if (step % 25 == 0)
        event_wait();
}

static void CUPTIAPI ignore_callback(void *userdata, CUpti_CallbackDomain domain, CUpti_CallbackId cbid,
                                     const void *data)
{
    (void)userdata;
    (void)domain;
    (void)cbid;
    (void)data;
}

/* What a profiler such as torch.profiler does: take the process's one CUPTI subscription. */
static void subscribe_to_cupti(void)
{
    const char *path = getenv("OTEL_GPU_CUPTI_PATH");
    void *cupti = path ? dlopen(path, RTLD_NOW | RTLD_LOCAL) : NULL;
    CUptiResult (*subscribe)(CUpti_SubscriberHandle *, CUpti_CallbackFunc, void *) =
        cupti ? (CUptiResult(*)(CUpti_SubscriberHandle *, CUpti_CallbackFunc, void *))dlsym(cupti, "cuptiSubscribe")
              : NULL;
    CUpti_SubscriberHandle subscriber;
    printf("took_cupti %d\n", subscribe ? (int)subscribe(&subscriber, ignore_callback, NULL) : -1);
    fflush(stdout);
}

static long kernels_launched(void)
{
    long n = 0;
    for (size_t i = 0; i < sizeof(sites) / sizeof(sites[0]); i++)
        n += (long)sites[i].count;
    return n;
}

/* The program's own profiler (--profiler-lib): one session from start to stop. */
static int (*profiler_start)(void);
static long (*profiler_stop)(void);
static long session_kernels0;

static void load_profiler(const char *path)
{
    void *lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    profiler_start = lib ? (int (*)(void))dlsym(lib, "fake_profiler_start") : NULL;
    profiler_stop = lib ? (long (*)(void))dlsym(lib, "fake_profiler_stop") : NULL;
    if (profiler_start == NULL || profiler_stop == NULL) {
        fprintf(stderr, "workload: cannot load %s: %s\n", path, dlerror());
        exit(1);
    }
}

NOINLINE void profile_session(int step, int at, int every, int length)
{
    if (profiler_start == NULL || at < 0 || step < at)
        return;
    int offset = every > 0 ? (step - at) % every : step - at;
    if (offset == 0) {
        printf("profiler_start %d\n", profiler_start());
        session_kernels0 = kernels_launched();
    } else if (offset == length) {
        drain();
        long expected = kernels_launched() - session_kernels0;
        printf("profiler_kernels %ld expected %ld\n", profiler_stop(), expected);
    }
    fflush(stdout);
}

static CUgraph built_graph;
static int graph_from = -1; /* --graph-from STEP: instantiate the graph only then, and launch it every 2 steps */
static long idle_before_graph_ms;

static void setup(void)
{
    CUdevice device;
    CUcontext context;
    CUmodule module;
    CHECK(cuDeviceGet(&device, 0));
    CHECK(cuDevicePrimaryCtxRetain(&context, device));
    CHECK(cuCtxSetCurrent(context));
    CHECK(cuModuleLoadData(&module, MODULE_TEXT));
    CHECK(cuModuleGetFunction(&matmul, module, "matmul_kernel"));
    CHECK(cuModuleGetFunction(&relu, module, "relu_kernel"));
    CHECK(cuModuleGetFunction(&tiny, module, "tiny_kernel"));
    CHECK(cuStreamCreate(&stream, 0));
    relu_stream = stream;
    if (side_stream)
        CHECK(cuStreamCreate(&relu_stream, 0));
    CHECK(cuEventCreate(&event, 0));
    CHECK(cuMemAlloc(&device_buffer, sizeof(host_buffer)));

    CUgraph graph;
    CHECK(cuGraphCreate(&graph, 0));
    static const char *const nodes[] = {"graph_a_kernel", "graph_b_kernel", "graph_c_kernel"};
    for (int i = 0; i < 3; i++) {
        CUDA_KERNEL_NODE_PARAMS params;
        memset(&params, 0, sizeof(params));
        CHECK(cuModuleGetFunction(&params.func, module, nodes[i]));
        CUgraphNode node;
        CHECK(cuGraphAddKernelNode(&node, graph, NULL, 0, &params));
    }
    built_graph = graph;
    if (graph_from < 0)
        CHECK(cuGraphInstantiate(&graph_exec, graph, 0));
}

int main(int argc, char **argv)
{
    int steps = 200, graph_every = 4, exit_at = -1, init = 1;
    long tiny_launches = 0, tiny_wait_every = 1000, lag_pace_us = 0, idle_ms = 0;
    int phase_blocks = 0, mixed_iterations = 0;
    int skip_exit_handlers = 0, fork_children = 0, take_cupti = 0, profile_at = -1, profile_every = 0,
        profile_steps = 10;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--steps") == 0 && i + 1 < argc)
            steps = atoi(argv[++i]);
        else if (strcmp(argv[i], "--graph-every") == 0 && i + 1 < argc)
            graph_every = atoi(argv[++i]);
        else if (strcmp(argv[i], "--exit-at") == 0 && i + 1 < argc)
            exit_at = atoi(argv[++i]);
        else if (strcmp(argv[i], "--graph-phases") == 0 && i + 1 < argc)
            phase_blocks = atoi(argv[++i]);
        else if (strcmp(argv[i], "--graph-execs") == 0 && i + 1 < argc)
            phase_execs = atoi(argv[++i]) < 1 ? 1 : atoi(argv[i]) > MAX_PHASE_EXECS ? MAX_PHASE_EXECS : atoi(argv[i]);
        else if (strcmp(argv[i], "--mixed") == 0 && i + 1 < argc)
            mixed_iterations = atoi(argv[++i]);
        else if (strcmp(argv[i], "--mixed-cpu-us") == 0 && i + 1 < argc)
            mixed_cpu_ns = (long)(atof(argv[++i]) * 1000.0);
        else if (strcmp(argv[i], "--tiny") == 0 && i + 1 < argc)
            tiny_launches = atol(argv[++i]);
        else if (strcmp(argv[i], "--tiny-wait-every") == 0 && i + 1 < argc)
            tiny_wait_every = atol(argv[++i]);
        else if (strcmp(argv[i], "--lagged-pace-us") == 0 && i + 1 < argc)
            lag_pace_us = atol(argv[++i]);
        else if (strcmp(argv[i], "--graph-from") == 0 && i + 1 < argc)
            graph_from = atoi(argv[++i]);
        else if (strcmp(argv[i], "--idle-ms") == 0 && i + 1 < argc)
            idle_ms = atol(argv[++i]);
        else if (strcmp(argv[i], "--idle-before-graph-ms") == 0 && i + 1 < argc)
            idle_before_graph_ms = atol(argv[++i]);
        else if (strcmp(argv[i], "--profiler-lib") == 0 && i + 1 < argc)
            load_profiler(argv[++i]);
        else if (strcmp(argv[i], "--profile-at") == 0 && i + 1 < argc)
            profile_at = atoi(argv[++i]);
        else if (strcmp(argv[i], "--profile-every") == 0 && i + 1 < argc)
            profile_every = atoi(argv[++i]);
        else if (strcmp(argv[i], "--profile-steps") == 0 && i + 1 < argc)
            profile_steps = atoi(argv[++i]);
        else if (strcmp(argv[i], "--side-stream") == 0)
            side_stream = 1;
        else if (strcmp(argv[i], "--take-cupti") == 0)
            take_cupti = 1;
        else if (strcmp(argv[i], "--fork-children") == 0)
            fork_children = 1;
        else if (strcmp(argv[i], "--skip-exit-handlers") == 0)
            skip_exit_handlers = 1;
        else if (strcmp(argv[i], "--no-init") == 0)
            init = 0;
        else {
            fprintf(stderr, "usage: %s [--steps N] [--graph-every K] [--idle-ms MS] [--exit-at STEP] [--no-init] [--tiny N [--tiny-wait-every K]] [--skip-exit-handlers]"
                            " [--lagged-pace-us US] [--mixed N [--mixed-cpu-us US]] [--side-stream] [--fork-children] [--take-cupti]"
                            " [--graph-from STEP [--idle-before-graph-ms MS]] [--graph-phases N [--graph-execs K]] [--profiler-lib PATH --profile-at STEP [--profile-every K] [--profile-steps N]]\n",
                    argv[0]);
            return 2;
        }
    }
    if (take_cupti)
        subscribe_to_cupti();
    if (init)
        CHECK(cuInit(0));
    setup();
    if (mixed_iterations > 0) {
        mixed_loop(mixed_iterations);
        drain();
        return 0;
    }
    if (tiny_launches > 0) {
        launch_bound_loop(tiny_launches, tiny_wait_every);
        return 0;
    }
    int children = 0;
    if (phase_blocks > 0) {
        graph_phases_loop(phase_blocks, built_graph);
        steps = 0;
    }
    if (lag_pace_us > 0)
        lagged_loop(steps, graph_every, lag_pace_us);
    for (int step = 0; step < steps && lag_pace_us == 0; step++) {
        profile_session(step, profile_at, profile_every, profile_steps);
        if (step == graph_from) {
            spin_ns(idle_before_graph_ms * 1000000L);
            CHECK(cuGraphInstantiate(&graph_exec, built_graph, 0));
            graph_every = 2;
        }
        train_step(step, graph_every, exit_at);
        if (idle_ms > 0) {
            struct timespec idle = {idle_ms / 1000, (idle_ms % 1000) * 1000000L};
            nanosleep(&idle, NULL);
        }
        if (fork_children && step % 5 == 0) {
            pid_t child = fork();
            if (child == 0)
                exit(0);
            int status = 0;
            if (child > 0 && waitpid(child, &status, 0) == child && WIFEXITED(status) && WEXITSTATUS(status) == 0)
                children++;
        }
    }
    if (fork_children)
        printf("children_exited_cleanly %d\n", children);
    drain();
    CHECK(cuDevicePrimaryCtxRelease(0));
    if (skip_exit_handlers) {
        printf("released the context, exiting without exit handlers\n");
        fflush(stdout);
        _exit(0);
    }

    Dl_info info;
    if (dladdr((void *)cuLaunchKernel, &info))
        printf("symbol_base libcuda %p\n", info.dli_fbase);
    for (size_t i = 0; i < sizeof(sites) / sizeof(sites[0]); i++)
        printf("site %s %s %llu %llu\n", sites[i].site, sites[i].kernel, sites[i].count,
               sites[i].count * sites[i].duration_ns);
    return 0;
}
