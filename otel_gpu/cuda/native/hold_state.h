/* SPDX-License-Identifier: Apache-2.0 */
/* The CUPTI hold's states and transitions (hold_state.c, used by hold.c); plain C, no CUDA headers, so tests can build
 * it alone. */
#ifndef OTEL_GPU_HOLD_STATE_H
#define OTEL_GPU_HOLD_STATE_H

/*
 * One atomic value in hold.c. The controller (under its lock) subscribes, releases, asks for a finalize, calls one
 * off and notices one done; the program's threads, in the API callback, perform an asked-for finalize or call it off
 * (a CUDA graph came). Every change is a compare-and-swap from the state it was decided on, so that the two sides
 * never overwrite each other's move.
 *
 *   FREE --subscribed--> HELD --ask--> ASKED --begin--> FINALIZING --done--> FINALIZED --settle--> FREE
 *                         ^              |                   |
 *                         +--call off----+                   |
 *                         +--failed--------------------------+
 *   released: HELD, FINALIZING, FINALIZED --> FREE (detach, stand aside, a failed set-up)
 *   FREE --step aside--> ASIDE --take back--> FREE (another CUPTI user of the program, coexist.c)
 */
enum hold_state {
    HOLD_FREE,       /* not subscribed: CUPTI is left to other tools */
    HOLD_HELD,       /* subscribed */
    HOLD_ASKED,      /* subscribed, a finalize asked for: the next synchronize exit (or any exit, later) performs it */
    HOLD_FINALIZING, /* an API exit is in cuptiFinalize */
    HOLD_FINALIZED,  /* an API exit finalized CUPTI; the controller has not noticed yet (it then subscribes again) */
    HOLD_ASIDE,      /* released for another CUPTI user of the program: not subscribed again until it is done */
};

enum hold_event {
    HOLD_SUBSCRIBED, /* controller: cuptiSubscribe succeeded */
    HOLD_RELEASED,   /* controller: cuptiUnsubscribe */
    HOLD_ASK,        /* controller: a linger ended (or detach): finalize at the next synchronize exit */
    HOLD_CALL_OFF,   /* controller about to use CUPTI, a first graph call, or an exit that may no longer finalize */
    HOLD_BEGIN,      /* an API exit takes the finalize up */
    HOLD_FAILED,     /* cuptiFinalize failed: CUPTI stays subscribed */
    HOLD_DONE,       /* cuptiFinalize succeeded */
    HOLD_SETTLE,     /* controller: noticed the finalize; CUPTI is no longer held */
    HOLD_STEP_ASIDE, /* another tool starts using CUPTI (after the release) */
    HOLD_TAKE_BACK,  /* controller: the other tool is done and quiet */
};

/* The state after the event; the state itself when the event does not apply to it. */
enum hold_state hold_next(enum hold_state from, enum hold_event event);

/* Whether CUPTI may be finalized at all: it has a cuptiFinalize, OTEL_GPU_CUPTI_FINALIZE is not 0, and no CUDA graph
 * has been seen (a graph recorded under one CUPTI faults when replayed under the next), unless the debug control
 * (OTEL_GPU_DEBUG_FINALIZE_WITH_GRAPHS=1) says finalize anyway. */
struct hold_policy {
    int has_finalize;
    int finalize_setting;
    int graphs_seen;
    int finalize_with_graphs;
};
int hold_may_finalize(const struct hold_policy *p);

/* Whether an API exit takes an asked-for finalize up: a synchronize's exit (CUPTI's documented place; not a blocking
 * copy's, which is often followed by a synchronize at once), or any exit once the finalize has waited too long. */
int hold_exit_takes_finalize(int synchronize_exit, int any_exit);

#endif /* OTEL_GPU_HOLD_STATE_H */
