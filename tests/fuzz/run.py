# SPDX-License-Identifier: Apache-2.0
"""Runs the fuzz targets of :mod:`tests.fuzz.targets` with atheris (coverage-guided, libFuzzer), each target in its
own process, ``--jobs`` of them at a time, and reports per target: inputs executed, crashes, hangs (an input that
ran past ``--timeout-s``), out-of-memory stops (past ``--rss-limit-mb``), peak RSS and wall time.

    .venv/bin/python -m tests.fuzz.run --seconds 30 --jobs 2         # what tests/fuzz/test_fuzz.py runs in CI
    .venv/bin/python -m tests.fuzz.run --runs 1000000 --jobs 2       # the longer run in docs/benchmarks.md

Each run starts from a fresh seed corpus (written by :func:`tests.fuzz.targets.seeds`); a crashing, hanging or
out-of-memory input is kept under ``--keep`` (default: a temporary folder, printed) as ``crash-*``, ``timeout-*``
or ``oom-*``, and can be replayed with ``python -m tests.fuzz.run --replay TARGET FILE``. Exit status 1 when any
target found one.
"""

from __future__ import annotations

import argparse
import hashlib
import logging
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DEFAULT_TIMEOUT_S = 10  # per input: the slowest seed takes milliseconds, so this only catches real hangs
DEFAULT_RSS_LIMIT_MB = 1024  # the whole fuzzing process (Python, atheris, coverage maps): ~100 MB is normal


@dataclass(frozen=True)
class Result:
    """What one target's run found."""

    target: str
    runs: int
    crashes: int
    hangs: int
    ooms: int
    new_inputs: int  # inputs kept for new coverage: 0 means the parser was not instrumented (or not reached)
    peak_rss_mb: int
    wall_s: float
    returncode: int
    artifacts: tuple[str, ...]
    log_tail: str

    @property
    def clean(self) -> bool:
        return self.returncode == 0 and not (self.crashes or self.hangs or self.ooms) and self.runs > 0 \
            and self.new_inputs > 0

    def line(self) -> str:
        return (f"{self.target:10} runs={self.runs:>9} crashes={self.crashes} hangs={self.hangs} ooms={self.ooms} "
                f"new_inputs={self.new_inputs} peak_rss_mb={self.peak_rss_mb} wall_s={self.wall_s:.0f} "
                f"rc={self.returncode}")


def fuzz(target: str, workdir: Path, *, seconds: int | None = None, runs: int | None = None,
         timeout_s: int = DEFAULT_TIMEOUT_S, rss_limit_mb: int = DEFAULT_RSS_LIMIT_MB) -> Result:
    """Fuzz ``target`` for ``seconds`` or ``runs`` inputs in a child process whose files go under ``workdir``."""
    from tests.fuzz import targets
    corpus, artifacts = workdir / "corpus", workdir / "artifacts"
    for folder in (corpus, artifacts):
        folder.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix="otel-gpu-fuzz-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None))
    for seed in targets.seeds(target):
        (corpus / hashlib.sha1(seed).hexdigest()).write_bytes(seed)
    limit = [f"-max_total_time={seconds}"] if seconds is not None else [f"-runs={runs}"]
    command = [sys.executable, "-m", "tests.fuzz.run", "--child", target, str(scratch), str(corpus), *limit,
               f"-max_len={targets.MAX_LEN.get(target, targets.DEFAULT_MAX_LEN)}", f"-timeout={timeout_s}",
               f"-rss_limit_mb={rss_limit_mb}", f"-artifact_prefix={artifacts}/", "-print_final_stats=1"]
    log = workdir / "fuzz.log"
    started = time.monotonic()
    # a backstop in case libFuzzer's own per-input alarm cannot fire: counted as a hang
    backstop_s = seconds + 2 * timeout_s + 120 if seconds is not None else None
    stuck = False
    with log.open("wb") as output:
        try:
            returncode = subprocess.run(command, cwd=REPO, stdout=output, stderr=subprocess.STDOUT, check=False,
                                        env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=backstop_s).returncode
        except subprocess.TimeoutExpired:
            returncode, stuck = -1, True
    wall_s = time.monotonic() - started
    shutil.rmtree(scratch, ignore_errors=True)
    text = log.read_text(errors="replace")
    found = sorted(p.name for p in artifacts.iterdir())
    return Result(target=target, runs=_stat(text, "number_of_executed_units"),
                  crashes=sum(name.startswith("crash-") for name in found),
                  hangs=sum(name.startswith("timeout-") for name in found) + stuck,
                  ooms=sum(name.startswith("oom-") for name in found),
                  new_inputs=_stat(text, "new_units_added"), peak_rss_mb=_stat(text, "peak_rss_mb"), wall_s=wall_s,
                  returncode=returncode, artifacts=tuple(str(artifacts / name) for name in found),
                  log_tail=text[-4000:])


