#!/usr/bin/env bash
# Build the base image the stub task image is built on, with no container registry:
# debootstrap a minimal Debian bookworm from Debian's package mirror, then `docker import` it.
# Usage: bash scripts/build-base-image.sh [TAG]   (default TAG: $STUB_BASE_IMAGE, else runner-base:bookworm)
# It holds bash, git, python3, GNU patch and CA certificates (about a minute, ~380 MB).
# Idempotent: does nothing when TAG exists. Needs root (debootstrap), installs debootstrap if missing.
# Mirror: $DEBIAN_MIRROR (default http://deb.debian.org/debian).
set -euo pipefail
tag=${1:-${STUB_BASE_IMAGE:-runner-base:bookworm}}
packages=git,python3,ca-certificates,patch
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
if docker image inspect "$tag" >/dev/null 2>&1; then
  echo "build-base-image: $tag exists"
  exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
  echo "build-base-image: debootstrap needs root (sudo bash $0 $tag)" >&2
  exit 1
fi
if ! command -v debootstrap >/dev/null 2>&1; then
  echo "build-base-image: installing debootstrap"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >/dev/null
  apt-get install -y -qq debootstrap >/dev/null
fi
root=$(mktemp -d)
trap 'rm -rf "$root"' EXIT
echo "build-base-image: debootstrap bookworm ($packages) from $mirror"
debootstrap --variant=minbase --include="$packages" bookworm "$root" "$mirror" >/dev/null
tar -C "$root" -c . | docker import --change 'CMD ["bash"]' - "$tag" >/dev/null
echo "build-base-image: built $tag"
