/* SPDX-License-Identifier: Apache-2.0 */
/* Which CUPTI driver-API callback ids the library listens to, and what each one is (launch kind, wait kind). */
#include <string.h>

#include "inject.h"

static const CUpti_CallbackId memcpy_cbids[] = {
    CUPTI_DRIVER_TRACE_CBID_cuMemcpy,
    CUPTI_DRIVER_TRACE_CBID_cuMemcpy2D,
    CUPTI_DRIVER_TRACE_CBID_cuMemcpy2DAsync,
    CUPTI_DRIVER_TRACE_CBID_cuMemcpy2DAsync_v2,
    CUPTI_DRIVER_TRACE_CBID_cuMemcpy2DAsync_v2_ptsz,
    CUPTI_DRIVER_TRACE_CBID_cuMemcpy2DUnaligned,
    CUPTI_DRIVER_TRACE_CBID_cuMemcpy2DUnaligned_v2,
    CUPTI_DRIVER_TRACE_CBID_cuMemcpy2DUnaligned_v2_ptds,
    CUPTI_DRIVER_TRACE_CBID_cuMemcpy2D_v2,
    CUPTI_DRIVER_TRACE_CBID_cuMemcpy2D_v2_ptds,
    CUPTI_DRIVER_TRACE_CBID_cuMemcpy3D,
    CUPTI_DRIVER_TRACE_CBID_cuMemcpy3DAsync,
    CUPTI_DRIVER_TRACE_CBID_cuMemcpy3DAsync_v2,
    CUPTI_DRIVER_TRACE_CBID_cuMemcpy3DAsync_v2_ptsz,
    CUPTI_DRIVER_TRACE_CBID_cuMemcpy3DBatchAsync,
    CUPTI_DRIVER_TRACE_CBID_cuMemcpy3DBatchAsync_ptsz,
    CUPTI_DRIVER_TRACE_CBID_cuMemcpy3DBatchAsync_v2,
    CUPTI_DRIVER_TRACE_CBID_cuMemcpy3DBatchAsync_v2_ptsz,
    CUPTI_DRIVER_TRACE_CBID_cuMemcpy3DPeer,
    CUPTI_DRIVER_TRACE_CBID_cuMemcpy3DPeerAsync,
    CUPTI_DRIVER_TRACE_CBID_cuMemcpy3DPeerAsync_ptsz,
    CUPTI_DRIVER_TRACE_CBID_cuMemcpy3DPeer_ptds,
    CUPTI_DRIVER_TRACE_CBID_cuMemcpy3D_v2,
    CUPTI_DRIVER_TRACE_CBID_cuMemcpy3D_v2_ptds,
    CUPTI_DRIVER_TRACE_CBID_cuMemcpyAsync,
    CUPTI_DRIVER_TRACE_CBID_cuMemcpyAsync_ptsz,
    CUPTI_DRIVER_TRACE_CBID_cuMemcpyAtoA,
    CUPTI_DRIVER_TRACE_CBID_cuMemcpyAtoA_v2,
    CUPTI_DRIVER_TRACE_CBID_cuMemcpyAtoA_v2_ptds,
    CUPTI_DRIVER_TRACE_CBID_cuMemcpyAtoD,
    CUPTI_DRIVER_TRACE_CBID_cuMemcpyAtoD_v2,
    CUPTI_DRIVER_TRACE_CBID_cuMemcpyAtoD_v2_ptds,
    CUPTI_DRIVER_TRACE_CBID_cuMemcpyAtoH,
    CUPTI_DRIVER_TRACE_CBID_cuMemcpyAtoHAsync,
    CUPTI_DRIVER_TRACE_CBID_cuMemcpyAtoHAsync_v2,
    CUPTI_DRIVER_TRACE_CBID_cuMemcpyAtoHAsync_v2_ptsz,
    CUPTI_DRIVER_TRACE_CBID_cuMemcpyAtoH_v2,
    CUPTI_DRIVER_TRACE_CBID_cuMemcpyAtoH_v2_ptds,
    CUPTI_DRIVER_TRACE_CBID_cuMemcpyBatchAsync,
    CUPTI_DRIVER_TRACE_CBID_cuMemcpyBatchAsync_ptsz,
    CUPTI_DRIVER_TRACE_CBID_cuMemcpyBatchAsync_v2,
    CUPTI_DRIVER_TRACE_CBID_cuMemcpyBatchAsync_v2_ptsz,
    CUPTI_DRIVER_TRACE_CBID_cuMemcpyDtoA,
    CUPTI_DRIVER_TRACE_CBID_cuMemcpyDtoA_v2,
    CUPTI_DRIVER_TRACE_CBID_cuMemcpyDtoA_v2_ptds,
    CUPTI_DRIVER_TRACE_CBID_cuMemcpyDtoD,
    CUPTI_DRIVER_TRACE_CBID_cuMemcpyDtoDAsync,
    CUPTI_DRIVER_TRACE_CBID_cuMemcpyDtoDAsync_v2,
    CUPTI_DRIVER_TRACE_CBID_cuMemcpyDtoDAsync_v2_ptsz,
    CUPTI_DRIVER_TRACE_CBID_cuMemcpyDtoD_v2,
    CUPTI_DRIVER_TRACE_CBID_cuMemcpyDtoD_v2_ptds,
    CUPTI_DRIVER_TRACE_CBID_cuMemcpyDtoH,
    CUPTI_DRIVER_TRACE_CBID_cuMemcpyDtoHAsync,
    CUPTI_DRIVER_TRACE_CBID_cuMemcpyDtoHAsync_v2,
    CUPTI_DRIVER_TRACE_CBID_cuMemcpyDtoHAsync_v2_ptsz,
    CUPTI_DRIVER_TRACE_CBID_cuMemcpyDtoH_v2,
    CUPTI_DRIVER_TRACE_CBID_cuMemcpyDtoH_v2_ptds,
    CUPTI_DRIVER_TRACE_CBID_cuMemcpyHtoA,
    CUPTI_DRIVER_TRACE_CBID_cuMemcpyHtoAAsync,
    CUPTI_DRIVER_TRACE_CBID_cuMemcpyHtoAAsync_v2,
    CUPTI_DRIVER_TRACE_CBID_cuMemcpyHtoAAsync_v2_ptsz,
    CUPTI_DRIVER_TRACE_CBID_cuMemcpyHtoA_v2,
    CUPTI_DRIVER_TRACE_CBID_cuMemcpyHtoA_v2_ptds,
    CUPTI_DRIVER_TRACE_CBID_cuMemcpyHtoD,
    CUPTI_DRIVER_TRACE_CBID_cuMemcpyHtoDAsync,
    CUPTI_DRIVER_TRACE_CBID_cuMemcpyHtoDAsync_v2,
    CUPTI_DRIVER_TRACE_CBID_cuMemcpyHtoDAsync_v2_ptsz,
    CUPTI_DRIVER_TRACE_CBID_cuMemcpyHtoD_v2,
    CUPTI_DRIVER_TRACE_CBID_cuMemcpyHtoD_v2_ptds,
    CUPTI_DRIVER_TRACE_CBID_cuMemcpyPeer,
    CUPTI_DRIVER_TRACE_CBID_cuMemcpyPeerAsync,
    CUPTI_DRIVER_TRACE_CBID_cuMemcpyPeerAsync_ptsz,
    CUPTI_DRIVER_TRACE_CBID_cuMemcpyPeer_ptds,
    CUPTI_DRIVER_TRACE_CBID_cuMemcpy_ptds,
    CUPTI_DRIVER_TRACE_CBID_cuMemcpy_v2,
};

