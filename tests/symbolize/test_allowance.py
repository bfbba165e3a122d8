# SPDX-License-Identifier: Apache-2.0
"""The allowance for reading symbol tables: a burst, then a share of one core; an overdraft is repaid first."""

from __future__ import annotations

import pytest

from otel_gpu.symbolize.allowance import ReadAllowance


def test_starts_with_the_burst_and_refills_at_the_share_up_to_it() -> None:
    allowance = ReadAllowance(share=0.01, burst_s=2.0, now_s=100.0)
    assert allowance.available_s(100.0) == 2.0
    allowance.spend(1.5)
    assert allowance.available_s(100.0) == pytest.approx(0.5)
    assert allowance.available_s(150.0) == pytest.approx(1.0)  # 50 s at 1 % of a core
    assert allowance.available_s(10_000.0) == 2.0  # never more than the burst


def test_an_overdraft_is_repaid_before_anything_more_is_read() -> None:
    """One file can take longer than what was left (its read is not cut short): the next reads wait for it."""
    allowance = ReadAllowance(share=0.01, burst_s=1.0, now_s=0.0)
    allowance.spend(3.0)  # 2 s over
    assert allowance.available_s(100.0) == 0.0  # 1 s refilled of the 2 owed
    assert allowance.available_s(300.0) == pytest.approx(1.0)  # repaid, then refilled up to the burst


def test_a_clock_that_goes_back_refills_nothing() -> None:
    allowance = ReadAllowance(share=0.5, burst_s=10.0, now_s=50.0)
    allowance.spend(10.0)
    assert allowance.available_s(40.0) == 0.0
    assert allowance.available_s(52.0) == pytest.approx(1.0)
