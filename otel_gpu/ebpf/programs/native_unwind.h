/* SPDX-License-Identifier: GPL-2.0 OR BSD-2-Clause */
/*
 * User stacks without frame pointers: a walker over the unwind tables that otel_gpu/unwind/ builds from each file's
 * .eh_frame (or .debug_frame). Per frame: find the mapping that holds the pc (binary search in the process's sorted
 * mappings), then the file's row for that pc (binary search in unwind_rows), then
 *     CFA = rsp or rbp + cfa_offset;  return address = [CFA - 8];  rbp = [CFA + rbp_offset] (when saved);  rsp = CFA
 * A pc that no row covers is stepped by frame pointer (CFA = rbp + 16, rbp = [rbp]), so frame-pointer code keeps
 * working. Every early stop is counted by reason (enum otel_gpu_cpu_stat). The walk is one bpf_loop callback, so the
 * verifier checks a frame once, not OTEL_GPU_MAX_STACK_DEPTH times.
 *
 * Included by cpu_profiler.bpf.c and gpu_time.bpf.c after their bump(index of enum otel_gpu_cpu_stat); only
 * processes the agent registered in unwind_processes are walked here, everything else keeps bpf_get_stackid. The
 * two objects share unwind_rows and unwind_processes (the GPU-time loader reuses the CPU sampler's maps: one set of
 * tables per process); each keeps its own per-CPU scratch.
 */
#ifndef OTEL_GPU_NATIVE_UNWIND_H
#define OTEL_GPU_NATIVE_UNWIND_H

#include "common.h"
#include "cpu_profiler.h"

#ifdef __BPF__ /* BPF code only: tests/ebpf/test_abi.py compiles every header of this folder for user space */

#define UNWIND_ROWS 1048576         /* the agent sets max_entries (CPUSampler's unwind_rows) */
#define UNWIND_ROW_STEPS 26         /* binary-search steps within one file: 2^26 rows (512 MiB) > any file's table */
#define UNWIND_MAPPING_STEPS 9      /* 2^9 > OTEL_GPU_UNWIND_MAX_MAPPINGS */

struct {
    __uint(type, BPF_MAP_TYPE_ARRAY);
    __uint(max_entries, UNWIND_ROWS);
    __uint(map_flags, 1024); /* BPF_F_MMAPABLE: the agent writes a file's rows with one copy */
    __type(key, __u32);
    __type(value, struct otel_gpu_unwind_row);
} unwind_rows SEC(".maps");

struct {
    __uint(type, BPF_MAP_TYPE_HASH);
    __uint(max_entries, 1024);
    __type(key, __u32); /* tgid */
    __type(value, struct otel_gpu_unwind_process);
} unwind_processes SEC(".maps");

/* Per file id (otel_gpu_unwind_mapping.file_id), the frames looked up in it: tells the agent which files samples
 * hit, so that it builds tables only for those (a file without a table is walked by frame pointer until then) and
 * evicts the least recently hit when unwind_rows is full. Mmap-able: the agent reads it without a syscall. */
struct {
    __uint(type, BPF_MAP_TYPE_ARRAY);
    __uint(max_entries, OTEL_GPU_UNWIND_MAX_FILES);
    __uint(map_flags, 1024); /* BPF_F_MMAPABLE */
    __type(key, __u32);
    __type(value, __u64);
} unwind_file_hits SEC(".maps");

/* Processes whose walk met a pc outside every registered mapping (a library loaded after registration, as torch
 * loads its libraries): the agent reads their mappings again. Set once until the agent takes it. */
struct {
    __uint(type, BPF_MAP_TYPE_HASH);
    __uint(max_entries, 1024);
    __type(key, __u32);  /* tgid */
    __type(value, __u8);
} unwind_remap SEC(".maps");

/* rbp is taken as a frame pointer only within this distance above rsp (a thread's stack is 8 MiB by default). */
#define UNWIND_MAX_FRAME_BYTES (8ULL << 20)

struct native_unwind_state {
    __u64 pc;
    __u64 sp;
    __u64 bp;
    __u32 pid;
    __u32 stop; /* 0: go on; else the stat that says why the walk ended (OTEL_GPU_STAT_COUNT: a normal end) */
    __u32 fp_step; /* the last step was by frame pointer (no table): its caller may be garbage */
    __u32 reserved;
    struct otel_gpu_unwound_stack stack; /* the frames so far and their running hash */
};

