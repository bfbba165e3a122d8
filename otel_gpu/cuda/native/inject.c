/* SPDX-License-Identifier: Apache-2.0 */
/*
 * libotel_gpu_inject.so: the CUDA driver calls InitializeInjection() at cuInit when CUDA_INJECTION64_PATH names this
 * library. It loads CUPTI and lets the controller (window.c) subscribe to driver-API callbacks and open short sampling
 * windows while an agent is attached; without an agent it holds no CUPTI subscription (hold.c), so other tools can.
 * Whatever fails, the workload runs on untouched: one "otel-gpu:" line on stderr and the library stays inert.
 *
 * Environment (read once here):
 *   OTEL_GPU_CUPTI_PATH        CUPTI to load (default: libcupti.so.13 / libcupti.so, then next to libcudart, then
 *                              the CUDA toolkit's)
 *   OTEL_GPU_OVERHEAD_BUDGET   allowed slowdown of the workload, a fraction (default 0.02)
 *   OTEL_GPU_WINDOW_MS         length of one sampling window in milliseconds (default 20)
 *   OTEL_GPU_MAX_WAITS_PER_S   blocking waits recorded per second at most, on average (default 100): past it one in N
 *                              is recorded with weight N, so the agent's cost (~25 us a record on an H200) stays bounded
 *   OTEL_GPU_API_ACTIVITY=0    leave CUPTI's driver-API activity kind off (default on, with the kernel/copy/set
 *                              kinds: without it CUDA 13's CUPTI gives many launches one correlation id)
 *   OTEL_GPU_CUPTI_FINALIZE=0  keep CUPTI subscribed between windows instead of finalizing it after each (window.c);
 *                              never finalized either once the process uses CUDA graphs (cbids.c)
 *   OTEL_GPU_DEBUG_FINALIZE_WITH_GRAPHS=1  diagnostics: finalize even with graphs in use (the crash-prone control)
 *   OTEL_GPU_FINALIZE_AT_ONCE=0  always wait up to 50 ms for a synchronize to finalize at; by default a program whose
 *                              finalizes waited that long in vain three times in a row is finalized at its next
 *                              launch's exit (hold.c; on an H100 this halved a never-synchronizing loop's loss:
 *                              baton I against L)
 *   OTEL_GPU_DEBUG_IDLE_KEEP=1  diagnostics: a window in which the program launched nothing (a server's idle time) is
 *                              not followed by a finalize and a take (window.c); off, since on an H100 such a window
 *                              left the same residue as a busy one (cupti_residue.py agent_idle; baton K)
 *   OTEL_GPU_DEBUG_CHARGE_TAKE=0|cpu  diagnostics (baton.py's modes U, C): leave the controller's time taking
 *                              CUPTI again after each finalize (subscribe, buffers, callbacks) out of the budget, or
 *                              charge only its CPU time (by default its wall time is charged, capped: hold.c)
 *   OTEL_GPU_DEBUG_NO_WAITS=1, OTEL_GPU_DEBUG_NO_WINDOWS=1  diagnostics (scripts/h200/baton.py): never switch the
 *                              wait callbacks on / never open a window
 *   OTEL_GPU_DEBUG_STATS=1     diagnostics: lines on stderr at exit: how launch exits in windows paired, how often
 *                              CUPTI was finalized and taken again, the waits ended in windows and in shadow windows
 *   OTEL_GPU_DEBUG_ALWAYS_ON=1 tests only: act as if an agent were attached
 *   OTEL_GPU_DEBUG_FILE        tests only: also append every fired record to this file (format in emit.c)
 */
#include <dlfcn.h>
#include <link.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <threads.h>
#include <time.h>

#include <cupti_activity.h>

#include "inject.h"

struct cupti_api g_cupti;
struct inject_settings g_settings;
struct inject_state g_state;

static _Atomic int initialized;

#define CONTEXT_DRAIN_NS 200000000ull /* a context being destroyed: wait up to 200 ms for its sampled work */

uint64_t now_ns(void)
{
    uint64_t ts = 0;
    if (g_cupti.get_timestamp == NULL || g_cupti.get_timestamp(&ts) != CUPTI_SUCCESS) {
        struct timespec t;
        clock_gettime(CLOCK_REALTIME, &t);
        ts = (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
    }
    return ts;
}

uint64_t monotonic_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}

