/* SPDX-License-Identifier: Apache-2.0 */
/* Exact replay counts of CUDA graphs, per graph exec (graphs.c). Needs nothing but the probe ABI, so that tests and
 * bench/bench_graph_counts.py can build it alone. */
#ifndef OTEL_GPU_GRAPHS_H
#define OTEL_GPU_GRAPHS_H

#include <stdint.h>

#include "otel_gpu_probes.h"

void graphs_count(uint64_t exec);                 /* one replay of exec (any thread; 0 is ignored) */
void graphs_reset(void);                          /* counts start again from zero (attach); execs keep their slots */
void graphs_report(struct otel_gpu_window *rec);  /* the totals into a window record */

#endif /* OTEL_GPU_GRAPHS_H */