def fuzz_all(names: list[str], workdir: Path, jobs: int, **limits: int | None) -> list[Result]:
    """Fuzz each of ``names``, ``jobs`` at a time (each target is one single-threaded process)."""
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        return list(pool.map(lambda name: fuzz(name, workdir / name, **limits), names))  # type: ignore[arg-type]


def _stat(text: str, name: str) -> int:
    found = re.findall(rf"stat::{name}:\s*(\d+)", text)
    return int(found[-1]) if found else 0


def _child(target: str, scratch: str, libfuzzer_args: list[str]) -> None:
    """Inside the fuzzing process: instrument the agent's modules for coverage, then hand over to libFuzzer."""
    import atheris
    logging.disable(logging.CRITICAL)  # the parsers log what they skip: a line per input would be all the output
    with atheris.instrument_imports(include=["otel_gpu"]):
        from tests.fuzz import targets
    targets.scratch = Path(scratch)
    atheris.Setup([sys.argv[0], *libfuzzer_args], targets.TARGETS[target])
    atheris.Fuzz()


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args[:1] == ["--child"]:
        _child(args[1], args[2], args[3:])  # before anything imports the agent's modules uninstrumented
        return 0
    from tests.fuzz import targets
    if args[:1] == ["--replay"]:
        targets.TARGETS[args[1]](Path(args[2]).read_bytes())  # raises what the fuzzer saw
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    limit = parser.add_mutually_exclusive_group()
    limit.add_argument("--seconds", type=int, help="fuzz each target this long (default 30)")
    limit.add_argument("--runs", type=int, help="fuzz each target for this many inputs")
    parser.add_argument("--jobs", type=int, default=2, help="targets fuzzed at once (one CPU each)")
    parser.add_argument("--timeout-s", type=int, default=DEFAULT_TIMEOUT_S, help="an input slower than this is a hang")
    parser.add_argument("--rss-limit-mb", type=int, default=DEFAULT_RSS_LIMIT_MB, help="memory limit of each target")
    parser.add_argument("--keep", type=Path, help="folder for corpora, logs and failing inputs (default: temporary)")
    parser.add_argument("targets", nargs="*", metavar="TARGET", help=f"default: all ({', '.join(targets.TARGETS)})")
    options = parser.parse_args(args)
    names = options.targets or list(targets.TARGETS)
    unknown = [name for name in names if name not in targets.TARGETS]
    if unknown:
        parser.error(f"unknown target(s): {', '.join(unknown)}")
    seconds = options.seconds if options.seconds is not None or options.runs is not None else 30
    workdir = options.keep or Path(tempfile.mkdtemp(prefix="otel-gpu-fuzz-"))
    print(f"fuzzing {', '.join(names)}, {options.jobs} at a time, files under {workdir}", flush=True)
    started = time.monotonic()
    results = fuzz_all(names, workdir, options.jobs, seconds=seconds, runs=options.runs,
                       timeout_s=options.timeout_s, rss_limit_mb=options.rss_limit_mb)
    for result in results:
        print(result.line())
        for artifact in result.artifacts:
            print(f"  {artifact}")
    print(f"total runs={sum(r.runs for r in results)} wall_s={time.monotonic() - started:.0f}")
    return 0 if all(result.clean for result in results) else 1


if __name__ == "__main__":
    sys.exit(main())
