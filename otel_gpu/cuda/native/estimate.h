/* SPDX-License-Identifier: Apache-2.0 */
/* The in-window slowdown estimate (estimate.c); plain C, no CUDA headers, so tests can build it alone. */
#ifndef OTEL_GPU_ESTIMATE_H
#define OTEL_GPU_ESTIMATE_H

#include <stdint.h>

/* CUPTI's own cost per recorded launch (callbacks + activity instrumentation inside the driver): not measurable from
 * inside the program, so a prior from the launch rates inside and outside windows on a GPU (docs/benchmarks.md). */
#define ESTIMATE_CUPTI_NS_PER_LAUNCH 10000.0
#define ESTIMATE_ACTIVITY_NS_PER_LAUNCH 4000.0 /* activity instrumentation of a launch outside a window */
#define ESTIMATE_EMPTY_CALLBACK_NS 1000.0      /* CUPTI dispatching a launch callback that returns at once */
#define ESTIMATE_MIN_UNDISTURBED 0.05          /* undisturbed time is taken as at least 5 % of the window */
#define ESTIMATE_PRIOR_MIN_UNDISTURBED 0.25    /* ... and 25 % while the priors price the window (below) */
#define ESTIMATE_FRACTION_MIN 0.001
#define ESTIMATE_FRACTION_MAX 0.2

struct window_cost {
    uint64_t window_ns; /* length of the window */
    uint64_t own_ns;    /* the library's own time in callbacks and buffer processing during the window */
    uint64_t launches;  /* launches recorded in the window */
    uint64_t linger_launches; /* after the window, while its late GPU work was awaited: launches (counted) */
    uint64_t finalize_ns;     /* the program's time in cuptiFinalize after the previous window and the controller's
                               * time subscribing again (measured; hold.c) */
    uint64_t shadow_launches; /* launches counted in shadow windows since the last charge (an empty callback each) */
    double measured_pace;     /* launches per second out of windows over in windows (estimate_pace), or 0 while
                               * too few launches were seen: the priors then */
};

#define ESTIMATE_MEASURED_MIN_LAUNCHES 500 /* launches seen in windows and in shadows before the rates are trusted */

/* The program's pace by its launches: launches per second in shadow windows (counting only) over launches per second
 * in windows (at least 1); 0 while either side has seen too few launches. */
double estimate_pace(uint64_t window_launches, uint64_t window_ns, uint64_t shadow_launches, uint64_t shadow_ns);

/* Slowdown of the program while sampling one window: extra time / undisturbed time (0.5 = 50 % slower). */
double estimate_slowdown(const struct window_cost *c);

/* The running estimate after one more window: halfway to the window's own, unless the window saw no launch at all
 * (an idle spell says nothing about what sampling costs, and must not raise the fraction just before a burst). */
double estimate_update(double previous, const struct window_cost *c);
/* The fraction of time to sample so that fraction x slowdown stays within budget, bounded to [0.1 %, 20 %]. */
double fraction_for_budget(double budget, double slowdown);

#endif /* OTEL_GPU_ESTIMATE_H */
