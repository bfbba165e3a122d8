// SPDX-License-Identifier: Apache-2.0
/*
 * A stand-in for libotel_gpu_inject.so for the eBPF tests: the same four USDT probes with semaphores (provider
 * otel_gpu), fired on demand with records the test schedule fills in. Built as libotel_gpu_inject.so in a temporary
 * folder by tests/cuda/test_probes.py.
 */
#define _SDT_HAS_SEMAPHORES 1
#include <sys/sdt.h>
#include <stddef.h>
#include <string.h>

#include "otel_gpu_probes.h"

#define EXPORT __attribute__((visibility("default")))

volatile unsigned short otel_gpu_launch_semaphore __attribute__((unused, section(".probes")));
volatile unsigned short otel_gpu_activity_semaphore __attribute__((unused, section(".probes")));
volatile unsigned short otel_gpu_sync_semaphore __attribute__((unused, section(".probes")));
volatile unsigned short otel_gpu_window_semaphore __attribute__((unused, section(".probes")));

EXPORT int emitter_attached(void)
{
    return otel_gpu_launch_semaphore && otel_gpu_activity_semaphore && otel_gpu_sync_semaphore &&
           otel_gpu_window_semaphore;
}

/* Sends only the used prefix of the record, as the real library may. */
static uint32_t launch_len(const struct otel_gpu_launch *rec)
{
    return (uint32_t)(offsetof(struct otel_gpu_launch, stack) + offsetof(struct otel_gpu_stack, strings) +
                      rec->stack.strings_len);
}

EXPORT __attribute__((noinline)) void emit_launch(const struct otel_gpu_launch *rec)
{
    if (otel_gpu_launch_semaphore)
        STAP_PROBE2(otel_gpu, launch, rec, launch_len(rec));
}

EXPORT __attribute__((noinline)) void emit_activity(const struct otel_gpu_activity *recs, uint32_t count)
{
    if (otel_gpu_activity_semaphore)
        STAP_PROBE2(otel_gpu, activity, recs, count);
}

EXPORT __attribute__((noinline)) void emit_sync(const struct otel_gpu_sync *rec)
{
    if (otel_gpu_sync_semaphore)
        STAP_PROBE2(otel_gpu, sync, rec, (uint32_t)sizeof(*rec));
}

EXPORT __attribute__((noinline)) void emit_window(const struct otel_gpu_window *rec)
{
    if (otel_gpu_window_semaphore)
        STAP_PROBE1(otel_gpu, window, rec);
}
