/* SPDX-License-Identifier: Apache-2.0 */
/*
 * A profiler inside the workload, the way torch.profiler's Kineto uses CUPTI: linked against libcupti (its calls go
 * through this object's GOT), it subscribes, registers its own activity buffers and enables the kernel kind for a
 * session, then flushes, disables and unsubscribes. The workload (--profiler-lib) loads it before cuInit, as Python
 * imports torch before CUDA starts, and reports what the session recorded.
 */
#include <stdlib.h>

#include <cupti.h>

#define API __attribute__((visibility("default")))

static CUpti_SubscriberHandle subscriber;
static long kernels;

static void CUPTIAPI on_callback(void *userdata, CUpti_CallbackDomain domain, CUpti_CallbackId cbid, const void *data)
{
    (void)userdata;
    (void)domain;
    (void)cbid;
    (void)data;
}

static void CUPTIAPI buffer_requested(uint8_t **buffer, size_t *size, size_t *max_records)
{
    *size = 1 << 20;
    *buffer = aligned_alloc(8, *size);
    *max_records = 0;
}

static void CUPTIAPI buffer_completed(CUcontext context, uint32_t stream, uint8_t *buffer, size_t size, size_t valid)
{
    (void)context;
    (void)stream;
    (void)size;
    CUpti_Activity *record = NULL;
    while (cuptiActivityGetNextRecord(buffer, valid, &record) == CUPTI_SUCCESS)
        if (record->kind == CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL || record->kind == CUPTI_ACTIVITY_KIND_KERNEL)
            kernels++;
    free(buffer);
}

/* Returns the CUptiResult of the first call that failed, 0 when the session started. */
API int fake_profiler_start(void)
{
    kernels = 0;
    CUptiResult rc = cuptiSubscribe(&subscriber, on_callback, NULL);
    if (rc == CUPTI_SUCCESS)
        rc = cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed);
    if (rc == CUPTI_SUCCESS)
        rc = cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL);
    return (int)rc;
}

/* Call after the profiled work has finished on the GPU: the kernels the session recorded. */
API long fake_profiler_stop(void)
{
    cuptiActivityFlushAll(0);
    cuptiActivityDisable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL);
    cuptiUnsubscribe(subscriber);
    return kernels;
}
