# SPDX-License-Identifier: Apache-2.0
"""The GPU-time thread's cost per record, replayed from ring-buffer bytes a real run wrote.

``record OUT``: opens the real GPUTimeSource (root, BTF, ``make build``), runs the fake CUDA stack's Python workload
injected for ``--seconds`` and writes every raw ring-buffer record the probes decoded (u32 length + bytes each).

``live``: the same run with nothing kept: the polling thread's CPU over the records it handled (ring buffer, ctypes
callback, decode, accounting, rescans), for the tree on PYTHONPATH (default: this one). Records a drain consumes
(on the caller's thread) are counted but not their CPU: the same share in both trees. Other injected programs
running on the machine add their records to the count, not to the cost per record.

``replay FILE``: decodes and handles those records and drains every ``--drain-every`` records, with a fresh
accounting per pass (a stub symbolizer: addresses, not symbol reading, which is cached per stack anyway; the stack
decoder's cache stays warm between passes, as in a long run), and prints records per second and CPU-us per record
(median of ``--passes``) and a digest of every drained batch. ``--base TREE`` runs the same replay against another
checkout (``git worktree add /tmp/base main``) in alternating subprocesses and prints both side by side, and whether
the outputs are identical. ``--profile`` prints cProfile's top functions of one pass instead.

Run (as root, after make build):
    .venv/bin/python bench/bench_gpu_time_decode.py record /tmp/gpu_time.raw --seconds 20
    .venv/bin/python bench/bench_gpu_time_decode.py replay /tmp/gpu_time.raw --base /tmp/base [--rounds 4]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import struct
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
FAKE = REPO / "tests/native/cuda"
_LENGTH = struct.Struct("<I")


def _workload(seconds: float, tree: Path) -> None:
    env = dict(os.environ, CUDA_INJECTION64_PATH=str(tree / "otel_gpu/cuda/native/libotel_gpu_inject.so"),
               OTEL_GPU_CUPTI_PATH=str(FAKE / "libcupti.so"))
    subprocess.run(["timeout", str(seconds), sys.executable, str(FAKE / "workload.py"), str(FAKE / "libcuda.so.1"),
                    "--steps", "100000000"], env=env, check=False)


def _thread_cpu_s(name: str) -> float:
    import threading

    thread = next(t for t in threading.enumerate() if t.name == name)
    stat = Path(f"/proc/self/task/{thread.native_id}/stat").read_text()
    fields = stat[stat.rindex(")") + 2:].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def live(seconds: float, drain_s: float) -> int:
    import threading

    from otel_gpu.cuda.source import GPUTimeSource

    source = GPUTimeSource()
    source.open()
    tree = Path(sys.modules["otel_gpu"].__file__ or "").parents[1]
    done = threading.Event()
    runner = threading.Thread(target=lambda: (_workload(seconds, tree), done.set()))
    runner.start()
    time.sleep(3)  # the workload's start-up, and the first records
    cpu0, records0, wall0 = _thread_cpu_s("otel-gpu-gpu-time"), source.records, time.monotonic()
    while not done.wait(drain_s):
        source.drain()
    cpu, records, wall = _thread_cpu_s("otel-gpu-gpu-time") - cpu0, source.records - records0, time.monotonic() - wall0
    runner.join()
    source.close()
    print(json.dumps({"tree": str(tree), "records": records, "records_per_s": records / wall,
                      "thread_cpu_s": cpu, "core_percent": 100 * cpu / wall,
                      "cpu_us_per_record": cpu / max(records, 1) * 1e6, "load": os.getloadavg()[0]}))
    return 0


def record(out: Path, seconds: float) -> int:
    from otel_gpu.cuda.source import GPUTimeSource

    raw: list[bytes] = []
    source = GPUTimeSource(poll_interval_s=0.2)
    decode = source._probes._decode

    def keep(data: bytes) -> None:
        raw.append(bytes(data))
        decode(data)

    source._probes._decode = keep  # type: ignore[method-assign]  # the ring buffer takes it at open
    source.open()
    try:
        _workload(seconds, REPO)
        source.drain()
    finally:
        source.close()
    with out.open("wb") as f:
        for data in raw:
            f.write(_LENGTH.pack(len(data)) + data)
    print(f"{len(raw)} records, {sum(map(len, raw)) / 1e6:.1f} MB -> {out}")
    return 0


def load(path: Path) -> list[bytes]:
    blob = path.read_bytes()
    out, at = [], 0
    while at < len(blob):
        (length,) = _LENGTH.unpack_from(blob, at)
        out.append(blob[at + 4:at + 4 + length])
        at += 4 + length
    return out


def replay(records: Sequence[bytes], passes: int, drain_every: int, profile: bool) -> dict[str, object]:
    """Decode + handle + drain, as GPUTimeProbes._decode and GPUTimeSource do, in this interpreter's tree."""
    from otel_gpu.cuda import abi
    from otel_gpu.cuda.accounting import GPUTimeAccounting
    from otel_gpu.cuda.stacks import StackFrames
    from otel_gpu.procfs import ProcessInfo
    from otel_gpu.profiles.model import Frame

    class Symbolizer:
        last_complete = True

        def remember(self, pid: int) -> None:
            pass

        def frames(self, pid: int, pcs: Sequence[int]) -> tuple[Frame, ...]:
            return tuple(Frame(f"0x{pc:x}", address=pc) for pc in pcs)

        def forget(self, pid: int) -> None:
            pass

    class Resolver:
        def info(self, pid: int) -> ProcessInfo:
            return ProcessInfo(pid=pid, executable_name="workload")

    def one_pass() -> str:
        accounting = GPUTimeAccounting(Resolver(), StackFrames(Symbolizer()), lambda pid: True)  # type: ignore[arg-type]
        digest = hashlib.sha256()
        for index, data in enumerate(records, 1):
            accounting.handle(abi.decode_event(data))
            if index % drain_every == 0 or index == len(records):
                for batch in accounting.drain(index * 1_000_000, [0, 0, 0], final=index == len(records)):
                    digest.update(repr(batch).encode())
        return digest.hexdigest()

    if profile:
        import cProfile
        import pstats

        one_pass()
        profiler = cProfile.Profile()
        profiler.runcall(one_pass)
        pstats.Stats(profiler).sort_stats("tottime").print_stats(25)
        return {}
    cpu_s, wall_s, digests = [], [], set()
    for _ in range(passes + 1):  # the first pass warms the stack decoder's cache, as a long run's first second does
        wall, cpu = time.perf_counter(), time.process_time()
        digests.add(one_pass())
        wall_s.append(time.perf_counter() - wall)
        cpu_s.append(time.process_time() - cpu)
    cpu, wall = statistics.median(cpu_s[1:]), statistics.median(wall_s[1:])
    return {"tree": str(Path(abi.__file__).parents[2]), "records": len(records), "records_per_s": len(records) / wall,
            "cpu_us_per_record": cpu / len(records) * 1e6, "digests": sorted(digests)}


