# SPDX-License-Identifier: Apache-2.0
"""From the record's span bytes to the samples: decode (ABI 4), accounting, and the OTLP link / pprof labels."""

from __future__ import annotations

import ctypes
import dataclasses
import struct

from otel_gpu.cuda import abi
from otel_gpu.profiles.otlp import encode_otlp
from otel_gpu.profiles.pprof import encode_pprof
from tests.cuda.records import kernel, launch, sync, window
from tests.cuda.test_accounting import _accounting
from tests.profiles import pprof_proto
from tests.profiles.pyroscope_rules import violations

TRACE = "0af7651916cd43dd8448eb211c80319c"
SPAN = "b7ad6b7169203331"


def _event(payload: abi.LaunchC | abi.SyncC, kind: int) -> bytes:
    head = struct.pack("<IIIIQ16s", kind, 10, 11, ctypes.sizeof(payload), 0, b"worker")
    return head + bytes(abi.KStackC()) + bytes(payload)


def test_decode_reads_the_span_and_leaves_none_outside_spans() -> None:
    rec = abi.LaunchC(abi_version=abi.ABI_VERSION, kind=abi.LAUNCH_KERNEL, correlation_id=1)
    outside = abi.decode_event(_event(rec, abi.EVENT_LAUNCH))
    assert (outside.trace_id, outside.span_id) == ("", "")
    rec.span.trace_id[:] = bytes.fromhex(TRACE)
    rec.span.span_id[:] = bytes.fromhex(SPAN)
    decoded = abi.decode_event(_event(rec, abi.EVENT_LAUNCH))
    assert (decoded.trace_id, decoded.span_id) == (TRACE, SPAN)
    wait = abi.SyncC(abi_version=abi.ABI_VERSION, kind=abi.SYNC_STREAM, start_ns=1, end_ns=5, weight=1)
    wait.span.trace_id[:] = bytes.fromhex(TRACE)
    wait.span.span_id[:] = bytes.fromhex(SPAN)
    decoded_wait = abi.decode_event(_event(wait, abi.EVENT_SYNC))
    assert (decoded_wait.trace_id, decoded_wait.span_id) == (TRACE, SPAN)


def test_gpu_time_and_sync_wait_samples_link_to_their_span_only() -> None:
    accounting, _ = _accounting({10})
    accounting.handle(dataclasses.replace(launch(10, 1), trace_id=TRACE, span_id=SPAN))
    accounting.handle(kernel(10, 1, 200, name="in_span"))
    accounting.handle(launch(10, 2))
    accounting.handle(kernel(10, 2, 300, name="outside"))
    accounting.handle(window(10, 1, covered_ns=100, elapsed_ns=100))
    accounting.handle(dataclasses.replace(sync(10, 50), trace_id=TRACE, span_id=SPAN))
    accounting.handle(sync(10, 70, cbid=127))
    gpu, waits = accounting.drain(now_ns=3_000)
    by_leaf = {s.frames[0].function: (s.trace_id, s.span_id) for p in gpu.processes for s in p.samples}
    assert by_leaf == {"in_span": (TRACE, SPAN), "outside": ("", "")}
    assert sorted((s.value, s.span_id) for p in waits.processes for s in p.samples) == [(50, SPAN), (70, "")]
    for batch in (gpu, waits):
        profile = pprof_proto.decode(encode_pprof(batch))
        strings = list(profile.string_table)
        labelled = [{strings[lab.key]: strings[lab.str] for lab in s.label if lab.str} for s in profile.sample]
        assert sorted(d.get("span_id", "") for d in labelled) == ["", SPAN]
        assert {d.get("trace_id") for d in labelled if "span_id" in d} == {TRACE}
        request = encode_otlp(batch)
        assert violations(request) == []
        links = request.resource_profiles[0].scope_profiles[0].profiles[0]
        table = request.dictionary.link_table
        assert sorted(table[s.link_index].span_id.hex() for s in links.samples) == ["", SPAN]
