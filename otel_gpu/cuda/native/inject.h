/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Internal declarations of libotel_gpu_inject.so, the library the CUDA driver loads into a workload through
 * CUDA_INJECTION64_PATH. Only InitializeInjection is exported; everything here is hidden.
 *
 *   inject.c    InitializeInjection, loading CUPTI through dlopen/dlsym, the API callback, exit handling
 *   coexist.c   stepping aside when another tool of the program (torch.profiler, ...) starts using CUPTI
 *   cbids.c     which driver-API callback ids are launches and which are blocking waits
 *   hold.c      the hold on CUPTI: subscribe, finalize after a window, subscribe again, the CUDA graph guard
 *   hold_state.c  the hold's states and pure transitions
 *   window.c    the controller thread: time windows sized to the overhead budget, sampled waits
 *   activity.c  CUPTI activity buffers, the sampled-correlation filter, conversion to probe records
 *   stack.c     eh_frame unwinding of the calling thread and its CPython frames through the C API (GIL held)
 *   pyframes.c  CPython 3.11-3.13 frames read directly from the interpreter's structures (no GIL needed)
 *   emit.c      the USDT probes (with semaphores) and the test-only debug file
 *   graphs.c    exact replay counts of CUDA graphs per graph exec, reported in the window record
 */
#ifndef OTEL_GPU_INJECT_H
#define OTEL_GPU_INJECT_H

#include <stdatomic.h>
#include <stdint.h>

#include <cupti.h>

#include "graphs.h"
#include "otel_gpu_probes.h"

/* Every CUPTI function the library uses, resolved with dlsym so that tests can hand it a fake libcupti. */
struct cupti_api {
    CUptiResult (*subscribe)(CUpti_SubscriberHandle *, CUpti_CallbackFunc, void *);
    CUptiResult (*subscribe_v2)(CUpti_SubscriberHandle *, CUpti_CallbackFunc, void *, CUpti_SubscriberParams *);
    CUptiResult (*unsubscribe)(CUpti_SubscriberHandle);
    CUptiResult (*enable_callback)(uint32_t, CUpti_SubscriberHandle, CUpti_CallbackDomain, CUpti_CallbackId);
    CUptiResult (*activity_enable)(CUpti_ActivityKind);
    CUptiResult (*activity_disable)(CUpti_ActivityKind);
    CUptiResult (*activity_register_callbacks)(CUpti_BuffersCallbackRequestFunc, CUpti_BuffersCallbackCompleteFunc);
    CUptiResult (*activity_flush_all)(uint32_t);
    CUptiResult (*activity_get_next_record)(uint8_t *, size_t, CUpti_Activity **);
    CUptiResult (*get_timestamp)(uint64_t *);
    CUptiResult (*get_result_string)(CUptiResult, const char **);
    CUptiResult (*activity_get_num_dropped)(CUcontext, uint32_t, size_t *); /* optional */
    CUptiResult (*finalize)(void); /* optional */
    CUptiResult (*get_device_id)(CUcontext, uint32_t *); /* optional */
};

/* g_cbid_class[cbid]: low 3 bits = enum otel_gpu_launch_kind (0 if not a launch), bit 3 = the call creates or runs a
 * CUDA graph, high bits = enum otel_gpu_sync_kind. */
#define CLASS_LAUNCH_MASK 0x07
#define CLASS_GRAPH_USE 0x08
#define CLASS_WAIT_SHIFT 4

extern struct cupti_api g_cupti;
extern CUpti_SubscriberHandle g_subscriber;
extern uint8_t g_cbid_class[CUPTI_DRIVER_TRACE_CBID_SIZE];

/* OTEL_GPU_DEBUG_CHARGE_TAKE: the takes of CUPTI after finalizes charged to the budget by their wall time (capped:
 * hold.c), by the controller's CPU time in them (cpu), or not at all (0). */
enum charge_take { CHARGE_TAKE_NONE, CHARGE_TAKE_WALL, CHARGE_TAKE_CPU };

