#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Build the agent's container image with Buildah, without a daemon or an image registry:
#   scripts/image.sh base    a minimal Debian bookworm imported as localhost/debian:bookworm-min (debootstrap with
#                            the machine's configured Debian mirror; kept in Podman's storage and reused)
#   scripts/image.sh build   the base, then the Dockerfile built FROM it as localhost/otel-gpu:dev (or $IMAGE); the
#                            CUDA headers and the wheels (the dependencies and the build system's setuptools) are
#                            fetched on the host first, and the build context is staged in .cache/image-context (the
#                            Dockerfile's COPY paths are relative to it)
# runc with no default ulimits: crun fails on these machines (hybrid cgroups, setrlimit).
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
base=${BASE_IMAGE:-localhost/debian:bookworm-min}
image=${IMAGE:-localhost/otel-gpu:dev}
conf="$top/.cache/containers/containers.conf"
mkdir -p "$(dirname "$conf")"
printf '[containers]\ndefault_ulimits = []\n' > "$conf"
export CONTAINERS_CONF=$conf
cd "$top"

make_base() {
  if podman image exists "$base"; then
    return 0
  fi
  local mirror rootfs
  mirror=$(awk '/^URIs:/{print $2; exit}' /etc/apt/sources.list.d/*.sources 2>/dev/null || true)
  if [ -z "$mirror" ]; then
    mirror=$(awk '$1=="deb" && $0 ~ /debian/ {for(i=2;i<=NF;i++) if ($i ~ /^[a-z]+:\/\//) {print $i; exit}}' \
             /etc/apt/sources.list 2>/dev/null || true)
  fi
  rootfs=$(mktemp -d /var/tmp/otel-gpu-rootfs.XXXXXX)
  trap 'rm -rf "$rootfs"' RETURN
  debootstrap --variant=minbase bookworm "$rootfs" ${mirror:+"$mirror"} >/dev/null
  # the image's apt uses the same mirror as this machine
  tar -C "$rootfs" -c . | podman import -q - "$base" >/dev/null
  echo "image: $base imported"
}

case "${1:-build}" in
  base) make_base ;;
  build)
    make_base
    # inputs fetched on the host, with this machine's pip configuration, so that the build needs no package index:
    # the CUDA headers the injection library compiles against, and as wheels the agent's dependencies and what
    # pyproject.toml's build system requires (a setuptools newer than Debian's)
    bash "$top/scripts/cuda-headers.sh" >/dev/null
    pip="$top/.venv/bin/pip"
    [ -x "$pip" ] || pip="python3 -m pip"
    python3 -c 'import tomllib; t = tomllib.load(open("pyproject.toml", "rb"))
print("\n".join(t["build-system"]["requires"] + t["project"]["dependencies"]))' > "$top/.cache/requirements-image.txt"
    $pip download -q -d .cache/wheelhouse -r .cache/requirements-image.txt 2>&1 | grep -v "is ignored" || true
    # the build context: the package's tracked (and new, not ignored) sources, never the host's build outputs
    context="$top/.cache/image-context"
    rm -rf "$context" && mkdir -p "$context"
    git ls-files -z --cached --others --exclude-standard -- pyproject.toml setup.py README.md LICENSE otel_gpu \
      | tar --null -T - -c | tar -C "$context" -x
    cp -r "$top/.cache/cuda/include" "$context/cuda-include"
    cp -r "$top/.cache/wheelhouse" "$context/wheelhouse"
    buildah --runtime runc bud -q --network host --layers --build-arg "BASE_IMAGE=$base" \
      -f "$top/Dockerfile" -t "$image" "$context"
    podman image inspect --format '{{.Size}}' "$image" | awk -v i="$image" '{printf "image: %s %.0f MB\n", i, $1/1e6}'
    ;;
  *) echo "usage: scripts/image.sh [base|build]" >&2; exit 2 ;;
esac
