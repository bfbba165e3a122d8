/* SPDX-License-Identifier: GPL-2.0 OR BSD-2-Clause */
/*
 * What the CPU sampler (cpu_profiler.bpf.c) shares with user space: its map keys and values, ring-buffer records
 * and statistics. otel_gpu/ebpf/abi.py mirrors it with ctypes; tests/ebpf/test_abi.py compiles a C program that
 * prints the sizes and offsets below and compares them with the mirror.
 */
#ifndef OTEL_GPU_CPU_PROFILER_H
#define OTEL_GPU_CPU_PROFILER_H

#ifdef __BPF__
/* vmlinux.h provides __u32/__s32/__u64 */
#else
#include <linux/types.h>
#endif

#include "common.h"

#define OTEL_GPU_MAX_STACK_DEPTH 127

/* The CPU sampler's statistics (a per-CPU array indexed by this enum). */
enum otel_gpu_cpu_stat {
    OTEL_GPU_STAT_SAMPLES = 0,          /* samples taken (after filters) */
    OTEL_GPU_STAT_FILTERED = 1,         /* samples skipped by the pid filter or the agent's own tgid */
    OTEL_GPU_STAT_USER_COLLISION = 2,   /* bpf_get_stackid -EEXIST on the user stack, or an unwound stack's id
                                         * held by another stack: the sample went whole through raw_samples */
    OTEL_GPU_STAT_KERNEL_COLLISION = 3, /* same for the kernel stack */
    OTEL_GPU_STAT_STACK_ERROR = 4,      /* bpf_get_stackid failed otherwise (-ENOMEM, ...), user or kernel */
    OTEL_GPU_STAT_COUNTS_FULL = 5,      /* the counts map was full: sample dropped */
    OTEL_GPU_STAT_EVENTS_FULL = 6,      /* the process-event ring buffer was full: new-process event dropped */
    OTEL_GPU_STAT_RAW_SENT = 7,         /* samples sent whole through raw_samples (a stack id collided, raw_only) */
    OTEL_GPU_STAT_RAW_FULL = 8,         /* raw_samples was full: a collided sample lost its stacks */
    OTEL_GPU_STAT_PYTHON_SAMPLES = 9,      /* samples of a registered Python process with a Python stack */
    OTEL_GPU_STAT_PYTHON_NO_THREAD = 10,   /* registered process, but no PyThreadState for the sampled thread */
    OTEL_GPU_STAT_PYTHON_TRUNCATED = 11,   /* Python stack deeper than OTEL_GPU_MAX_PYTHON_DEPTH: outer frames cut */
    OTEL_GPU_STAT_PYTHON_STACKS_FULL = 12, /* python_stacks could not take the stack: its frames are lost */
    /* native_unwind.h: user stacks unwound from .eh_frame tables, and why a walk stopped early */
    OTEL_GPU_STAT_UNWIND_SAMPLES = 13,     /* samples whose user stack was unwound with tables */
    OTEL_GPU_STAT_UNWIND_FP_FRAMES = 14,  /* frames stepped by frame pointer (no table covered the pc) */
    OTEL_GPU_STAT_UNWIND_NO_MAPPING = 15, /* a pc outside every mapping the agent registered (JIT, new dlopen) */
    OTEL_GPU_STAT_UNWIND_UNSUPPORTED = 16, /* a rule the walker does not follow (CFA expression, e.g. PLT) */
    OTEL_GPU_STAT_UNWIND_READ_FAILED = 17, /* reading the return address or saved rbp from the stack failed */
    OTEL_GPU_STAT_UNWIND_TRUNCATED = 18,  /* the stack was deeper than OTEL_GPU_MAX_STACK_DEPTH */
    OTEL_GPU_STAT_UNWIND_NO_REGS = 19,    /* the user registers could not be read */
    OTEL_GPU_STAT_UNWIND_BAD_FP = 20,     /* no table for the pc and rbp is no frame pointer (below rsp or far
                                           * above it), or the caller it gave is in no mapping: garbage */
    OTEL_GPU_STAT_PYTHON_EVENTS_FULL = 21, /* python_events was full: a new Python stack is read at the drain only */
    OTEL_GPU_STAT_COUNT = 22,
};

/* native_unwind.h's maps, written by otel_gpu/unwind/: one rule per pc range of a file (rows of every file in
 * one array, each file's rows sorted by pc), and per process its executable mappings sorted by start. */
#define OTEL_GPU_UNWIND_MAX_MAPPINGS 256
#define OTEL_GPU_UNWIND_MAX_FILES 16384 /* file ids: unwind_file_hits holds one 8-byte counter each (128 KiB) */

enum otel_gpu_unwind_kind {
    OTEL_GPU_UNWIND_NONE = 0,        /* no FDE covers the pc: step by frame pointer */
    OTEL_GPU_UNWIND_RSP = 1,         /* CFA = rsp + cfa_offset */
    OTEL_GPU_UNWIND_RBP = 2,         /* CFA = rbp + cfa_offset */
    OTEL_GPU_UNWIND_END = 3,         /* the outermost frame (return address undefined) */
    OTEL_GPU_UNWIND_UNSUPPORTED = 4, /* anything else */
};

