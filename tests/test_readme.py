# SPDX-License-Identifier: Apache-2.0
"""The README's configuration and metric tables are the code's: a new option or metric must show up there."""

from __future__ import annotations

import subprocess
import sys

from tests.conftest import REPO


def test_readme_tables_match_config_and_semconv() -> None:
    result = subprocess.run([sys.executable, str(REPO / "scripts" / "gen_readme_tables.py"), "--check"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr


def test_readme_gives_the_two_commands() -> None:
    text = (REPO / "README.md").read_text()
    assert "make run" in text and "make test" in text
