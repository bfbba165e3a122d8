/* SPDX-License-Identifier: Apache-2.0 */
/*
 * A multi-GPU job on the fake CUDA driver, built like workload.c (frame pointers, no inlining) so that every
 * function below appears in the launching stacks.
 *
 * Default: a data-parallel job of --ranks R processes (one device each: rank r drives device r), meeting in a
 * rendezvous file in /dev/shm. Like torchrun, the launcher starts each rank (fork, then exec of this program with
 * --as-rank r) with RANK, LOCAL_RANK and WORLD_SIZE in its environment, where /proc/PID/environ shows them. Each step
 * of each rank:
 *
 *   main -> run_rank -> train_step -> load_batch    (sleeps --slow-us on the slow rank only: the straggler)
 *                                  -> forward       -> launch_matmul (cuLaunchKernel "matmul_kernel", 2 ms)
 *                                  -> all_reduce    -> launch_collective
 *                                                      (cuLaunchKernel "ncclDevKernel_AllReduce_Sum_f32_RING_LL",
 *                                                       0.3 ms once every rank has launched it)
 *                                  -> sync_point    (cuStreamSynchronize)
 *
 * The fast ranks reach the collective first and wait in sync_point for the slow rank: their waits are longer by
 * about --slow-us a step.
 *
 * --devices D instead runs one process driving D devices: each step launches "shard<d>_kernel" (1 ms) on a stream
 * of device d from launch_shard, for every d, then synchronizes every stream.
 *
 * usage: ranks [--ranks R] [--slow-rank S] [--slow-us US] [--steps N] | ranks --devices D [--steps N]
 * Prints "rank <r> pid <pid> device <d>" per rank (or "device <d> pid <pid>" per device) and, per rank, "collectives
 * <rank> <n>" at the end.
 */
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cuda.h>

#define NOINLINE __attribute__((noinline))
#define MAX_DEVICES 8
#define RENDEZVOUS_BYTES ((size_t)65536 * 8 * sizeof(uint64_t)) /* fake_cuda.c's MAX_COLLECTIVES x MAX_RANKS */

static const char MODULE_TEXT[] = "matmul_kernel=2000000\nncclDevKernel_AllReduce_Sum_f32_RING_LL=300000\n"
                                  "shard0_kernel=1000000\nshard1_kernel=1000000\nshard2_kernel=1000000\n"
                                  "shard3_kernel=1000000\nshard4_kernel=1000000\nshard5_kernel=1000000\n"
                                  "shard6_kernel=1000000\nshard7_kernel=1000000\n";

