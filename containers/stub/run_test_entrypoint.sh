#!/bin/bash
# Stub of an AgentIssue-Bench task image entrypoint (task: calc_add).
# Mirrors the structure and messages of the real benchmark/<tag>/run_test_entrypoint.sh scripts
# (e.g. benchmark/lagent_239 in alfin06/AgentIssue-Bench), with explicit exit codes instead of
# `set -e`, so a failed patch or test always prints its line before exiting.
set -uo pipefail

SOURCE_BUGGY="/app/source_code_buggy"
SOURCE_FIXED="/app/source_code_fixed"
PYTHON_CMD="${PYTHON_CMD:-python3}"
REPRO_SCRIPT_PY="/app/reproduce/reproduce.py"
TEST_LOG="/tmp/test_output.log"

# The real images bake BUGGY_COMMIT/FIXED_COMMIT in as ENV at build time; the stub creates its
# commits during the build, so it records them in /app/commits.env (an explicit env still wins).
STUB_BUGGY_COMMIT=""
STUB_FIXED_COMMIT=""
if [ -f /app/commits.env ]; then
    # shellcheck disable=SC1091
    . /app/commits.env
fi
BUGGY_COMMIT="${BUGGY_COMMIT:-$STUB_BUGGY_COMMIT}"
FIXED_COMMIT="${FIXED_COMMIT:-$STUB_FIXED_COMMIT}"

run_test() {
    local version=$1
    local source_dir
    if [ "$version" == "buggy" ] || [ "$version" == "patched" ]; then
        source_dir="$SOURCE_BUGGY"
    else
        source_dir="$SOURCE_FIXED"
    fi
    echo "--- Running Test for ${version} version ---"
    if [ ! -f "$REPRO_SCRIPT_PY" ]; then
        echo "--- FATAL ERROR: No reproduction script found! ---"
        echo "Looked for ${REPRO_SCRIPT_PY}"
        return 127
    fi
    cd "$source_dir" || return 2
    echo "Found reproduce.py. Executing with ${PYTHON_CMD}..."
    "$PYTHON_CMD" "$REPRO_SCRIPT_PY" "$version" "$source_dir" 2>&1 | tee "$TEST_LOG"
    local exit_code=${PIPESTATUS[0]}
    if [ "$version" == "buggy" ]; then
        # The reproduce script fails (exit 1, "FAILED: ...") while the bug is present.
        if [ "$exit_code" -eq 1 ] && grep -q "^FAILED:" "$TEST_LOG"; then
            echo "✅ BUG REPRODUCED: calc.mathops.add does not add in the buggy version"
            return 0
        fi
        echo "❌ BUG NOT REPRODUCED: reproduce.py exited with code ${exit_code}"
        return 1
    fi
    if [ "$exit_code" -eq 0 ] && grep -q "FIX CONFIRMED" "$TEST_LOG"; then
        echo "✅ SUCCESS: Fix working in ${version} version"
        return 0
    fi
    echo "❌ TEST FAILED: Script returned exit code ${exit_code}"
    return 1
}

apply_patch() {
    local patch_file=$1
    if [ ! -f "$patch_file" ]; then
        echo "Error: Patch file not found at $patch_file"
        return 1
    fi
    echo "Applying patch to buggy version..."
    cd "$SOURCE_BUGGY" || return 2
    echo "Applying patch from $patch_file..."
    patch -p1 --batch --forward < "$patch_file"
    local rc=$?
    if [ "$rc" -eq 0 ]; then
        echo "✅ Patch applied successfully"
    else
        echo "❌ Failed to apply patch (patch exit code ${rc})"
    fi
    return "$rc"
}

case "${1:-help}" in
    test_buggy)
        echo "=== Testing BUGGY Version (Commit: ${BUGGY_COMMIT}) ==="
        cd "$SOURCE_BUGGY" || exit 2
        git -c advice.detachedHead=false checkout "${BUGGY_COMMIT}" --force || exit 2
        run_test "buggy"
        ;;
    test_fixed)
        if [ -z "${FIXED_COMMIT}" ] || [ "${FIXED_COMMIT}" == "N/A" ]; then
            echo "ERROR: FIXED_COMMIT not set." >&2; exit 1
        fi
        echo "=== Testing FIXED Version (Commit: ${FIXED_COMMIT}) ==="
        cd "$SOURCE_FIXED" || exit 2
        git -c advice.detachedHead=false checkout "${FIXED_COMMIT}" --force || exit 2
        run_test "fixed"
        ;;
    apply_patch)
        if [ -z "${2:-}" ]; then
            echo "Error: Patch file path required"
            echo "Usage: docker run -v \$(pwd):/patches IMAGE apply_patch /patches/my_patch.patch"
            exit 1
        fi
        apply_patch "$2"
        ;;
    test_patched)
        echo "=== Testing PATCHED Version (Buggy + Your Patch) ==="
        run_test "patched"
        ;;
    show_diff)
        if [ -z "${FIXED_COMMIT}" ] || [ "${FIXED_COMMIT}" == "N/A" ]; then
            echo "ERROR: FIXED_COMMIT not set." >&2; exit 1
        fi
        echo "=== Diff between BUGGY (${BUGGY_COMMIT}) and FIXED (${FIXED_COMMIT}) ==="
        cd "$SOURCE_BUGGY" || exit 2
        git diff "${BUGGY_COMMIT}" "${FIXED_COMMIT}" --
        ;;
    bash)
        echo "Entering bash shell. Use 'cd /app/source_code_buggy' or 'cd /app/source_code_fixed'"
        exec /bin/bash
        ;;
    help)
        echo "Usage: docker run [OPTIONS] IMAGE [COMMAND]"
        echo ""
        echo "Stub AgentIssue-Bench task image (task: ${STUB_TASK:-calc_add})"
        echo ""
        echo "Commands:"
        echo "  test_buggy      Test if the bug exists in the buggy version"
        echo "  test_fixed      Test if the fix works in the fixed version"
        echo "  apply_patch     Apply a patch file to the buggy version (requires mounted volume)"
        echo "                  Example: docker run -v \$(pwd):/patches IMAGE apply_patch /patches/my_patch.patch"
        echo "  test_patched    Test the buggy version with your applied patch"
        echo "  show_diff       Show the diff between buggy and fixed versions"
        echo "  bash            Start a bash shell"
        echo "  help            Show this help message"
        ;;
    *)
        echo "Unknown command: $1"
        echo "Run with 'help' for the list of commands."
        exit 1
        ;;
esac
