# SPDX-License-Identifier: Apache-2.0
"""Pure parts of the GPU reader."""

from __future__ import annotations

from otel_gpu.gpu.reader import counter_delta


def test_counter_delta_counts_increase_and_wraps() -> None:
    assert counter_delta(100, 250, 64) == 150
    assert counter_delta(2**32 - 10, 5, 32) == 15  # a 32-bit counter wrapped
    assert counter_delta(2**32 - 10, 5, 64) == 15  # ... even when NVML hands it over in a 64-bit field
    assert counter_delta(2**40, 7, 64) == 7  # a 64-bit counter went back: reset, counted from zero
    assert counter_delta(2**64 - 10, 5, 64) == 5


def test_counter_delta_never_goes_negative() -> None:
    for previous, current in ((5, 4), (2**33, 1), (0, 0), (2**63, 2**62)):
        assert 0 <= counter_delta(previous, current, 64) <= max(current, 2**32)
