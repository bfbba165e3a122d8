/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The private interface between the fake CUDA driver (libcuda.so.1) and the fake CUPTI (libcupti.so), the way the
 * real driver exposes hooks to the real CUPTI: the driver numbers every API call (correlation id), calls the tracer
 * around it, and reports each piece of synthetic GPU work with its start and end on CUPTI's clock (CLOCK_REALTIME ns).
 */
#ifndef FAKE_TRACER_H
#define FAKE_TRACER_H

#include <stdint.h>

/* The fake driver's context (CUcontext points at one): the primary context of one device. */
struct CUctx_st {
    int device;
};

enum fake_work_kind { FAKE_WORK_KERNEL = 1, FAKE_WORK_MEMCPY = 2, FAKE_WORK_MEMSET = 3 };

struct fake_call {
    uint32_t cbid;             /* CUPTI_DRIVER_TRACE_CBID_* */
    uint32_t correlation_id;
    const char *function_name; /* "cuLaunchKernel" ... */
    const char *symbol_name;   /* kernel name for launches, else NULL */
    const void *params;        /* the call's parameter struct (layouts of generated_cuda_meta.h) */
    int result;                /* CUresult, valid at exit */
    uint64_t correlation_data; /* shared between the enter and exit callbacks */
    uint64_t begin_ns;         /* when the call began, before the tracer's entry callback */
    struct CUctx_st *context;  /* the calling thread's current context (CUpti_CallbackData.context) */
    uint32_t context_uid;      /* unique per context in the process (CUpti_CallbackData.contextUid) */
};

struct fake_work {
    enum fake_work_kind kind;
    uint32_t correlation_id;
    const char *name;   /* kernel name, stable for the life of the process */
    uint64_t start_ns;
    uint64_t end_ns;
    uint32_t device_id;
    uint32_t stream_id;
    uint32_t graph_id;
    uint64_t graph_node_id;
    uint64_t bytes;
    uint8_t copy_kind;
    uint8_t src_kind;
    uint8_t dst_kind;
};

struct fake_tracer {
    void (*api_enter)(struct fake_call *call);
    void (*api_exit)(struct fake_call *call);
    void (*gpu_work)(const struct fake_work *work);
    void (*context_destroy_starting)(void); /* CUPTI_CBID_RESOURCE_CONTEXT_DESTROY_STARTING */
};

/* Exported by libcuda.so.1; the fake CUPTI installs itself at cuptiSubscribe. */
typedef void (*fake_cuda_set_tracer_fn)(const struct fake_tracer *tracer);
#define FAKE_CUDA_SET_TRACER "fake_cuda_set_tracer"

#endif /* FAKE_TRACER_H */
