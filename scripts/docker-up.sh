#!/usr/bin/env bash
# Make a Docker Engine answer, for the integration tests and the runner itself.
# Does nothing when `docker info` already works (DOCKER_HOST or the default socket).
# Otherwise (as root, on Debian/Ubuntu): installs Debian's docker.io when dockerd is missing,
# starts dockerd in the background on DOCKER_HOST's unix socket (default /var/run/docker.sock)
# and waits up to 60 s for it. Its log: $DOCKERD_LOG (default /var/log/runner-dockerd.log).
# No registry is needed afterwards: scripts/build-base-image.sh builds the base image locally.
set -euo pipefail
if docker info >/dev/null 2>&1; then
  echo "docker-up: a Docker Engine answers"
  exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
  echo "docker-up: no Docker Engine answers and starting one needs root (sudo bash $0)" >&2
  exit 1
fi
if ! command -v dockerd >/dev/null 2>&1 || ! command -v docker >/dev/null 2>&1; then
  echo "docker-up: installing Debian's docker.io"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >/dev/null
  apt-get install -y -qq docker.io >/dev/null
fi
args=()
case "${DOCKER_HOST:-}" in
  "") ;;
  unix://*) args+=(--host "$DOCKER_HOST"); mkdir -p "$(dirname "${DOCKER_HOST#unix://}")" ;;
  *) echo "docker-up: DOCKER_HOST=$DOCKER_HOST does not answer and is not a local unix socket" >&2; exit 1 ;;
esac
log=${DOCKERD_LOG:-/var/log/runner-dockerd.log}
echo "docker-up: starting dockerd (log: $log)"
nohup dockerd "${args[@]}" >"$log" 2>&1 &
for _ in $(seq 1 60); do
  if docker info >/dev/null 2>&1; then
    echo "docker-up: the Docker Engine answers"
    exit 0
  fi
  sleep 1
done
echo "docker-up: dockerd did not answer within 60 s; see $log" >&2
exit 1
