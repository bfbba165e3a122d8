# SPDX-License-Identifier: Apache-2.0
"""scripts/h200/verify_nvml.py runs end to end on the fake NVML with a stand-in nvidia-smi, so the script the
lead runs once on the H200 does not rot. Without torch here the load check fails, so the script exits 1, but
every nvidia-smi comparison must agree."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.conftest import REPO
from tests.gpu.conftest import FAKE_NVML_DIR, UUIDS, build_fake_nvml

BIN = Path(__file__).resolve().parent / "bin"


def test_verify_script_compares_with_nvidia_smi_and_writes_markdown(tmp_path: Path) -> None:
    build_fake_nvml()
    env = {k: v for k, v in os.environ.items() if not k.startswith("FAKE_NVML_")}
    env.update({"LD_LIBRARY_PATH": str(FAKE_NVML_DIR), "PATH": f"{BIN}{os.pathsep}{env.get('PATH', '')}"})
    report = tmp_path / "h200-nvml.md"
    result = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "h200" / "verify_nvml.py"), str(report), "--load-seconds", "2",
         "--samples", "2", "--gap-seconds", "0.2"],
        check=False, cwd=REPO, env=env, capture_output=True, text=True, timeout=240)
    text = report.read_text()
    comparison_rows = [line for line in text.splitlines() if line.startswith(("| 0 |", "| 1 |"))]
    compared = [row for row in comparison_rows if row.rstrip().endswith(("| yes |", "| NO |"))]
    assert len(compared) == 2 * 2 * 8  # samples x GPUs x readings
    assert all(row.rstrip().endswith("| yes |") for row in compared), "\n".join(compared)
    assert UUIDS[0] in text and UUIDS[1] in text
    assert "## GPM" in text and "## Cost" in text and "PCIe bytes from fields" in text
    torch_missing = "torch load could not start" in text or "did not become ready" in text
    assert result.returncode == (1 if torch_missing else 0), result.stderr
