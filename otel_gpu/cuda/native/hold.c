/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The library's hold on CUPTI: subscribing, the finalize after each window and the subscription taken again, the
 * graph guard and the release when the library detaches or steps aside. The states and their transitions are
 * hold_state.c's (pure, tested alone); this file performs them on CUPTI, one atomic state changed by compare-and-swap.
 * Stepping aside for another CUPTI user of the program (coexist.c sees it start) is a state of the same hold: released,
 * and not subscribed again until the controller takes CUPTI back.
 * The controller's side runs under window.c's lock; the API side (hold_graph_use, hold_api_exit) in any of the
 * program's threads, without a lock (the thread may hold driver locks the controller waits on).
 *
 * CUPTI takes one subscriber per process: holding it only while an agent is attached leaves it to other tools
 * (torch.profiler, Nsight) the rest of the time.
 *
 * Why finalize: once a window has had the activity kinds on, CUPTI keeps slowing every launch down after they and the
 * callbacks are off again, for as long as it stays subscribed; only cuptiFinalize undoes it (scripts/h200/baton.py;
 * numbers in docs/benchmarks.md). So at a linger's end (and at detach) every record is flushed and a finalize is asked
 * for: the next exit of a synchronize call, in whatever thread, performs it (CUPTI's documented place for a dynamic
 * detach; any API exit after FINALIZE_PATIENCE_NS without one, and the next launch's exit at once after that happened
 * IMPATIENT_AFTER times in a row, unless OTEL_GPU_FINALIZE_AT_ONCE=0: a loop that never synchronizes otherwise runs
 * 50 ms slowed by the residue after each window), and the controller, woken by it, subscribes again at once so that
 * waits between windows are recorded.
 * Waits that begin between the finalize and the new subscription go unseen. OTEL_GPU_CUPTI_FINALIZE=0 keeps the
 * subscription.
 *
 * What a take costs the program: while the controller subscribes again the driver holds back the program's launches,
 * so a launch-bound program loses the take's wall time (8-12 ms on an H100 and an H200), of which the controller's
 * own CPU time is a fraction (an H200's baton lost +0.6 % on a 2 % budget with the wall time charged, +3-5 % with the
 * CPU time). A GPU-bound program's take lasts 290-390 ms, waiting for its queue while the GPU works through it: that
 * wait costs nothing, and charged in full it held the fraction at its floor. So each take is charged its wall time up
 * to CHARGE_MAX_NS (window.c adds the charge to the next window's cost, with the finalize's). The finalize is charged
 * the same way: ~2 ms of the program's thread in a launch-bound program, 70 ms and more in a GPU-bound one that it
 * catches with a full queue (an H100's matmul baton), waiting while the GPU works through it.
 *
 * CUDA graphs: a graph that ran under one CUPTI may fault when replayed under a re-initialised one (PyTorch's
 * profiler stopped tearing CUPTI down when graphs are in use, pytorch/pytorch#112507, and an H200 saw XID 31 under
 * the finalizing library), so once the process has captured, instantiated or launched a graph CUPTI is never
 * finalized again. The graph calls' callbacks stay on while subscribed, so the first one is seen at its entry; a
 * finalize asked for and not yet performed is called off right there (never performed at an entry: the driver goes
 * on into the call with CUPTI's state gone, and an H100 segfaulted in torch.cuda.graph's capture_begin, 2 runs in 20,
 * when it was). OTEL_GPU_DEBUG_FINALIZE_WITH_GRAPHS=1 finalizes anyway (the crash-prone control).
 */
#include <sched.h>
#include <stdio.h>
#include <time.h>

#include <cupti_activity.h>

#include "hold_state.h"
#include "inject.h"

#define FINALIZE_PATIENCE_NS 50000000ull /* a finalize waits this long for a wait's exit, then takes any: 50 ms */
#define CHARGE_MAX_NS 20000000ull        /* a finalize or a take is charged its wall time up to this: 20 ms (above) */
#define IMPATIENT_AFTER 3u   /* finalizes in a row that waited FINALIZE_PATIENCE_NS for nothing: the next ones at once */
#define PATIENT_EVERY 16u    /* ... but every 16th finalize waits again, in case the program synchronizes now */

CUpti_SubscriberHandle g_subscriber;

static _Atomic int state = HOLD_FREE;  /* enum hold_state */
static _Atomic int at_any_exit;        /* 0: only a synchronize's exit takes an asked-for finalize up; 1: any exit */
static _Atomic int graphs_seen;        /* the process has captured, instantiated or launched a CUDA graph: never
                                        * finalize CUPTI again (cbids.c) */
static _Atomic uint64_t graph_calls;   /* graph calls seen (diagnostics) */
static _Atomic int dirty;              /* activity kinds were on since CUPTI was last finalized: every launch pays for
                                        * that until the next finalize, whether or not a window is open */
static _Atomic uint64_t finalizes, finalize_ns; /* how often, and how long the API exits spent in cuptiFinalize */
static _Atomic uint64_t finalize_charged_ns;    /* that time, each finalize capped at CHARGE_MAX_NS (the budget's) */
static _Atomic uint64_t asked_ns;      /* controller: monotonic, when the finalize was asked for */
static uint64_t asks;                  /* controller: finalizes asked for */
static _Atomic uint32_t waited_in_vain; /* finalizes in a row performed at another exit after the patience ran out */
static _Atomic int asked_at_once;      /* the pending finalize was asked for at any exit from the start */
static _Atomic uint64_t at_sync_exit, after_patience, at_once; /* where finalizes were performed (stats) */
static _Atomic uint64_t ask_to_finalize_ns, at_once_ns; /* from ask to finalize, summed (all; those at once): the
                                                         * program runs with the kinds' residue meanwhile */
static uint64_t kept;                  /* controller: windows let go without a finalize, nothing launched in them */
static uint64_t retakes, retake_ns;    /* controller: subscriptions taken (attach, after each finalize), total time */
static uint64_t subscribed_ns;         /* controller: CPU time of the takes that subscribed (after a finalize) */
static uint64_t take_charged_ns;       /* controller: their wall time, each capped at CHARGE_MAX_NS (the budget's) */

/* What the budget is charged for a finalize or a take that lasted ``took`` ns (above). */
static uint64_t charged(uint64_t took)
{
    return took < CHARGE_MAX_NS ? took : CHARGE_MAX_NS;
}

/* Moves from the state the caller decided on; 0 when the event does not apply or another thread moved first. */
static int move(enum hold_event event, enum hold_state from)
{
    enum hold_state to = hold_next(from, event);
    int expected = (int)from;
    return to != from && atomic_compare_exchange_strong(&state, &expected, (int)to);
}

/* Moves from whatever the state is now, if the event applies to it. */
static int move_now(enum hold_event event)
{
    for (;;) {
        enum hold_state from = (enum hold_state)atomic_load(&state);
        if (hold_next(from, event) == from)
            return 0;
        if (move(event, from))
            return 1;
    }
}

static int may_finalize(void)
{
    struct hold_policy policy = {
        .has_finalize = g_cupti.finalize != NULL,
        .finalize_setting = g_settings.cupti_finalize,
        .graphs_seen = atomic_load(&graphs_seen),
        .finalize_with_graphs = g_settings.finalize_with_graphs,
    };
    return hold_may_finalize(&policy);
}

/* --- subscribing --------------------------------------------------------------------------------------------- */

/* Returns 0 when subscribed; logs once when another tool holds CUPTI. */
static int subscribe(void)
{
    CUptiResult rc;
    char holder[CUPTI_OLD_SUBSCRIBER_NAME_MIN_LEN] = "";
    if (g_cupti.subscribe_v2 != NULL) {
        CUpti_SubscriberParams params = {
            .structSize = CUpti_SubscriberParams_STRUCT_SIZE,
            .subscriberName = "otel-gpu",
            .oldSubscriberName = holder,
            .oldSubscriberSize = sizeof(holder),
        };
        rc = g_cupti.subscribe_v2(&g_subscriber, inject_callback, NULL, &params);
    } else {
        rc = g_cupti.subscribe(&g_subscriber, inject_callback, NULL);
    }
    if (rc == CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED) {
        static _Atomic int logged;
        if (!atomic_exchange(&logged, 1))
            fprintf(stderr,
                    "otel-gpu: CUPTI is in use by another tool%s%s; GPU-time profiling waits until it is free\n",
                    holder[0] ? ": " : "", holder);
        return -1;
    }
    if (rc != CUPTI_SUCCESS) {
        log_once("cuptiSubscribe failed; GPU-time profiling is off while it fails");
        return -1;
    }
    /* Rare, so on while subscribed: a destroyed context's records are flushed before they are lost. */
    if (g_cupti.enable_callback(1, g_subscriber, CUPTI_CB_DOMAIN_RESOURCE,
                                CUPTI_CBID_RESOURCE_CONTEXT_DESTROY_STARTING) != CUPTI_SUCCESS)
        log_once("cannot watch context destruction; records of a destroyed context may be lost");
    return 0;
}

void hold_release(void)
{
    g_cupti.unsubscribe(g_subscriber);
    g_subscriber = NULL;
    move_now(HOLD_RELEASED);
}

/* --- the controller's side (under window.c's lock) ------------------------------------------------------------ */

void hold_settle(void)
{
    move(HOLD_SETTLE, HOLD_FINALIZED);
}

int hold_holding(void)
{
    if (move(HOLD_CALL_OFF, HOLD_ASKED))
        return 1;
    while (atomic_load(&state) == HOLD_FINALIZING)
        sched_yield();
    hold_settle();
    enum hold_state s = (enum hold_state)atomic_load(&state);
    return s != HOLD_FREE && s != HOLD_ASIDE;
}

/* The calling thread's CPU time: what a take costs the machine's CPUs (its wall time also holds waits for the GPU:
 * ~8.5 ms of wall a take beside a launch-bound program on an H200, ~300 ms beside a queue of large matmuls). */
static uint64_t thread_cpu_ns(void)
{
    struct timespec ts;
    if (clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts) != 0)
        return 0;
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

int hold_take(void)
{
    uint64_t t0 = monotonic_ns(), cpu0 = thread_cpu_ns();
    if (hold_aside()) /* another tool stepped in while the controller's lock was let go (rescan): not ours to take */
        return -1;
    int subscribing = !hold_holding();
    if (subscribing) {
        if (subscribe() != 0)
            return -1;
        move(HOLD_SUBSCRIBED, HOLD_FREE);
    }
    cbids_enable_launches(0); /* a called-off finalize may have left them on (hold_hurry) */
    if (activity_init() != 0) {
        log_once("cannot register CUPTI activity buffers; GPU-time profiling is off while that fails");
        hold_release();
        return -1;
    }
    if (!g_settings.debug_no_waits && cbids_enable_waits(1) != 0)
        log_once("some blocking-call callbacks could not be enabled");
    if (cbids_enable_graph_watch(1) != 0)
        log_once("some CUDA graph callbacks could not be enabled");
    uint64_t took = monotonic_ns() - t0;
    retakes++;
    retake_ns += took;
    if (subscribing && retakes > 1) { /* not the first take at attach */
        subscribed_ns += thread_cpu_ns() - cpu0;
        take_charged_ns += charged(took);
    }
    return 0;
}

void hold_let_go(void)
{
    activity_enable(0);
    int finalizing = may_finalize();
    /* A program that did not synchronize within the patience the last few times (a launch-bound loop that never
     * waits) would run the patience out again, every launch slowed by the activity kinds' residue for those 50 ms:
     * the next launch's exit performs the finalize instead, as it would after the patience (the launch callbacks
     * stay on for it). */
    int at_once = finalizing && g_settings.finalize_at_once && atomic_load(&waited_in_vain) >= IMPATIENT_AFTER &&
                  ++asks % PATIENT_EVERY != 0;
    if (!at_once)
        cbids_enable_launches(0); /* after the kinds: no recorded launch goes without its own id */
    if (finalizing) {
        g_cupti.activity_flush_all(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
        atomic_store(&asked_at_once, at_once);
        atomic_store(&at_any_exit, at_once);
        atomic_store(&asked_ns, monotonic_ns());
        if (!move(HOLD_ASK, HOLD_HELD) && at_once) { /* not held after all: nothing for an exit to perform */
            atomic_store(&at_any_exit, 0);
            cbids_enable_launches(0);
        }
    }
}

void hold_keep(void)
{
    activity_enable(0);
    cbids_enable_launches(0); /* after the kinds, as in hold_let_go */
    atomic_store(&dirty, 0);  /* the kinds were on with no launch, and CUPTI was clean before (window.c) */
    kept++;
}

void hold_release_unless_asked(void)
{
    if (atomic_load(&state) != HOLD_ASKED)
        hold_release();
}

void hold_hurry(int launches_wanted)
{
    enum hold_state s = (enum hold_state)atomic_load(&state);
    int none_pending = s != HOLD_ASKED && s != HOLD_FINALIZING && s != HOLD_FINALIZED;
    if (none_pending && atomic_exchange(&at_any_exit, 0) && s == HOLD_HELD && !launches_wanted)
        cbids_enable_launches(0);
    if (atomic_load(&state) == HOLD_ASKED && !atomic_load(&at_any_exit) &&
        monotonic_ns() - asked_ns >= FINALIZE_PATIENCE_NS) {
        atomic_store(&at_any_exit, 1);
        cbids_enable_launches(1);
    }
}

void hold_step_aside(void)
{
    move(HOLD_STEP_ASIDE, HOLD_FREE);
}

void hold_take_back(void)
{
    move(HOLD_TAKE_BACK, HOLD_ASIDE);
}

int hold_aside(void)
{
    return atomic_load(&state) == HOLD_ASIDE;
}

int hold_finalized(void)
{
    return atomic_load(&state) == HOLD_FINALIZED;
}

int hold_undisturbed(void)
{
    return atomic_load(&state) == HOLD_HELD;
}

void hold_mark_dirty(void)
{
    atomic_store(&dirty, 1);
}

int hold_dirty(void)
{
    return atomic_load(&dirty);
}

int hold_graphs_seen(void)
{
    return atomic_load(&graphs_seen);
}

uint64_t hold_finalize_ns(void)
{
    return atomic_load(&finalize_charged_ns);
}

uint64_t hold_retake_ns(void)
{
    return g_settings.charge_take == CHARGE_TAKE_CPU ? subscribed_ns : take_charged_ns;
}

static double mean_us(uint64_t total_ns, uint64_t count)
{
    return count ? (double)total_ns / 1e3 / (double)count : 0.0;
}

void hold_print_stats(void)
{
    uint64_t count = atomic_load(&finalizes);
    fprintf(stderr, "otel-gpu: stats CUPTI finalized %llu times (%.0f us each in an API exit; %.0f ms charged in all), "
            "taken %llu times (%.0f us each; after finalizes %.0f ms of CPU, %.0f ms charged in all)\n",
            (unsigned long long)count, mean_us(atomic_load(&finalize_ns), count),
            (double)atomic_load(&finalize_charged_ns) / 1e6, (unsigned long long)retakes, mean_us(retake_ns, retakes),
            (double)subscribed_ns / 1e6, (double)take_charged_ns / 1e6);
    fprintf(stderr, "otel-gpu: stats finalizes at a synchronize's exit %llu, at another exit after %.0f ms without one "
            "%llu, at once (no synchronize within that the last %u times) %llu; %.1f ms from the ask each (those at once "
            "%.1f ms); kept without one after %llu windows that saw no launch\n",
            (unsigned long long)atomic_load(&at_sync_exit), (double)FINALIZE_PATIENCE_NS / 1e6,
            (unsigned long long)atomic_load(&after_patience), IMPATIENT_AFTER, (unsigned long long)atomic_load(&at_once),
            mean_us(atomic_load(&ask_to_finalize_ns), count) / 1e3,
            mean_us(atomic_load(&at_once_ns), atomic_load(&at_once)) / 1e3, (unsigned long long)kept);
    fprintf(stderr, "otel-gpu: stats CUDA graph calls %llu, graphs in use %d (CUPTI %s finalized since)\n",
            (unsigned long long)atomic_load(&graph_calls), atomic_load(&graphs_seen),
            may_finalize() ? "still" : "no longer");
}

/* --- the API side (any thread, no lock) ----------------------------------------------------------------------- */

/* Performs an asked-for finalize at an API exit. */
static void finalize_from_callback(int synchronize_exit)
{
    if (!may_finalize()) { /* a graph came since the finalize was asked for: CUPTI stays subscribed */
        move(HOLD_CALL_OFF, HOLD_ASKED);
        return;
    }
    if (!move(HOLD_BEGIN, HOLD_ASKED))
        return;
    uint64_t t0 = monotonic_ns();
    CUptiResult rc = g_cupti.finalize();
    uint64_t took = monotonic_ns() - t0;
    atomic_fetch_add(&finalize_ns, took);
    atomic_fetch_add(&finalize_charged_ns, charged(took));
    atomic_fetch_add(&finalizes, 1);
    if (rc != CUPTI_SUCCESS) {
        log_once("cuptiFinalize failed; CUPTI stays subscribed between windows (launch-bound programs run slower)");
        move(HOLD_FAILED, HOLD_FINALIZING);
        return;
    }
    atomic_store(&dirty, 0);
    uint64_t waited = monotonic_ns() - atomic_load(&asked_ns);
    atomic_fetch_add(&ask_to_finalize_ns, waited);
    if (synchronize_exit) {
        atomic_store(&waited_in_vain, 0);
        atomic_fetch_add(&at_sync_exit, 1);
    } else if (atomic_load(&asked_at_once)) {
        atomic_fetch_add(&at_once, 1);
        atomic_fetch_add(&at_once_ns, waited);
    } else {
        atomic_fetch_add(&waited_in_vain, 1);
        atomic_fetch_add(&after_patience, 1);
    }
    move(HOLD_DONE, HOLD_FINALIZING);
    window_wake(); /* the controller subscribes again at once: waits between windows are recorded again */
}

void hold_graph_use(void)
{
    atomic_fetch_add_explicit(&graph_calls, 1, memory_order_relaxed);
    if (atomic_load_explicit(&graphs_seen, memory_order_relaxed) || g_settings.finalize_with_graphs)
        return;
    atomic_store(&graphs_seen, 1); /* before the call-off: an exit in another thread no longer may finalize */
    move(HOLD_CALL_OFF, HOLD_ASKED);
}

void hold_api_exit(uint32_t wait_kind)
{
    int synchronize_exit = wait_kind != 0 && wait_kind != OTEL_GPU_SYNC_MEMCPY;
    if (atomic_load_explicit(&state, memory_order_relaxed) == HOLD_ASKED &&
        hold_exit_takes_finalize(synchronize_exit, atomic_load(&at_any_exit)))
        finalize_from_callback(synchronize_exit);
}
