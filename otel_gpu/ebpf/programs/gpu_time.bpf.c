// SPDX-License-Identifier: GPL-2.0 OR BSD-2-Clause
/*
 * GPU-time probes: USDT handlers for otel_gpu:launch/activity/sync/window (fired by libotel_gpu_inject.so).
 * Each handler adds pid, tid and comm (and, for launches and syncs, a kernel-side user stack as a fallback: walked
 * from the CPU sampler's unwind tables when the process has them, native_unwind.h, else by frame pointer),
 * copies the library's record with bpf_probe_read_user into the ring buffer "events", and counts what it could not
 * deliver in the per-CPU array "drops" (index: enum otel_gpu_drop_reason).
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include <bpf/usdt.bpf.h>

#include "gpu_time.h"
#include "cpu_profiler.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";

struct {
    __uint(type, BPF_MAP_TYPE_RINGBUF);
    __uint(max_entries, 4 * 1024 * 1024); /* bytes; the loader may resize it before load */
} events SEC(".maps");

struct {
    __uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
    __uint(max_entries, OTEL_GPU_DROP_REASONS);
    __type(key, __u32);
    __type(value, __u64);
} drops SEC(".maps");

/* Scratch for a launch or sync record: it is assembled here and copied into the ring buffer with only its used
 * bytes (a stack-carrying record reserves ~8.5 KiB but mostly uses 1-2 KiB, so the ring holds several times more). */
struct otel_gpu_scratch {
    __u8 bytes[sizeof(struct otel_gpu_event) + sizeof(struct otel_gpu_kstack) + OTEL_GPU_MAX_RECORD];
};

struct {
    __uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
    __uint(max_entries, 1);
    __type(key, __u32);
    __type(value, struct otel_gpu_scratch);
} scratch SEC(".maps");

/* Wake the reader only once this many bytes wait in the ring buffer (0: after every record). The agent reads the
 * buffer every poll interval anyway, so waking it per record would only cost context switches. */
const volatile __u64 wakeup_bytes = 0;

/* The native unwinder's counters (index: enum otel_gpu_cpu_stat, only its OTEL_GPU_STAT_UNWIND_* entries used). */
struct {
    __uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
    __uint(max_entries, OTEL_GPU_STAT_COUNT);
    __type(key, __u32);
    __type(value, __u64);
} unwind_stats SEC(".maps");

static __always_inline void bump(__u32 index)
{
    __u64 *value = bpf_map_lookup_elem(&unwind_stats, &index);
    if (value)
        *value += 1;
}

/* unwind_rows and unwind_processes are the CPU sampler's (the loader reuses them): a process it registered has its
 * fallback stack walked from the same tables; without the sampler they are empty and the fallback is
 * bpf_get_stack's frame-pointer walk. */
#include "native_unwind.h"

/* The fallback user stack: walked from the unwind tables for a registered process, else by frame pointer. */
static __always_inline __s32 fallback_stack(struct pt_regs *ctx, __u64 *pcs, __u32 size)
{
    __u32 pid = bpf_get_current_pid_tgid() >> 32;
    if (!native_unwind_wanted(pid))
        return bpf_get_stack(ctx, pcs, size, BPF_F_USER_STACK);
    struct native_unwind_state *walk = native_unwind_walk(pid, PT_REGS_IP(ctx), PT_REGS_SP(ctx), PT_REGS_FP(ctx));
    if (!walk)
        return -1;
    __u32 depth = walk->stack.depth;
    if (depth > OTEL_GPU_KSTACK_DEPTH)
        depth = OTEL_GPU_KSTACK_DEPTH;
    if (depth == 0)
        return 0;
    if (bpf_probe_read_kernel(pcs, depth * sizeof(__u64), walk->stack.frames))
        return -1;
    return depth * sizeof(__u64);
}

#define STACK_OFFSET __builtin_offsetof(struct otel_gpu_launch, stack)
_Static_assert(__builtin_offsetof(struct otel_gpu_launch, stack) == __builtin_offsetof(struct otel_gpu_sync, stack),
               "launch and sync records keep their stack at the same offset");

#define STACK_RECORD_BYTES (sizeof(struct otel_gpu_event) + sizeof(struct otel_gpu_kstack) + OTEL_GPU_MAX_RECORD)

static __always_inline void count_drop(__u32 reason)
{
    __u64 *value = bpf_map_lookup_elem(&drops, &reason);
    if (value)
        *value += 1;
}

static __always_inline __u64 submit_flags(void)
{
    if (wakeup_bytes == 0 || bpf_ringbuf_query(&events, BPF_RB_AVAIL_DATA) >= wakeup_bytes)
        return BPF_RB_FORCE_WAKEUP;
    return BPF_RB_NO_WAKEUP;
}