/* Per thread, so that the API callback needs no lock; seeded from the clock and the state's own address (distinct
 * per thread). */
static thread_local uint64_t rng_state;

uint64_t random_u64(void)
{
    if (rng_state == 0)
        rng_state = monotonic_ns() ^ (uint64_t)(uintptr_t)&rng_state;
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}

double random_uniform01(void)
{
    return (double)(random_u64() >> 11) / (double)(1ull << 53);
}

void log_once(const char *what)
{
    /* One line per distinct message: the messages are string literals, so their addresses identify them. */
    static const char *seen[32];
    static _Atomic int seen_count;
    for (int i = 0; i < atomic_load(&seen_count) && i < 32; i++)
        if (seen[i] == what)
            return;
    int at = atomic_fetch_add(&seen_count, 1);
    if (at < 32)
        seen[at] = what;
    fprintf(stderr, "otel-gpu: %s\n", what);
}

/* --- loading CUPTI ------------------------------------------------------------------------------------------- */

struct found_path {
    const char *needle;
    char dir[4096];
};

static int find_loaded(struct dl_phdr_info *info, size_t size, void *data)
{
    (void)size;
    struct found_path *found = data;
    const char *name = info->dlpi_name;
    const char *base = name ? strrchr(name, '/') : NULL;
    if (base == NULL || strstr(base, found->needle) == NULL)
        return 0;
    size_t len = (size_t)(base - name);
    if (len >= sizeof(found->dir))
        return 0;
    memcpy(found->dir, name, len);
    found->dir[len] = '\0';
    return 1;
}

static void *open_cupti(void)
{
    const char *explicit_path = getenv("OTEL_GPU_CUPTI_PATH");
    if (explicit_path != NULL && explicit_path[0] != '\0')
        return dlopen(explicit_path, RTLD_NOW | RTLD_LOCAL);
    void *lib = dlopen("libcupti.so.13", RTLD_NOW | RTLD_LOCAL);
    if (lib == NULL)
        lib = dlopen("libcupti.so", RTLD_NOW | RTLD_LOCAL);
    if (lib != NULL)
        return lib;
    /* PyTorch's wheels: libcudart and libcupti side by side in .../nvidia/cu13/lib. */
    struct found_path found = {.needle = "libcudart.so"};
    if (dl_iterate_phdr(find_loaded, &found)) {
        char path[4200];
        snprintf(path, sizeof(path), "%s/libcupti.so.13", found.dir);
        if ((lib = dlopen(path, RTLD_NOW | RTLD_LOCAL)) != NULL)
            return lib;
    }
    static const char *const toolkit[] = {
        "/usr/local/cuda/extras/CUPTI/lib64/libcupti.so.13",
        "/usr/local/cuda/targets/x86_64-linux/lib/libcupti.so.13",
        "/usr/local/cuda-13.0/targets/x86_64-linux/lib/libcupti.so.13",
        "/usr/local/cuda-13.0/extras/CUPTI/lib64/libcupti.so.13",
    };
    for (size_t i = 0; i < sizeof(toolkit) / sizeof(toolkit[0]) && lib == NULL; i++)
        lib = dlopen(toolkit[i], RTLD_NOW | RTLD_LOCAL);
    return lib;
}

#define RESOLVE(field, symbol)                                                                                        \
    do {                                                                                                              \
        *(void **)(&g_cupti.field) = dlsym(lib, symbol);                                                              \
        if (g_cupti.field == NULL)                                                                                    \
            return symbol;                                                                                            \
    } while (0)

/* Returns NULL on success, else the name of the first missing function. */
static const char *resolve_cupti(void *lib)
{
    RESOLVE(subscribe, "cuptiSubscribe");
    RESOLVE(unsubscribe, "cuptiUnsubscribe");
    RESOLVE(enable_callback, "cuptiEnableCallback");
    RESOLVE(activity_enable, "cuptiActivityEnable");
    RESOLVE(activity_disable, "cuptiActivityDisable");
    RESOLVE(activity_register_callbacks, "cuptiActivityRegisterCallbacks");
    RESOLVE(activity_flush_all, "cuptiActivityFlushAll");
    RESOLVE(activity_get_next_record, "cuptiActivityGetNextRecord");
    RESOLVE(get_timestamp, "cuptiGetTimestamp");
    RESOLVE(get_result_string, "cuptiGetResultString");
    *(void **)(&g_cupti.subscribe_v2) = dlsym(lib, "cuptiSubscribe_v2"); /* CUDA 13; optional */
    *(void **)(&g_cupti.activity_get_num_dropped) = dlsym(lib, "cuptiActivityGetNumDroppedRecords"); /* optional */
    *(void **)(&g_cupti.finalize) = dlsym(lib, "cuptiFinalize"); /* optional */
    *(void **)(&g_cupti.get_device_id) = dlsym(lib, "cuptiGetDeviceId"); /* optional: spans get no devices */
    return NULL;
}