struct {
    __uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
    __uint(max_entries, 1);
    __type(key, __u32);
    __type(value, struct native_unwind_state);
} unwind_scratch SEC(".maps");

struct native_unwind_search {
    __u64 pc;
    __u32 low;
    __u32 high;
    __u32 pid; /* for the mapping search: whose mappings */
    __u32 reserved;
};

/* One binary-search step over the process's mappings (re-looked up: a callback cannot be handed a map value). */
static long unwind_mapping_step(__u32 index, struct native_unwind_search *search) {
    if (search->low >= search->high)
        return 1;
    __u32 pid = search->pid;
    struct otel_gpu_unwind_process *proc = bpf_map_lookup_elem(&unwind_processes, &pid);
    if (!proc)
        return 1;
    __u32 mid = (search->low + search->high) / 2;
    if (proc->mappings[mid & (OTEL_GPU_UNWIND_MAX_MAPPINGS - 1)].start <= search->pc)
        search->low = mid + 1;
    else
        search->high = mid;
    return 0;
}

/* The last mapping whose start <= pc, if pc < its end. */
static __always_inline struct otel_gpu_unwind_mapping *unwind_find_mapping(struct otel_gpu_unwind_process *proc,
                                                                           __u32 pid, __u64 pc) {
    __u32 count = proc->count;
    struct native_unwind_search search = {.pc = pc, .low = 0, .pid = pid,
                                          .high = count > OTEL_GPU_UNWIND_MAX_MAPPINGS ? OTEL_GPU_UNWIND_MAX_MAPPINGS
                                                                                       : count};
    bpf_loop(UNWIND_MAPPING_STEPS, unwind_mapping_step, &search, 0);
    if (search.low == 0)
        return 0;
    struct otel_gpu_unwind_mapping *found = &proc->mappings[(search.low - 1) & (OTEL_GPU_UNWIND_MAX_MAPPINGS - 1)];
    return pc < found->end ? found : 0;
}

/* One binary-search step over unwind_rows; its own bpf_loop callback, so the verifier checks one step, not every
 * path through UNWIND_ROW_STEPS of them (that took seconds at load). */
static long unwind_search_step(__u32 index, struct native_unwind_search *search) {
    if (search->low >= search->high)
        return 1;
    __u32 mid = search->low + (search->high - search->low) / 2;
    struct otel_gpu_unwind_row *row = bpf_map_lookup_elem(&unwind_rows, &mid);
    if (!row)
        return 1;
    if (row->pc <= search->pc)
        search->low = mid + 1;
    else
        search->high = mid;
    return 0;
}

/* The rule for pc (an offset from the table's base) among the file's rows; 0 when pc is before the first row. */
static __always_inline struct otel_gpu_unwind_row *unwind_find_row(struct otel_gpu_unwind_mapping *mapping, __u32 pc) {
    struct native_unwind_search search = {.pc = pc, .low = mapping->first_row,
                                          .high = mapping->first_row + mapping->row_count};
    __u32 first = search.low;
    bpf_loop(UNWIND_ROW_STEPS, unwind_search_step, &search, 0);
    if (search.low == first)
        return 0;
    __u32 index = search.low - 1;
    return bpf_map_lookup_elem(&unwind_rows, &index);
}

/* A row's rule, unpacked (see OTEL_GPU_UNWIND_KIND_BITS): the offsets are sign-extended by arithmetic shifts. */
static __always_inline __u32 unwind_rule_kind(__u32 rule) {
    return rule & ((1U << OTEL_GPU_UNWIND_KIND_BITS) - 1);
}

static __always_inline __s32 unwind_rule_rbp_offset(__u32 rule) {
    __u32 above = 32 - OTEL_GPU_UNWIND_KIND_BITS - OTEL_GPU_UNWIND_RBP_BITS; /* the bits above rbp_offset's */
    return (__s32)(rule << above) >> (32 - OTEL_GPU_UNWIND_RBP_BITS);
}

static __always_inline __s32 unwind_rule_cfa_offset(__u32 rule) {
    return (__s32)rule >> (OTEL_GPU_UNWIND_KIND_BITS + OTEL_GPU_UNWIND_RBP_BITS);
}

