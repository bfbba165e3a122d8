/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The in-window slowdown estimate that sizes the sampling fraction: pure arithmetic, no state, so that tests can
 * call it directly (tests/native/cuda builds it into a small shared library).
 *
 * Inside a window every launch pays the library's own time (callbacks, stack, buffer processing: measured) and
 * CUPTI's own cost per recorded launch (callback dispatch and activity instrumentation inside the driver: not
 * measurable from here, so a conservative prior). The slowdown is relative to the time the same work takes
 * undisturbed: cost / (window - cost). After a window closes, the activity kinds may stay on until the window's
 * sampled launches' GPU work has arrived ("linger"), and the launch callbacks with them (so that every launch gets
 * its own correlation id); launches then pay CUPTI's activity cost and an empty callback. The callback counts them.
 * Then CUPTI is finalized in one of the program's threads (window.c): that time, measured, is charged too, and so
 * is the controller's time subscribing again after it, during which the driver holds the program's launches back
 * (hold.c: the take's wall time, capped where a GPU-bound program's take waits for its queue): a launch-bound program
 * lost +2.5-3.1 % on a 2 % budget without it, +0.6 % with the take's wall time charged (~8.5 ms on an H200) and
 * +3.7-5.3 % with only the controller's CPU time in it (scripts/h200/baton.py, docs/benchmarks.md).
 *
 * Once enough launches were seen, the in-window part is measured instead of priced: the gaps' shadow windows count
 * the program's launches with callbacks that do nothing else (window.c), so launches per second with nothing
 * observed against launches per second in windows is the slowdown itself, whatever CUPTI and the library cost per
 * launch on this machine (a launch-bound program slows by that ratio; a GPU-bound one launches at the GPU's pace in
 * both, and measures no in-window slowdown). The shadows' callbacks are charged at the empty-callback prior.
 */
#include "estimate.h"

double estimate_pace(uint64_t window_launches, uint64_t window_ns, uint64_t shadow_launches, uint64_t shadow_ns)
{
    if (window_launches < ESTIMATE_MEASURED_MIN_LAUNCHES || shadow_launches < ESTIMATE_MEASURED_MIN_LAUNCHES ||
        window_ns == 0 || shadow_ns == 0)
        return 0.0;
    double pace = ((double)shadow_launches / (double)shadow_ns) / ((double)window_launches / (double)window_ns);
    return pace > 1.0 ? pace : 1.0;
}

double estimate_slowdown(const struct window_cost *c)
{
    if (c->window_ns == 0)
        return 0.0;
    double window = (double)c->window_ns;
    double in_window, undisturbed;
    if (c->measured_pace >= 1.0) {
        undisturbed = window / c->measured_pace;
        in_window = window - undisturbed;
    } else {
        /* The priors price a launch at most 4x its undisturbed time: the most launch-bound programs measured ran 2-4x
         * slower in windows (an H100's and an H200's paces), while the priors on a program's first launches (its
         * library's caches cold) said 20x and more: one such window's estimate of 97 held an H100's graph program's
         * windows seconds apart. */
        in_window = (double)c->own_ns + (double)c->launches * ESTIMATE_CUPTI_NS_PER_LAUNCH;
        if (in_window > window * (1.0 - ESTIMATE_PRIOR_MIN_UNDISTURBED))
            in_window = window * (1.0 - ESTIMATE_PRIOR_MIN_UNDISTURBED);
        undisturbed = window - in_window;
    }
    if (undisturbed < window * ESTIMATE_MIN_UNDISTURBED)
        undisturbed = window * ESTIMATE_MIN_UNDISTURBED; /* the work took at least this long undisturbed */
    double lingering = (double)c->linger_launches * (ESTIMATE_ACTIVITY_NS_PER_LAUNCH + ESTIMATE_EMPTY_CALLBACK_NS);
    double shadows = (double)c->shadow_launches * ESTIMATE_EMPTY_CALLBACK_NS;
    return (in_window + lingering + shadows + (double)c->finalize_ns) / undisturbed;
}

double estimate_update(double previous, const struct window_cost *c)
{
    if (c->window_ns == 0 || (c->launches == 0 && c->linger_launches == 0))
        return previous;
    return 0.5 * previous + 0.5 * estimate_slowdown(c);
}

double fraction_for_budget(double budget, double slowdown)
{
    double f = slowdown > 0.0 ? budget / slowdown : ESTIMATE_FRACTION_MAX;
    return f < ESTIMATE_FRACTION_MIN ? ESTIMATE_FRACTION_MIN : (f > ESTIMATE_FRACTION_MAX ? ESTIMATE_FRACTION_MAX : f);
}
