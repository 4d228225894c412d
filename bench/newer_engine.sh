#!/usr/bin/env bash
# The benchmark against a newer Docker Engine (Debian trixie's docker.io, 26.x), run beside the
# machine's own engine (DESIGN.md installs bookworm's 20.10) on a socket, data root and bridge of
# its own, then stopped. Why: on 20.10 every put_archive re-executes the dockerd binary
# (about 40 ms); newer engines unpack in-process (moby/moby#44210), and the evaluate figure
# depends on it.
#
#   bash bench/newer_engine.sh --only evaluate      # any run_bench.py options
#
# Needs root, curl, xz, dpkg-deb, iproute2, and the runner-base:bookworm image on the machine's
# engine (it is copied over). Figures go to bench/results/newer-engine.json. PYTHON picks the
# interpreter that has the runner installed (default: python).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
arch=$(dpkg --print-architecture)
cache=${RUNNER_BENCH_ENGINE_CACHE:-/var/cache/runner-bench-engine}
state=/run/runner-bench-engine
data=/var/lib/runner-bench-engine
bridge=rbench0
export_host="unix://$state/docker.sock"

mkdir -p "$cache" "$state"
if [ ! -x "$cache/root/usr/sbin/dockerd" ]; then
  echo "newer-engine: fetching trixie's docker.io ($arch) from $mirror" >&2
  curl -fsS "$mirror/dists/trixie/main/binary-$arch/Packages.xz" | xz -dc > "$cache/Packages"
  file=$(awk '/^Package: docker.io$/{p=1} p&&/^Filename:/{print $2; exit}' "$cache/Packages")
  [ -n "$file" ] || { echo "newer-engine: docker.io not found in trixie's index" >&2; exit 1; }
  curl -fsS -o "$cache/docker.io.deb" "$mirror/$file"
  dpkg-deb -x "$cache/docker.io.deb" "$cache/root"
fi

if [ -f "$state/dockerd.pid" ] && kill -0 "$(cat "$state/dockerd.pid")" 2>/dev/null; then
  echo "newer-engine: a dockerd from an earlier run still runs (pid $(cat "$state/dockerd.pid")); stop it first" >&2
  exit 1
fi

engine=""
cleanup() {
  if [ -n "$engine" ]; then
    kill "$engine" 2>/dev/null || true
    wait "$engine" 2>/dev/null || true
  fi
  ip link del "$bridge" 2>/dev/null || true
}
trap cleanup EXIT

# A bridge of its own, no iptables rules (the machine's engine owns those), no daemon.json of
# the machine's, and containerd namespaces of its own should it find the machine's containerd.
if ! ip link show "$bridge" >/dev/null 2>&1; then
  ip link add "$bridge" type bridge
  ip addr add 172.31.250.1/24 dev "$bridge"
  ip link set "$bridge" up
fi
echo '{}' > "$state/daemon.json"
PATH="$cache/root/usr/sbin:$cache/root/usr/bin:$PATH" "$cache/root/usr/sbin/dockerd" \
  --config-file "$state/daemon.json" --host "$export_host" --data-root "$data" \
  --exec-root "$state/exec" --pidfile "$state/dockerd.pid" \
  --containerd-namespace runner-bench --containerd-plugins-namespace runner-bench-plugins \
  --bridge "$bridge" --iptables=false --ip-forward=false --ip-masq=false \
  >"$state/dockerd.log" 2>&1 &
engine=$!

for _ in $(seq 1 60); do
  DOCKER_HOST=$export_host docker info >/dev/null 2>&1 && break
  kill -0 "$engine" 2>/dev/null || { echo "newer-engine: dockerd exited; see $state/dockerd.log" >&2; exit 1; }
  sleep 1
done
DOCKER_HOST=$export_host docker info >/dev/null

if ! DOCKER_HOST=$export_host docker image inspect runner-base:bookworm >/dev/null 2>&1; then
  docker save runner-base:bookworm | DOCKER_HOST=$export_host docker load >/dev/null
fi
DOCKER_HOST=$export_host "${PYTHON:-python}" "$here/run_bench.py" --output "$here/results/newer-engine.json" "$@"