#define CHECK(call)                                                                                                   \
    do {                                                                                                              \
        CUresult rc_ = (call);                                                                                        \
        if (rc_ != CUDA_SUCCESS) {                                                                                    \
            fprintf(stderr, "ranks: %s failed: %d\n", #call, (int)rc_);                                               \
            exit(1);                                                                                                  \
        }                                                                                                             \
    } while (0)

static CUmodule module;
static CUstream stream;
static CUfunction matmul, allreduce;
static long collectives;

static CUcontext use_device(int device)
{
    CUdevice d;
    CUcontext context;
    CHECK(cuDeviceGet(&d, device));
    CHECK(cuDevicePrimaryCtxRetain(&context, d));
    CHECK(cuCtxSetCurrent(context));
    return context;
}

NOINLINE void load_batch(long slow_us)
{
    if (slow_us <= 0)
        return;
    struct timespec pause = {slow_us / 1000000, (slow_us % 1000000) * 1000};
    nanosleep(&pause, NULL);
}

NOINLINE void launch_matmul(void)
{
    CHECK(cuLaunchKernel(matmul, 64, 64, 1, 128, 1, 1, 0, stream, NULL, NULL));
}

NOINLINE void forward(void)
{
    launch_matmul();
}

NOINLINE void launch_collective(void)
{
    CHECK(cuLaunchKernel(allreduce, 8, 1, 1, 512, 1, 1, 0, stream, NULL, NULL));
    collectives++;
}

NOINLINE void all_reduce(void)
{
    launch_collective();
}

NOINLINE void sync_point(void)
{
    CHECK(cuStreamSynchronize(stream));
}

NOINLINE void train_step(long slow_us)
{
    load_batch(slow_us);
    forward();
    all_reduce();
    sync_point();
}

NOINLINE void run_rank(int rank, int steps, long slow_us)
{
    CHECK(cuInit(0));
    use_device(rank);
    CHECK(cuModuleLoadData(&module, MODULE_TEXT));
    CHECK(cuModuleGetFunction(&matmul, module, "matmul_kernel"));
    CHECK(cuModuleGetFunction(&allreduce, module, "ncclDevKernel_AllReduce_Sum_f32_RING_LL"));
    CHECK(cuStreamCreate(&stream, 0));
    for (int step = 0; step < steps; step++)
        train_step(slow_us);
    CHECK(cuCtxSynchronize());
    CHECK(cuDevicePrimaryCtxRelease(rank));
    printf("collectives %d %ld\n", rank, collectives);
    fflush(stdout);
}

static int run_job(int ranks, int slow_rank, long slow_us, int steps)
{
    char path[64];
    snprintf(path, sizeof(path), "/dev/shm/otel-gpu-fake-nccl-%d", (int)getpid());
    int fd = open(path, O_RDWR | O_CREAT | O_EXCL, 0600);
    if (fd < 0 || ftruncate(fd, (off_t)RENDEZVOUS_BYTES) != 0) {
        perror("ranks: the rendezvous file");
        return 1;
    }
    close(fd);
    char count[16];
    snprintf(count, sizeof(count), "%d", ranks);
    pid_t pids[MAX_DEVICES];
    for (int r = 0; r < ranks; r++) {
        fflush(stdout);
        pids[r] = fork();
        if (pids[r] == 0) {
            char me[16], step_count[16], slow[32];
            snprintf(me, sizeof(me), "%d", r);
            snprintf(step_count, sizeof(step_count), "%d", steps);
            snprintf(slow, sizeof(slow), "%ld", r == slow_rank ? slow_us : 0);
            setenv("FAKE_CUDA_RENDEZVOUS", path, 1);
            setenv("FAKE_CUDA_RANKS", count, 1);
            setenv("FAKE_CUDA_RANK", me, 1);
            setenv("FAKE_CUDA_DEVICES", count, 1);
            setenv("RANK", me, 1);
            setenv("LOCAL_RANK", me, 1);
            setenv("WORLD_SIZE", count, 1);
            printf("rank %d pid %d device %d\n", r, (int)getpid(), r);
            fflush(stdout);
            execl("/proc/self/exe", "ranks", "--as-rank", me, "--steps", step_count, "--slow-us", slow, (char *)NULL);
            perror("ranks: exec");
            _exit(1);
        }
    }
    int failed = 0;
    for (int r = 0; r < ranks; r++) {
        int status = 0;
        if (pids[r] < 0 || waitpid(pids[r], &status, 0) != pids[r] || !WIFEXITED(status) || WEXITSTATUS(status) != 0)
            failed++;
    }
    unlink(path);
    return failed ? 1 : 0;
}

static CUstream shard_streams[MAX_DEVICES];
static CUfunction shard_kernels[MAX_DEVICES];
static CUcontext shard_contexts[MAX_DEVICES];

NOINLINE void launch_shard(int device)
{
    CHECK(cuCtxSetCurrent(shard_contexts[device]));
    CHECK(cuLaunchKernel(shard_kernels[device], 64, 1, 1, 128, 1, 1, 0, shard_streams[device], NULL, NULL));
}

static int run_devices(int devices, int steps)
{
    char count[16];
    snprintf(count, sizeof(count), "%d", devices);
    setenv("FAKE_CUDA_DEVICES", count, 1);
    CHECK(cuInit(0));
    for (int d = 0; d < devices; d++) {
        char name[32];
        shard_contexts[d] = use_device(d);
        CHECK(cuModuleLoadData(&module, MODULE_TEXT));
        snprintf(name, sizeof(name), "shard%d_kernel", d);
        CHECK(cuModuleGetFunction(&shard_kernels[d], module, name));
        CHECK(cuStreamCreate(&shard_streams[d], 0));
        printf("device %d pid %d\n", d, (int)getpid());
    }
    for (int step = 0; step < steps; step++) {
        for (int d = 0; d < devices; d++)
            launch_shard(d);
        for (int d = 0; d < devices; d++)
            CHECK(cuStreamSynchronize(shard_streams[d]));
    }
    CHECK(cuCtxSynchronize());
    for (int d = 0; d < devices; d++)
        CHECK(cuDevicePrimaryCtxRelease(d));
    return 0;
}

int main(int argc, char **argv)
{
    int ranks = 2, slow_rank = -1, steps = 200, devices = 0, as_rank = -1;
    long slow_us = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--ranks") == 0 && i + 1 < argc)
            ranks = atoi(argv[++i]);
        else if (strcmp(argv[i], "--slow-rank") == 0 && i + 1 < argc)
            slow_rank = atoi(argv[++i]);
        else if (strcmp(argv[i], "--slow-us") == 0 && i + 1 < argc)
            slow_us = atol(argv[++i]);
        else if (strcmp(argv[i], "--steps") == 0 && i + 1 < argc)
            steps = atoi(argv[++i]);
        else if (strcmp(argv[i], "--devices") == 0 && i + 1 < argc)
            devices = atoi(argv[++i]);
        else if (strcmp(argv[i], "--as-rank") == 0 && i + 1 < argc) /* the launcher's: one rank of the job */
            as_rank = atoi(argv[++i]);
        else {
            fprintf(stderr, "usage: %s [--ranks R] [--slow-rank S] [--slow-us US] [--steps N] | --devices D [--steps N]\n",
                    argv[0]);
            return 2;
        }
    }
    if (ranks < 1 || ranks > MAX_DEVICES || devices < 0 || devices > MAX_DEVICES) {
        fprintf(stderr, "ranks: --ranks and --devices take 1 to %d\n", MAX_DEVICES);
        return 2;
    }
    if (as_rank >= 0) {
        run_rank(as_rank, steps, slow_us);
        return 0;
    }
    return devices > 0 ? run_devices(devices, steps) : run_job(ranks, slow_rank, slow_us, steps);
}
