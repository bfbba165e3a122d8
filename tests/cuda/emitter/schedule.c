// SPDX-License-Identifier: Apache-2.0
/*
 * The known schedule for tests/cuda/test_probes.py: launches from named call sites, their GPU activity, a graph,
 * a copy, a blocking wait and two sampling windows; then exits at once (nothing may be lost). Expected totals are
 * in test_probes.py. Prints "ready PID", waits until the agent has attached (every semaphore set), prints "done".
 * usage: schedule [MANY [LINGER_MS]]
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "otel_gpu_probes.h"

int emitter_attached(void);
void emit_launch(const struct otel_gpu_launch *rec);
void emit_activity(const struct otel_gpu_activity *recs, uint32_t count);
void emit_sync(const struct otel_gpu_sync *rec);
void emit_window(const struct otel_gpu_window *rec);

static struct otel_gpu_launch launch_rec;
static struct otel_gpu_sync sync_rec;
static struct otel_gpu_activity acts[64];

#define HERE() ({ __label__ here; here: (uint64_t)(uintptr_t)&&here; })

static void launch(uint32_t kind, uint32_t corr, uint64_t window, uint64_t pc0, uint64_t pc1, int python)
{
    memset(&launch_rec, 0, sizeof(launch_rec));
    launch_rec.abi_version = OTEL_GPU_ABI_VERSION;
    launch_rec.kind = kind;
    launch_rec.correlation_id = corr;
    launch_rec.cbid = 307;
    launch_rec.window_id = window;
    if (pc0) {
        launch_rec.stack.native_count = 2;
        launch_rec.stack.native[0] = pc0;
        launch_rec.stack.native[1] = pc1;
    }
    if (python) {
        static const char strings[] = "train_step\0/app/train.py\0<module>\0/app/train.py";
        memcpy(launch_rec.stack.strings, strings, sizeof(strings));
        launch_rec.stack.strings_len = sizeof(strings);
        launch_rec.stack.python_count = 2;
        launch_rec.stack.python[0] = (struct otel_gpu_python_frame){12, 0, 11, 10};
        launch_rec.stack.python[1] = (struct otel_gpu_python_frame){40, 25, 34, 1};
        launch_rec.stack.flags = 1;
    }
    emit_launch(&launch_rec);
}

static void activity(uint32_t i, uint32_t kind, uint32_t corr, uint64_t duration, const char *name, uint32_t graph)
{
    struct otel_gpu_activity *a = &acts[i];
    memset(a, 0, sizeof(*a));
    a->kind = kind;
    a->correlation_id = corr;
    a->start_ns = 1000000;
    a->end_ns = 1000000 + duration;
    a->device_id = 0;
    a->stream_id = 7;
    a->graph_id = graph;
    if (name) {
        a->name_len = (uint32_t)strlen(name);
        memcpy(a->name, name, a->name_len);
    }
}

static void window(uint64_t id, uint64_t covered, uint64_t elapsed, uint64_t launches)
{
    struct otel_gpu_window w = {OTEL_GPU_ABI_VERSION, 0, id, 0, 0, covered, elapsed, launches, 0, 0};
    emit_window(&w);
}

__attribute__((noinline)) void launch_site_a(uint32_t corr, uint64_t window_id)
{
    launch(OTEL_GPU_LAUNCH_KERNEL, corr, window_id, HERE(), (uint64_t)(uintptr_t)__builtin_return_address(0), 0);
}

__attribute__((noinline)) void launch_site_b(uint32_t corr)
{
    launch(OTEL_GPU_LAUNCH_KERNEL, corr, 1, HERE(), (uint64_t)(uintptr_t)__builtin_return_address(0), 1);
}

__attribute__((noinline)) void launch_site_graph(uint32_t corr)
{
    launch(OTEL_GPU_LAUNCH_GRAPH, corr, 1, HERE(), (uint64_t)(uintptr_t)__builtin_return_address(0), 0);
}

__attribute__((noinline)) void launch_site_copy(uint32_t corr)
{
    launch(OTEL_GPU_LAUNCH_MEMCPY, corr, 1, HERE(), (uint64_t)(uintptr_t)__builtin_return_address(0), 0);
}

__attribute__((noinline)) void launch_site_fallback(uint32_t corr)
{
    launch(OTEL_GPU_LAUNCH_KERNEL, corr, 2, 0, 0, 0); /* no library stack: the kernel's user stack is used */
    __asm__ volatile("" ::: "memory");
}