static const CUpti_CallbackId memset_cbids[] = {
    CUPTI_DRIVER_TRACE_CBID_cuMemsetD16,
    CUPTI_DRIVER_TRACE_CBID_cuMemsetD16Async,
    CUPTI_DRIVER_TRACE_CBID_cuMemsetD16Async_ptsz,
    CUPTI_DRIVER_TRACE_CBID_cuMemsetD16_v2,
    CUPTI_DRIVER_TRACE_CBID_cuMemsetD16_v2_ptds,
    CUPTI_DRIVER_TRACE_CBID_cuMemsetD2D16,
    CUPTI_DRIVER_TRACE_CBID_cuMemsetD2D16Async,
    CUPTI_DRIVER_TRACE_CBID_cuMemsetD2D16Async_ptsz,
    CUPTI_DRIVER_TRACE_CBID_cuMemsetD2D16_v2,
    CUPTI_DRIVER_TRACE_CBID_cuMemsetD2D16_v2_ptds,
    CUPTI_DRIVER_TRACE_CBID_cuMemsetD2D32,
    CUPTI_DRIVER_TRACE_CBID_cuMemsetD2D32Async,
    CUPTI_DRIVER_TRACE_CBID_cuMemsetD2D32Async_ptsz,
    CUPTI_DRIVER_TRACE_CBID_cuMemsetD2D32_v2,
    CUPTI_DRIVER_TRACE_CBID_cuMemsetD2D32_v2_ptds,
    CUPTI_DRIVER_TRACE_CBID_cuMemsetD2D8,
    CUPTI_DRIVER_TRACE_CBID_cuMemsetD2D8Async,
    CUPTI_DRIVER_TRACE_CBID_cuMemsetD2D8Async_ptsz,
    CUPTI_DRIVER_TRACE_CBID_cuMemsetD2D8_v2,
    CUPTI_DRIVER_TRACE_CBID_cuMemsetD2D8_v2_ptds,
    CUPTI_DRIVER_TRACE_CBID_cuMemsetD32,
    CUPTI_DRIVER_TRACE_CBID_cuMemsetD32Async,
    CUPTI_DRIVER_TRACE_CBID_cuMemsetD32Async_ptsz,
    CUPTI_DRIVER_TRACE_CBID_cuMemsetD32_v2,
    CUPTI_DRIVER_TRACE_CBID_cuMemsetD32_v2_ptds,
    CUPTI_DRIVER_TRACE_CBID_cuMemsetD8,
    CUPTI_DRIVER_TRACE_CBID_cuMemsetD8Async,
    CUPTI_DRIVER_TRACE_CBID_cuMemsetD8Async_ptsz,
    CUPTI_DRIVER_TRACE_CBID_cuMemsetD8_v2,
    CUPTI_DRIVER_TRACE_CBID_cuMemsetD8_v2_ptds,
};

