// SPDX-License-Identifier: GPL-2.0 OR BSD-2-Clause
/*
 * The design not taken, for bench/bench_unwind.py only: per sample, copy the user registers and a bounded window of
 * the user stack (STACK_WINDOW bytes from rsp) into a ring buffer, for user space to unwind with the same tables.
 * Compiled by the bench itself (clang -target bpf), never shipped.
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>

#ifndef STACK_WINDOW
#define STACK_WINDOW 16384
#endif

char LICENSE[] SEC("license") = "Dual BSD/GPL";

const volatile __u32 target_tgid = 0;

struct window {
    __u64 ip, sp, bp;
    __u32 pid, bytes;
    __u8 stack[STACK_WINDOW];
};

struct {
    __uint(type, BPF_MAP_TYPE_RINGBUF);
    __uint(max_entries, 64 * 1024 * 1024);
} windows SEC(".maps");

struct {
    __uint(type, BPF_MAP_TYPE_ARRAY);
    __uint(max_entries, 2);
    __type(key, __u32);
    __type(value, __u64);
} counters SEC(".maps"); /* 0: sent, 1: dropped or unread */

SEC("perf_event")
int copy_stack(struct bpf_perf_event_data *ctx) {
    __u32 pid = bpf_get_current_pid_tgid() >> 32;
    if (pid != target_tgid)
        return 0;
    __u32 index = 1;
    struct window *w = bpf_ringbuf_reserve(&windows, sizeof(*w), 0);
    if (!w)
        goto count;
    __u64 cs = *(volatile __u64 *)&ctx->regs.cs;
    if ((cs & 3) != 3) { /* in the kernel: a real design would read task_pt_regs; the bench workload is user-mode */
        bpf_ringbuf_discard(w, 0);
        goto count;
    }
    w->ip = *(volatile __u64 *)&ctx->regs.ip;
    w->sp = *(volatile __u64 *)&ctx->regs.sp;
    w->bp = *(volatile __u64 *)&ctx->regs.bp;
    w->pid = pid;
    /* the window may run past the stack's top: fall back to shorter copies */
    w->bytes = STACK_WINDOW;
    if (bpf_probe_read_user(w->stack, STACK_WINDOW, (void *)w->sp)) {
        w->bytes = STACK_WINDOW / 4;
        if (bpf_probe_read_user(w->stack, STACK_WINDOW / 4, (void *)w->sp))
            w->bytes = 0;
    }
    bpf_ringbuf_submit(w, 0);
    index = 0;
count:;
    __u64 *value = bpf_map_lookup_elem(&counters, &index);
    if (value)
        __sync_fetch_and_add(value, 1);
    return 0;
}
