// SPDX-License-Identifier: GPL-2.0 OR BSD-2-Clause
/*
 * The CPU sampler: attached to a software cpu-clock perf event on every online CPU. Each sample records the user
 * and kernel stacks (frame-pointer unwinding by bpf_get_stackid) and counts it in the current generation's hash map
 * keyed by (tgid, exec id, tid, user stack id, kernel stack id). User space flips the generation in `control` and
 * drains the other one. The first sample of a process, and its first after each exec, is announced through the
 * process_events ring buffer: the exec id in every sample tells the programs one pid ran apart. When a stack id
 * collides in the stack map (-EEXIST), the whole sample goes through the raw_samples ring buffer instead. In a
 * process the agent registered as CPython, the thread's Python frames are walked too (python_frames.h) and the
 * sample's key carries the id of that Python stack. Processes the agent registered unwind tables for
 * (native_unwind.h) have their user stack walked from those tables instead of frame pointers; the walked stack is
 * kept in the generation's unwound_stacks map under an id hashed from its frames and counted like any other.
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include <bpf/bpf_core_read.h>
#include "cpu_profiler.h"
#include "span_context.h"

#define EEXIST 17
#define EFAULT 14
#define STACK_ENTRIES 8192
#define COUNT_ENTRIES 16384
#define UNWOUND_ENTRIES 4096 /* the agent may set max_entries (CPUSampler's unwound_stacks) */

char LICENSE[] SEC("license") = "Dual BSD/GPL";

const volatile __u32 self_tgid = 0;   /* the agent's own tgid, left out; 0 = include every process */
const volatile __u8 filter_pids = 0;  /* 1: sample only tgids present in pid_filter */
const volatile __u8 raw_only = 0;     /* 1: send every sample whole through raw_samples (no in-kernel aggregation) */

struct stack_map {
    __uint(type, BPF_MAP_TYPE_STACK_TRACE);
    __uint(max_entries, STACK_ENTRIES);
    __uint(key_size, sizeof(__u32));
    __uint(value_size, OTEL_GPU_MAX_STACK_DEPTH * sizeof(__u64));
};

struct count_map {
    __uint(type, BPF_MAP_TYPE_HASH);
    __uint(max_entries, COUNT_ENTRIES);
    __type(key, struct otel_gpu_sample_key);
    __type(value, struct otel_gpu_sample_value);
};

/* Stacks walked by native_unwind.h, by their id (OTEL_GPU_UNWOUND_ID_BASE | 30 bits of their hash); 1 KiB each. */
struct unwound_map {
    __uint(type, BPF_MAP_TYPE_HASH);
    __uint(max_entries, UNWOUND_ENTRIES);
    __type(key, __u32);
    __type(value, struct otel_gpu_unwound_stack);
};

struct stack_map stacks0 SEC(".maps");
struct stack_map stacks1 SEC(".maps");
struct count_map counts0 SEC(".maps");
struct count_map counts1 SEC(".maps");
struct unwound_map unwound_stacks0 SEC(".maps");
struct unwound_map unwound_stacks1 SEC(".maps");

struct {
    __uint(type, BPF_MAP_TYPE_ARRAY);
    __uint(max_entries, 1);
    __type(key, __u32);
    __type(value, struct otel_gpu_control);
} control SEC(".maps");

struct {
    __uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
    __uint(max_entries, OTEL_GPU_STAT_COUNT);
    __type(key, __u32);
    __type(value, __u64);
} stats SEC(".maps");

struct {
    __uint(type, BPF_MAP_TYPE_HASH);
    __uint(max_entries, 1024);
    __type(key, __u32);
    __type(value, __u8);
} pid_filter SEC(".maps");

/* tgid -> the exec id it was last announced with */
struct {
    __uint(type, BPF_MAP_TYPE_LRU_HASH);
    __uint(max_entries, 16384);
    __type(key, __u32);
    __type(value, __u32);
} known_pids SEC(".maps");

struct {
    __uint(type, BPF_MAP_TYPE_RINGBUF);
    __uint(max_entries, 256 * 1024);
} process_events SEC(".maps");

struct {
    __uint(type, BPF_MAP_TYPE_RINGBUF);
    __uint(max_entries, 1024 * 1024);
} raw_samples SEC(".maps");

static __always_inline void bump(__u32 index) {
    __u64 *value = bpf_map_lookup_elem(&stats, &index);
    if (value)
        *value += 1;
}