/* A row's rule in 32 bits, from the low bits up: kind (enum otel_gpu_unwind_kind), rbp_offset (signed), cfa_offset
 * (signed). The widths hold every rule of this machine's libraries (CFA offsets up to 540,128, saved rbp at most
 * 80 below the CFA: docs/benchmarks.md, "8-byte unwind rows"); a rule whose offsets do not fit is UNSUPPORTED. */
#define OTEL_GPU_UNWIND_KIND_BITS 3
#define OTEL_GPU_UNWIND_RBP_BITS 8
#define OTEL_GPU_UNWIND_CFA_BITS 21

/* From pc on until the next row: return address at CFA-8, rbp saved at CFA+rbp_offset (0: rbp unchanged). pc is the
 * link-time address less the table's base (its first row's), which the mapping's bias includes: 32 bits hold any
 * file whose code spans less than 4 GiB (a larger one gets no table). 8 bytes a row: 2 Mi rows are 16 MiB. */
struct otel_gpu_unwind_row {
    __u32 pc;
    __u32 rule;
};

struct otel_gpu_unwind_mapping {
    __u64 start;       /* [start, end): the mapping's addresses in the process */
    __u64 end;
    __u64 bias;        /* address - bias = pc in the file's rows (link-time address - the table's base) */
    __u32 first_row;   /* the file's rows: [first_row, first_row + row_count) of unwind_rows */
    __u32 row_count;   /* 0: no table (yet, or none: no frame information, too large, no room): frame pointers */
    __u32 file_id;     /* the agent's id of the file (index of unwind_file_hits); 0: none */
    __u32 reserved;
};

struct otel_gpu_unwind_process {
    __u32 count; /* mappings used, sorted by start */
    __u32 reserved;
    struct otel_gpu_unwind_mapping mappings[OTEL_GPU_UNWIND_MAX_MAPPINGS];
};

/* A user stack walked by native_unwind.h, counted in the kernel like a frame-pointer one: kept in the generation's
 * unwound_stacks map under a 32-bit id made from a hash of its frames, with OTEL_GPU_UNWOUND_ID_BASE set (stack-map
 * ids stay below it), which the sample key carries as its user_stack_id. An id already held by another stack (its
 * hash or depth differ) sends the sample whole through raw_samples instead. */
#define OTEL_GPU_UNWOUND_ID_BASE 0x40000000

struct otel_gpu_unwound_stack {
    __u64 hash;  /* of the frames, leaf first */
    __u32 depth; /* frames used */
    __u32 reserved;
    __u64 frames[OTEL_GPU_MAX_STACK_DEPTH];
};

/* Key of the aggregated counts: one entry per distinct (process image, thread, user stack, kernel stack). */
struct otel_gpu_sample_key {
    __u32 pid;             /* tgid */
    __u32 tid;
    __s32 user_stack_id;   /* id in the generation's stack map, < 0 when there is none (error code) */
    __s32 kernel_stack_id; /* id in the generation's stack map, < 0 when the sample was taken in user mode */
    __u64 python_stack_id; /* key in python_stacks, 0 when the thread runs no Python code (python_frames.h) */
    __u8 trace_id[16];     /* the trace the thread was in (span_context.h), all zero outside one */
    __u8 span_id[8];       /* the local root of its active span (span_context.h: otel_gpu_span_ids) */
    __u32 exec_id;         /* the task's self_exec_id (low 32 bits): one more after each exec, so the samples of
                            * the program a process ran before an exec are told apart from those of the one after */
    __u32 reserved;
};

struct otel_gpu_sample_value {
    __u64 count;
    char comm[OTEL_GPU_COMM_LEN]; /* the thread's name when the entry was created */
};

/* Sent through the process_events ring buffer the first time a process is sampled, and again at the first sample
 * after each exec, so user space can read /proc/PID/maps while that program still runs. */
struct otel_gpu_process_event {
    __u32 pid;
    __u32 tid;
    __u64 time_ns; /* bpf_ktime_get_ns() */
    char comm[OTEL_GPU_COMM_LEN];
    __u32 exec_id;   /* as in otel_gpu_sample_key */
    __u32 reserved;
    __u64 arg_start; /* mm->arg_start: placed anew (stack randomization) by each exec, and shown in /proc/PID/stat
                      * (field 48), so user space can tell whether what it reads there is still this program's */
};

/* Sent through the python_events ring buffer when a Python stack is first stored in python_stacks, so user space can
 * read its code objects while the process still lives (a short job may exit before the next drain). Sent without a
 * wakeup: the agent picks these up at its next poll (every 250 ms at most), so they cost no thread wakeups. */