static long unwind_step(__u32 index, void *unused) {
    __u32 zero = 0;
    struct native_unwind_state *st = bpf_map_lookup_elem(&unwind_scratch, &zero);
    if (!st)
        return 1;
    if (st->stack.depth >= OTEL_GPU_MAX_STACK_DEPTH) {
        st->stop = OTEL_GPU_STAT_UNWIND_TRUNCATED;
        return 1;
    }
    __u32 depth = st->stack.depth;
    if (depth >= OTEL_GPU_MAX_STACK_DEPTH) /* again, in a register the verifier follows */
        return 1;
    __u64 hash_before = st->stack.hash;
    st->stack.frames[depth] = st->pc;
    st->stack.depth = depth + 1;
    st->stack.hash = (hash_before ^ st->pc) * 0x100000001b3ULL; /* FNV-1a over 8-byte words */
    __u32 pid = st->pid;
    struct otel_gpu_unwind_process *proc = bpf_map_lookup_elem(&unwind_processes, &pid);
    if (!proc) {
        st->stop = OTEL_GPU_STAT_UNWIND_NO_MAPPING;
        return 1;
    }
    /* A caller's pc is a return address: the call instruction is the byte before it (which matters when the call
     * is the last instruction of a function or of a rule's range). */
    __u64 lookup = st->stack.depth > 1 ? st->pc - 1 : st->pc;
    struct otel_gpu_unwind_mapping *mapping = unwind_find_mapping(proc, pid, lookup);
    if (!mapping) {
        if (st->fp_step) { /* a frame-pointer step from code without a table gave a pc no file holds: garbage, */
            st->stack.depth = depth; /* so it is no frame */
            st->stack.hash = hash_before;
            st->stop = OTEL_GPU_STAT_UNWIND_BAD_FP;
            return 1;
        }
        __u8 one = 1; /* else maybe a library loaded since the process was registered: read its maps again */
        bpf_map_update_elem(&unwind_remap, &pid, &one, BPF_NOEXIST);
        st->stop = OTEL_GPU_STAT_UNWIND_NO_MAPPING;
        return 1;
    }
    __u32 file_id = mapping->file_id;
    if (file_id) {
        __u64 *hits = bpf_map_lookup_elem(&unwind_file_hits, &file_id);
        if (hits)
            __sync_fetch_and_add(hits, 1);
    }
    /* Before the table's base the offset wraps past 32 bits: no row covers it, as none covers the code after it. */
    __u64 offset = lookup - mapping->bias;
    struct otel_gpu_unwind_row *row = mapping->row_count && offset <= 0xFFFFFFFFULL ? unwind_find_row(mapping, offset)
                                                                                    : 0;
    __u32 rule = row ? row->rule : OTEL_GPU_UNWIND_NONE;
    __u32 kind = unwind_rule_kind(rule);
    __u64 cfa;
    __s32 rbp_offset;
    if (kind == OTEL_GPU_UNWIND_END) {
        st->stop = OTEL_GPU_STAT_COUNT;
        return 1;
    } else if (kind == OTEL_GPU_UNWIND_RSP || kind == OTEL_GPU_UNWIND_RBP) {
        cfa = (kind == OTEL_GPU_UNWIND_RSP ? st->sp : st->bp) + unwind_rule_cfa_offset(rule);
        rbp_offset = unwind_rule_rbp_offset(rule);
        st->fp_step = 0;
    } else if (kind == OTEL_GPU_UNWIND_NONE) {
        if (st->bp == 0) { /* the outermost frame-pointer frame */
            st->stop = OTEL_GPU_STAT_COUNT;
            return 1;
        }
        /* Code built without frame pointers uses rbp as an ordinary register: a value below the stack pointer or
         * far above it would make a garbage caller (and then a failed read or an unmapped pc). Stop, and say why. */
        if (st->bp < st->sp || st->bp - st->sp > UNWIND_MAX_FRAME_BYTES) {
            st->stop = OTEL_GPU_STAT_UNWIND_BAD_FP;
            return 1;
        }
        bump(OTEL_GPU_STAT_UNWIND_FP_FRAMES);
        cfa = st->bp + 16;
        rbp_offset = -16;
        st->fp_step = 1;
    } else {
        st->stop = OTEL_GPU_STAT_UNWIND_UNSUPPORTED;
        return 1;
    }
    __u64 ra = 0;
    if (bpf_probe_read_user(&ra, sizeof(ra), (void *)(cfa - 8))) {
        st->stop = OTEL_GPU_STAT_UNWIND_READ_FAILED;
        return 1;
    }
    if (rbp_offset) {
        __u64 bp = 0;
        if (bpf_probe_read_user(&bp, sizeof(bp), (void *)(cfa + rbp_offset))) {
            st->stop = OTEL_GPU_STAT_UNWIND_READ_FAILED;
            return 1;
        }
        st->bp = bp;
    }
    if (ra == 0) { /* a zeroed return address ends the stack (the thread's first frame) */
        st->stop = OTEL_GPU_STAT_COUNT;
        return 1;
    }
    st->pc = ra;
    st->sp = cfa;
    return 0;
}

