# SPDX-License-Identifier: Apache-2.0
"""The two demanglers the agent had, side by side (issue 11 kept one): libstdc++'s ``__cxa_demangle`` in the agent's
process (the removed ``otel_gpu/cuda/demangle.py``, taken from git) and ``c++filt -i`` in a process of its own
(``otel_gpu/symbolize/demangle.py``).

  1. speed on real names: every mangled dynamic symbol of libstdc++ (and any --nm FILE given), best of 5;
  2. hostile names: N levels of a valid name whose demangled form doubles per level (190 bytes -> 1.7 MB at 16),
     each demangler in a fresh process: output kept, wall time, peak RSS of that process and of c++filt.

Run: .venv/bin/python bench/bench_demangle.py [--nm /path/to/lib.so ...] [--levels 16 20 22]
"""

from __future__ import annotations

import argparse
import pathlib
import subprocess
import sys
import tempfile
import time

REPO = pathlib.Path(__file__).resolve().parent.parent
OLD = "536e513"  # the last commit with otel_gpu/cuda/demangle.py


def mangled_names(files: list[str]) -> list[str]:
    names: set[str] = set()
    for path in files:
        out = subprocess.run(["nm", "-D", path], capture_output=True, text=True, check=True).stdout
        names.update(line.split()[-1].split("@")[0] for line in out.splitlines() if line.split()[-1:][0:1] and
                     line.split()[-1].startswith("_Z"))
    return sorted(names)


def expanding_name(levels: int) -> str:
    sys.path.insert(0, str(REPO))
    from tests.symbolize.test_demangle import expanding_name as build

    return build(levels)


CHILD = """
import resource, sys, time
sys.path[:0] = [{old!r}, {repo!r}]
name = {name!r}
start = time.perf_counter()
if {which!r} == "cxa":
    import cxa_demangle_old as m
    out = m.demangle(name)
else:
    from otel_gpu.symbolize.demangle import Demangler
    out = Demangler().demangle(name)
wall = time.perf_counter() - start
own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024
children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss // 1024
print(len(out), f"{{wall:.2f}}", own, children)
"""


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--nm", nargs="*", default=[])
    parser.add_argument("--levels", nargs="*", type=int, default=[16, 20, 22])
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as old:
        source = subprocess.run(["git", "-C", str(REPO), "show", f"{OLD}:otel_gpu/cuda/demangle.py"],
                                capture_output=True, text=True, check=True).stdout
        pathlib.Path(old, "cxa_demangle_old.py").write_text(source)
        sys.path[:0] = [old, str(REPO)]
        import cxa_demangle_old as cxa  # type: ignore[import-not-found]

        from otel_gpu.symbolize.demangle import Demangler

        names = mangled_names(["/usr/lib/x86_64-linux-gnu/libstdc++.so.6", *args.nm])

        def timed(run) -> float:  # type: ignore[no-untyped-def]
            return min(run() for _ in range(5))

        def in_process() -> float:
            start = time.perf_counter()
            for name in names:
                cxa.demangle.__wrapped__(name)
            return time.perf_counter() - start

        def one_batch() -> float:
            demangler, start = Demangler(), time.perf_counter()
            demangler.prepare(names)
            return time.perf_counter() - start

        def one_name_per_run() -> float:
            start = time.perf_counter()
            for name in names[:200]:
                Demangler().prepare([name])
            return (time.perf_counter() - start) / 200

        t_cxa, t_batch, t_one = timed(in_process), timed(one_batch), timed(one_name_per_run)
        kept = Demangler()
        kept.prepare(names)
        differ = sum(cxa.demangle.__wrapped__(n) != kept.demangle(n) for n in names)
        print(f"{len(names)} names, {sum(map(len, names)) / len(names):.0f} bytes on average (best of 5)")
        print(f"  __cxa_demangle in process   {t_cxa * 1e3:7.1f} ms  {t_cxa / len(names) * 1e6:5.2f} us/name")
        print(f"  c++filt -i, one batch       {t_batch * 1e3:7.1f} ms  {t_batch / len(names) * 1e6:5.2f} us/name")
        print(f"  c++filt -i, one name a run  {t_one * 1e3:7.2f} ms per run")
        print(f"  names demangled differently: {differ}")
        for levels in args.levels:
            name = expanding_name(levels)
            for which in ("cxa", "c++filt"):
                code = CHILD.format(old=old, repo=str(REPO), name=name, which=which)
                out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
                kept_chars, wall, own_mb, children_mb = out.stdout.split()
                print(f"  {levels} levels ({len(name)} bytes), {which:8}: kept {int(kept_chars):>11,} chars, "
                      f"{wall} s, peak RSS {own_mb} MB (its children: {children_mb} MB)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
