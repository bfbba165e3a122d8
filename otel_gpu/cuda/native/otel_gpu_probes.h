/* SPDX-License-Identifier: Apache-2.0 OR GPL-2.0-only */
/*
 * The probe ABI between the injected CUDA library (libotel_gpu_inject.so, loaded into workloads through
 * CUDA_INJECTION64_PATH) and the agent's eBPF program. Every struct that crosses that boundary is here, once;
 * otel_gpu/cuda/abi.py mirrors it with ctypes and a test checks sizes and offsets against this header.
 *
 * USDT probes, provider "otel_gpu", each guarded by a semaphore so that a workload with no agent attached
 * does no work at all (no sampling windows are opened while every semaphore is 0):
 *
 *   otel_gpu:launch   (const struct otel_gpu_launch *rec, uint32_t rec_len)
 *       one sampled launch (kernel, graph, memcpy, memset), fired at the API's exit; rec_len <= OTEL_GPU_MAX_RECORD
 *   otel_gpu:activity (const struct otel_gpu_activity *recs, uint32_t count)
 *       completed GPU work of sampled launches, count <= OTEL_GPU_ACTIVITY_BATCH records
 *   otel_gpu:sync     (const struct otel_gpu_sync *rec, uint32_t rec_len)
 *       one sampled blocking wait of a CPU thread on the GPU (synchronize calls, blocking copies)
 *   otel_gpu:window   (const struct otel_gpu_window *rec)
 *       one sampling window closed: how long it was open and what fraction of time windows cover, so that the
 *       agent can re-weight sampled values into unbiased totals, and how often each CUDA graph was replayed
 *
 * All times are nanoseconds from CUPTI's timestamp clock (cuptiGetTimestamp), which is CLOCK_REALTIME-based on Linux.
 */
#ifndef OTEL_GPU_PROBES_H
#define OTEL_GPU_PROBES_H

#ifdef __BPF__
/* vmlinux.h provides __u32/__u64 */
typedef __u8 otel_u8;
typedef __u32 otel_u32;
typedef __s32 otel_s32;
typedef __u64 otel_u64;
#else
#include <stdint.h>
typedef uint8_t otel_u8;
typedef uint32_t otel_u32;
typedef int32_t otel_s32;
typedef uint64_t otel_u64;
#endif

#define OTEL_GPU_ABI_VERSION 7
#define OTEL_GPU_MAX_NATIVE_FRAMES 96
#define OTEL_GPU_MAX_PYTHON_FRAMES 64
#define OTEL_GPU_MAX_STRINGS 6144
#define OTEL_GPU_MAX_NAME 512
#define OTEL_GPU_ACTIVITY_BATCH 32
#define OTEL_GPU_GRAPH_SLOTS 64

enum otel_gpu_launch_kind {
    OTEL_GPU_LAUNCH_KERNEL = 1,
    OTEL_GPU_LAUNCH_GRAPH = 2,
    OTEL_GPU_LAUNCH_MEMCPY = 3,
    OTEL_GPU_LAUNCH_MEMSET = 4,
};

enum otel_gpu_activity_kind {
    OTEL_GPU_ACTIVITY_KERNEL = 1,
    OTEL_GPU_ACTIVITY_MEMCPY = 2,
    OTEL_GPU_ACTIVITY_MEMSET = 3,
};

enum otel_gpu_sync_kind {
    OTEL_GPU_SYNC_STREAM = 1,
    OTEL_GPU_SYNC_CONTEXT = 2,
    OTEL_GPU_SYNC_EVENT = 3,
    OTEL_GPU_SYNC_MEMCPY = 4, /* a blocking copy (device to pageable host memory, cuMemcpy, cuMemcpyDtoH) */
};

/* One interpreter frame of the launching thread, innermost first; strings live in otel_gpu_stack.strings. */
struct otel_gpu_python_frame {
    otel_u32 line;
    otel_u32 name_offset;     /* qualified function name, NUL-terminated, offset into strings */
    otel_u32 filename_offset; /* source file, NUL-terminated, offset into strings */
    otel_u32 first_line;      /* the code's first line, | OTEL_GPU_PYTHON_ENTRY on an entry frame */
};
/* An entry frame is the outermost one its native call of the evaluation loop runs (3.10 and older: every frame;
 * 3.11 _PyInterpreterFrame.is_entry; 3.12+ the frame above a FRAME_OWNED_BY_CSTACK shim), so the frames split into
 * runs that each take the place of one _PyEval_EvalFrameDefault frame, as in CPU samples. */
#define OTEL_GPU_PYTHON_ENTRY 0x80000000u

/*
 * The launching thread's stack as the injected library unwound it (eh_frame unwinding: works through libraries
 * built without frame pointers, such as libcuda, libcupti and libtorch) plus the Python frames when the thread
 * runs Python code and holds the GIL. Native PCs are leaf first and start at the CUDA API entry point that
 * the application called (the library's own and CUPTI's frames are cut off).
 */
struct otel_gpu_stack {
    otel_u32 native_count;
    otel_u32 python_count;
    otel_u32 strings_len;
    otel_u32 flags; /* bit 0: python frames present; bit 1: native stack truncated; bit 2: python truncated */
    otel_u64 native[OTEL_GPU_MAX_NATIVE_FRAMES];
    struct otel_gpu_python_frame python[OTEL_GPU_MAX_PYTHON_FRAMES];
    char strings[OTEL_GPU_MAX_STRINGS];
};

/* The span the recording thread was in (docs/span-context.md: read from the process's span context table, which an
 * application publishes with otel_gpu.instrumentation); all zero outside any span or without the table. ABI 4. */
