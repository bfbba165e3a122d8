/* SPDX-License-Identifier: GPL-2.0 OR BSD-2-Clause */
/*
 * CPython frames for the CPU sampler, walked in the BPF program at each sample (included by cpu_profiler.bpf.c
 * after its stats map and bump()).
 *
 * The agent registers each Python process in python_procs (tgid -> struct otel_gpu_python_proc): where the main
 * interpreter's pointer sits and the offsets of the version it runs (tables for 3.10-3.12, _Py_DebugOffsets for
 * 3.13+; see otel_gpu/cpu/python.py). At a sample of a registered process this walks the interpreter's thread list
 * for the PyThreadState whose thread_id (pthread_self(), the task's fsbase on x86-64) is the current thread's --
 * fsbase rather than the kernel tid, because the tid CPython records is the one of the process's pid namespace --
 * then walks that thread's frames (code object address, instruction offset), innermost first. Nothing depends on
 * the GIL: a thread that released it keeps its thread state and frame chain. The stack is stored in python_stacks
 * under a hash of (tgid, frames) that goes into the sample's key; user space reads the code objects, of a stack
 * stored for the first time as soon as python_events tells it (a short job may be gone by the drain). Each frame
 * that is the first an evaluation loop ran is marked (entries), so user space can interleave the Python frames
 * with the native ones: Python -> C extension -> Python callback.
 */
#ifndef OTEL_GPU_PYTHON_FRAMES_H
#define OTEL_GPU_PYTHON_FRAMES_H

#include "common.h"
#include "cpu_profiler.h"

#ifdef __BPF__ /* the BPF program's code: user space shares only cpu_profiler.h's structs */
#include <bpf/bpf_core_read.h>

#define PYTHON_THREADS_WALKED 128 /* threads of one interpreter looked at, at most (the newest first) */

struct {
    __uint(type, BPF_MAP_TYPE_HASH);
    __uint(max_entries, 4096);
    __type(key, __u32);
    __type(value, struct otel_gpu_python_proc);
} python_procs SEC(".maps");

/* Content-addressed (the key is a hash of the value), so an entry read late is still right: LRU, never cleared. */
struct {
    __uint(type, BPF_MAP_TYPE_LRU_HASH);
    __uint(max_entries, 16384);
    __type(key, __u64);
    __type(value, struct otel_gpu_python_stack);
} python_stacks SEC(".maps");

struct {
    __uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
    __uint(max_entries, 1);
    __type(key, __u32);
    __type(value, struct otel_gpu_python_stack);
} python_scratch SEC(".maps");

/* New stacks (struct otel_gpu_python_stack_event, 24 bytes with the record header): 64 KiB hold ~2700, far more than
 * the samples of one poll period of a node. */
struct {
    __uint(type, BPF_MAP_TYPE_RINGBUF);
    __uint(max_entries, 64 * 1024);
} python_events SEC(".maps");

static __always_inline __u64 read_pointer(__u64 address) {
    __u64 value = 0;
    if (bpf_probe_read_user(&value, sizeof(value), (const void *)address))
        return 0;
    return value;
}

static __always_inline __u64 mix(__u64 hash, __u64 value) {
    hash ^= value + 0x9e3779b97f4a7c15ull + (hash << 6) + (hash >> 2);
    return hash * 0xff51afd7ed558ccdull;
}

/* State of one walk, shared with the bpf_loop callbacks (loops the verifier checks once, not per iteration). */
struct python_walk {
    struct otel_gpu_python_proc proc;
    __u64 fsbase; /* the sampled thread's pthread_self() */
    __u64 tstate; /* the thread list's cursor, then the thread's PyThreadState (0: not found) */
    __u64 frame;
    __u64 hash;
    __u64 entries[OTEL_GPU_PYTHON_ENTRY_WORDS]; /* otel_gpu_python_stack.entries */
    __u32 depth;
    __u32 found;
};

static long find_thread_step(__u64 index, void *data) {
    struct python_walk *walk = data;
    if (!walk->tstate)
        return 1;
    if (read_pointer(walk->tstate + walk->proc.tstate_thread_id) == walk->fsbase) {
        walk->found = 1;
        return 1;
    }
    walk->tstate = read_pointer(walk->tstate + walk->proc.tstate_next);
    return 0;
}

_Static_assert(OTEL_GPU_PYTHON_ENTRY_WORDS == 2, "mark_entry picks one of two words");

/* A branch per word rather than an index: the walk lives on the caller's stack, where the verifier refuses a read
 * at a variable offset. */
static __always_inline void mark_entry(struct python_walk *walk, __u32 depth) {
    if (depth < 64)
        walk->entries[0] |= 1ull << (depth & 63);
    else
        walk->entries[1] |= 1ull << (depth & 63);
}

