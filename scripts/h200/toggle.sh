#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Run THERE (like run.sh): only the within-one-process overhead measurement of
# verify_gpu_time.py, with PHASES alternating attach/detach phases of 3 s (default 30).
set -uo pipefail
source "$(dirname "$0")/setup.sh" || exit 1
VERIFY_TOGGLE_PHASES=${PHASES:-30} python3 - <<'PY' | tee "$OUT/toggle.md"
import pathlib, sys, tempfile
sys.path.insert(0, "scripts/h200")
import verify_gpu_time as v
v.WORK = pathlib.Path(tempfile.mkdtemp())
(v.WORK / "program.py").write_text(v.PROGRAM)
source = v.WindowedSource(rescan_interval_s=0.2, full_rescan_s=0.5)
source.open()
lines, results = [], {}
v.step_toggle(source, lines, results)
print("\n".join(lines))
PY
