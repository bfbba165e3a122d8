#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Fetches the CUDA 13 headers the injected library is built against (cuda.h, cupti.h, cupti_activity.h, ...)
# from the PyPI wheels nvidia-cuda-runtime, nvidia-cuda-cupti and nvidia-cuda-crt (crt/host_defines.h), with pip, into .cache/cuda/include.
# No GPU and no CUDA toolkit are needed. Prints the include folder. Idempotent: does nothing once present.
#   usage: scripts/cuda-headers.sh [DEST]   (DEST defaults to <repo>/.cache/cuda)
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
dest="${1:-$repo/.cache/cuda}"
include="$dest/include"
if [[ -f "$include/cupti_activity.h" && -f "$include/cuda.h" && -f "$include/crt/host_defines.h" ]]; then
    echo "$include"
    exit 0
fi

pip="$repo/.venv/bin/pip"
[[ -x "$pip" ]] || pip="pip3"
wheels="$dest/wheels"
mkdir -p "$wheels" "$include"
# 13.0.x: the CUDA release the GPU machines run (driver 580).
"$pip" download --quiet --no-deps --dest "$wheels" \
    "nvidia-cuda-runtime==13.0.*" "nvidia-cuda-cupti==13.0.*" "nvidia-cuda-crt==13.0.*" >&2

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
for whl in "$wheels"/nvidia_cuda_runtime-13.0.*.whl "$wheels"/nvidia_cuda_cupti-13.0.*.whl \
           "$wheels"/nvidia_cuda_crt-13.0.*.whl; do
    [[ -f "$whl" ]] || { echo "cuda-headers: missing wheel $whl" >&2; exit 1; }
    # A wheel is a zip; take only its include folder.
    python3 - "$whl" "$tmp" <<'PY'
import sys, zipfile
whl, out = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(whl) as zf:
    zf.extractall(out, [n for n in zf.namelist() if n.startswith("nvidia/cu13/include/")])
PY
done
cp -r "$tmp"/nvidia/cu13/include/. "$include"/
echo "$include"