static const CUpti_CallbackId kernel_cbids[] = {
    CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel,
    CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel_ptsz,
    CUPTI_DRIVER_TRACE_CBID_cuLaunchKernelEx,
    CUPTI_DRIVER_TRACE_CBID_cuLaunchKernelEx_ptsz,
    CUPTI_DRIVER_TRACE_CBID_cuLaunchCooperativeKernel,
    CUPTI_DRIVER_TRACE_CBID_cuLaunchCooperativeKernel_ptsz,
};

static const CUpti_CallbackId graph_cbids[] = {
    CUPTI_DRIVER_TRACE_CBID_cuGraphLaunch,
    CUPTI_DRIVER_TRACE_CBID_cuGraphLaunch_ptsz,
};

/* Calls that create, instantiate or run a CUDA graph. CUPTI must not be finalized (and subscribed again) in a
 * process that uses graphs: PyTorch's profiler stopped tearing CUPTI down when CUDA graphs are in use after crashes
 * on the re-initialisation, and an H200 crashed a torch.compile(mode="reduce-overhead") program with XID 31 under the
 * finalizing library. Their callbacks stay on while subscribed (they are rare: capture and instantiation happen
 * once, a graph launch stands for many kernels), so the library learns of the first graph before it finalizes. */
static const CUpti_CallbackId graph_use_cbids[] = {
    CUPTI_DRIVER_TRACE_CBID_cuGraphLaunch,
    CUPTI_DRIVER_TRACE_CBID_cuGraphLaunch_ptsz,
    CUPTI_DRIVER_TRACE_CBID_cuGraphInstantiate,
    CUPTI_DRIVER_TRACE_CBID_cuGraphInstantiate_v2,
    CUPTI_DRIVER_TRACE_CBID_cuGraphInstantiateWithFlags,
    CUPTI_DRIVER_TRACE_CBID_cuGraphInstantiateWithParams,
    CUPTI_DRIVER_TRACE_CBID_cuGraphInstantiateWithParams_ptsz,
    CUPTI_DRIVER_TRACE_CBID_cuStreamBeginCapture,
    CUPTI_DRIVER_TRACE_CBID_cuStreamBeginCapture_ptsz,
    CUPTI_DRIVER_TRACE_CBID_cuStreamBeginCapture_v2,
    CUPTI_DRIVER_TRACE_CBID_cuStreamBeginCapture_v2_ptsz,
    CUPTI_DRIVER_TRACE_CBID_cuStreamBeginCaptureToGraph,
    CUPTI_DRIVER_TRACE_CBID_cuStreamBeginCaptureToGraph_ptsz,
    CUPTI_DRIVER_TRACE_CBID_cuGraphUpload,
    CUPTI_DRIVER_TRACE_CBID_cuGraphUpload_ptsz,
    CUPTI_DRIVER_TRACE_CBID_cuGraphExecUpdate,
    CUPTI_DRIVER_TRACE_CBID_cuGraphExecUpdate_v2,
};

struct wait_cbid {
    CUpti_CallbackId cbid;
    enum otel_gpu_sync_kind kind;
};

