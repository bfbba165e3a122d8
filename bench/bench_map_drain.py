# SPDX-License-Identifier: Apache-2.0
"""A BPF map drain (``BPFMap.pop_all``, what each CPU profile report does to the walked-stack and count maps): agent
CPU per drain, the previous batch buffers (4,096 entries a call, copied whole) against today's (at most
``loader._BATCH_BYTES`` a call, only the entries returned copied), with glibc's heap as the agent tunes it
(``selfcost.tune_heap``: a large buffer is a fresh mmap each time, its pages faulted in as it is zeroed) or not.

Run (root, after make build): .venv/bin/python bench/bench_map_drain.py [--untuned] [--rounds 20]
"""

from __future__ import annotations

import argparse
import ctypes
import errno
import os
import time

from otel_gpu import selfcost
from otel_gpu.ebpf import _libbpf
from otel_gpu.ebpf.loader import BPFMap, BPFObject, program_path


def previous_pop(bpf_map: BPFMap) -> list[tuple[bytes, bytes]]:
    """pop_all's batch path before the change (error handling left out: the bench's maps never fail)."""
    capacity = max(1, min(bpf_map.max_entries, 4096))
    keys = ctypes.create_string_buffer(bpf_map.key_size * capacity)
    values = ctypes.create_string_buffer(bpf_map.value_size * capacity)
    token = ctypes.create_string_buffer(max(bpf_map.key_size, 8))
    opts = _libbpf.MapBatchOpts(sz=ctypes.sizeof(_libbpf.MapBatchOpts))
    out: list[tuple[bytes, bytes]] = []
    first = True
    while True:
        count = ctypes.c_uint32(capacity)
        err = bpf_map._lib.bpf_map_lookup_and_delete_batch(bpf_map.fd, None if first else token, token, keys, values,
                                                           ctypes.byref(count), ctypes.byref(opts))
        first = False
        key_raw, value_raw = keys.raw, values.raw
        ks, vs = bpf_map.key_size, bpf_map.value_size
        out.extend((key_raw[i * ks:(i + 1) * ks], value_raw[i * vs:(i + 1) * vs]) for i in range(count.value))
        if err == -errno.ENOENT:
            return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--untuned", action="store_true", help="leave glibc's heap thresholds as they are")
    parser.add_argument("--rounds", type=int, default=20)
    args = parser.parse_args()
    print(f"heap tuned as the agent does: {not args.untuned and selfcost.tune_heap()}")
    with BPFObject(program_path("cpu_profiler"), rodata={"self_tgid": os.getpid()}) as bpf:
        for name in ("unwound_stacks0", "counts0"):
            bpf_map = bpf.map(name)
            print(f"{name}: key {bpf_map.key_size} B, value {bpf_map.value_size} B, {bpf_map.max_entries} entries; "
                  f"ms of CPU per drain, mean of {args.rounds}")
            for entries in (0, 100, 1000):
                spent = {}
                for label, drain in (("previous", previous_pop), ("now", BPFMap.pop_all)):
                    total = 0.0
                    for _ in range(args.rounds):
                        for n in range(entries):
                            bpf_map.update(n.to_bytes(4, "little") * (bpf_map.key_size // 4), bytes(bpf_map.value_size))
                        started = time.thread_time()
                        drained = drain(bpf_map)
                        total += time.thread_time() - started
                        assert len(drained) == entries
                    spent[label] = total / args.rounds
                print(f"  {entries:5d} entries: previous {spent['previous'] * 1e3:7.3f}  now {spent['now'] * 1e3:7.3f}"
                      f"  ratio {spent['previous'] / max(spent['now'], 1e-9):6.1f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
