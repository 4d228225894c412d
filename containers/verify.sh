#!/usr/bin/env bash
# Smoke-test the stub image the way the official eval_patches.py drives a real one.
# Usage: bash containers/verify.sh [TAG]   (default TAG: agentissue-runner-stub:latest)
# Every container is started with --rm; the patch directory is a read-only bind mount.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
image=${1:-agentissue-runner-stub:latest}
ep=/usr/local/bin/run_test_entrypoint.sh
patches=$(mktemp -d)
trap 'rm -rf "$patches"' EXIT
cp "$here/stub/golden.patch" "$patches/attempt.patch"
# The golden patch without its new file: must apply, then fail the test on the import.
awk '/^diff --git /{keep = ($0 ~ /mathops\.py/)} keep' "$here/stub/golden.patch" > "$patches/partial.patch"

fail() { echo "verify: FAIL: $*" >&2; exit 1; }
run() { docker run --rm "$@"; }
eval_patch() {  # same command shape and placeholder env as eval_patches.py
    run --entrypoint bash -v "$patches:/patches:ro" \
        -e OPENAI_API_KEY=api-key -e OPENAI_API_BASE=api-base-url "$image" \
        -c "$ep apply_patch /patches/$1 && $ep test_patched"
}

out=$(run "$image" help) || fail "help exit code"
grep -q "test_patched" <<<"$out" || fail "help output"
out=$(run "$image" test_buggy 2>/dev/null) || fail "test_buggy exit code"
grep -q "BUG REPRODUCED" <<<"$out" || fail "test_buggy output"
if out=$(run "$image" test_patched); then fail "test_patched passed on the buggy tree"; fi
grep -q FAILED <<<"$out" || fail "test_patched output on the buggy tree"
out=$(run "$image" test_fixed 2>/dev/null) || fail "test_fixed exit code"
grep -q "FIX CONFIRMED" <<<"$out" || fail "test_fixed output"
log=$(run --entrypoint bash "$image" -c 'cd /app/source_code_buggy && git log --all --oneline')
grep -q "Fix add" <<<"$log" || fail "fix commit not reachable from the buggy checkout"
out=$(eval_patch attempt.patch) || fail "golden patch: exit code"
grep -q "FIX CONFIRMED" <<<"$out" && ! grep -q FAILED <<<"$out" || fail "golden patch: output"
if out=$(eval_patch partial.patch); then fail "partial patch passed"; fi
grep -q FAILED <<<"$out" || fail "partial patch output"
echo "verify: ok ($image)"