struct otel_gpu_span {
    otel_u8 trace_id[16];    /* W3C byte order */
    otel_u8 span_id[8];
    otel_u8 local_root_span_id[8];
};

struct otel_gpu_launch {
    otel_u32 abi_version;
    otel_u32 kind;           /* enum otel_gpu_launch_kind */
    otel_u32 correlation_id; /* CUPTI correlation id; joins with otel_gpu_activity.correlation_id (per process) */
    otel_s32 cbid;           /* CUPTI driver API callback id of the call */
    otel_u64 window_id;      /* the sampling window this launch fell in */
    otel_u64 timestamp_ns;   /* API exit */
    otel_u64 graph_exec;     /* CUgraphExec for graph launches, else 0 */
    struct otel_gpu_span span;
    struct otel_gpu_stack stack;
};

struct otel_gpu_activity {
    otel_u32 kind;           /* enum otel_gpu_activity_kind */
    otel_u32 correlation_id;
    otel_u64 start_ns;
    otel_u64 end_ns;
    otel_u32 device_id;
    otel_u32 stream_id;
    otel_u32 graph_id;       /* 0 when not part of a graph */
    otel_u32 name_len;       /* bytes of name used (without NUL); truncated names have name_len == OTEL_GPU_MAX_NAME - 1 */
    otel_u64 bytes;          /* memcpy / memset size */
    otel_u8 copy_kind;       /* CUpti_ActivityMemcpyKind */
    otel_u8 src_kind;        /* CUpti_ActivityMemoryKind (pageable, pinned, device, ...) */
    otel_u8 dst_kind;
    otel_u8 reserved[5];
    char name[OTEL_GPU_MAX_NAME]; /* mangled kernel name; empty for copies and sets */
};

struct otel_gpu_sync {
    otel_u32 abi_version;
    otel_u32 kind;           /* enum otel_gpu_sync_kind */
    otel_s32 cbid;
    otel_u32 reserved;
    otel_u64 start_ns;       /* the call's entry */
    otel_u64 end_ns;         /* the call's exit: end - start is the time the thread was blocked */
    otel_u64 weight;         /* how many waits this sampled one stands for (1 when every wait is recorded) */
    struct otel_gpu_span span;
    struct otel_gpu_stack stack;
};

struct otel_gpu_window {
    otel_u32 abi_version;
    otel_u32 open_us;        /* microseconds the flush and switching callbacks and activity on took before the window opened */
    otel_u64 window_id;
    otel_u64 start_ns;
    otel_u64 end_ns;
    otel_u64 covered_ns;     /* total time covered by windows since the library started */
    otel_u64 elapsed_ns;     /* total time since the library started; covered/elapsed = sampling fraction */
    otel_u64 launches;       /* launches recorded in this window */
    otel_u64 dropped;        /* records the library could not emit (buffers full, names truncated) */
    otel_u64 overhead_ns;    /* time the library spent in its own callbacks during this window */
    /* The program's pace inside windows against outside (totals since the library started): blocking waits that
     * ended inside windows (over covered_ns), and inside shadow windows - stretches of the gaps between windows, as
     * long as a window, where nothing but the waits is observed - over shadow_ns. */
    otel_u64 window_waits;
    otel_u64 shadow_waits;
    otel_u64 shadow_ns;
    /* Time another tool of the program (torch.profiler, ...) held CUPTI and no window could open, and how many times
     * the library stepped aside for one (totals since the library started; ABI 3). The covered/elapsed totals start
     * again when the library takes CUPTI back, so that time is never extrapolated into. */
    otel_u64 yielded_ns;
    otel_u64 yields;
    otel_u64 aside_since_ns; /* non-zero only in the record fired as the library steps aside: from this time on
                              * another tool holds CUPTI, until a record with a larger yields says the library is back */
    /* The program's pace by its launches (ABI 6; totals since the library started), for programs that seldom wait:
     * launches recorded in windows (over covered_ns), and launches counted in the gaps' shadow windows, whose launch
     * callbacks only count, over shadow_launch_ns, the time of the shadows that counted them (only while CUPTI is
     * kept subscribed with its activity kinds used before: window.c). */
    otel_u64 launches_total;
    otel_u64 shadow_launches;
    otel_u64 shadow_launch_ns;
    /* Lingers (ABI 7; totals since the library started): the time after windows while their sampled launches' GPU
     * work was awaited with the activity kinds on (the program runs slowed then, nearly as in a window), and the
     * launches counted in that time. */
    otel_u64 linger_ns;
    otel_u64 linger_launches;
    /* Every replay of a CUDA graph while attached, counted per graph exec (graphs.c; totals since the library
     * attached, so a lost record loses nothing): the agent weights a sampled graph launch's work by the replays of
     * its exec over the sampled ones instead of by the window (ABI 5). graph_count entries of graphs are in use
     * (first come, first kept); replays of execs beyond them add to graph_other_replays. */
    otel_u64 graph_other_replays;
    otel_u32 graph_count;
    otel_u32 reserved;
    struct otel_gpu_graph_replays {
        otel_u64 exec;       /* CUgraphExec, as in otel_gpu_launch.graph_exec */
        otel_u64 replays;    /* cuGraphLaunch calls of it that returned while attached */
    } graphs[OTEL_GPU_GRAPH_SLOTS];
};

#define OTEL_GPU_MAX_RECORD (sizeof(struct otel_gpu_sync) > sizeof(struct otel_gpu_launch) ? \
                             sizeof(struct otel_gpu_sync) : sizeof(struct otel_gpu_launch))

#endif /* OTEL_GPU_PROBES_H */
