/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The USDT probes of provider "otel_gpu" (see otel_gpu_probes.h) and their semaphores. A semaphore is a 16-bit
 * counter in .probes that the kernel increments for every attached uprobe that names it; all four at zero means
 * no agent is attached and the library does nothing.
 *
 * Test-only: OTEL_GPU_DEBUG_FILE=<path> also appends every record the library fires to that file, framed as
 *   u32 type (1 launch, 2 activity, 3 sync, 4 window), u32 payload_len, payload (the probe's struct bytes;
 *   for activity: count consecutive struct otel_gpu_activity).
 */
#define _SDT_HAS_SEMAPHORES 1
#include <sys/sdt.h>

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stddef.h>
#include <stdlib.h>
#include <sys/uio.h>
#include <unistd.h>

#include "inject.h"

/* Names are fixed by sys/sdt.h: <provider>_<probe>_semaphore. */
volatile unsigned short otel_gpu_launch_semaphore __attribute__((unused, section(".probes")));
volatile unsigned short otel_gpu_activity_semaphore __attribute__((unused, section(".probes")));
volatile unsigned short otel_gpu_sync_semaphore __attribute__((unused, section(".probes")));
volatile unsigned short otel_gpu_window_semaphore __attribute__((unused, section(".probes")));

enum debug_record_type { DEBUG_LAUNCH = 1, DEBUG_ACTIVITY = 2, DEBUG_SYNC = 3, DEBUG_WINDOW = 4 };

static int debug_fd = -1;
static pthread_mutex_t debug_lock = PTHREAD_MUTEX_INITIALIZER;

int emit_init(void)
{
    const char *path = getenv("OTEL_GPU_DEBUG_FILE");
    if (path == NULL || path[0] == '\0')
        return 0;
    debug_fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    return debug_fd < 0 ? -errno : 0;
}

int emit_any_semaphore(void)
{
    return otel_gpu_launch_semaphore | otel_gpu_activity_semaphore | otel_gpu_sync_semaphore |
           otel_gpu_window_semaphore;
}

static void debug_write(uint32_t type, const void *payload, uint32_t len)
{
    if (debug_fd < 0)
        return;
    uint32_t header[2] = {type, len};
    struct iovec iov[2] = {{header, sizeof(header)}, {(void *)payload, len}};
    pthread_mutex_lock(&debug_lock);
    ssize_t want = (ssize_t)(sizeof(header) + len);
    ssize_t done = writev(debug_fd, iov, 2);
    pthread_mutex_unlock(&debug_lock);
    if (done != want)
        log_once("cannot write the debug file (OTEL_GPU_DEBUG_FILE)");
}

/* Bytes of a stack-carrying record that are in use: everything up to the end of the used strings. */
static uint32_t used_len(size_t stack_offset, const struct otel_gpu_stack *stack)
{
    return (uint32_t)(stack_offset + offsetof(struct otel_gpu_stack, strings) + stack->strings_len);
}

void emit_launch(const struct otel_gpu_launch *rec)
{
    uint32_t len = used_len(offsetof(struct otel_gpu_launch, stack), &rec->stack);
    if (otel_gpu_launch_semaphore)
        STAP_PROBE2(otel_gpu, launch, rec, len);
    debug_write(DEBUG_LAUNCH, rec, len);
}

void emit_activity(const struct otel_gpu_activity *recs, uint32_t count)
{
    if (count == 0)
        return;
    if (otel_gpu_activity_semaphore)
        STAP_PROBE2(otel_gpu, activity, recs, count);
    debug_write(DEBUG_ACTIVITY, recs, count * (uint32_t)sizeof(*recs));
}

void emit_sync(const struct otel_gpu_sync *rec)
{
    uint32_t len = used_len(offsetof(struct otel_gpu_sync, stack), &rec->stack);
    if (otel_gpu_sync_semaphore)
        STAP_PROBE2(otel_gpu, sync, rec, len);
    debug_write(DEBUG_SYNC, rec, len);
}

void emit_window(const struct otel_gpu_window *rec)
{
    if (otel_gpu_window_semaphore)
        STAP_PROBE1(otel_gpu, window, rec);
    debug_write(DEBUG_WINDOW, rec, (uint32_t)sizeof(*rec));
}
