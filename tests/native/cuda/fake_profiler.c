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

#ifdef VIA_DLSYM
/* Built with -DVIA_DLSYM (libfake_profiler_dlsym.so), it is a tool that loads CUPTI the way XLA and TensorFlow do:
 * dlopen the libcupti.so beside it when a session starts, and look every function up by name in that handle. */
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

static CUptiResult (*p_subscribe)(CUpti_SubscriberHandle *, CUpti_CallbackFunc, void *);
static CUptiResult (*p_unsubscribe)(CUpti_SubscriberHandle);
static CUptiResult (*p_register_callbacks)(CUpti_BuffersCallbackRequestFunc, CUpti_BuffersCallbackCompleteFunc);
static CUptiResult (*p_enable)(CUpti_ActivityKind);
static CUptiResult (*p_disable)(CUpti_ActivityKind);
static CUptiResult (*p_flush_all)(uint32_t);
static CUptiResult (*p_next_record)(uint8_t *, size_t, CUpti_Activity **);

API long fake_profiler_stop(void);

/* A library that watches dlsym must keep lookups that depend on the caller as they were: RTLD_DEFAULT searches the
 * caller's own scope (this object, loaded RTLD_LOCAL), RTLD_NEXT the objects after it. */
static int lookups_as_before(void)
{
    return dlsym(RTLD_DEFAULT, "fake_profiler_stop") == (void *)fake_profiler_stop &&
           dlsym(RTLD_NEXT, "getpid") != NULL;
}

static int load_cupti(void)
{
    if (!lookups_as_before())
        return -2;
    if (p_subscribe != NULL)
        return 0;
    Dl_info self;
    char path[4096];
    if (dladdr((void *)load_cupti, &self) == 0 || strlen(self.dli_fname) >= sizeof(path) - 16)
        return -1;
    snprintf(path, sizeof(path), "%s", self.dli_fname);
    char *slash = strrchr(path, '/');
    snprintf(slash ? slash + 1 : path, sizeof(path) - (size_t)(slash ? slash + 1 - path : 0), "libcupti.so");
    void *cupti = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (cupti == NULL)
        return -1;
    *(void **)&p_unsubscribe = dlsym(cupti, "cuptiUnsubscribe");
    *(void **)&p_register_callbacks = dlsym(cupti, "cuptiActivityRegisterCallbacks");
    *(void **)&p_enable = dlsym(cupti, "cuptiActivityEnable");
    *(void **)&p_disable = dlsym(cupti, "cuptiActivityDisable");
    *(void **)&p_flush_all = dlsym(cupti, "cuptiActivityFlushAll");
    *(void **)&p_next_record = dlsym(cupti, "cuptiActivityGetNextRecord");
    *(void **)&p_subscribe = dlsym(cupti, "cuptiSubscribe");
    return p_subscribe && p_unsubscribe && p_register_callbacks && p_enable && p_disable && p_flush_all &&
                   p_next_record ? 0 : -1;
}

#define cuptiSubscribe p_subscribe
#define cuptiUnsubscribe p_unsubscribe
#define cuptiActivityRegisterCallbacks p_register_callbacks
#define cuptiActivityEnable p_enable
#define cuptiActivityDisable p_disable
#define cuptiActivityFlushAll p_flush_all
#define cuptiActivityGetNextRecord p_next_record
#else
static int load_cupti(void)
{
    return 0;
}
#endif

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
    if (load_cupti() != 0)
        return -1;
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
