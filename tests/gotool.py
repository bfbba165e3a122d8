# SPDX-License-Identifier: Apache-2.0
"""`go tool pprof` (Debian's golang-go, installed by scripts/install-system.sh) reading the agent's pprof files."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest


def go_binary() -> str | None:
    found = shutil.which("go")
    if found:
        return found
    candidates = sorted(Path("/usr/lib").glob("go-*/bin/go"))
    return str(candidates[-1]) if candidates else None


needs_go = pytest.mark.skipif(go_binary() is None,
                              reason="needs Debian's golang-go for `go tool pprof` (scripts/install-system.sh)")

_TOP_LINE = re.compile(r"\s*([\d.]+)(?:ms)?\s+[\d.]+%\s+[\d.]+%\s+([\d.]+)(?:ms)?\s+[\d.]+%\s+(.+?)\s*$")


def pprof_top(files: list[Path], tmp_path: Path, *flags: str) -> tuple[str, dict[str, tuple[float, float]]]:
    """`go tool pprof -top -unit=ms FLAGS FILES` (several files are merged): its output, and function -> (flat ms,
    cum ms) for every row."""
    top = subprocess.run([str(go_binary()), "tool", "pprof", "-top", "-nodecount=60", "-unit=ms", *flags,
                          *map(str, files)], capture_output=True, text=True, timeout=120, check=True,
                         env={"HOME": str(tmp_path), "PATH": "/usr/bin:/bin", "PPROF_TMPDIR": str(tmp_path)})
    rows: dict[str, tuple[float, float]] = {}
    for line in top.stdout.splitlines():
        match = _TOP_LINE.match(line)
        if match:
            rows[match.group(3)] = (float(match.group(1)), float(match.group(2)))
    assert rows, top.stdout + top.stderr
    return top.stdout, rows