struct otel_gpu_python_stack_event {
    __u32 pid; /* tgid */
    __u32 reserved;
    __u64 stack_id; /* key in python_stacks */
};

/* A whole sample with its stacks (bpf_get_stack), sent through the raw_samples ring buffer instead of the counts
 * when bpf_get_stackid reports a stack-map collision (-EEXIST), so that a collision costs no sample. */
struct otel_gpu_raw_sample {
    __u32 pid;
    __u32 tid;
    __s32 user_bytes;   /* bytes written into user (bpf_get_stack), < 0: error */
    __s32 kernel_bytes; /* bytes written into kernel, < 0: error (-EFAULT in user mode) */
    char comm[OTEL_GPU_COMM_LEN];
    __u64 python_stack_id; /* as in otel_gpu_sample_key */
    __u64 user[OTEL_GPU_MAX_STACK_DEPTH];
    __u64 kernel[OTEL_GPU_MAX_STACK_DEPTH];
    __u8 trace_id[16];  /* as in otel_gpu_sample_key */
    __u8 span_id[8];
    __u32 exec_id;      /* as in otel_gpu_sample_key */
    __u32 reserved;
};

/* A registered CPython process (python_procs, keyed by tgid): where its main interpreter's pointer sits and the
 * offsets of the structures the BPF program reads, in bytes; OTEL_GPU_PYTHON_NO_OFFSET where the version has none. */
#define OTEL_GPU_PYTHON_NO_OFFSET 0xFFFF
/* Python frames read per sample, innermost first. Each costs the walk about five user-memory reads (its cost grows
 * only with the stacks that deep), and python_stacks' 16384 entries 12 bytes of preallocated map memory each
 * (128: 25 MB in all); deeper stacks are cut and flagged, and user space roots them in a truncation frame. */
#define OTEL_GPU_MAX_PYTHON_DEPTH 128
#define OTEL_GPU_PYTHON_ENTRY_WORDS (OTEL_GPU_MAX_PYTHON_DEPTH / 64) /* 64-bit words of otel_gpu_python_stack.entries */
#define OTEL_GPU_PYTHON_TRUNCATED 1 /* otel_gpu_python_stack.flags: the outermost frames were cut */

struct otel_gpu_python_proc {
    __u64 interpreters_head;    /* address of _PyRuntime.interpreters.head (PyInterpreterState *) */
    __u32 version;              /* Py_Version's major.minor, e.g. 0x030C0000 */
    __u16 interp_threads_head;  /* PyInterpreterState.threads.head (3.11+), .tstate_head (3.10) */
    __u16 tstate_next;          /* PyThreadState.next */
    __u16 tstate_thread_id;     /* PyThreadState.thread_id: pthread_self(), the task's fsbase */
    __u16 tstate_frame;         /* PyThreadState.frame (3.10), .cframe (3.11, 3.12), .current_frame (3.13+) */
    __u16 cframe_current;       /* _PyCFrame.current_frame (3.11, 3.12) */
    __u16 frame_code;           /* f_code, f_executable (3.13+) */
    __u16 frame_previous;       /* f_back (3.10), previous */
    __u16 frame_instr;          /* f_lasti (3.10), prev_instr (3.11, 3.12), instr_ptr (3.13+) */
    __u16 frame_owner;          /* _PyInterpreterFrame.owner (3.11+) */
    __u16 code_adaptive;        /* PyCodeObject.co_code_adaptive (3.11+): where frame_instr points into */
    __u16 frame_is_entry;       /* _PyInterpreterFrame.is_entry (3.11 only) */
    __u8 instr_is_lasti;        /* 1: frame_instr is an int of code units (3.10), 0: a pointer (3.11+) */
    __u8 owner_cstack;          /* FRAME_OWNED_BY_CSTACK (3.12+), 0xFF when the version has none */
    __u8 reserved[4];
};

/* One thread's Python stack, innermost first: code object addresses and instruction byte offsets into them.
 * Each native call of the interpreter's evaluation loop runs a run of frames; bit i of entries (word i / 64, bit
 * i % 64) marks frame i as
 * the outermost of its run (3.10: every frame; 3.11: is_entry; 3.12+: the frame under a C-stack shim frame), so
 * user space can put each run in place of its _PyEval_EvalFrameDefault frame in the native stack. */
struct otel_gpu_python_stack {
    __u32 depth;
    __u32 flags;
    __u64 entries[OTEL_GPU_PYTHON_ENTRY_WORDS];
    __u64 code[OTEL_GPU_MAX_PYTHON_DEPTH];
    __u32 offset[OTEL_GPU_MAX_PYTHON_DEPTH];
};

/* Single entry of the control array: which generation of counts/stack maps the sampler writes to (0 or 1).
 * User space flips it before draining the other generation, so no sample is lost while draining. */
struct otel_gpu_control {
    __u32 generation;
    __u32 reserved;
};

#endif /* OTEL_GPU_CPU_PROFILER_H */
