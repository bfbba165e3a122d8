# SPDX-License-Identifier: Apache-2.0
"""Rank identity from a process's environment: parsed without trusting it, read through /proc for a real process,
and carried by the OTLP resource and the per-process GPU-time metric attributes."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from otel_gpu import semconv
from otel_gpu.cuda.instruments import process_attributes
from otel_gpu.cuda.source import ProcessCounters
from otel_gpu.procfs import ProcessInfo, ProcessResolver
from otel_gpu.profiles.otlp import process_resource
from otel_gpu.ranks import rank_attributes

TORCHRUN = b"PATH=/bin\0RANK=3\0LOCAL_RANK=1\0WORLD_SIZE=8\0HOME=/root\0"


@pytest.mark.parametrize(("environ", "expected"), [
    (TORCHRUN, {semconv.DISTRIBUTED_RANK: 3, semconv.DISTRIBUTED_LOCAL_RANK: 1, semconv.DISTRIBUTED_WORLD_SIZE: 8}),
    (b"RANK=0\0WORLD_SIZE=2", {semconv.DISTRIBUTED_RANK: 0, semconv.DISTRIBUTED_WORLD_SIZE: 2}),  # first, last
    (b"PATH=/bin\0HOME=/root\0", {}),  # not a distributed job
    (b"MY_RANK=5\0XRANK=6\0RANK_ID=7\0", {}),  # other variables ending or starting alike
    (b"RANK=-1\0LOCAL_RANK=x\0WORLD_SIZE=\0", {}),  # not decimal numbers
    (b"RANK=99999999999999999999\0", {}),  # too large to be a rank
    (b"RANK=2\0RANK=5\0", {semconv.DISTRIBUTED_RANK: 2}),  # the first one, as getenv reads it
    (b"RANK=4\xff\0", {}),  # junk bytes
    (b"\0" * 100 + b"RANK=1", {semconv.DISTRIBUTED_RANK: 1}),
])
def test_rank_attributes(environ: bytes, expected: dict[str, int]) -> None:
    assert dict(rank_attributes(environ)) == expected


def test_a_real_process_is_read_with_its_rank() -> None:
    env = dict(os.environ, RANK="1", LOCAL_RANK="1", WORLD_SIZE="2")
    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE, env=env)
    try:
        info = ProcessResolver().info(child.pid)
        assert info is not None
        assert dict(info.ranks) == {semconv.DISTRIBUTED_RANK: 1, semconv.DISTRIBUTED_LOCAL_RANK: 1,
                                    semconv.DISTRIBUTED_WORLD_SIZE: 2}
    finally:
        child.communicate(b"")
    plain = {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE")}
    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE, env=plain)
    try:
        info = ProcessResolver().info(child.pid)
        assert info is not None and info.ranks == ()
    finally:
        child.communicate(b"")


def test_rank_goes_on_the_profile_resource_and_the_process_metrics() -> None:
    info = ProcessInfo(pid=7, executable_name="python3", ranks=rank_attributes(TORCHRUN))
    resource = {kv.key: kv.value for kv in process_resource(info).attributes}
    assert resource[semconv.DISTRIBUTED_RANK].int_value == 3
    assert resource[semconv.DISTRIBUTED_WORLD_SIZE].int_value == 8
    attributes = process_attributes(ProcessCounters(info))
    assert attributes[semconv.DISTRIBUTED_RANK] == 3 and attributes[semconv.DISTRIBUTED_LOCAL_RANK] == 1
    bare = {kv.key for kv in process_resource(ProcessInfo(pid=7, executable_name="python3")).attributes}
    assert not any(key.startswith("distributed.") for key in bare)


def test_rank_goes_on_the_nvml_process_metrics() -> None:
    from otel_gpu.gpu.model import ProcessUsage
    from otel_gpu.metrics.gpu_instruments import process_attributes as nvml_process_attributes

    usage = ProcessUsage(pid=7, executable_name="python3", ranks=rank_attributes(TORCHRUN))
    assert nvml_process_attributes(usage)[semconv.DISTRIBUTED_RANK] == 3
    assert semconv.DISTRIBUTED_RANK not in nvml_process_attributes(ProcessUsage(pid=7))


def test_rank_is_a_pprof_label() -> None:
    from otel_gpu.profiles.model import Frame, ProcessProfile, ProfileBatch, Sample, sync_wait_profile_type
    from otel_gpu.profiles.pprof import encode_pprof
    from tests.profiles import pprof_proto
    from tests.profiles.test_pprof import _labels

    sample = Sample((Frame("[cuStreamSynchronize]"),), 5, attributes=((semconv.NCCL_COLLECTIVE, "all_reduce"),))
    ranked = ProcessInfo(pid=7, executable_name="python3", ranks=rank_attributes(TORCHRUN))
    batch = ProfileBatch(sync_wait_profile_type(), 0, 1, (ProcessProfile(ranked, (sample,)),
                                                          ProcessProfile(ProcessInfo(8, "python3"), (sample,))))
    profile = pprof_proto.decode(encode_pprof(batch))
    first, second = (_labels(profile, s) for s in profile.sample)
    assert first["rank"] == "3" and first[semconv.NCCL_COLLECTIVE] == "all_reduce"
    assert "rank" not in second
