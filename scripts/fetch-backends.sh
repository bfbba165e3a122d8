#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Fetch the real backends the tests talk to, as Debian packages extracted under .cache/backends:
#   victoria-metrics (unstable suite: OTLP ingestion needs >= 1.92) and prometheus (the machine's own suite).
# Uses the Debian mirror this machine's apt is already configured with; adds the unstable suite only in a
# private apt folder. Nothing is installed system-wide.
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
cache="$top/.cache/backends"
if [ -x "$cache/victoria-metrics/usr/bin/victoria-metrics" ] && [ -x "$cache/prometheus/usr/bin/prometheus" ]; then
  exit 0
fi
apt_dir="$top/.cache/apt"
mkdir -p "$apt_dir/lists/partial" "$apt_dir/archives/partial" "$apt_dir/sources" "$cache/debs"
# The mirror and keyring of the first Debian source configured on this machine (deb822 or one-line format).
uri=$(awk '/^URIs:/{print $2; exit}' /etc/apt/sources.list.d/*.sources 2>/dev/null || true)
keyring=$(awk '/^Signed-By:/{print $2; exit}' /etc/apt/sources.list.d/*.sources 2>/dev/null || true)
if [ -z "$uri" ]; then
  uri=$(awk '$1=="deb" && $0 ~ /debian/ {for(i=2;i<=NF;i++) if ($i ~ /^[a-z]+:\/\//) {print $i; exit}}' \
        /etc/apt/sources.list 2>/dev/null || true)
fi
if [ -z "$uri" ]; then
  echo "fetch-backends: no Debian mirror is configured for apt on this machine" >&2
  exit 1
fi
keyring=${keyring:-/usr/share/keyrings/debian-archive-keyring.gpg}
cat > "$apt_dir/sources/unstable.sources" <<SRC
Types: deb
URIs: $uri
Suites: unstable
Components: main
Signed-By: $keyring
SRC
private=(-o "Dir::Etc::SourceList=/dev/null" -o "Dir::Etc::SourceParts=$apt_dir/sources"
         -o "Dir::State::Lists=$apt_dir/lists" -o "Dir::Cache::Archives=$apt_dir/archives"
         -o "APT::Architecture=amd64" -o "Debug::NoLocking=1")
apt-get "${private[@]}" update -qq
cd "$cache/debs"
apt-get "${private[@]}" download victoria-metrics 2>&1 | grep -v 'unsandboxed' || true
# Prometheus from the machine's own suite (its OTLP receiver is compiled out in Debian; the tests scrape with it).
apt-get download prometheus 2>&1 | grep -v 'unsandboxed' || true
for name in victoria-metrics prometheus; do
  deb=$(ls -t "$cache/debs/${name}"_*.deb | head -1)
  rm -rf "${cache:?}/$name"
  dpkg -x "$deb" "$cache/$name"
  # Debian's victoria-metrics build prints an empty -version, so report the package version instead
  echo "fetch-backends: $(dpkg-deb -f "$deb" Package) $(dpkg-deb -f "$deb" Version) in $cache/$name"
done
test -x "$cache/victoria-metrics/usr/bin/victoria-metrics"
"$cache/prometheus/usr/bin/prometheus" --version 2>&1 | head -1