/* --- the API callback ---------------------------------------------------------------------------------------- */

static thread_local struct otel_gpu_launch launch_rec;
static thread_local struct otel_gpu_sync sync_rec;
/* The windows open at the entries of this thread's launch calls in progress (innermost last): an exit takes its own
 * call's entry even when a launch call makes another. A call whose entry came before the callbacks were on has none;
 * one whose exit came after they went off leaves a stale entry, dropped when the depth runs out. */
#define LAUNCH_DEPTH 4
static thread_local struct {
    uint32_t depth;
    struct {
        uint32_t correlation_id;
        uint64_t window_id;
    } at[LAUNCH_DEPTH];
} launch_enter;

/* Launch exits, by outcome (diagnostics, OTEL_GPU_DEBUG_STATS): recorded (entered inside a window); of those, the
 * ones whose CUPTI id at the exit differed from the one at the entry and the ones whose window closed during the call;
 * exits inside a window whose entry was not seen (the callbacks came on during the call) or came before the window
 * opened (not sampled). */
static _Atomic uint64_t exits_recorded, exits_no_entry, exits_window_changed, exits_id_changed, exits_entered_before;

void inject_print_stats(void)
{
    fprintf(stderr, "otel-gpu: stats launch exits: recorded %llu (entry id differed %llu, window closed during the "
            "call %llu), in a window without an entry %llu, entered before the window %llu\n",
            (unsigned long long)atomic_load(&exits_recorded), (unsigned long long)atomic_load(&exits_id_changed),
            (unsigned long long)atomic_load(&exits_window_changed), (unsigned long long)atomic_load(&exits_no_entry),
            (unsigned long long)atomic_load(&exits_entered_before));
}

/* cuGraphLaunch_params and cuGraphLaunch_ptsz_params of generated_cuda_meta.h (that header needs the whole toolkit's
 * typedefs): both are { CUgraphExec; CUstream; }. */
struct graph_launch_params {
    CUgraphExec exec;
    CUstream stream;
};

static uint64_t graph_exec_of(CUpti_CallbackId cbid, const void *params)
{
    if (params == NULL || (cbid != CUPTI_DRIVER_TRACE_CBID_cuGraphLaunch &&
                           cbid != CUPTI_DRIVER_TRACE_CBID_cuGraphLaunch_ptsz))
        return 0;
    return (uint64_t)(uintptr_t)((const struct graph_launch_params *)params)->exec;
}

/* The device (ordinal) of the launch's context, or -1 when unknown. Asked of CUPTI once per context and thread:
 * contextUid is unique within the process (never reused, unlike a destroyed context's address), and a thread
 * mostly launches into one context. Called for sampled launches inside a span only. */
static int device_of(const CUpti_CallbackData *cb)
{
    static thread_local uint32_t cached_uid;
    static thread_local int cached_device = -1;
    if (cb->context == NULL || g_cupti.get_device_id == NULL)
        return -1;
    if (cached_device >= 0 && cb->contextUid == cached_uid)
        return cached_device;
    uint32_t device = 0;
    if (g_cupti.get_device_id(cb->context, &device) != CUPTI_SUCCESS || device >= 64) {
        log_once("cuptiGetDeviceId failed for a launch's context; spans miss that device");
        return -1;
    }
    cached_uid = cb->contextUid;
    cached_device = (int)device;
    return cached_device;
}