/* Settings read once from the environment at InitializeInjection. */
struct inject_settings {
    double overhead_budget;    /* OTEL_GPU_OVERHEAD_BUDGET: allowed slowdown, fraction of wall time (0.02) */
    double max_waits_per_s;    /* OTEL_GPU_MAX_WAITS_PER_S: waits recorded per second at most, on average (100) */
    uint64_t window_ns;        /* OTEL_GPU_WINDOW_MS: length of one sampling window */
    int debug_always_on;       /* OTEL_GPU_DEBUG_ALWAYS_ON=1: behave as if an agent were attached (tests only) */
    int debug_stats;           /* OTEL_GPU_DEBUG_STATS=1: diagnostics lines on stderr at exit (window.c) */
    int api_activity;          /* the driver-API activity kind is on with the others (OTEL_GPU_API_ACTIVITY=0: off) */
    int debug_no_waits;        /* OTEL_GPU_DEBUG_NO_WAITS=1: diagnostics, never switch the wait callbacks on */
    int debug_no_windows;      /* OTEL_GPU_DEBUG_NO_WINDOWS=1: diagnostics, attach but never open a window */
    int cupti_finalize;        /* CUPTI is finalized after each window (OTEL_GPU_CUPTI_FINALIZE=0: never) */
    int finalize_with_graphs;  /* OTEL_GPU_DEBUG_FINALIZE_WITH_GRAPHS=1: finalize even once graphs are in use (the
                                * crash-prone behaviour, kept as a control for scripts/h200/do_no_harm.py) */
    int idle_keep;             /* OTEL_GPU_DEBUG_IDLE_KEEP=1: a window and its linger that saw no launch leave CUPTI
                                * subscribed without a finalize (window.c) */
    int finalize_at_once;      /* on unless OTEL_GPU_FINALIZE_AT_ONCE=0: a program that never synchronizes is
                                * finalized at its next launch's exit once the patience ran out three times in a row
                                * (hold.c) */
    enum charge_take charge_take; /* what the budget is charged for the takes after finalizes */
    int sample_graphs;         /* OTEL_GPU_CUDA_GRAPHS=sample: keep sampling once graphs are in use whatever it costs */
    double graph_residue_ns;   /* what each launch is assumed to keep paying once the activity kinds were on (window.c;
                                * OTEL_GPU_DEBUG_GRAPH_RESIDUE_NS sets it for tests) */
    uint64_t graph_probe_every_ns; /* the least time between looks at the launch rate (window.c; 1 s, or
                                    * OTEL_GPU_DEBUG_GRAPH_PROBE_EVERY_MS for tests) */
};
extern struct inject_settings g_settings;

/* Once a window had CUPTI's activity kinds on, each launch stays this much slower until CUPTI is finalized: the worst
 * kind measured (the driver-API records) with a margin (scripts/h200/cupti_residue.py; docs/benchmarks.md). */
#define GRAPH_RESIDUE_NS_PER_LAUNCH 2500.0

/* What the API callback (inject.c) and the window controller (window.c) share, and activity.c adds its time to; each
 * file keeps the rest of its state to itself. */
struct inject_state {
    _Atomic uint64_t window_id;        /* id of the open window, 0 while none is open */
    _Atomic uint64_t window_launches;  /* launches recorded in the open window */
    _Atomic uint64_t overhead_ns;      /* time spent in the library's callbacks since the last window closed */
    _Atomic uint64_t wait_overhead_ns; /* time spent recording waits since the controller last looked */
    _Atomic uint32_t wait_sample_every; /* record one blocking wait in N (N >= 1); the record's weight is N */
    _Atomic uint64_t waits_recorded;   /* waits recorded since the controller last looked */
    _Atomic uint64_t waits_seen;       /* blocking waits that ended while attached (seen at entry and exit) */
    _Atomic uint32_t in_launch;        /* API callbacks currently recording a launch */
    _Atomic uint32_t launches_entered; /* launch calls that entered inside a window and have not exited yet: the
                                        * linger keeps activity on for them (window.c) */
    _Atomic uint64_t outside_launches; /* launches seen outside a window (callbacks on for the linger) */
    _Atomic int attached;              /* an agent is attached (or the debug mode pretends so) */
};
extern struct inject_state g_state;

/* Another tool's use of CUPTI, as seen through coexist.c's wrappers. */
struct foreign_state {
    _Atomic uintptr_t subscriber;    /* the other tool's subscriber handle, 0 when it holds none */
    _Atomic uint64_t kinds;          /* activity kinds the other tool has enabled (bit per CUpti_ActivityKind < 64) */
    _Atomic uint64_t last_call_ns;   /* monotonic: its last CUPTI call */
};
extern struct foreign_state g_foreign;
#define FOREIGN_QUIET_NS 2000000000ull /* taken back after the other tool has been quiet this long: 2 s */