static __always_inline void fill_event(struct otel_gpu_event *event, __u32 type, __u32 payload_len)
{
    __u64 pid_tgid = bpf_get_current_pid_tgid();

    event->type = type;
    event->pid = pid_tgid >> 32;
    event->tid = (__u32)pid_tgid;
    event->payload_len = payload_len;
    event->ktime_ns = bpf_ktime_get_ns();
    bpf_get_current_comm(event->comm, sizeof(event->comm));
}

/* launch and sync: event | kernel-side user stack | the library's record (rec_len bytes). */
static __always_inline int emit_with_stack(struct pt_regs *ctx, __u32 type, const void *rec, __u64 rec_len)
{
    if (rec_len == 0 || rec_len > OTEL_GPU_MAX_RECORD) {
        count_drop(OTEL_GPU_DROP_BAD_LENGTH);
        return 0;
    }
    __u32 zero = 0;
    void *buf = bpf_map_lookup_elem(&scratch, &zero);
    if (!buf)
        return 0;
    struct otel_gpu_event *event = buf;
    struct otel_gpu_kstack *stack = buf + sizeof(struct otel_gpu_event);
    void *payload = buf + sizeof(struct otel_gpu_event) + sizeof(struct otel_gpu_kstack);

    fill_event(event, type, rec_len);
    stack->reserved = 0;
    stack->bytes = 0;
    if (bpf_probe_read_user(payload, rec_len, rec) != 0) {
        count_drop(OTEL_GPU_DROP_READ_FAILED);
        return 0;
    }
    /* The kernel's unwind only when the library's is empty (both records keep their stack at the same offset). */
    const struct otel_gpu_stack *lib_stack = payload + STACK_OFFSET;
    if (rec_len < STACK_OFFSET + sizeof(lib_stack->native_count) || lib_stack->native_count == 0)
        stack->bytes = fallback_stack(ctx, stack->pcs, sizeof(stack->pcs));
    __u64 used = sizeof(struct otel_gpu_event) + sizeof(struct otel_gpu_kstack) + rec_len;
    if (used > STACK_RECORD_BYTES) /* cannot happen (rec_len was checked); tells the verifier the bound */
        used = STACK_RECORD_BYTES;
    if (bpf_ringbuf_output(&events, buf, used, submit_flags()) != 0)
        count_drop(OTEL_GPU_DROP_RINGBUF_FULL);
    return 0;
}

SEC("usdt")
int BPF_USDT(otel_gpu_launch, const void *rec, __u64 rec_len)
{
    return emit_with_stack(ctx, OTEL_GPU_EVENT_LAUNCH, rec, rec_len);
}

SEC("usdt")
int BPF_USDT(otel_gpu_sync, const void *rec, __u64 rec_len)
{
    return emit_with_stack(ctx, OTEL_GPU_EVENT_SYNC, rec, rec_len);
}

SEC("usdt")
int BPF_USDT(otel_gpu_activity, const struct otel_gpu_activity *recs, __u64 count)
{
    if (count > OTEL_GPU_ACTIVITY_BATCH) {
        count_drop(OTEL_GPU_DROP_BAD_LENGTH);
        count = OTEL_GPU_ACTIVITY_BATCH;
    }
    for (__u32 i = 0; i < OTEL_GPU_ACTIVITY_BATCH; i++) {
        if (i >= count)
            break;
        void *buf = bpf_ringbuf_reserve(&events, sizeof(struct otel_gpu_event) + sizeof(struct otel_gpu_activity), 0);
        if (!buf) {
            count_drop(OTEL_GPU_DROP_RINGBUF_FULL);
            continue;
        }
        fill_event(buf, OTEL_GPU_EVENT_ACTIVITY, sizeof(struct otel_gpu_activity));
        if (bpf_probe_read_user(buf + sizeof(struct otel_gpu_event), sizeof(struct otel_gpu_activity), &recs[i]) != 0) {
            count_drop(OTEL_GPU_DROP_READ_FAILED);
            bpf_ringbuf_discard(buf, 0);
            continue;
        }
        bpf_ringbuf_submit(buf, submit_flags());
    }
    return 0;
}

SEC("usdt")
int BPF_USDT(otel_gpu_window, const struct otel_gpu_window *rec)
{
    void *buf = bpf_ringbuf_reserve(&events, sizeof(struct otel_gpu_event) + sizeof(struct otel_gpu_window), 0);
    if (!buf) {
        count_drop(OTEL_GPU_DROP_RINGBUF_FULL);
        return 0;
    }
    fill_event(buf, OTEL_GPU_EVENT_WINDOW, sizeof(struct otel_gpu_window));
    if (bpf_probe_read_user(buf + sizeof(struct otel_gpu_event), sizeof(struct otel_gpu_window), rec) != 0) {
        count_drop(OTEL_GPU_DROP_READ_FAILED);
        bpf_ringbuf_discard(buf, 0);
        return 0;
    }
    bpf_ringbuf_submit(buf, submit_flags());
    return 0;
}
