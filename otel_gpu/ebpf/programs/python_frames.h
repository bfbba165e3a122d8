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
 * under a hash of (tgid, frames) that goes into the sample's key; user space reads the code objects.
 */
#ifndef OTEL_GPU_PYTHON_FRAMES_H
#define OTEL_GPU_PYTHON_FRAMES_H

#include "common.h"
#include "cpu_profiler.h"

#ifdef __BPF__ /* the BPF program's code: user space shares only cpu_profiler.h's structs */
#include <bpf/bpf_core_read.h>

#define PYTHON_THREADS_WALKED 64 /* threads of one interpreter looked at, at most */

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

/* The current thread's PyThreadState in a registered process, 0 when there is none (a thread without one). */
static __always_inline __u64 find_thread_state(const struct otel_gpu_python_proc *proc) {
    struct task_struct *task = (struct task_struct *)bpf_get_current_task();
    __u64 fsbase = BPF_CORE_READ(task, thread.fsbase);
    __u64 interp = read_pointer(proc->interpreters_head);
    if (!interp)
        return 0;
    __u64 tstate = read_pointer(interp + proc->interp_threads_head);
    for (int i = 0; i < PYTHON_THREADS_WALKED && tstate; i++) {
        if (read_pointer(tstate + proc->tstate_thread_id) == fsbase)
            return tstate;
        tstate = read_pointer(tstate + proc->tstate_next);
    }
    return 0;
}

/* Walks the current thread's Python frames into python_stacks; returns the stack's hash, 0 when there is none. */
static __always_inline __u64 python_stack(__u32 pid) {
    struct otel_gpu_python_proc *proc = bpf_map_lookup_elem(&python_procs, &pid);
    if (!proc)
        return 0;
    __u64 tstate = find_thread_state(proc);
    if (!tstate) {
        bump(OTEL_GPU_STAT_PYTHON_NO_THREAD);
        return 0;
    }
    __u32 zero = 0;
    struct otel_gpu_python_stack *stack = bpf_map_lookup_elem(&python_scratch, &zero);
    if (!stack)
        return 0;
    stack->depth = 0;
    stack->flags = 0;
    __u64 frame = read_pointer(tstate + proc->tstate_frame);
    if (proc->cframe_current != OTEL_GPU_PYTHON_NO_OFFSET && frame)
        frame = read_pointer(frame + proc->cframe_current);
    __u64 hash = mix(0, pid);
    __u32 depth = 0;
    for (int i = 0; i < OTEL_GPU_MAX_PYTHON_DEPTH && frame; i++) {
        __u64 code = read_pointer(frame + proc->frame_code);
        __u64 next = read_pointer(frame + proc->frame_previous);
        __u8 owner = 0;
        if (proc->frame_owner != OTEL_GPU_PYTHON_NO_OFFSET &&
            bpf_probe_read_user(&owner, 1, (const void *)(frame + proc->frame_owner)) == 0 &&
            owner == proc->owner_cstack) {
            frame = next; /* the C stack's shim frame between two evaluation loops (3.12+) */
            continue;
        }
        __u32 offset = 0;
        if (proc->instr_is_lasti) { /* 3.10: f_lasti, an int counting 2-byte code units */
            __s32 lasti = 0;
            bpf_probe_read_user(&lasti, sizeof(lasti), (const void *)(frame + proc->frame_instr));
            offset = lasti < 0 ? 0 : (__u32)lasti * 2;
        } else { /* 3.11+: a pointer into the code object's co_code_adaptive */
            __u64 instr = read_pointer(frame + proc->frame_instr);
            offset = instr > code + proc->code_adaptive ? (__u32)(instr - code - proc->code_adaptive) : 0;
        }
        if (depth < OTEL_GPU_MAX_PYTHON_DEPTH) {
            stack->code[depth] = code;
            stack->offset[depth] = offset;
            depth++;
        }
        hash = mix(mix(hash, code), offset);
        frame = next;
    }
    if (frame)
        stack->flags |= OTEL_GPU_PYTHON_TRUNCATED;
    stack->depth = depth;
    if (!depth)
        return 0;
    hash |= 1; /* never 0, which means "no Python stack" */
    if (!bpf_map_lookup_elem(&python_stacks, &hash) && bpf_map_update_elem(&python_stacks, &hash, stack, BPF_ANY))
        bump(OTEL_GPU_STAT_PYTHON_STACKS_FULL);
    bump(OTEL_GPU_STAT_PYTHON_SAMPLES);
    if (stack->flags & OTEL_GPU_PYTHON_TRUNCATED)
        bump(OTEL_GPU_STAT_PYTHON_TRUNCATED);
    return hash;
}

#endif /* __BPF__ */
#endif /* OTEL_GPU_PYTHON_FRAMES_H */
