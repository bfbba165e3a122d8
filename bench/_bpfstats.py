# SPDX-License-Identifier: Apache-2.0
"""A loaded BPF program's run statistics through bpftool (the kernel counts them while kernel.bpf_stats_enabled=1)."""

from __future__ import annotations

import json
import shutil
import subprocess


def program_stats(program_id: int) -> tuple[int, int]:
    """(run_time_ns, run_cnt) of one loaded program."""
    bpftool = shutil.which("bpftool") or "/usr/sbin/bpftool"
    out = subprocess.run([bpftool, "prog", "show", "id", str(program_id), "-j"], capture_output=True, text=True,
                         check=True).stdout
    prog = json.loads(out)
    return int(prog.get("run_time_ns", 0)), int(prog.get("run_cnt", 0))
