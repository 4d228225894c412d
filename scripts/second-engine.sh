#!/usr/bin/env bash
# A Docker Engine of its own beside the machine's: its own socket, data root, exec root, bridge
# and containerd namespace, no iptables rules (the machine's engine owns those). For work that must
# not meet the machine's containers (a helper's test run, a test that stops "its" Docker), and
# for tests that kill an engine on purpose.
#
#   bash scripts/second-engine.sh start NAME [SUBNET_OCTET]   # prints DOCKER_HOST=unix://...
#   bash scripts/second-engine.sh stop NAME
#
# Uses the machine's dockerd (scripts/docker-up.sh installs it); copies runner-base:bookworm over
# from the machine's engine when that has it. Needs root and iproute2.
set -euo pipefail
action=${1:?start|stop}
name=${2:?a short name: letters and digits}
octet=${3:-$(( 200 + $(printf '%s' "$name" | cksum | cut -d' ' -f1) % 50 ))}
state=/run/runner-engine-$name
data=/var/lib/runner-engine-$name
bridge=re-${name:0:10}
host="unix://$state/docker.sock"

case "$action" in
  stop)
    if [ -f "$state/dockerd.pid" ]; then
      pid=$(cat "$state/dockerd.pid")
      kill "$pid" 2>/dev/null || true
      for _ in $(seq 1 30); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
    fi
    ip link del "$bridge" 2>/dev/null || true
    echo "second-engine: $name stopped"
    exit 0 ;;
  start) ;;
  *) echo "second-engine: start or stop" >&2; exit 2 ;;
esac

if [ -f "$state/dockerd.pid" ] && kill -0 "$(cat "$state/dockerd.pid")" 2>/dev/null; then
  echo "DOCKER_HOST=$host"
  exit 0
fi
command -v dockerd >/dev/null || bash "$(dirname "$0")/docker-up.sh" >&2
mkdir -p "$state" "$data"
if ! ip link show "$bridge" >/dev/null 2>&1; then
  ip link add "$bridge" type bridge
  ip addr add "172.31.$octet.1/24" dev "$bridge"
  ip link set "$bridge" up
fi
echo '{}' > "$state/daemon.json"
nohup dockerd --config-file "$state/daemon.json" --host "$host" --data-root "$data" \
  --exec-root "$state/exec" --pidfile "$state/dockerd.pid" \
  --containerd-namespace "runner-$name" --containerd-plugins-namespace "runner-$name-plugins" \
  --bridge "$bridge" --iptables=false --ip-forward=false --ip-masq=false \
  >"$state/dockerd.log" 2>&1 &
for _ in $(seq 1 60); do
  DOCKER_HOST=$host docker info >/dev/null 2>&1 && break
  sleep 1
done
DOCKER_HOST=$host docker info >/dev/null || { echo "second-engine: dockerd did not answer; see $state/dockerd.log" >&2; exit 1; }
if ! DOCKER_HOST=$host docker image inspect runner-base:bookworm >/dev/null 2>&1 \
   && docker image inspect runner-base:bookworm >/dev/null 2>&1; then
  docker save runner-base:bookworm | DOCKER_HOST=$host docker load >/dev/null
fi
echo "DOCKER_HOST=$host"
