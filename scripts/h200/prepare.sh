#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Run HERE (the development machine) before a device run: builds everything and stages what the GPU machine
# lacks under .device/ (ignored by git) and .whl/: the built BPF objects and native libraries (relative paths kept;
# among them otel_gpu/instrumentation/_hooks.abi3.so, the span processor's C hooks, built here against the limited API
# so that the device's Python 3.12 loads it), libbpf.so.1 from Debian's libbpf1, and the project's Python dependencies
# as Python 3.12 wheels.
# Then call the device tool with carry [".device", ".whl"] and the command `bash scripts/h200/run.sh`.
set -euo pipefail
top=$(cd "$(dirname "$0")/../.." && pwd)
cd "$top"
make -s build
rm -rf .device/artifacts && mkdir -p .device/artifacts .device/lib .whl
git status --ignored --porcelain | awk '$1=="!!"{print $2}' \
  | grep -E '\.(bpf\.o|so(\.[0-9]+)*)$|^tests/native/(workloads|cuda)/[a-z_0-9]+$' \
  | grep -vE "tests/native/(nvml|cuda)/" | while read -r f; do mkdir -p ".device/artifacts/$(dirname "$f")" && cp -a "$f" ".device/artifacts/$f"; done
if [ ! -e .device/lib/libbpf.so.1 ]; then
  tmp=$(mktemp -d); (cd "$tmp" && apt-get download libbpf1 >/dev/null 2>&1 && dpkg -x libbpf1_*.deb x)
  cp -a "$tmp"/x/usr/lib/*/libbpf.so.1* .device/lib/; rm -rf "$tmp"
fi
# baton.py's mode E: an injection library that does nothing (what the driver's injection itself costs)
echo 'int InitializeInjection(void) { return 1; }' | cc -x c -shared -fPIC -O2 -o .device/empty_inject.so -
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl \
  opentelemetry-api==1.45.2 opentelemetry-sdk==1.45.2 opentelemetry-semantic-conventions==0.66b2 \
  opentelemetry-exporter-otlp-proto-common==1.45.2 opentelemetry-exporter-otlp-proto-grpc==1.45.2 \
  opentelemetry-exporter-otlp-proto-http==1.45.2 opentelemetry-exporter-http-transport==0.66b2 \
  opentelemetry-exporter-otlp-common==0.66b2 opentelemetry-exporter-prometheus==0.66b2 opentelemetry-proto==1.45.2 \
  googleapis-common-protos==1.76.0 pyelftools==0.33 typing_extensions==4.16.0 py-spy==0.4.3 2>&1 | grep -v WARNING || true
du -sh .device .whl
