# SPDX-License-Identifier: Apache-2.0
"""The injected library's in-window slowdown estimate (otel_gpu/cuda/native/estimate.c), called through ctypes."""

from __future__ import annotations

import ctypes
import subprocess
from pathlib import Path

import pytest

FAKES = Path(__file__).resolve().parents[2] / "tests" / "native" / "cuda"


class WindowCost(ctypes.Structure):
    _fields_ = [
        ("window_ns", ctypes.c_uint64),
        ("own_ns", ctypes.c_uint64),
        ("launches", ctypes.c_uint64),
        ("linger_launches", ctypes.c_uint64),
        ("finalize_ns", ctypes.c_uint64),
        ("shadow_launches", ctypes.c_uint64),
        ("measured_pace", ctypes.c_double),
    ]


@pytest.fixture(scope="module")
def estimate() -> ctypes.CDLL:
    subprocess.run(["make", "-s", "-C", str(FAKES), "libestimate.so"], check=True, capture_output=True, timeout=300)
    lib = ctypes.CDLL(str(FAKES / "libestimate.so"))
    lib.estimate_slowdown.argtypes = [ctypes.POINTER(WindowCost)]
    lib.estimate_slowdown.restype = ctypes.c_double
    lib.fraction_for_budget.argtypes = [ctypes.c_double, ctypes.c_double]
    lib.fraction_for_budget.restype = ctypes.c_double
    lib.estimate_pace.argtypes = [ctypes.c_uint64] * 4
    lib.estimate_pace.restype = ctypes.c_double
    return lib


def slowdown(lib: ctypes.CDLL, window_ns: int, own_ns: int, launches: int, linger_launches: int = 0) -> float:
    return float(lib.estimate_slowdown(ctypes.byref(WindowCost(window_ns, own_ns, launches, linger_launches))))