static void record_launch(CUpti_CallbackId cbid, const CUpti_CallbackData *cb, uint32_t kind, uint64_t window_id)
{
    struct otel_gpu_launch *rec = &launch_rec;
    rec->abi_version = OTEL_GPU_ABI_VERSION;
    rec->kind = kind;
    rec->correlation_id = cb->correlationId;
    rec->cbid = (int32_t)cbid;
    rec->window_id = window_id;
    rec->timestamp_ns = now_ns();
    rec->graph_exec = graph_exec_of(cbid, cb->functionParams);
    if (span_context_read(&rec->span))
        span_context_note_device(device_of(cb)); /* the launch's device joins its local root's */
    stack_capture(&rec->stack);
    activity_remember(cb->correlationId, window_id, kind == OTEL_GPU_LAUNCH_GRAPH);
    emit_launch(rec);
    atomic_fetch_add(&g_state.window_launches, 1);
}

static void record_wait(CUpti_CallbackId cbid, const CUpti_CallbackData *cb, uint32_t kind)
{
    uint32_t every = atomic_load_explicit(&g_state.wait_sample_every, memory_order_relaxed);
    if (every > 1 && random_u64() % every != 0)
        return;
    uint64_t t0 = monotonic_ns();
    struct otel_gpu_sync *rec = &sync_rec;
    rec->abi_version = OTEL_GPU_ABI_VERSION;
    rec->kind = kind;
    rec->cbid = (int32_t)cbid;
    rec->reserved = 0;
    rec->start_ns = *cb->correlationData;
    rec->end_ns = now_ns();
    rec->weight = every;
    span_context_read(&rec->span);
    stack_capture(&rec->stack);
    emit_sync(rec);
    atomic_fetch_add(&g_state.waits_recorded, 1);
    atomic_fetch_add(&g_state.wait_overhead_ns, monotonic_ns() - t0);
}

static void on_driver_api(CUpti_CallbackId cbid, const CUpti_CallbackData *cb);

void CUPTIAPI inject_callback(void *userdata, CUpti_CallbackDomain domain, CUpti_CallbackId cbid, const void *data)
{
    (void)userdata;
    if (domain == CUPTI_CB_DOMAIN_DRIVER_API && cbid < CUPTI_DRIVER_TRACE_CBID_SIZE) {
        const CUpti_CallbackData *cb = data;
        if ((g_cbid_class[cbid] & CLASS_GRAPH_USE) && cb->callbackSite == CUPTI_API_ENTER)
            hold_graph_use();
        on_driver_api(cbid, cb);
        /* After this call's own record. At a synchronize's exit: the program's next wait, which CUPTI would not
         * see while it is finalized and not yet taken again, usually comes an iteration later (a blocking copy is
         * often followed by a synchronize at once). */
        if (cb->callbackSite == CUPTI_API_EXIT)
            hold_api_exit(g_cbid_class[cbid] >> CLASS_WAIT_SHIFT);
        return;
    }
    if (domain == CUPTI_CB_DOMAIN_RESOURCE && cbid == CUPTI_CBID_RESOURCE_CONTEXT_DESTROY_STARTING) {
        /* The context's records go with it: hand over what CUPTI holds (no lock: CUPTI's flush is thread-safe, and
         * the controller may be waiting on the driver this thread is in). */
        if (atomic_load(&g_state.attached))
            activity_drain(CONTEXT_DRAIN_NS);
    }
}

/* A sampled launch's exit: one fewer in its call. Never below zero: a linger that timed out reset the count while a
 * launch was still in its call (window.c). */
static void leave_entered(void)
{
    uint32_t n = atomic_load(&g_state.launches_entered);
    while (n != 0 && !atomic_compare_exchange_weak(&g_state.launches_entered, &n, n - 1))
        ;
}

