// SPDX-License-Identifier: GPL-2.0 OR BSD-2-Clause
/*
 * Counting probes, per tgid: `count_uprobe` for a uprobe on any function and `count_usdt` for a USDT probe.
 * Used by the loader's tests and handy to check that a probe point fires; the GPU-time profiler has its own program.
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include <bpf/usdt.bpf.h>

char LICENSE[] SEC("license") = "Dual BSD/GPL";

struct {
    __uint(type, BPF_MAP_TYPE_HASH);
    __uint(max_entries, 1024);
    __type(key, __u32);
    __type(value, __u64);
} uprobe_hits SEC(".maps");

struct {
    __uint(type, BPF_MAP_TYPE_HASH);
    __uint(max_entries, 1024);
    __type(key, __u32);
    __type(value, __u64);
} usdt_hits SEC(".maps");

/* The sum of the first argument of every counted call, to check argument access. */
struct {
    __uint(type, BPF_MAP_TYPE_ARRAY);
    __uint(max_entries, 1);
    __type(key, __u32);
    __type(value, __u64);
} arg_sum SEC(".maps");

static __always_inline void count(void *map) {
    __u32 pid = bpf_get_current_pid_tgid() >> 32;
    __u64 one = 1;
    __u64 *value = bpf_map_lookup_elem(map, &pid);
    if (value)
        __sync_fetch_and_add(value, 1);
    else
        bpf_map_update_elem(map, &pid, &one, BPF_NOEXIST);
}

SEC("uprobe")
int BPF_KPROBE(count_uprobe, int value) {
    __u32 zero = 0;
    __u64 *sum = bpf_map_lookup_elem(&arg_sum, &zero);
    if (sum)
        __sync_fetch_and_add(sum, (__u64)value);
    count(&uprobe_hits);
    return 0;
}

SEC("usdt")
int BPF_USDT(count_usdt, long value) {
    count(&usdt_hits);
    return 0;
}
