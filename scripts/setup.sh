#!/usr/bin/env bash
# Everything a fresh clone needs to run its own tests, on a fresh Debian machine (as root):
# a Docker Engine (scripts/docker-up.sh), the base image built without a registry
# (scripts/build-base-image.sh), and a virtual environment .venv with the package and its
# test extras (Debian's Python refuses `pip install` outside one: PEP 668).
# Then: .venv/bin/python -m pytest      Idempotent: each step is skipped when already done.
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$repo"
bash scripts/docker-up.sh
bash scripts/build-base-image.sh "${STUB_BASE_IMAGE:-runner-base:bookworm}"
if [ ! -x .venv/bin/python ]; then
  if ! python3 -c 'import ensurepip' >/dev/null 2>&1; then  # Debian ships venv's pip apart
    echo "setup: installing python3-venv"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >/dev/null
    apt-get install -y -qq python3-venv >/dev/null
  fi
  python3 -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -e '.[test]'
echo "setup: ready; run the tests with: .venv/bin/python -m pytest"
