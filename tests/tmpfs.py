# SPDX-License-Identifier: Apache-2.0
"""Real file-system limits for tests: a tmpfs of a few pages (a full disk) and the same remounted read-only.

Mounting needs root with CAP_SYS_ADMIN; where that is refused the test is skipped and says so."""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest


@contextlib.contextmanager
def small_tmpfs(where: Path, size_bytes: int) -> Iterator[Path]:
    """A tmpfs of ``size_bytes`` (rounded up to pages) mounted at ``where`` while the block runs."""
    where.mkdir(parents=True, exist_ok=True)
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_bytes},mode=0755", "tmpfs", str(where)],
                             capture_output=True, text=True, check=False)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs (needs root with CAP_SYS_ADMIN): {mounted.stderr.strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], capture_output=True, check=False)


def remount(where: Path, mode: str) -> None:
    """Remount the tmpfs at ``where`` ``ro`` or ``rw``."""
    subprocess.run(["mount", "-o", f"remount,{mode}", str(where)], capture_output=True, check=True)