def test_launch_bound_window_of_the_h200_smoke_run(estimate: ctypes.CDLL) -> None:
    """Inject smoke run 1 on an H200: 17 windows, 342.6 ms, 12302 launches, 121.95 ms of the library's own time;
    the launch rate in windows was 36k/s against ~147k/s outside, a real in-window slowdown of about 3 (300 %)."""
    s = slowdown(estimate, window_ns=342_600_000 // 17, own_ns=121_950_000 // 17, launches=12302 // 17)
    assert 2.0 <= s <= 4.0  # the old estimate (overhead / window length, 4 us prior) said 0.5
    f = estimate.fraction_for_budget(0.02, s)
    assert f * 3.1 <= 0.03  # at the real slowdown, the default 2 % budget costs well under 5 %


def test_gpu_bound_window_is_cheap(estimate: ctypes.CDLL) -> None:
    """A matmul loop: 14 launches in a 20 ms window, 30 us of the library's time: the maximum fraction."""
    s = slowdown(estimate, window_ns=20_000_000, own_ns=30_000, launches=14)
    assert s == pytest.approx((30_000 + 14 * 10_000) / (20_000_000 - 30_000 - 14 * 10_000))
    assert estimate.fraction_for_budget(0.02, s) == pytest.approx(0.2)


def test_slowdown_is_relative_to_the_undisturbed_time(estimate: ctypes.CDLL) -> None:
    """Half the window spent on recording is a slowdown of 1 (100 %), not 0.5."""
    assert slowdown(estimate, window_ns=20_000_000, own_ns=10_000_000, launches=0) == pytest.approx(1.0)
    # Recording that takes (nearly) the whole window: by the priors, the undisturbed time is floored at 25 % of it (a
    # slowdown of 3); by a measured pace at 5 %
    assert slowdown(estimate, window_ns=20_000_000, own_ns=19_990_000, launches=0) == pytest.approx(3.0)
    paced = WindowCost(20_000_000, 19_990_000, 100, 0, 0, 0, 50.0)
    assert estimate.estimate_slowdown(ctypes.byref(paced)) == pytest.approx(19.6)  # (20 - 20 / 50) / 1 ms


def test_lingering_activity_adds_its_launches_cost(estimate: ctypes.CDLL) -> None:
    """Launches counted while the kinds linger after the window pay the activity cost (4 us) and an empty callback
    (1 us), charged to the window they linger for."""
    base = slowdown(estimate, window_ns=20_000_000, own_ns=1_000_000, launches=100)
    lingered = slowdown(estimate, window_ns=20_000_000, own_ns=1_000_000, launches=100, linger_launches=90)
    undisturbed = 20_000_000 - 1_000_000 - 100 * 10_000
    assert lingered - base == pytest.approx(90 * (4_000 + 1_000) / undisturbed)


def test_fraction_is_bounded(estimate: ctypes.CDLL) -> None:
    assert estimate.fraction_for_budget(0.02, 0.0) == pytest.approx(0.2)
    assert estimate.fraction_for_budget(0.02, 1000.0) == pytest.approx(0.001)
    assert estimate.fraction_for_budget(0.02, 2.0) == pytest.approx(0.01)


def test_idle_windows_leave_the_estimate_alone(estimate: ctypes.CDLL) -> None:
    """Windows that open while the program launches nothing (an inference server between requests) say nothing about
    what sampling costs: the estimate keeps its value, so the next burst is not sampled at the 20 % cap."""
    estimate.estimate_update.argtypes = [ctypes.c_double, ctypes.POINTER(WindowCost)]
    estimate.estimate_update.restype = ctypes.c_double
    busy = WindowCost(20_000_000, 1_000_000, 1000, 0)  # 1000 launches: (1 ms + 10 ms prior) / 9 ms
    s = estimate.estimate_update(0.0, ctypes.byref(busy))
    assert s == pytest.approx(0.5 * 11 / 9)
    for _ in range(50):
        s_idle = estimate.estimate_update(s, ctypes.byref(WindowCost(20_000_000, 40_000, 0, 0)))  # a wait recorded
        assert s_idle == s
    assert estimate.fraction_for_budget(0.02, s) < 0.04
    lingering = estimate.estimate_update(s, ctypes.byref(WindowCost(20_000_000, 0, 0, 500)))  # launches while lingering
    assert lingering == pytest.approx(0.5 * s + 0.5 * 500 * 5_000 / 20_000_000)


def test_the_finalize_after_a_window_is_charged_to_the_next(estimate: ctypes.CDLL) -> None:
    """cuptiFinalize runs in one of the program's threads (2.0-2.4 ms each on an H200): that time counts as slowdown
    like the library's own, so the budget covers it."""
    base = WindowCost(20_000_000, 1_000_000, 100, 0, 0)
    charged = WindowCost(20_000_000, 1_000_000, 100, 0, 2_200_000)
    undisturbed = 20_000_000 - 1_000_000 - 100 * 10_000
    assert estimate.estimate_slowdown(ctypes.byref(charged)) - estimate.estimate_slowdown(
        ctypes.byref(base)) == pytest.approx(2_200_000 / undisturbed)


def test_a_measured_pace_replaces_the_priors_in_the_window(estimate: ctypes.CDLL) -> None:
    """The smoke run again, measured instead of priced: 36k launches a second in windows against 147k in the shadows
    (where the launch callbacks only count) is a slowdown of 147/36 - 1 in the window, whatever the
    library's own time says; the shadows' callbacks, the linger and the finalize are charged on top."""
    pace = estimate.estimate_pace(36_000, 10**9, 147_000, 10**9)
    assert pace == pytest.approx(147 / 36)
    window = WindowCost(20_000_000, 1_000_000, 720, 0, 0, 0, pace)
    assert estimate.estimate_slowdown(ctypes.byref(window)) == pytest.approx(pace - 1)
    charged = WindowCost(20_000_000, 1_000_000, 720, 100, 500_000, 3000, pace)
    undisturbed = 20_000_000 / pace
    assert estimate.estimate_slowdown(ctypes.byref(charged)) == pytest.approx(
        pace - 1 + (100 * 5_000 + 500_000 + 3000 * 1_000) / undisturbed)
    # a GPU-bound program launches at the GPU's pace in and out of windows: no in-window slowdown, the fraction's cap
    gpu_bound = WindowCost(20_000_000, 30_000, 14, 0, 0, 0, estimate.estimate_pace(2800, 10**9, 2790, 10**9))
    assert estimate.estimate_slowdown(ctypes.byref(gpu_bound)) == 0.0
    assert estimate.fraction_for_budget(0.02, 0.0) == pytest.approx(0.2)


def test_the_priors_never_price_a_window_past_four_times_its_undisturbed_time(estimate: ctypes.CDLL) -> None:
    """A program's first launches (its libraries' caches cold) cost the library far more than later ones: priced by
    the priors, an H100's graph program's first window with launches came to an in-window slowdown estimate of 97, and
    its next windows came seconds apart, while its measured pace was 2.0-2.4. The priors take at most 75 % of a window
    for the sampling's cost (a slowdown of 3), the measured pace alone may say more."""
    assert slowdown(estimate, window_ns=5_000_000, own_ns=4_900_000, launches=250) == pytest.approx(3.0)
    finalized = WindowCost(5_000_000, 4_900_000, 250, 0, 10_000_000, 0, 0.0)
    assert estimate.estimate_slowdown(ctypes.byref(finalized)) == pytest.approx((3_750_000 + 10_000_000) / 1_250_000)
    measured = WindowCost(5_000_000, 4_900_000, 250, 0, 0, 0, 8.0)
    assert estimate.estimate_slowdown(ctypes.byref(measured)) == pytest.approx(7.0)


def test_the_pace_waits_for_enough_launches(estimate: ctypes.CDLL) -> None:
    """Under 500 launches on either side the rates are not trusted (0: the priors decide); a program that ran
    faster in windows than outside (noise, phases) measures no slowdown, never a negative one."""
    assert estimate.estimate_pace(499, 10**9, 50_000, 10**9) == 0.0
    assert estimate.estimate_pace(50_000, 10**9, 499, 10**9) == 0.0
    assert estimate.estimate_pace(500, 10**9, 1000, 10**9) == 2.0
    assert estimate.estimate_pace(50_000, 0, 50_000, 10**9) == 0.0
    assert estimate.estimate_pace(60_000, 10**9, 50_000, 10**9) == 1.0
    prior = WindowCost(20_000_000, 1_000_000, 100, 0, 0, 0, 0.0)
    assert estimate.estimate_slowdown(ctypes.byref(prior)) == pytest.approx(
        (1_000_000 + 100 * 10_000) / (20_000_000 - 1_000_000 - 100 * 10_000))