/* inject.c */
uint64_t now_ns(void);            /* CUPTI's timestamp clock */
uint64_t monotonic_ns(void);      /* for measuring the library's own cost */
uint64_t random_u64(void);        /* the library's one random source: xorshift64, one state per thread */
double random_uniform01(void);    /* uniform in [0, 1), from random_u64 */
void log_once(const char *what);  /* one "otel-gpu:" line on stderr per distinct message site */
void inject_print_stats(void);    /* OTEL_GPU_DEBUG_STATS: how launch exits in windows paired */

/* The API callback CUPTI calls (inject.c; hold.c subscribes it). */
void CUPTIAPI inject_callback(void *userdata, CUpti_CallbackDomain domain, CUpti_CallbackId cbid, const void *data);

/* hold.c: the hold on CUPTI (states and transitions in hold_state.h). The controller's side, under window.c's lock: */
int hold_take(void);                 /* subscribe unless held, buffers, wait and graph callbacks on; 0 on success */
int hold_holding(void);              /* whether subscribed; a finalize asked for is called off, one running awaited */
void hold_settle(void);              /* a finalize an API exit has completed: CUPTI is no longer held */
void hold_let_go(void);              /* kinds and launch callbacks off, then (if allowed) a finalize asked for */
void hold_keep(void);                /* kinds and launch callbacks off, no finalize: nothing was launched (window.c) */
void hold_hurry(int launches_wanted); /* after FINALIZE_PATIENCE_NS without a synchronize: any API exit finalizes */
void hold_release(void);             /* unsubscribe */
void hold_release_unless_asked(void); /* unsubscribe unless a finalize was asked for (detach) */
void hold_step_aside(void);          /* after the release: left to another CUPTI user until taken back */
void hold_take_back(void);           /* the other user is done: CUPTI may be subscribed again */
int hold_aside(void);                /* (any thread) stepped aside for another CUPTI user */
int hold_finalized(void);            /* an API exit finalized CUPTI, not yet settled */
int hold_undisturbed(void);          /* subscribed, no finalize pending */
void hold_mark_dirty(void);          /* an activity kind goes on: launches pay until the next finalize */
int hold_dirty(void);
int hold_graphs_seen(void);
uint64_t hold_finalize_ns(void);     /* API exits' time in cuptiFinalize charged to the budget (capped each) */
uint64_t hold_retake_ns(void);       /* the takes of CUPTI after finalizes charged to the budget, in all */
void hold_print_stats(void);         /* OTEL_GPU_DEBUG_STATS lines on finalizes and graphs */
/* The API side, any thread: */
void hold_graph_use(void);           /* a graph call's entry: CUPTI is never finalized again (nor here) */
void hold_api_exit(uint32_t wait_kind); /* an API exit: performs an asked-for finalize where it may */

/* cbids.c */
void cbids_init(void);
int cbids_enable_launches(uint32_t enable);
int cbids_enable_waits(uint32_t enable);
int cbids_enable_graph_watch(uint32_t enable);

/* coexist.c */
void coexist_init(void);
void coexist_rescan(void);
int coexist_foreign_done(uint64_t now_monotonic_ns);
uint64_t coexist_slots_patched(void);
uint64_t coexist_dlsym_slots_patched(void);
uint64_t coexist_lookups_diverted(void);

/* window.c */
int window_start(void);
void window_step_aside(void);
void window_wake(void);
void window_stop_and_flush(void);

/* activity.c */
int activity_init(void);
int activity_enable(int enable);
void activity_remember(uint32_t correlation_id, uint64_t window_id, int is_graph);
uint32_t activity_expire(uint64_t max_lag_ns);
uint32_t activity_outstanding(void);
uint64_t activity_take_dropped(void);
void activity_drain(uint64_t max_wait_ns);

/* stack.c */
void stack_init(void);
void stack_capture(struct otel_gpu_stack *stack);
/* context.c: the span this thread is in, all zero outside one; 1 when in one */
int span_context_read(struct otel_gpu_span *out);
/* Adds a device (ordinal) to the mask of the local root the last span_context_read found this thread in, if any. */
void span_context_note_device(int device);

/* pyframes.c */
int pyframes_init(void);
int pyframes_capture(struct otel_gpu_stack *stack);

/* emit.c */
int emit_init(void);
int emit_any_semaphore(void);
void emit_launch(const struct otel_gpu_launch *rec);
void emit_activity(const struct otel_gpu_activity *recs, uint32_t count);
void emit_sync(const struct otel_gpu_sync *rec);
void emit_window(const struct otel_gpu_window *rec);


#endif /* OTEL_GPU_INJECT_H */