static void on_driver_api(CUpti_CallbackId cbid, const CUpti_CallbackData *cb)
{
    uint8_t cls = g_cbid_class[cbid];
    uint32_t wait_kind = cls >> CLASS_WAIT_SHIFT;
    uint32_t launch_kind = cls & CLASS_LAUNCH_MASK;
    if (cb->callbackSite == CUPTI_API_ENTER) {
        /* A wait's duration is the time the thread was blocked: from entry to exit. */
        if (wait_kind != 0 && cb->correlationData != NULL)
            *cb->correlationData = now_ns();
        /* A launch is sampled if and only if a window is open at its entry (activity recording was on before the
         * window opened, so its GPU work is certain to be recorded), wherever its exit falls: sampling by one instant
         * per launch keeps long launches (a graph's, under CUPTI) as likely to be sampled as short ones. */
        if (launch_kind != 0) {
            if (launch_enter.depth >= LAUNCH_DEPTH)
                launch_enter.depth = 0;
            uint64_t window_id = atomic_load(&g_state.window_id);
            launch_enter.at[launch_enter.depth].correlation_id = cb->correlationId;
            launch_enter.at[launch_enter.depth].window_id = window_id;
            launch_enter.depth++;
            if (window_id != 0)
                atomic_fetch_add(&g_state.launches_entered, 1);
        }
        return;
    }
    uint64_t entered_window = 0;
    uint32_t entered_id = 0;
    int entered = 0;
    if (launch_kind != 0 && launch_enter.depth > 0) {
        launch_enter.depth--;
        entered_window = launch_enter.at[launch_enter.depth].window_id;
        entered_id = launch_enter.at[launch_enter.depth].correlation_id;
        entered = 1;
    }
    int sampled = entered && entered_window != 0;
    if (!atomic_load_explicit(&g_state.attached, memory_order_relaxed)) {
        if (sampled)
            leave_entered();
        return;
    }
    if (launch_kind == OTEL_GPU_LAUNCH_GRAPH)
        graphs_count(graph_exec_of(cbid, cb->functionParams)); /* every replay, sampled or not (graphs.c) */
    /* Outside a window the launch callbacks are on only while activity lingers (see window.c): nothing to do but
     * count the launch (its cost is charged by estimate.c), unless it entered inside the window that closed since. */
    if (launch_kind != 0 && wait_kind == 0 && !sampled &&
        atomic_load_explicit(&g_state.window_id, memory_order_relaxed) == 0) {
        atomic_fetch_add_explicit(&g_state.outside_launches, 1, memory_order_relaxed);
        return;
    }
    uint64_t t0 = monotonic_ns();
    if (launch_kind != 0) {
        /* in_launch lets the controller wait until no launch can still be counted in the window it closes; it goes
         * up before launches_entered goes down, so a closing window sees one or the other until the launch's id is
         * known to the activity filter (its records may arrive at the close's flush). */
        atomic_fetch_add(&g_state.in_launch, 1);
        if (sampled)
            leave_entered();
        uint64_t window_id = atomic_load(&g_state.window_id);
        if (sampled) {
            record_launch(cbid, cb, launch_kind, entered_window);
            atomic_fetch_add_explicit(&exits_recorded, 1, memory_order_relaxed);
            if (entered_window != window_id)
                atomic_fetch_add_explicit(&exits_window_changed, 1, memory_order_relaxed);
            if (entered_id != cb->correlationId)
                atomic_fetch_add_explicit(&exits_id_changed, 1, memory_order_relaxed);
        } else if (window_id != 0) {
            atomic_fetch_add_explicit(entered ? &exits_entered_before : &exits_no_entry, 1, memory_order_relaxed);
        }
        atomic_fetch_sub(&g_state.in_launch, 1);
    }
    if (wait_kind != 0 && cb->correlationData != NULL && *cb->correlationData != 0) {
        atomic_fetch_add_explicit(&g_state.waits_seen, 1, memory_order_relaxed); /* the program's pace (window.c) */
        record_wait(cbid, cb, wait_kind);
    }
    atomic_fetch_add_explicit(&g_state.overhead_ns, monotonic_ns() - t0, memory_order_relaxed);
}

/* --- setup and teardown -------------------------------------------------------------------------------------- */

static double env_double(const char *name, double fallback, double lo, double hi)
{
    const char *text = getenv(name);
    if (text == NULL || text[0] == '\0')
        return fallback;
    char *end = NULL;
    double value = strtod(text, &end);
    if (end == text || *end != '\0' || !(value >= lo && value <= hi)) {
        fprintf(stderr, "otel-gpu: ignoring %s=%s (expected a number in [%g, %g])\n", name, text, lo, hi);
        return fallback;
    }
    return value;
}

/* Whether the variable is set to exactly this value (the switches: "1" turns a default-off one on, "0" a default-on
 * one off). */
static int env_is(const char *name, const char *value)
{
    const char *text = getenv(name);
    return text != NULL && strcmp(text, value) == 0;
}