/* Whether the agent registered unwind tables for this process. */
static __always_inline int native_unwind_wanted(__u32 pid) {
    return bpf_map_lookup_elem(&unwind_processes, &pid) != 0;
}

/* Walk the user stack from the registers pc, sp, bp of process pid. Returns the walk's per-CPU state (the frames, leaf
 * first, in st->stack), valid until the next walk on this CPU; 0 when the state is missing. Counts the walk and the
 * reason it stopped early, if it did. */
static __always_inline struct native_unwind_state *native_unwind_walk(__u32 pid, __u64 pc, __u64 sp, __u64 bp) {
    __u32 zero = 0;
    struct native_unwind_state *st = bpf_map_lookup_elem(&unwind_scratch, &zero);
    if (!st)
        return 0;
    st->pc = pc;
    st->sp = sp;
    st->bp = bp;
    st->pid = pid;
    st->stop = 0;
    st->fp_step = 0;
    st->stack.depth = 0;
    st->stack.hash = 0xcbf29ce484222325ULL;
    bpf_loop(OTEL_GPU_MAX_STACK_DEPTH + 1, unwind_step, 0, 0);
    if (st->stop && st->stop != OTEL_GPU_STAT_COUNT)
        bump(st->stop);
    bump(OTEL_GPU_STAT_UNWIND_SAMPLES);
    return st;
}

/* The same, from a perf event's registers (sampled in user mode) or the ones the task entered the kernel with. */
static __always_inline struct native_unwind_state *native_unwind_perf(struct bpf_perf_event_data *ctx, __u32 pid) {
    __u64 pc, sp, bp;
    /* volatile: the context allows only whole 8-byte loads, and `cs & 3` would otherwise become a 2-byte one */
    __u64 cs = *(volatile __u64 *)&ctx->regs.cs;
    if ((cs & 3) == 3) { /* sampled in user mode; volatile loads keep each one a plain ctx load */
        pc = *(volatile __u64 *)&ctx->regs.ip;
        sp = *(volatile __u64 *)&ctx->regs.sp;
        bp = *(volatile __u64 *)&ctx->regs.bp;
    } else { /* in the kernel: the registers the task entered it with */
        struct pt_regs *regs = (struct pt_regs *)bpf_task_pt_regs(bpf_get_current_task_btf());
        if (!regs || bpf_probe_read_kernel(&pc, sizeof(pc), &regs->ip) ||
            bpf_probe_read_kernel(&sp, sizeof(sp), &regs->sp) || bpf_probe_read_kernel(&bp, sizeof(bp), &regs->bp)) {
            bump(OTEL_GPU_STAT_UNWIND_NO_REGS);
            return 0;
        }
    }
    return native_unwind_walk(pid, pc, sp, bp);
}

/* Copy a walk's frames into frames (OTEL_GPU_MAX_STACK_DEPTH entries); returns the bytes written, or < 0. */
static __always_inline long native_unwind_copy(struct native_unwind_state *st, __u64 *frames) {
    __u32 depth = st->stack.depth;
    if (depth > OTEL_GPU_MAX_STACK_DEPTH)
        depth = OTEL_GPU_MAX_STACK_DEPTH;
    if (depth == 0)
        return 0;
    if (bpf_probe_read_kernel(frames, depth * sizeof(__u64), st->stack.frames))
        return -1;
    return depth * sizeof(__u64);
}

#endif /* __BPF__ */
#endif /* OTEL_GPU_NATIVE_UNWIND_H */
