/* SPDX-License-Identifier: Apache-2.0 */
/* The CUPTI hold's transitions (hold_state.h): pure, no state, so that tests can call them directly
 * (tests/native/cuda builds this file into a small shared library, tests/cuda/test_hold_state.py). */
#include "hold_state.h"

enum hold_state hold_next(enum hold_state from, enum hold_event event)
{
    switch (event) {
    case HOLD_SUBSCRIBED:
        return from == HOLD_FREE ? HOLD_HELD : from;
    case HOLD_RELEASED:
        return from == HOLD_HELD || from == HOLD_FINALIZING || from == HOLD_FINALIZED ? HOLD_FREE : from;
    case HOLD_ASK:
        return from == HOLD_HELD ? HOLD_ASKED : from;
    case HOLD_CALL_OFF:
        return from == HOLD_ASKED ? HOLD_HELD : from;
    case HOLD_BEGIN:
        return from == HOLD_ASKED ? HOLD_FINALIZING : from;
    case HOLD_FAILED:
        return from == HOLD_FINALIZING ? HOLD_HELD : from;
    case HOLD_DONE:
        return from == HOLD_FINALIZING ? HOLD_FINALIZED : from;
    case HOLD_SETTLE:
        return from == HOLD_FINALIZED ? HOLD_FREE : from;
    case HOLD_STEP_ASIDE:
        return from == HOLD_FREE ? HOLD_ASIDE : from;
    case HOLD_TAKE_BACK:
        return from == HOLD_ASIDE ? HOLD_FREE : from;
    }
    return from;
}

int hold_may_finalize(const struct hold_policy *p)
{
    return p->finalize_setting && p->has_finalize && (!p->graphs_seen || p->finalize_with_graphs);
}

int hold_exit_takes_finalize(int synchronize_exit, int any_exit)
{
    return synchronize_exit || any_exit;
}
