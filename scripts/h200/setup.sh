# SPDX-License-Identifier: Apache-2.0
# Sourced THERE by run.sh and toggle.sh (the H200 machine, through the device tool, carry [".device", ".whl"]):
# restores the staged build outputs, installs the wheels into /tmp/site (once per machine), sets $top, $OUT and the
# environment the scripts run in. Returns non-zero when the wheels cannot be installed.
top=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$top" || return 1
OUT=${OUT:-/tmp/otel-gpu-out}; mkdir -p "$OUT"
cp -a .device/artifacts/. .
if [ ! -d /tmp/site/opentelemetry ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || { echo "wheel install failed"; return 1; }
fi
export PYTHONPATH="$top:/tmp/site" LD_LIBRARY_PATH="$top/.device/lib:${LD_LIBRARY_PATH:-}" PYTHONUNBUFFERED=1
