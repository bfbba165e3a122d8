# SPDX-License-Identifier: Apache-2.0
"""The GPU machine's span-devices script (scripts/h200/span_devices.py) checked before device time is spent on it:
it passes when the attribute sits on gpu-step roots only and names the devices of their children's gpu_time samples,
and fails on each way the two could disagree."""

from __future__ import annotations

from collections import Counter

import pytest

from tests import h200_scripts


@pytest.fixture(scope="module")
def script():  # type: ignore[no-untyped-def]
    return h200_scripts.load("span_devices")


SPANS = [["forward", "f1", "r1", []], ["gpu-step", "r1", "", [0]],
         ["forward", "f2", "r2", []], ["gpu-step", "r2", "", []], ["cpu-step", "c1", "", []]]


def test_agreeing_attribute_and_samples_pass(script) -> None:  # type: ignore[no-untyped-def]
    lines, ok = script.analyse([0], SPANS, {"f1": Counter({"0": 5})})
    assert ok, lines
    assert "| gpu-step | 2 | 1 (50.00 %) | [0] x1 |" in lines


@pytest.mark.parametrize("spans, samples", [
    (SPANS, {"f1": Counter({"0": 5}), "f2": Counter({"0": 3})}),  # r2's child has samples, r2 names no device
    (SPANS, {"f1": Counter({"1": 5})}),  # r1 names device 0, its samples are on device 1
    ([*SPANS[:4], ["cpu-step", "c1", "", [0]]], {"f1": Counter({"0": 5})}),  # the attribute on a cpu-only root
    ([*SPANS[1:2], ["forward", "f1", "r1", [0]]], {"f1": Counter({"0": 5})}),  # the attribute on a child
    ([s for s in SPANS if s[1] != "r1"] + [["gpu-step", "r1", "", []]], {}),  # no root carries it at all
], ids=["root-missing", "other-device", "cpu-root", "child", "none"])
def test_each_disagreement_fails(script, spans, samples) -> None:  # type: ignore[no-untyped-def]
    _, ok = script.analyse([0, 1], spans, samples)
    assert not ok