static long walk_frame_step(__u64 index, void *data) {
    struct python_walk *walk = data;
    __u64 frame = walk->frame;
    if (!frame)
        return 1;
    __u32 zero = 0;
    struct otel_gpu_python_stack *stack = bpf_map_lookup_elem(&python_scratch, &zero);
    if (!stack)
        return 1;
    __u64 code = read_pointer(frame + walk->proc.frame_code);
    walk->frame = read_pointer(frame + walk->proc.frame_previous);
    __u32 depth = walk->depth;
    if (walk->proc.frame_owner != OTEL_GPU_PYTHON_NO_OFFSET) {
        __u8 owner = 0;
        if (bpf_probe_read_user(&owner, 1, (const void *)(frame + walk->proc.frame_owner)) == 0 &&
            owner == walk->proc.owner_cstack) {
            /* the C stack's shim frame under each evaluation loop's first frame (3.12+) */
            if (depth > 0 && depth <= OTEL_GPU_MAX_PYTHON_DEPTH)
                mark_entry(walk, depth - 1);
            return 0;
        }
    }
    if (depth >= OTEL_GPU_MAX_PYTHON_DEPTH)
        return 1;
    __u8 entry = walk->proc.instr_is_lasti; /* 3.10: one evaluation loop per frame */
    if (walk->proc.frame_is_entry != OTEL_GPU_PYTHON_NO_OFFSET)
        bpf_probe_read_user(&entry, 1, (const void *)(frame + walk->proc.frame_is_entry)); /* 3.11 */
    if (entry)
        mark_entry(walk, depth);
    __u32 offset = 0;
    if (walk->proc.instr_is_lasti) { /* 3.10: f_lasti, an int counting 2-byte code units */
        __s32 lasti = 0;
        bpf_probe_read_user(&lasti, sizeof(lasti), (const void *)(frame + walk->proc.frame_instr));
        offset = lasti < 0 ? 0 : (__u32)lasti * 2;
    } else { /* 3.11+: a pointer into the code object's co_code_adaptive */
        __u64 instr = read_pointer(frame + walk->proc.frame_instr);
        __u64 instructions = code + walk->proc.code_adaptive;
        offset = instr > instructions ? (__u32)(instr - instructions) : 0;
    }
    stack->code[depth] = code;
    stack->offset[depth] = offset;
    walk->depth = depth + 1;
    walk->hash = mix(mix(walk->hash, code), offset);
    return 0;
}

/* Walks the current thread's Python frames into python_stacks; returns the stack's hash, 0 when there is none. */
static __always_inline __u64 python_stack(__u32 pid) {
    struct otel_gpu_python_proc *proc = bpf_map_lookup_elem(&python_procs, &pid);
    if (!proc)
        return 0;
    struct python_walk walk = {.proc = *proc};
    struct task_struct *task = (struct task_struct *)bpf_get_current_task();
    walk.fsbase = BPF_CORE_READ(task, thread.fsbase);
    __u64 interp = read_pointer(walk.proc.interpreters_head);
    walk.tstate = interp ? read_pointer(interp + walk.proc.interp_threads_head) : 0;
    bpf_loop(PYTHON_THREADS_WALKED, find_thread_step, &walk, 0);
    if (!walk.found) {
        bump(OTEL_GPU_STAT_PYTHON_NO_THREAD);
        return 0;
    }
    walk.frame = read_pointer(walk.tstate + walk.proc.tstate_frame);
    if (walk.proc.cframe_current != OTEL_GPU_PYTHON_NO_OFFSET && walk.frame)
        walk.frame = read_pointer(walk.frame + walk.proc.cframe_current);
    walk.hash = mix(0, pid);
    /* more iterations than frames kept: shim frames take one each and are skipped */
    bpf_loop(2 * OTEL_GPU_MAX_PYTHON_DEPTH, walk_frame_step, &walk, 0);
    __u32 zero = 0;
    struct otel_gpu_python_stack *stack = bpf_map_lookup_elem(&python_scratch, &zero);
    if (!stack || !walk.depth)
        return 0;
    stack->depth = walk.depth;
    stack->flags = walk.frame ? OTEL_GPU_PYTHON_TRUNCATED : 0;
    __u64 hash = walk.hash;
    for (int i = 0; i < OTEL_GPU_PYTHON_ENTRY_WORDS; i++) {
        stack->entries[i] = walk.entries[i];
        hash = mix(hash, walk.entries[i]);
    }
    hash |= 1; /* never 0, which means "no Python stack" */
    if (!bpf_map_lookup_elem(&python_stacks, &hash)) { /* first sight of this stack */
        if (bpf_map_update_elem(&python_stacks, &hash, stack, BPF_ANY)) {
            bump(OTEL_GPU_STAT_PYTHON_STACKS_FULL);
        } else {
            struct otel_gpu_python_stack_event event = {.pid = pid, .stack_id = hash};
            if (bpf_ringbuf_output(&python_events, &event, sizeof(event), BPF_RB_NO_WAKEUP))
                bump(OTEL_GPU_STAT_PYTHON_EVENTS_FULL);
        }
    }
    bump(OTEL_GPU_STAT_PYTHON_SAMPLES);
    if (stack->flags & OTEL_GPU_PYTHON_TRUNCATED)
        bump(OTEL_GPU_STAT_PYTHON_TRUNCATED);
    return hash;
}

#endif /* __BPF__ */
#endif /* OTEL_GPU_PYTHON_FRAMES_H */
