#!/usr/bin/env bash
# Build the stub AgentIssue-Bench task image without any registry access.
# Usage: bash containers/build.sh [TAG]        (default TAG: agentissue-runner-stub:latest)
# Base image: $STUB_BASE_IMAGE, else runner-base:bookworm when it exists locally
# (built by scripts/build-base-image.sh), else debian:bookworm-slim.
# Idempotent: rebuilding unchanged sources reuses Docker's layer cache and re-tags the same image.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
tag=${1:-agentissue-runner-stub:latest}
if [ -n "${STUB_BASE_IMAGE:-}" ]; then
    base=$STUB_BASE_IMAGE
elif docker image inspect runner-base:bookworm >/dev/null 2>&1; then
    base=runner-base:bookworm
else
    base=debian:bookworm-slim
fi
echo "building $tag from base $base" >&2
docker build --quiet --build-arg BASE_IMAGE="$base" -t "$tag" "$here/stub" >/dev/null
echo "built $tag ($(docker image inspect --format '{{.Id}}' "$tag"))"