#include "native_unwind.h"

/* The current task's exec id: task_struct.self_exec_id, which exec (begin_new_exec) increments and clone copies, so
 * every thread of a process holds the same one. */
static __always_inline __u32 current_exec_id(void) {
    struct task_struct *task = bpf_get_current_task_btf();
    return (__u32)task->self_exec_id;
}

static __always_inline void announce(__u32 pid, __u32 tid, __u32 exec_id) {
    __u32 *known = bpf_map_lookup_elem(&known_pids, &pid);
    if (known && *known == exec_id)
        return;
    bpf_map_update_elem(&known_pids, &pid, &exec_id, BPF_ANY);
    struct otel_gpu_process_event *event = bpf_ringbuf_reserve(&process_events, sizeof(*event), 0);
    if (!event) {
        bump(OTEL_GPU_STAT_EVENTS_FULL);
        return;
    }
    event->pid = pid;
    event->tid = tid;
    event->time_ns = bpf_ktime_get_ns();
    bpf_get_current_comm(event->comm, sizeof(event->comm));
    event->exec_id = exec_id;
    event->reserved = 0;
    struct task_struct *task = (struct task_struct *)bpf_get_current_task();
    event->arg_start = BPF_CORE_READ(task, mm, arg_start); /* 0 for a task without memory */
    bpf_ringbuf_submit(event, 0);
}

#include "python_frames.h"

static __always_inline void check_stack_id(__s32 id, __u32 collision_stat) {
    if (id >= 0 || id == -EFAULT)
        return;
    bump(id == -EEXIST ? collision_stat : OTEL_GPU_STAT_STACK_ERROR);
}

/* Send the whole sample through raw_samples: when a stack id collided, so that the collision costs nothing, or for
 * raw_only. `unwound`: the process has unwind tables, and `walk` is its user stack (0: the walk failed). */
static __always_inline int send_whole(struct bpf_perf_event_data *ctx, __u32 pid, __u32 tid, __u32 exec_id,
                                      __u64 python_stack_id, bool unwound, struct native_unwind_state *walk) {
    struct otel_gpu_raw_sample *raw = bpf_ringbuf_reserve(&raw_samples, sizeof(*raw), 0);
    if (!raw) {
        bump(OTEL_GPU_STAT_RAW_FULL);
        return 0;
    }
    raw->pid = pid;
    raw->tid = tid;
    raw->exec_id = exec_id;
    raw->reserved = 0;
    raw->python_stack_id = python_stack_id;
    if (unwound)
        raw->user_bytes = walk ? native_unwind_copy(walk, raw->user) : -1;
    else
        raw->user_bytes = bpf_get_stack(ctx, raw->user, sizeof(raw->user), BPF_F_USER_STACK);
    raw->kernel_bytes = bpf_get_stack(ctx, raw->kernel, sizeof(raw->kernel), 0);
    bpf_get_current_comm(raw->comm, sizeof(raw->comm));
    struct otel_gpu_span_ids ids = {};
    read_span_ids(pid, tid, &ids);
    __builtin_memcpy(raw->trace_id, ids.trace_id, sizeof(ids.trace_id));
    __builtin_memcpy(raw->span_id, ids.span_id, sizeof(ids.span_id));
    bpf_ringbuf_submit(raw, 0);
    bump(OTEL_GPU_STAT_RAW_SENT);
    return 1;
}

/* The id under which the walked stack is kept in unwound (the generation's unwound_stacks), as bpf_get_stackid
 * would return it: -EFAULT for an empty stack, -EEXIST when the id holds another stack, another error when the map
 * is full or the walk failed. */
static __always_inline __s32 unwound_stack_id(void *unwound, struct native_unwind_state *walk) {
    if (!walk)
        return -1; /* the registers could not be read: counted as unwind_no_regs, the user stack lost */
    if (walk->stack.depth == 0)
        return -EFAULT;
    __u64 hash = walk->stack.hash ^ (walk->stack.hash >> 29) ^ (walk->stack.hash >> 47);
    __u32 id = OTEL_GPU_UNWOUND_ID_BASE | (__u32)(hash & (OTEL_GPU_UNWOUND_ID_BASE - 1));
    struct otel_gpu_unwound_stack *held = bpf_map_lookup_elem(unwound, &id);
    if (!held) {
        long err = bpf_map_update_elem(unwound, &id, &walk->stack, BPF_NOEXIST);
        if (!err)
            return id;
        if (err != -EEXIST) /* full until the next drain */
            return (__s32)err;
        held = bpf_map_lookup_elem(unwound, &id); /* another CPU added it meanwhile */
        if (!held)
            return -EEXIST;
    }
    return held->hash == walk->stack.hash && held->depth == walk->stack.depth ? (__s32)id : -EEXIST;
}

