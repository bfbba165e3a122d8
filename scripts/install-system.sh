#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# System packages for building otel-gpu on Debian/Ubuntu: the BPF toolchain (clang, bpftool, libbpf headers), USDT
# headers and a C compiler. With --test also what the tests use: Go (for `go tool pprof`) and Podman/Buildah with
# debootstrap (the container image test: no daemon, no registry). Runtime needs only libbpf1 + libelf1.
set -euo pipefail
packages=(clang llvm libbpf-dev libbpf1 bpftool libelf-dev zlib1g-dev systemtap-sdt-dev gcc make)
if [ "${1:-}" = "--test" ]; then
  packages+=(golang-go podman buildah runc debootstrap fuse-overlayfs uidmap slirp4netns)
fi
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  if [ "$(id -u)" != 0 ]; then
    echo "install-system: need root to install: ${missing[*]}" >&2
    exit 1
  fi
  echo "install-system: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
