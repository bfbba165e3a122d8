/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The controller thread. While an agent is attached (a probe semaphore is non-zero, or the debug mode), it holds a
 * CUPTI subscription (taken at attach, given back at detach; see "Letting go" for between windows) and opens
 * sampling windows of OTEL_GPU_WINDOW_MS at randomly jittered times: in a window the launch callbacks and the
 * kernel/memcpy/memset activity kinds are on, outside they are off (but for the linger, below), so the workload pays
 * CUPTI's per-launch cost only for a fraction f of wall time. f is chosen so that f x (slowdown inside a window)
 * stays within the overhead budget; the in-window slowdown comes from estimate.c (the library's measured own time
 * plus a prior for CUPTI's cost per recorded launch and the program's time in the last CUPTI finalize, relative to
 * the undisturbed time; windows without launches leave it alone), and f is bounded to [0.1 %, 20 %].
 * Each closed window fires otel_gpu:window with covered_ns/elapsed_ns, the fraction the agent re-weights by, and the
 * program's pace in and out of windows (the waits it ended in windows and in the gaps' shadow windows, below).
 *
 * Late GPU work: a GPU-bound program's launches run on the GPU long after the call (its queue can lag by seconds).
 * When a window closes the activity kinds stay on ("linger", polled with growing pauses of 1..20 ms) until every
 * launch sampled in it has delivered its GPU work, or MAX_LAG_NS has passed for a launch (then it counts as dropped
 * in the next window record). A window's weight applies to its launches whenever their work arrives, so the
 * re-weighted totals stay unbiased under any queue lag.
 *
 * Correlation ids: CUDA 13's CUPTI gives launches ids of their own only while the driver-API activity kind is on
 * (activity.c switches it with the others unless OTEL_GPU_API_ACTIVITY=0); without it many launches share one id.
 * The launch callbacks are on whenever any activity kind is: switched on before the kinds at a window's open, off
 * only after the kinds at the linger's end, so that no recorded launch goes without its own id. Outside a window the
 * callback just counts the launch (the linger's cost, charged by estimate.c) and the sampled-id filter drops its work.
 *
 * Letting go: once a window has had the activity kinds on, CUPTI keeps slowing every launch down until it is
 * finalized, so at a linger's end (and at detach) the controller asks hold.c for a finalize, and subscribes again
 * once an API exit has performed it (the reasons, and what it costs, are hold.c's; numbers in docs/benchmarks.md).
 * OTEL_GPU_CUPTI_FINALIZE=0 keeps the subscription.
 *
 * Blocking waits are recorded outside windows too (their callbacks stay on while attached, but for the moments
 * between a finalize and the next subscription): one wait in N, chosen at random, with weight N; N doubles when
 * recording waits costs more than half the budget and halves back when it costs less than a quarter of that.
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <sched.h>
#include <time.h>

#include <cupti_activity.h>

#include "estimate.h"
#include "inject.h"

#define POLL_NS 100000000ull             /* how often a detached library looks at the semaphores: 100 ms */
#define PRIOR_SLOWDOWN 1.0               /* in-window slowdown assumed before the first window is measured */
#define MAX_LAG_NS 3000000000ull         /* a sampled launch's GPU work is awaited this long: 3 s */
#define LINGER_POLL_MIN_NS 1000000ull    /* first pause while awaiting late work: 1 ms, doubling ... */
#define LINGER_POLL_MAX_NS 20000000ull   /* ... up to 20 ms */
#define EXPIRE_EVERY_NS 100000000ull     /* how often the sampled-id filter is swept while lingering: 100 ms */
#define WAIT_EVERY_MAX (1u << 20)
#define EXIT_DRAIN_NS 200000000ull       /* at exit, wait up to 200 ms for sampled launches' GPU work */

static pthread_t controller;
static pthread_mutex_t ctl_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t ctl_wake = PTHREAD_COND_INITIALIZER;

/* The controller's state, under ctl_lock (the callback's side of what they share is g_state). */
static struct {
    int stopped; /* the final flush has run */
    /* Windows, and the re-weighting totals since attach (the window record carries them). */
    uint64_t last_window_id;
    uint64_t open_start_ns;
    uint32_t open_us; /* the open window's switch-on time */
    uint64_t attach_start_ns;
    uint64_t covered_ns;
    /* The program's pace in and out of windows, by the blocking waits it ends (totals since attach; the window record
     * carries them): observing launches slows a program that waits on the GPU every iteration, so windows see less
     * of its work than their share of the time, and the agent corrects the weights by this ratio. */
    uint64_t window_waits, waits_at_open;
    uint64_t shadow_waits, shadow_ns;
    /* The same by launches, for programs that seldom wait: launches recorded in windows, and launches counted in
     * shadow windows (their launch callbacks on, counting only) over those shadows' time; the launches counted
     * since the last window's cost was charged (an empty callback each). */
    uint64_t launches_total, shadow_launches, shadow_launch_ns, shadow_launches_uncharged;
    int shadow_left_launches_on; /* a completed shadow left the launch callbacks on for the window that follows */
    /* The budget: the in-window slowdown estimate, the fraction of time sampled, the waits' sampling period. */
    double slowdown;
    double fraction; /* set from the budget and the prior at start */
    double slowdown_max;     /* the highest estimate after a window, and the windows that left the fraction at its */
    uint64_t floor_windows;  /* floor (debug stats: a spike there means gaps of seconds and windows of huge weight) */
    uint64_t wait_period_start_ns;
    uint64_t finalize_ns_charged; /* hold_finalize_ns() already charged to a window's cost */
    /* Late GPU work. */
    int lingering;            /* the activity kinds are on outside a window, for late GPU work */
    uint64_t linger_start_ns; /* monotonic: the window closed */
    uint64_t linger_launches; /* launches during the last linger (counted by the callback); next window's cost */
    int dirty_before_window;  /* the kinds had been on since the last finalize before this window opened */
    /* Totals since attach (the window record carries them): the program runs slowed in a linger, nearly as in a
     * window, so the agent weights that time by the launches counted in it, not by the shadows' pace. */
    uint64_t lingered_ns, lingered_launches;
    /* Time left to other tools. */
    uint64_t yielded_ns, yields; /* time CUPTI was left to another tool, and how often (window record) */
    uint64_t aside_since_ns;     /* monotonic: the library stepped aside */
    int paused_for_graphs;       /* the library stood aside for good: the process uses CUDA graphs */
    /* The choice for a graph program (below, at probe_for_graphs_locked). */
    int graphs_decided;        /* the choice was made (sample or stand aside) */
    int graph_probes;          /* looks so far */
    uint64_t graph_probe_ns;   /* monotonic: the last look began */
    double graphs_launch_rate; /* launches per second of the busiest look */
} ctl = {.slowdown = PRIOR_SLOWDOWN, .fraction = ESTIMATE_FRACTION_MIN};

static int agent_present(void)
{
    return g_settings.debug_always_on || emit_any_semaphore();
}

/* Patches objects loaded since the last look (coexist.c), without ctl_lock: dl_iterate_phdr takes the loader's lock,
 * and a thread that holds it (a library's constructor) may call a wrapper that waits for ctl_lock. */
static void rescan_unlocked(void)
{
    pthread_mutex_unlock(&ctl_lock);
    coexist_rescan();
    pthread_mutex_lock(&ctl_lock);
}

/* Takes CUPTI again if an API exit finalized it; 0 while held, -1 (detached, logged) when taking it fails. A finalize
 * asked for but not yet performed is called off. */
static int keep_holding_locked(void)
{
    if (hold_holding() || hold_take() == 0)
        return 0;
    atomic_store(&g_state.attached, 0); /* attached again when CUPTI can be taken */
    return -1;
}

static int attach_locked(void)
{
    if (hold_take() != 0)
        return -1;
    graphs_reset(); /* the record's replay counts are totals since attach, like covered/elapsed */
    atomic_store(&g_state.attached, 1);
    /* After the switch: every call that starts from now on is seen at entry and exit. */
    ctl.attach_start_ns = now_ns();
    ctl.wait_period_start_ns = monotonic_ns();
    ctl.covered_ns = 0;
    ctl.window_waits = ctl.shadow_waits = ctl.shadow_ns = 0;
    ctl.launches_total = ctl.shadow_launches = ctl.shadow_launch_ns = ctl.shadow_launches_uncharged = 0;
    ctl.lingered_ns = ctl.lingered_launches = 0;
    return 0;
}

/* Ends the linger: its launches are the next window's cost, its time and launches go into the totals. */
static void end_linger_locked(void)
{
    ctl.lingering = 0;
    ctl.linger_launches = atomic_exchange(&g_state.outside_launches, 0);
    ctl.lingered_ns += monotonic_ns() - ctl.linger_start_ns;
    ctl.lingered_launches += ctl.linger_launches;
}

/* Opens a window, switching the launch callbacks and activity kinds on first (begin: monotonic, before the flush
 * that precedes the open; the window record states how long flush and switches took). */
static void open_window_locked(uint64_t begin)
{
    int was_lingering = ctl.lingering;
    int launches_on = was_lingering || ctl.shadow_left_launches_on; /* a linger or the gap's shadow left them on */
    ctl.shadow_left_launches_on = 0;
    if (ctl.lingering)
        end_linger_locked();
    activity_expire(MAX_LAG_NS);
    atomic_store(&g_state.window_launches, 0);
    atomic_store(&g_state.overhead_ns, 0);
    /* Callbacks before activity (a linger left both on): no launch whose work is recorded goes without its own id. */
    if (!launches_on && cbids_enable_launches(1) != 0)
        log_once("some launch callbacks could not be enabled");
    ctl.dirty_before_window = hold_dirty();
    hold_mark_dirty();
    if (activity_enable(1) != 0)
        log_once("some CUPTI activity kinds could not be enabled");
    uint64_t switched = monotonic_ns();
    ctl.open_us = (switched - begin) / 1000u < UINT32_MAX ? (uint32_t)((switched - begin) / 1000u) : UINT32_MAX;
    ctl.open_start_ns = now_ns();
    atomic_store_explicit(&g_state.window_id, ++ctl.last_window_id, memory_order_release);
    ctl.waits_at_open = atomic_load(&g_state.waits_seen);
}

/* At most every 100 ms, from the gap's slices as well as at window ends (windows can be seconds apart while a
 * sync-heavy workload waits thousands of times): one wait in N is recorded; N doubles while recording waits costs
 * more than half the budget or more waits are recorded than OTEL_GPU_MAX_WAITS_PER_S allows (each record costs the
 * agent a decode: a matmul loop that synchronizes 700 times a second kept the agent's GPU-time thread at 1.75 % of a
 * core on the H200), and halves back when both are under a quarter of that. */
static void adapt_waits_locked(void)
{
    uint64_t now = monotonic_ns();
    uint64_t period_ns = now - ctl.wait_period_start_ns;
    if (period_ns < 100000000ull)
        return;
    double wait_cost = (double)atomic_exchange(&g_state.wait_overhead_ns, 0);
    double allowed = 0.5 * g_settings.overhead_budget * (double)period_ns;
    double recorded = (double)atomic_exchange(&g_state.waits_recorded, 0);
    double recordable = g_settings.max_waits_per_s * (double)period_ns / 1e9;
    uint32_t every = atomic_load(&g_state.wait_sample_every);
    if ((wait_cost > allowed || recorded > recordable) && every < WAIT_EVERY_MAX)
        atomic_store(&g_state.wait_sample_every, every * 2);
    else if (wait_cost * 4 < allowed && recorded * 4 < recordable && every > 1)
        atomic_store(&g_state.wait_sample_every, every / 2);
    ctl.wait_period_start_ns = now;
}

static void adapt_locked(uint64_t window_ns, uint64_t overhead_ns, uint64_t launches, uint64_t lingered)
{
    adapt_waits_locked();
    /* the finalize after the previous window, in one of the program's threads */
    uint64_t finalize_ns = hold_finalize_ns() + (g_settings.charge_take != CHARGE_TAKE_NONE ? hold_retake_ns() : 0);
    struct window_cost cost = {window_ns, overhead_ns, launches, lingered, finalize_ns - ctl.finalize_ns_charged,
                               ctl.shadow_launches_uncharged,
                               estimate_pace(ctl.launches_total, ctl.covered_ns, ctl.shadow_launches,
                                             ctl.shadow_launch_ns)};
    if (launches != 0 || lingered != 0) { /* an idle window is not counted (estimate_update): charge the next one */
        ctl.finalize_ns_charged = finalize_ns;
        ctl.shadow_launches_uncharged = 0;
    }
    ctl.slowdown = estimate_update(ctl.slowdown, &cost);
    ctl.fraction = fraction_for_budget(g_settings.overhead_budget, ctl.slowdown);
    ctl.slowdown_max = ctl.slowdown > ctl.slowdown_max ? ctl.slowdown : ctl.slowdown_max;
    ctl.floor_windows += ctl.fraction <= ESTIMATE_FRACTION_MIN;
}

/* A window record with the running totals (graph replays included); launches, overhead, the switch-on time and
 * aside_since_ns are the caller's. */
static struct otel_gpu_window window_record_locked(uint64_t id, uint64_t start, uint64_t end)
{
    struct otel_gpu_window rec = {
        .abi_version = OTEL_GPU_ABI_VERSION,
        .window_id = id,
        .start_ns = start,
        .end_ns = end,
        .covered_ns = ctl.covered_ns,
        .elapsed_ns = end - ctl.attach_start_ns,
        .dropped = activity_take_dropped(),
        .window_waits = ctl.window_waits,
        .shadow_waits = ctl.shadow_waits,
        .shadow_ns = ctl.shadow_ns,
        .yielded_ns = ctl.yielded_ns,
        .yields = ctl.yields,
        .launches_total = ctl.launches_total,
        .shadow_launches = ctl.shadow_launches,
        .shadow_launch_ns = ctl.shadow_launch_ns,
        /* a linger still going on (at exit) counts up to now */
        .linger_ns = ctl.lingered_ns + (ctl.lingering ? monotonic_ns() - ctl.linger_start_ns : 0),
        .linger_launches = ctl.lingered_launches + (ctl.lingering ? atomic_load(&g_state.outside_launches) : 0),
    };
    graphs_report(&rec);
    return rec;
}

/* aside_from_ns: 0, or (stepping aside) the CUPTI time from which another tool holds CUPTI, for the record. */
static void close_window_locked(uint32_t flush_flag, uint64_t aside_from_ns)
{
    uint64_t id = atomic_exchange(&g_state.window_id, 0);
    if (id == 0)
        return;
    uint64_t end = now_ns(); /* launches entered from here on are not sampled */
    uint64_t closed = monotonic_ns(); /* the linger starts here: the kinds stay on, launches are counted from now */
    atomic_store(&g_state.outside_launches, 0);
    /* Launches that entered the window finish their calls and records first, so the window's record counts them
     * (bounded: a stuck thread must not stall exit; one that takes longer is still recorded, in no window's count). */
    uint64_t give_up = monotonic_ns() + 50000000ull;
    while ((atomic_load(&g_state.in_launch) != 0 || atomic_load(&g_state.launches_entered) != 0) &&
           monotonic_ns() < give_up)
        sched_yield();
    g_cupti.activity_flush_all(flush_flag);
    uint64_t lingered = ctl.linger_launches; /* the linger before this window: charged to it */
    ctl.linger_launches = 0;
    ctl.covered_ns += end - ctl.open_start_ns;
    ctl.window_waits += atomic_load(&g_state.waits_seen) - ctl.waits_at_open;
    uint64_t launches = atomic_load(&g_state.window_launches);
    ctl.launches_total += launches;
    struct otel_gpu_window rec = window_record_locked(id, ctl.open_start_ns, end);
    /* The activity kinds, and the launch callbacks with them, stay on until the sampled launches' GPU work has
     * arrived (see linger_check_locked): a linger from the window's end, in the next window's record. */
    ctl.lingering = 1;
    ctl.linger_start_ns = closed;
    rec.open_us = ctl.open_us;
    rec.launches = launches;
    rec.overhead_ns = atomic_load(&g_state.overhead_ns);
    rec.aside_since_ns = aside_from_ns;
    emit_window(&rec);
    adapt_locked(end - ctl.open_start_ns, rec.overhead_ns, rec.launches, lingered);
}

/* A record of the totals up to now with no window in it (no launches, start = end), when the library stands aside
 * and at exit: the time and the graph replays since the last window reach the agent (replays after the last window
 * were otherwise never counted). aside_from_ns as for close_window_locked. */
static void record_totals_locked(uint64_t aside_from_ns)
{
    uint64_t now = aside_from_ns ? aside_from_ns : now_ns();
    struct otel_gpu_window rec = window_record_locked(++ctl.last_window_id, now, now);
    rec.aside_since_ns = aside_from_ns;
    emit_window(&rec);
}

/* Closes the open window, or records the totals when none is open (while attached). */
static void close_or_record_locked(uint32_t flush_flag, uint64_t aside_from_ns)
{
    if (atomic_load(&g_state.window_id) != 0)
        close_window_locked(flush_flag, aside_from_ns);
    else if (atomic_load(&g_state.attached))
        record_totals_locked(aside_from_ns);
}

/* Ends a linger once nothing sampled is outstanding (or what is left has timed out); 1 while it goes on. */
static int linger_check_locked(void)
{
    if (!ctl.lingering)
        return 0;
    g_cupti.activity_flush_all(0);
    uint64_t now = monotonic_ns();
    /* a launch that entered inside the window and is still in its call is sampled: its work must be recorded */
    int outstanding = activity_outstanding() != 0 || atomic_load(&g_state.launches_entered) != 0;
    if (outstanding && now - ctl.linger_start_ns <= MAX_LAG_NS)
        return 1;
    atomic_store(&g_state.launches_entered, 0); /* an entry whose exit the callbacks missed must not hold the next */
    if (activity_outstanding() != 0)
        activity_expire(MAX_LAG_NS); /* counts what never came as dropped */
    /* A window and its linger that saw no launch, with CUPTI clean when the window opened, recorded nothing (a
     * server's idle time): with OTEL_GPU_DEBUG_IDLE_KEEP=1, CUPTI is kept as it was, sparing the next request a
     * finalize and a take. Not when the kinds had been on since the last finalize (an earlier window's linger ran
     * into this one, or its finalize is still to come): what they left behind still needs the finalize. */
    if (g_settings.idle_keep && !ctl.dirty_before_window && atomic_load(&g_state.window_launches) == 0 &&
        atomic_load(&g_state.outside_launches) == 0)
        hold_keep();
    else
        hold_let_go();
    end_linger_locked();
    return 0;
}

static void detach_locked(void)
{
    close_window_locked(0, 0); /* no totals without a window: the agent that would read them is gone */
    atomic_store(&g_state.attached, 0);
    ctl.lingering = 0;
    if (!hold_holding())
        return;
    cbids_enable_waits(0);
    cbids_enable_graph_watch(0);
    activity_drain(EXIT_DRAIN_NS); /* bounded: the agent is gone, what has not come by then is lost */
    hold_let_go();
    hold_release_unless_asked();
}

/* Sleeps up to duration_ns (ctl_lock held, released while waiting); returns non-zero when the library is stopping. */
static int sleep_locked(uint64_t duration_ns)
{
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    uint64_t ns = (uint64_t)until.tv_nsec + duration_ns;
    until.tv_sec += (time_t)(ns / 1000000000u);
    until.tv_nsec = (long)(ns % 1000000000u);
    while (!ctl.stopped && !hold_finalized()) {
        int rc = pthread_cond_timedwait(&ctl_wake, &ctl_lock, &until);
        if (rc == ETIMEDOUT)
            break;
    }
    return ctl.stopped;
}

/* From an API exit that finalized CUPTI (no lock: the thread may hold driver locks the controller waits on). */
void window_wake(void)
{
    pthread_cond_broadcast(&ctl_wake);
}

/* Subscribed with nothing but the wait callbacks on: how the program runs when no window observes it. */
static int undisturbed_locked(void)
{
    return hold_undisturbed() && !ctl.lingering;
}

/* Lets go of everything: the open window is closed and recorded (an empty one if none is open, while attached) with
 * the time from which nothing is measured, sampled work still running is counted as dropped, our activity kinds and
 * callbacks go off, what CUPTI holds for us is flushed to our buffers, and the subscription is given up (no finalize:
 * another tool may be about to use CUPTI, and graphs may be in use). */
static void stand_aside_locked(void)
{
    close_or_record_locked(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED, now_ns());
    atomic_store(&g_state.attached, 0);
    ctl.lingering = 0;
    if (hold_holding()) {
        activity_enable(0);
        cbids_enable_launches(0);
        cbids_enable_waits(0);
        cbids_enable_graph_watch(0);
        g_cupti.activity_flush_all(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
        activity_expire(0); /* what never came is counted as dropped in the next window record */
        hold_release();
    }
    ctl.aside_since_ns = monotonic_ns();
}

/* From a coexist.c wrapper, in the thread of another tool that starts using CUPTI: lets go of everything before that
 * tool's call goes on; the controller takes CUPTI back once the tool is done with it. */
void window_step_aside(void)
{
    pthread_mutex_lock(&ctl_lock);
    if (!hold_aside() && !ctl.stopped && !ctl.paused_for_graphs) {
        int was_attached = atomic_load(&g_state.attached);
        stand_aside_locked();
        ctl.yields++;
        hold_step_aside();
        if (was_attached)
            log_once("another tool in this program started using CUPTI (torch.profiler, Nsight, ...); GPU-time "
                     "profiling steps aside until it is done");
    }
    pthread_mutex_unlock(&ctl_lock);
}

/* A process that uses CUDA graphs can never have CUPTI finalized again (a graph recorded under one CUPTI faults when
 * replayed under the next), and once a window has switched the activity kinds on, every launch stays slower until a
 * finalize, with every kind and callback off again (GRAPH_RESIDUE_NS_PER_LAUNCH, measured by
 * scripts/h200/cupti_residue.py; numbers in docs/benchmarks.md).
 * So when graphs show up while no kinds have been on since the last finalize, no window opens until the library has
 * counted the program's launches a few times, a second or more apart (one look may fall on a pause, or on the
 * compile that captured the graph), and seen some; it keeps sampling only if the busiest look's lasting cost fits the
 * overhead budget, otherwise it stands aside for the rest of the process. Once the kinds have been on, the cost is
 * paid whether or not windows go on, so they go on. OTEL_GPU_CUDA_GRAPHS=sample keeps sampling in any case. */
#define GRAPH_PROBE_NS 100000000ull        /* how long one look counts launches (g_settings: how far apart) */
#define GRAPH_PROBES 5                     /* looks before the choice */
static int graphs_undecided_locked(void)
{
    return !g_settings.sample_graphs && !ctl.graphs_decided && hold_graphs_seen() && !hold_dirty() &&
           hold_undisturbed();
}

static int graphs_probe_due_locked(void)
{
    return graphs_undecided_locked() && monotonic_ns() - ctl.graph_probe_ns >= g_settings.graph_probe_every_ns;
}

/* One look at the launch rate (callbacks alone leave nothing behind once off, unlike the activity kinds), and the
 * choice once enough looks saw the program launch. */
static void probe_for_graphs_locked(void)
{
    ctl.graph_probe_ns = monotonic_ns();
    atomic_store(&g_state.outside_launches, 0);
    cbids_enable_launches(1);
    sleep_locked(GRAPH_PROBE_NS);
    cbids_enable_launches(0);
    uint64_t launches = atomic_exchange(&g_state.outside_launches, 0), spent = monotonic_ns() - ctl.graph_probe_ns;
    double rate = (double)launches * 1e9 / (double)(spent ? spent : 1);
    ctl.graphs_launch_rate = rate > ctl.graphs_launch_rate ? rate : ctl.graphs_launch_rate;
    if (++ctl.graph_probes < GRAPH_PROBES || ctl.graphs_launch_rate == 0.0)
        return;
    ctl.graphs_decided = 1;
    if (ctl.graphs_launch_rate * g_settings.graph_residue_ns / 1e9 <= g_settings.overhead_budget)
        return;
    int was_attached = atomic_load(&g_state.attached);
    stand_aside_locked();
    ctl.paused_for_graphs = 1;
    if (was_attached)
        log_once("this program uses CUDA graphs and launches too often for CUPTI's lasting cost: GPU-time sampling "
                 "stops for it (CUPTI can never be finalized again; OTEL_GPU_CUDA_GRAPHS=sample samples anyway)");
}

/* The gap's shadow window: its last stretch as long as a window, counted only if it began and ended undisturbed
 * (its start is as random as the gap's length, like a window's). The launch callbacks are on in it and only count
 * (inject.c: outside a window a launch is counted and nothing else), so the shadow measures the program's launch
 * rate with nothing observed but for CUPTI's dispatch of an empty callback (charged to the next window's cost at
 * estimate.h's prior; on an H200 the shadows' rate came within 1.5 % of the program's whole rate outside windows,
 * so their time is taken as it is). Only in a subscription whose activity kinds have been on (CUPTI kept while
 * graphs are in use, or OTEL_GPU_CUPTI_FINALIZE=0): on an H200 (CUDA 13), launch callbacks on alone in a fresh
 * subscription, for a whole shadow before the first window, left every launch of the process with one correlation
 * id from then on, windows included. Graph launches, whose callbacks stay on, are counted only in shadows that
 * switched the others on. */
struct shadow {
    uint64_t at, waits0, start_ns;
    int counting;
    int launches_on; /* the shadow switched the launch callbacks on (1: all of them, -1: some failed) */
};

static void shadow_step_locked(struct shadow *sh, uint64_t now)
{
    if (sh->at == 0 || now < sh->at)
        return;
    sh->at = 0;
    sh->counting = undisturbed_locked();
    sh->waits0 = atomic_load(&g_state.waits_seen);
    if (sh->counting && hold_dirty()) {
        atomic_store(&g_state.outside_launches, 0);
        sh->launches_on = cbids_enable_launches(1) == 0 ? 1 : -1;
    }
    sh->start_ns = now_ns();
}

/* The launch callbacks off again if a completed shadow left them on and no window opened after it. */
static void shadow_callbacks_off_locked(void)
{
    if (ctl.shadow_left_launches_on && hold_holding() && !ctl.lingering && atomic_load(&g_state.window_id) == 0)
        cbids_enable_launches(0);
    ctl.shadow_left_launches_on = 0;
}

/* completed: the gap ran to its end (a shadow cut short is not counted). A completed shadow leaves the launch
 * callbacks on for the window that opens next: switched off and on again in between, a launch that entered unseen
 * would take the entry a missed exit left behind (inject.c's per-thread entry stack). */
static void shadow_end_locked(struct shadow *sh, int completed)
{
    if (completed && sh->launches_on == 1)
        ctl.shadow_left_launches_on = 1;
    else if (sh->launches_on && hold_holding())
        cbids_enable_launches(0);
    uint64_t launches = sh->launches_on ? atomic_exchange(&g_state.outside_launches, 0) : 0;
    ctl.shadow_launches_uncharged += launches;
    if (!completed || !sh->counting || !undisturbed_locked())
        return;
    uint64_t took = now_ns() - sh->start_ns;
    ctl.shadow_waits += atomic_load(&g_state.waits_seen) - sh->waits0;
    ctl.shadow_ns += took;
    if (sh->launches_on != 1)
        return;
    ctl.shadow_launches += launches;
    ctl.shadow_launch_ns += took;
}

/* Sleeps the gap before the next window in slices, leaving early if the agent goes away; 0 = still attached.
 * While lingering, the slices are short and each ends with a flush and a look at what is still outstanding. */
static int wait_gap_locked(uint64_t gap_ns)
{
    uint64_t poll = LINGER_POLL_MIN_NS, last_expire = monotonic_ns(), end = last_expire + gap_ns, now;
    struct shadow shadow = {.at = gap_ns > 2 * g_settings.window_ns ? end - g_settings.window_ns : 0};
    int rc = 0, completed = 0;
    shadow_callbacks_off_locked(); /* the last gap's shadow was not followed by a window */
    for (;;) {
        if ((now = monotonic_ns()) >= end) {
            completed = 1;
            break;
        }
        shadow_step_locked(&shadow, now);
        uint64_t most = ctl.lingering ? poll : POLL_NS;
        if (shadow.at != 0 && shadow.at - now < most)
            most = shadow.at - now;
        uint64_t slice = end - now < most ? end - now : most;
        if (sleep_locked(slice)) {
            rc = -1;
            break;
        }
        if (ctl.lingering) {
            poll = poll * 2 < LINGER_POLL_MAX_NS ? poll * 2 : LINGER_POLL_MAX_NS;
            if (linger_check_locked() && monotonic_ns() - last_expire >= EXPIRE_EVERY_NS) {
                activity_expire(MAX_LAG_NS); /* clears tombstones and finished graph launches from the filter */
                last_expire = monotonic_ns();
            }
        }
        if (!agent_present() || hold_aside()) {
            rc = -1;
            break;
        }
        if (graphs_probe_due_locked())
            break; /* cut short for a look at a graph program's launches (no shadow window counted) */
        rescan_unlocked();
        hold_hurry(ctl.lingering || atomic_load(&g_state.window_id) != 0);
        if (hold_finalized() && keep_holding_locked() != 0) {
            rc = -1;
            break;
        }
        adapt_waits_locked();
    }
    shadow_end_locked(&shadow, completed);
    return rc;
}

static void *controller_main(void *arg)
{
    (void)arg;
    pthread_mutex_lock(&ctl_lock);
    while (!ctl.stopped) {
        hold_settle(); /* a finalize asked for at detach may have happened since (sleep_locked wakes for it) */
        hold_hurry(ctl.lingering || atomic_load(&g_state.window_id) != 0);
        rescan_unlocked();
        if (ctl.paused_for_graphs) {
            sleep_locked(POLL_NS);
            continue;
        }
        if (hold_aside()) {
            if (!coexist_foreign_done(monotonic_ns())) {
                sleep_locked(POLL_NS);
                continue;
            }
            ctl.yielded_ns += monotonic_ns() - ctl.aside_since_ns;
            hold_take_back(); /* attached again below while an agent is there: totals restart */
        }
        if (!atomic_load(&g_state.attached)) {
            if (!agent_present() || attach_locked() != 0) {
                sleep_locked(POLL_NS);
                continue;
            }
        }
        double mean_gap = (double)g_settings.window_ns * (1.0 - ctl.fraction) / ctl.fraction;
        uint64_t gap_ns = (uint64_t)(mean_gap * (0.5 + random_uniform01()));
        if (wait_gap_locked(gap_ns) != 0) {
            if (!ctl.stopped)
                detach_locked();
            continue;
        }
        if (g_settings.debug_no_windows)
            continue;
        if (keep_holding_locked() != 0)
            continue;
        if (graphs_undecided_locked()) { /* no window before the choice: a look when one is due, else another gap */
            if (graphs_probe_due_locked())
                probe_for_graphs_locked();
            continue;
        }
        uint64_t begin = monotonic_ns();
        g_cupti.activity_flush_all(0); /* records of earlier windows that completed since */
        open_window_locked(begin);
        sleep_locked(g_settings.window_ns);
        if (!ctl.stopped)
            close_window_locked(0, 0);
    }
    pthread_mutex_unlock(&ctl_lock);
    return NULL;
}

int window_start(void)
{
    ctl.fraction = fraction_for_budget(g_settings.overhead_budget, PRIOR_SLOWDOWN);
    /* An agent attached to this library file before the process loaded it (the kernel set the semaphores when the
     * file was mapped): take CUPTI here, before cuInit returns, so that the program's first waits are seen and its
     * first windows follow; otherwise the controller looks every POLL_NS. */
    pthread_mutex_lock(&ctl_lock);
    if (agent_present())
        (void)attach_locked();
    pthread_mutex_unlock(&ctl_lock);
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    int rc = pthread_create(&controller, &attr, controller_main, NULL);
    pthread_attr_destroy(&attr);
    return rc;
}

/* At exit: close an open window and hand everything CUPTI still holds to the probes. Runs once. */
void window_stop_and_flush(void)
{
    pthread_mutex_lock(&ctl_lock);
    if (!ctl.stopped) {
        if (g_settings.debug_stats) {
            inject_print_stats();
            hold_print_stats();
            fprintf(stderr, "otel-gpu: stats graphs: %s (%d looks, busiest %.0f launches/s)\n",
                    !ctl.graphs_decided ? "no choice made" : ctl.paused_for_graphs ? "stood aside" : "kept sampling",
                    ctl.graph_probes, ctl.graphs_launch_rate);
            fprintf(stderr, "otel-gpu: stats stepped aside for another CUPTI user %llu times (%.0f ms), %llu GOT slots "
                    "of CUPTI imports watched, %llu of dlsym (%llu CUPTI lookups answered)\n",
                    (unsigned long long)ctl.yields, (double)ctl.yielded_ns / 1e6,
                    (unsigned long long)coexist_slots_patched(), (unsigned long long)coexist_dlsym_slots_patched(),
                    (unsigned long long)coexist_lookups_diverted());
            fprintf(stderr, "otel-gpu: stats waits ended in windows %llu in %.0f ms, in shadow windows %llu in %.0f ms\n",
                    (unsigned long long)ctl.window_waits, (double)ctl.covered_ns / 1e6,
                    (unsigned long long)ctl.shadow_waits,
                    (double)ctl.shadow_ns / 1e6);
            fprintf(stderr, "otel-gpu: stats launches in windows %llu in %.0f ms, in shadow windows %llu in %.0f ms "
                    "(counting only): pace %.3f, in-window slowdown estimate %.3f (highest %.3f), fraction %.4f (at "
                    "its floor after %llu windows)\n",
                    (unsigned long long)ctl.launches_total, (double)ctl.covered_ns / 1e6,
                    (unsigned long long)ctl.shadow_launches, (double)ctl.shadow_launch_ns / 1e6,
                    estimate_pace(ctl.launches_total, ctl.covered_ns, ctl.shadow_launches, ctl.shadow_launch_ns),
                    ctl.slowdown, ctl.slowdown_max, ctl.fraction, (unsigned long long)ctl.floor_windows);
        }
        ctl.stopped = 1;
        if (atomic_load(&g_state.attached)) {
            int holding = hold_holding(); /* a window is open only while CUPTI is held */
            close_or_record_locked(0, 0);
            if (holding)
                activity_drain(EXIT_DRAIN_NS);
        }
        pthread_cond_broadcast(&ctl_wake);
    }
    pthread_mutex_unlock(&ctl_lock);
}
