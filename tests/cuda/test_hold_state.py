# SPDX-License-Identifier: Apache-2.0
"""The injected library's hold on CUPTI: the pure transitions of otel_gpu/cuda/native/hold_state.c, through ctypes.

hold.c performs each transition as a compare-and-swap from the state it was decided on, with the next state from
hold_next; these tests pin the table: which event moves which state, and that every other pair leaves it alone.
"""

from __future__ import annotations

import ctypes
import enum
import subprocess
from pathlib import Path

import pytest

FAKES = Path(__file__).resolve().parents[2] / "tests" / "native" / "cuda"


class State(enum.IntEnum):
    FREE = 0
    HELD = 1
    ASKED = 2
    FINALIZING = 3
    FINALIZED = 4
    ASIDE = 5


class Event(enum.IntEnum):
    SUBSCRIBED = 0
    RELEASED = 1
    ASK = 2
    CALL_OFF = 3
    BEGIN = 4
    FAILED = 5
    DONE = 6
    SETTLE = 7
    STEP_ASIDE = 8
    TAKE_BACK = 9


class Policy(ctypes.Structure):
    _fields_ = [
        ("has_finalize", ctypes.c_int),
        ("finalize_setting", ctypes.c_int),
        ("graphs_seen", ctypes.c_int),
        ("finalize_with_graphs", ctypes.c_int),
    ]


# Every transition that moves; any (state, event) pair not listed leaves the state as it was.
MOVES = {
    (State.FREE, Event.SUBSCRIBED): State.HELD,
    (State.HELD, Event.RELEASED): State.FREE,
    (State.FINALIZING, Event.RELEASED): State.FREE,  # detach racing an API exit's finalize: both end not held
    (State.FINALIZED, Event.RELEASED): State.FREE,
    (State.HELD, Event.ASK): State.ASKED,
    (State.ASKED, Event.CALL_OFF): State.HELD,
    (State.ASKED, Event.BEGIN): State.FINALIZING,
    (State.FINALIZING, Event.FAILED): State.HELD,
    (State.FINALIZING, Event.DONE): State.FINALIZED,
    (State.FINALIZED, Event.SETTLE): State.FREE,
    (State.FREE, Event.STEP_ASIDE): State.ASIDE,
    (State.ASIDE, Event.TAKE_BACK): State.FREE,
}


@pytest.fixture(scope="module")
def hold() -> ctypes.CDLL:
    subprocess.run(["make", "-s", "-C", str(FAKES), "libhold_state.so"], check=True, capture_output=True, timeout=300)
    lib = ctypes.CDLL(str(FAKES / "libhold_state.so"))
    lib.hold_next.argtypes = [ctypes.c_int, ctypes.c_int]
    lib.hold_next.restype = ctypes.c_int
    lib.hold_may_finalize.argtypes = [ctypes.POINTER(Policy)]
    lib.hold_may_finalize.restype = ctypes.c_int
    lib.hold_exit_takes_finalize.argtypes = [ctypes.c_int, ctypes.c_int]
    lib.hold_exit_takes_finalize.restype = ctypes.c_int
    return lib


def step(lib: ctypes.CDLL, state: State, event: Event) -> State:
    return State(lib.hold_next(state, event))


@pytest.mark.parametrize("state", list(State))
@pytest.mark.parametrize("event", list(Event))
def test_transition_table(hold: ctypes.CDLL, state: State, event: Event) -> None:
    assert step(hold, state, event) == MOVES.get((state, event), state)


def test_a_window_cycle_ends_free_and_subscribes_again(hold: ctypes.CDLL) -> None:
    """Attach, a linger ends (ask), a synchronize exit finalizes, the controller notices and subscribes again."""
    s = State.FREE
    for event, expected in [(Event.SUBSCRIBED, State.HELD), (Event.ASK, State.ASKED), (Event.BEGIN, State.FINALIZING),
                            (Event.DONE, State.FINALIZED), (Event.SETTLE, State.FREE), (Event.SUBSCRIBED, State.HELD)]:
        s = step(hold, s, event)
        assert s == expected, event


def test_only_an_asked_finalize_can_begin(hold: ctypes.CDLL) -> None:
    """An API exit never finalizes a CUPTI the controller did not ask about, nor one called off (graph, next window)."""
    for state in State:
        if state != State.ASKED:
            assert step(hold, state, Event.BEGIN) == state
    called_off = step(hold, State.ASKED, Event.CALL_OFF)
    assert step(hold, called_off, Event.BEGIN) == State.HELD


def test_a_running_finalize_is_never_called_off(hold: ctypes.CDLL) -> None:
    """The controller waits for a finalize in progress (hold_holding) rather than calling it off."""
    assert step(hold, State.FINALIZING, Event.CALL_OFF) == State.FINALIZING
    assert step(hold, State.FINALIZING, Event.SETTLE) == State.FINALIZING


def test_aside_is_left_only_by_taking_back(hold: ctypes.CDLL) -> None:
    """While another CUPTI user of the program holds CUPTI, nothing subscribes, asks or finalizes: only the controller's
    take-back (the other tool done and quiet) frees it; and the library steps aside only once released."""
    for event in Event:
        assert step(hold, State.ASIDE, event) == (State.FREE if event == Event.TAKE_BACK else State.ASIDE)
    for state in (State.HELD, State.ASKED, State.FINALIZING, State.FINALIZED):
        assert step(hold, state, Event.STEP_ASIDE) == state


def test_a_failed_finalize_keeps_the_subscription(hold: ctypes.CDLL) -> None:
    assert step(hold, State.FINALIZING, Event.FAILED) == State.HELD


@pytest.mark.parametrize(
    ("has_finalize", "setting", "graphs", "with_graphs", "expected"),
    [
        (1, 1, 0, 0, 1),
        (0, 1, 0, 0, 0),  # a CUPTI without cuptiFinalize
        (1, 0, 0, 0, 0),  # OTEL_GPU_CUPTI_FINALIZE=0
        (1, 1, 1, 0, 0),  # CUDA graphs in use: never again
        (1, 1, 1, 1, 1),  # OTEL_GPU_DEBUG_FINALIZE_WITH_GRAPHS=1, the control
        (1, 0, 1, 1, 0),
    ],
)
def test_may_finalize(hold: ctypes.CDLL, has_finalize: int, setting: int, graphs: int, with_graphs: int,
                      expected: int) -> None:
    policy = Policy(has_finalize, setting, graphs, with_graphs)
    assert hold.hold_may_finalize(ctypes.byref(policy)) == expected


def test_which_exits_take_a_finalize_up(hold: ctypes.CDLL) -> None:
    assert hold.hold_exit_takes_finalize(1, 0) == 1  # a synchronize's exit
    assert hold.hold_exit_takes_finalize(0, 0) == 0  # a launch's or a blocking copy's, while patient
    assert hold.hold_exit_takes_finalize(0, 1) == 1  # any exit once the finalize has waited too long