def side_by_side(path: Path, base: Path, rounds: int, passes: int, drain_every: int) -> int:
    trees = {"before": base.resolve(), "after": REPO}
    results: dict[str, list[dict[str, object]]] = {name: [] for name in trees}
    for round_ in range(rounds):
        order = list(trees) if round_ % 2 == 0 else list(reversed(trees))  # alternate: the load drifts
        for name in order:
            out = subprocess.run([sys.executable, __file__, "replay", str(path), "--json", "--passes", str(passes),
                                  "--drain-every", str(drain_every)], check=True, capture_output=True, text=True,
                                 env=dict(os.environ, PYTHONPATH=str(trees[name])), cwd=trees[name])
            results[name].append(json.loads(out.stdout))
            assert Path(results[name][-1]["tree"]) == trees[name], results[name][-1]["tree"]  # type: ignore[arg-type]
    print(f"{results['after'][0]['records']} records, {rounds} rounds x {passes} passes, median of rounds; "
          f"load {os.getloadavg()[0]:.2f}")
    print(f"{'tree':8} {'records/s':>10} {'CPU us/record':>14}")
    for name in trees:
        rate = statistics.median(r["records_per_s"] for r in results[name])  # type: ignore[misc]
        us = statistics.median(r["cpu_us_per_record"] for r in results[name])  # type: ignore[misc]
        print(f"{name:8} {rate:10.0f} {us:14.2f}")
    digests = {name: {d for r in results[name] for d in r["digests"]} for name in trees}  # type: ignore[attr-defined]
    same = digests["before"] == digests["after"] and len(digests["after"]) == 1
    print(f"outputs identical: {same}")
    return 0 if same else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    rec = sub.add_parser("record", help="capture raw records of a real run (root)")
    rec.add_argument("out", type=Path)
    rec.add_argument("--seconds", type=float, default=20.0)
    liv = sub.add_parser("live", help="the polling thread's CPU per record in a real run (root)")
    liv.add_argument("--seconds", type=float, default=30.0)
    liv.add_argument("--drain-s", type=float, default=10.0, help="seconds between drains, as the agent's interval")
    rep = sub.add_parser("replay", help="replay captured records through decode + handle + drain")
    rep.add_argument("file", type=Path)
    rep.add_argument("--passes", type=int, default=5, help="passes per measurement (after one warm-up pass)")
    rep.add_argument("--drain-every", type=int, default=5000, help="records between drains")
    rep.add_argument("--base", type=Path, help="another checkout to compare with, side by side")
    rep.add_argument("--rounds", type=int, default=4, help="with --base: alternating subprocess rounds per tree")
    rep.add_argument("--profile", action="store_true", help="cProfile one pass")
    rep.add_argument("--json", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if "PYTHONPATH" not in os.environ:
        sys.path.insert(0, str(REPO))
    if args.command == "record":
        return record(args.out, args.seconds)
    if args.command == "live":
        return live(args.seconds, args.drain_s)
    if args.base is not None:
        return side_by_side(args.file, args.base, args.rounds, args.passes, args.drain_every)
    result = replay(load(args.file), args.passes, args.drain_every, args.profile)
    print(json.dumps(result) if args.json else "\n".join(f"{k}: {v}" for k, v in result.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
