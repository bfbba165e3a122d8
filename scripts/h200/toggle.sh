#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Run THERE after run.sh has set up the machine: only the within-one-process overhead measurement of
# verify_gpu_time.py, with PHASES alternating attach/detach phases of 3 s (default 30).
set -uo pipefail
top=$(cd "$(dirname "$0")/../.." && pwd); cd "$top"
OUT=${OUT:-/tmp/otel-gpu-out}; mkdir -p "$OUT"
cp -a .device/artifacts/. .
[ -d /tmp/site/opentelemetry ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
export PYTHONPATH="$top:/tmp/site" LD_LIBRARY_PATH="$top/.device/lib:${LD_LIBRARY_PATH:-}" PYTHONUNBUFFERED=1
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