static __always_inline void count_sample(void *counts, struct otel_gpu_sample_key *key) {
    struct otel_gpu_sample_value *value = bpf_map_lookup_elem(counts, key);
    if (value) {
        __sync_fetch_and_add(&value->count, 1);
        return;
    }
    struct otel_gpu_sample_value fresh = {.count = 1};
    bpf_get_current_comm(fresh.comm, sizeof(fresh.comm));
    long err = bpf_map_update_elem(counts, key, &fresh, BPF_NOEXIST);
    if (err == -EEXIST) { /* another CPU created it meanwhile */
        value = bpf_map_lookup_elem(counts, key);
        if (value)
            __sync_fetch_and_add(&value->count, 1);
    } else if (err) {
        bump(OTEL_GPU_STAT_COUNTS_FULL);
    }
}

SEC("perf_event")
int on_cpu_sample(struct bpf_perf_event_data *ctx) {
    __u64 pid_tgid = bpf_get_current_pid_tgid();
    __u32 pid = pid_tgid >> 32;
    __u32 tid = (__u32)pid_tgid;
    if (pid == 0) /* the idle task */
        return 0;
    if ((self_tgid && pid == self_tgid) || (filter_pids && !bpf_map_lookup_elem(&pid_filter, &pid))) {
        bump(OTEL_GPU_STAT_FILTERED);
        return 0;
    }
    bump(OTEL_GPU_STAT_SAMPLES);
    __u32 exec_id = current_exec_id();
    announce(pid, tid, exec_id);
    __u64 python_stack_id = python_stack(pid);

    bool unwound = native_unwind_wanted(pid);
    struct native_unwind_state *walk = unwound ? native_unwind_perf(ctx, pid) : 0;
    if (raw_only) {
        send_whole(ctx, pid, tid, exec_id, python_stack_id, unwound, walk);
        return 0;
    }
    __u32 zero = 0;
    struct otel_gpu_control *ctl = bpf_map_lookup_elem(&control, &zero);
    __u32 generation = ctl ? ctl->generation : 0;
    struct otel_gpu_sample_key key = {.pid = pid, .tid = tid, .python_stack_id = python_stack_id,
                                      .exec_id = exec_id};
    struct otel_gpu_span_ids ids = {};
    read_span_ids(pid, tid, &ids);
    __builtin_memcpy(key.trace_id, ids.trace_id, sizeof(ids.trace_id));
    __builtin_memcpy(key.span_id, ids.span_id, sizeof(ids.span_id));
    if (unwound)
        key.user_stack_id = unwound_stack_id(generation ? (void *)&unwound_stacks1 : (void *)&unwound_stacks0, walk);
    else if (generation)
        key.user_stack_id = bpf_get_stackid(ctx, &stacks1, BPF_F_USER_STACK);
    else
        key.user_stack_id = bpf_get_stackid(ctx, &stacks0, BPF_F_USER_STACK);
    if (generation)
        key.kernel_stack_id = bpf_get_stackid(ctx, &stacks1, 0);
    else
        key.kernel_stack_id = bpf_get_stackid(ctx, &stacks0, 0);
    if (!unwound)
        check_stack_id(key.user_stack_id, OTEL_GPU_STAT_USER_COLLISION);
    else if (key.user_stack_id == -EEXIST) /* a failed walk is counted as unwind_no_regs already */
        bump(OTEL_GPU_STAT_USER_COLLISION);
    check_stack_id(key.kernel_stack_id, OTEL_GPU_STAT_KERNEL_COLLISION);
    if (key.user_stack_id == -EEXIST || key.kernel_stack_id == -EEXIST ||
        (unwound && walk && key.user_stack_id < 0 && key.user_stack_id != -EFAULT)) { /* unwound_stacks full */
        send_whole(ctx, pid, tid, exec_id, python_stack_id, unwound, walk);
        return 0;
    }
    if (generation)
        count_sample(&counts1, &key);
    else
        count_sample(&counts0, &key);
    return 0;
}