static void read_settings(void)
{
    g_settings.overhead_budget = env_double("OTEL_GPU_OVERHEAD_BUDGET", 0.02, 0.0001, 1.0);
    g_settings.window_ns = (uint64_t)(env_double("OTEL_GPU_WINDOW_MS", 20.0, 0.1, 10000.0) * 1e6);
    g_settings.max_waits_per_s = env_double("OTEL_GPU_MAX_WAITS_PER_S", 100.0, 1.0, 1e9);
    g_settings.debug_always_on = env_is("OTEL_GPU_DEBUG_ALWAYS_ON", "1");
    g_settings.debug_stats = env_is("OTEL_GPU_DEBUG_STATS", "1");
    g_settings.debug_no_waits = env_is("OTEL_GPU_DEBUG_NO_WAITS", "1");
    g_settings.debug_no_windows = env_is("OTEL_GPU_DEBUG_NO_WINDOWS", "1");
    g_settings.api_activity = !env_is("OTEL_GPU_API_ACTIVITY", "0");
    g_settings.cupti_finalize = !env_is("OTEL_GPU_CUPTI_FINALIZE", "0");
    g_settings.finalize_with_graphs = env_is("OTEL_GPU_DEBUG_FINALIZE_WITH_GRAPHS", "1");
    g_settings.finalize_at_once = !env_is("OTEL_GPU_FINALIZE_AT_ONCE", "0");
    g_settings.idle_keep = env_is("OTEL_GPU_DEBUG_IDLE_KEEP", "1");
    g_settings.charge_take = env_is("OTEL_GPU_DEBUG_CHARGE_TAKE", "0")     ? CHARGE_TAKE_NONE
                             : env_is("OTEL_GPU_DEBUG_CHARGE_TAKE", "cpu") ? CHARGE_TAKE_CPU
                                                                           : CHARGE_TAKE_WALL;
    g_settings.sample_graphs = env_is("OTEL_GPU_CUDA_GRAPHS", "sample");
    g_settings.graph_probe_every_ns =
        (uint64_t)(env_double("OTEL_GPU_DEBUG_GRAPH_PROBE_EVERY_MS", 1000.0, 1.0, 60000.0) * 1e6);
    g_settings.graph_residue_ns = env_double("OTEL_GPU_DEBUG_GRAPH_RESIDUE_NS", GRAPH_RESIDUE_NS_PER_LAUNCH, 0.0, 1e9);
}

/* A forked child has no controller thread and may have copied ctl_lock while held: the library goes inert there. */
static _Atomic int forked_child;

static void on_fork_child(void)
{
    atomic_store(&forked_child, 1);
    atomic_store(&g_state.attached, 0);
    atomic_store(&g_state.window_id, 0);
}

static void at_exit(void)
{
    if (!atomic_load(&forked_child))
        window_stop_and_flush();
}

__attribute__((visibility("default"))) int InitializeInjection(void)
{
    int expected = 0;
    if (!atomic_compare_exchange_strong(&initialized, &expected, 1))
        return 1;
    read_settings();
    atomic_store(&g_state.wait_sample_every, 1);
    void *lib = open_cupti();
    if (lib == NULL) {
        fprintf(stderr, "otel-gpu: cannot load CUPTI (%s); GPU-time profiling is off for this process "
                        "(set OTEL_GPU_CUPTI_PATH to libcupti.so.13)\n", dlerror());
        return 0;
    }
    const char *missing = resolve_cupti(lib);
    if (missing != NULL) {
        fprintf(stderr, "otel-gpu: CUPTI lacks %s; GPU-time profiling is off for this process\n", missing);
        return 0;
    }
    if (emit_init() != 0)
        fprintf(stderr, "otel-gpu: cannot open OTEL_GPU_DEBUG_FILE; debug records are not written\n");
    cbids_init();
    stack_init();
    coexist_init(); /* before the controller, which rescans for objects loaded later */
    if (window_start() != 0) {
        fprintf(stderr, "otel-gpu: cannot start the sampling thread; GPU-time profiling is off for this process\n");
        return 0;
    }
    pthread_atfork(NULL, NULL, on_fork_child);
    atexit(at_exit);
    return 1;
}

__attribute__((destructor)) static void on_unload(void)
{
    if (atomic_load(&initialized) && !atomic_load(&forked_child))
        window_stop_and_flush();
}