__attribute__((noinline)) void wait_site_c(void)
{
    memset(&sync_rec, 0, sizeof(sync_rec));
    sync_rec.abi_version = OTEL_GPU_ABI_VERSION;
    sync_rec.kind = OTEL_GPU_SYNC_STREAM;
    sync_rec.cbid = 126;
    sync_rec.start_ns = 5000;
    sync_rec.end_ns = 15000;
    sync_rec.weight = 3;
    sync_rec.stack.native_count = 2;
    sync_rec.stack.native[0] = HERE();
    sync_rec.stack.native[1] = (uint64_t)(uintptr_t)__builtin_return_address(0);
    emit_sync(&sync_rec);
}

int main(int argc, char **argv)
{
    int many = argc > 1 ? atoi(argv[1]) : 40; /* extra kernels from site A, sent in batches of 32 */
    int linger_ms = argc > 2 ? atoi(argv[2]) : 0; /* stay alive this long after "done" */
    printf("ready %d\n", getpid());
    fflush(stdout);
    for (int i = 0; i < 2000 && !emitter_attached(); i++) {
        struct timespec ts = {0, 10 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    if (!emitter_attached()) {
        printf("not attached\n");
        return 3;
    }
    /* window 1 (weight 10) */
    launch_site_a(1, 1);
    launch_site_b(2);
    launch_site_graph(3);
    launch_site_copy(4);
    activity(0, OTEL_GPU_ACTIVITY_KERNEL, 2, 3000, "_Z7kernelBv", 0); /* B's activity before A's */
    activity(1, OTEL_GPU_ACTIVITY_KERNEL, 1, 1000, "_Z7kernelAv", 0);
    activity(2, OTEL_GPU_ACTIVITY_KERNEL, 3, 100, "graph_k1", 5);
    activity(3, OTEL_GPU_ACTIVITY_KERNEL, 3, 200, "graph_k2", 5);
    activity(4, OTEL_GPU_ACTIVITY_KERNEL, 3, 100, "graph_k1", 5);
    activity(5, OTEL_GPU_ACTIVITY_MEMCPY, 4, 700, NULL, 0);
    acts[5].bytes = 4u << 20;
    acts[5].copy_kind = 2; /* DtoH */
    acts[5].src_kind = 3;  /* device */
    acts[5].dst_kind = 1;  /* pageable */
    emit_activity(acts, 6);
    window(1, 100, 1000, 4);
    /* window 2 (weight 2): many kernels from site A, sent 32 at a time, and one without a library stack */
    for (int i = 0; i < many; i++)
        launch_site_a(100 + i, 2);
    launch_site_fallback(99);
    for (int sent = 0; sent < many;) {
        int n = many - sent > OTEL_GPU_ACTIVITY_BATCH ? OTEL_GPU_ACTIVITY_BATCH : many - sent;
        for (int j = 0; j < n; j++)
            activity(j, OTEL_GPU_ACTIVITY_KERNEL, 100 + sent + j, 10, "_Z7kernelAv", 0);
        emit_activity(acts, n);
        sent += n;
    }
    activity(0, OTEL_GPU_ACTIVITY_KERNEL, 99, 50, "fallback_kernel", 0);
    emit_activity(acts, 1);
    wait_site_c();
    window(2, 300, 1400, many + 1);
    printf("done\n");
    fflush(stdout);
    struct timespec linger = {linger_ms / 1000, (linger_ms % 1000) * 1000000L};
    nanosleep(&linger, NULL);
    return 0;
}
