/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Every replay of a CUDA graph counted, per graph exec, while an agent is attached. Windows sample launches by time,
 * and on clustered work (a phase of graph replays, then an eager phase) a short window sees one phase or the other,
 * so a graph's window-weighted time spreads widely between runs. Graph launches are rare (one stands for many
 * kernels) and their callbacks stay on while subscribed (cbids.c), so they can be counted exactly: the agent then
 * weights a sampled replay's work by (replays of its exec) / (sampled replays of it) over a stretch of time.
 *
 * The path is the exit of every graph launch: no lock, no allocation, no call out. A fixed open-addressed table of
 * OTEL_GPU_GRAPH_SLOTS execs; an exec takes a free slot with one compare-and-swap and keeps it for the process's
 * life (a destroyed exec's handle reused by a new one is counted as the same: both are replays of whatever the
 * handle names); replays of execs that find no slot go to one "other" counter, which the agent weights by windows.
 * Counts are totals since the last attach, so a lost window record loses nothing.
 */
#include <stdatomic.h>

#include "graphs.h"

static struct {
    _Atomic uint64_t exec; /* 0: free */
    _Atomic uint64_t replays;
} slots[OTEL_GPU_GRAPH_SLOTS];
static _Atomic uint64_t other_replays;

/* Graph execs are heap pointers: drop the low bits an allocator leaves at zero, mix the rest (Fibonacci hashing). */
static uint32_t slot_of(uint64_t exec)
{
    return (uint32_t)(((exec >> 4) * 0x9E3779B97F4A7C15ull) >> 32) % OTEL_GPU_GRAPH_SLOTS;
}

void graphs_count(uint64_t exec)
{
    if (exec == 0)
        return;
    uint32_t at = slot_of(exec);
    for (uint32_t probe = 0; probe < OTEL_GPU_GRAPH_SLOTS; probe++, at = (at + 1) % OTEL_GPU_GRAPH_SLOTS) {
        uint64_t held = atomic_load_explicit(&slots[at].exec, memory_order_acquire);
        if (held == 0) {
            uint64_t expected = 0;
            if (atomic_compare_exchange_strong(&slots[at].exec, &expected, exec) || expected == exec) {
                atomic_fetch_add_explicit(&slots[at].replays, 1, memory_order_relaxed);
                return;
            }
            continue; /* another exec took it first */
        }
        if (held == exec) {
            atomic_fetch_add_explicit(&slots[at].replays, 1, memory_order_relaxed);
            return;
        }
    }
    atomic_fetch_add_explicit(&other_replays, 1, memory_order_relaxed);
}

void graphs_reset(void)
{
    for (uint32_t i = 0; i < OTEL_GPU_GRAPH_SLOTS; i++)
        atomic_store_explicit(&slots[i].replays, 0, memory_order_relaxed);
    atomic_store_explicit(&other_replays, 0, memory_order_relaxed);
}

void graphs_report(struct otel_gpu_window *rec)
{
    uint32_t n = 0;
    for (uint32_t i = 0; i < OTEL_GPU_GRAPH_SLOTS; i++) {
        uint64_t exec = atomic_load_explicit(&slots[i].exec, memory_order_acquire);
        if (exec == 0)
            continue;
        rec->graphs[n].exec = exec;
        rec->graphs[n].replays = atomic_load_explicit(&slots[i].replays, memory_order_relaxed);
        n++;
    }
    rec->graph_count = n;
    rec->graph_other_replays = atomic_load_explicit(&other_replays, memory_order_relaxed);
}