/* Calls that block the CPU thread until the GPU has done something: the callbacks stay on while an agent is attached. */
static const struct wait_cbid wait_cbids[] = {
    {CUPTI_DRIVER_TRACE_CBID_cuStreamSynchronize, OTEL_GPU_SYNC_STREAM},
    {CUPTI_DRIVER_TRACE_CBID_cuStreamSynchronize_ptsz, OTEL_GPU_SYNC_STREAM},
    {CUPTI_DRIVER_TRACE_CBID_cuCtxSynchronize, OTEL_GPU_SYNC_CONTEXT},
    {CUPTI_DRIVER_TRACE_CBID_cuCtxSynchronize_v2, OTEL_GPU_SYNC_CONTEXT},
    {CUPTI_DRIVER_TRACE_CBID_cuEventSynchronize, OTEL_GPU_SYNC_EVENT},
    /* Copies to (pageable) host memory return only once the data is there. */
    {CUPTI_DRIVER_TRACE_CBID_cuMemcpyDtoH, OTEL_GPU_SYNC_MEMCPY},
    {CUPTI_DRIVER_TRACE_CBID_cuMemcpyDtoH_v2, OTEL_GPU_SYNC_MEMCPY},
    {CUPTI_DRIVER_TRACE_CBID_cuMemcpyDtoH_v2_ptds, OTEL_GPU_SYNC_MEMCPY},
    {CUPTI_DRIVER_TRACE_CBID_cuMemcpyAtoH, OTEL_GPU_SYNC_MEMCPY},
    {CUPTI_DRIVER_TRACE_CBID_cuMemcpyAtoH_v2, OTEL_GPU_SYNC_MEMCPY},
    {CUPTI_DRIVER_TRACE_CBID_cuMemcpyAtoH_v2_ptds, OTEL_GPU_SYNC_MEMCPY},
    {CUPTI_DRIVER_TRACE_CBID_cuMemcpy, OTEL_GPU_SYNC_MEMCPY},
    {CUPTI_DRIVER_TRACE_CBID_cuMemcpy_ptds, OTEL_GPU_SYNC_MEMCPY},
    {CUPTI_DRIVER_TRACE_CBID_cuMemcpy_v2, OTEL_GPU_SYNC_MEMCPY},
};

uint8_t g_cbid_class[CUPTI_DRIVER_TRACE_CBID_SIZE];

#define COUNT(a) (sizeof(a) / sizeof((a)[0]))

void cbids_init(void)
{
    memset(g_cbid_class, 0, sizeof(g_cbid_class));
    for (size_t i = 0; i < COUNT(memcpy_cbids); i++)
        g_cbid_class[memcpy_cbids[i]] |= OTEL_GPU_LAUNCH_MEMCPY;
    for (size_t i = 0; i < COUNT(memset_cbids); i++)
        g_cbid_class[memset_cbids[i]] |= OTEL_GPU_LAUNCH_MEMSET;
    for (size_t i = 0; i < COUNT(kernel_cbids); i++)
        g_cbid_class[kernel_cbids[i]] |= OTEL_GPU_LAUNCH_KERNEL;
    for (size_t i = 0; i < COUNT(graph_cbids); i++)
        g_cbid_class[graph_cbids[i]] |= OTEL_GPU_LAUNCH_GRAPH;
    for (size_t i = 0; i < COUNT(wait_cbids); i++)
        g_cbid_class[wait_cbids[i].cbid] |= (uint8_t)(wait_cbids[i].kind << CLASS_WAIT_SHIFT);
    for (size_t i = 0; i < COUNT(graph_use_cbids); i++)
        g_cbid_class[graph_use_cbids[i]] |= CLASS_GRAPH_USE;
}

/* Turns the callbacks of every launch-like call on or off (the sampling window's switch). */
int cbids_enable_launches(uint32_t enable)
{
    int failed = 0;
    for (CUpti_CallbackId cbid = 0; cbid < CUPTI_DRIVER_TRACE_CBID_SIZE; cbid++) {
        uint8_t cls = g_cbid_class[cbid];
        /* Blocking calls and graph use stay on while subscribed; everything else follows the window. */
        if ((cls & CLASS_LAUNCH_MASK) == 0 || (cls >> CLASS_WAIT_SHIFT) != 0 || (!enable && (cls & CLASS_GRAPH_USE)))
            continue;
        if (g_cupti.enable_callback(enable, g_subscriber, CUPTI_CB_DOMAIN_DRIVER_API, cbid) != CUPTI_SUCCESS)
            failed++;
    }
    return failed;
}

int cbids_enable_waits(uint32_t enable)
{
    int failed = 0;
    for (size_t i = 0; i < COUNT(wait_cbids); i++)
        if (g_cupti.enable_callback(enable, g_subscriber, CUPTI_CB_DOMAIN_DRIVER_API, wait_cbids[i].cbid) !=
            CUPTI_SUCCESS)
            failed++;
    return failed;
}

int cbids_enable_graph_watch(uint32_t enable)
{
    int failed = 0;
    for (size_t i = 0; i < COUNT(graph_use_cbids); i++)
        if (g_cupti.enable_callback(enable, g_subscriber, CUPTI_CB_DOMAIN_DRIVER_API, graph_use_cbids[i]) !=
            CUPTI_SUCCESS)
            failed++;
    return failed;
}
