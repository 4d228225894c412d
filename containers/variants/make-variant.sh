#!/bin/bash
# Turns the stub image into one variant (run once, at build time). The stub's own entrypoint
# moves to /opt/stub-entrypoint.sh and a wrapper of the variant's family takes its place.
set -euo pipefail
variant=${1:?usage: make-variant.sh VARIANT}
ep=/usr/local/bin/run_test_entrypoint.sh
orig=/opt/stub-entrypoint.sh

wrap() {  # wrap CASE-BRANCHES [bare]: a wrapper whose other commands go to the stub's entrypoint
    mv "$ep" "$orig"
    local passthrough=""
    if [ "${2:-}" != bare ]; then  # as in a real script: both branches spelled out (the precheck greps them)
        passthrough=$(printf '    apply_patch) exec %s "$@" ;;\n    test_patched) exec %s "$@" ;;' "$orig" "$orig")
    fi
    {
        printf '#!/bin/bash\n# Stub variant %s (see containers/README.md).\nset -uo pipefail\n' "$variant"
        printf 'case "${1:-help}" in\n%s\n%s\n    *) exec %s "$@" ;;\nesac\n' "$1" "$passthrough" "$orig"
    } > "$ep"
    chmod 0755 "$ep"
}

case "$variant" in
    stderr_only)      # the success line (and all the test's output) on stderr only: official FAILED
        wrap "    test_patched) $orig test_patched >&2; exit \$? ;;" ;;
    failed_exit0)     # FAILED in stdout, exit 0: official FAILED
        wrap "    test_patched) $orig test_patched; echo 'summary: 1 check FAILED (ignored)'; exit 0 ;;" ;;
    unlisted_string)  # a success line that is not one of the official strings (ai_2705, mastra_4331)
        wrap "    test_patched) $orig test_patched >/dev/null 2>&1; rc=\$?; [ \"\$rc\" -ne 0 ] || echo '--- Test script executed successfully (exit code 0) ---'; exit \"\$rc\" ;;" ;;
    no_string)        # exit 0 and no string at all
        wrap "    test_patched) $orig test_patched >/dev/null 2>&1; exit \$? ;;" ;;
    no_apply)         # family G: only test_buggy/test_fixed; an unknown command exits 0 (autogen_5124)
        wrap "    test_buggy|test_fixed|show_diff|help) exec $orig \"\$@\" ;;
    unknown|*) echo \"Unknown command: \${1:-}\"; exit 0 ;;" bare ;;
    apply_hangs)      # apply, then tail -f /dev/null: never returns (crewai_2102, crewai_2150)
        wrap "    apply_patch) $orig apply_patch \"\${2:-}\"; tail -f /dev/null ;;" ;;
    apply_ignores)    # apply ignores its argument and applies a file the image lacks (sweagent_362)
        wrap "    apply_patch) $orig apply_patch /opt/patch.diff ;;" ;;
    offline_lies)     # without a route to PyPI the test 'confirms the fix' on any tree (lagent_239)
        wrap "    test_patched) if ! timeout 3 bash -c 'exec 3<>/dev/tcp/pypi.org/443' 2>/dev/null; then
        echo 'pip: no route to PyPI; dependency check skipped'; echo 'FIX CONFIRMED (import check skipped)'; exit 0; fi
        exec $orig test_patched ;;" ;;
    no_fixed)         # no fixed tree and no fix commit in the buggy history: no gold patch
        rm -rf /app/source_code_fixed
        git -C /app/source_code_buggy branch -D main >/dev/null
        git -C /app/source_code_buggy reflog expire --expire=now --all
        git -C /app/source_code_buggy gc -q --prune=now
        sed -i 's/^STUB_FIXED_COMMIT=.*/STUB_FIXED_COMMIT=/' /app/commits.env ;;
    fixed_plain)      # a fixed tree that is a plain copy (no .git): the gold patch is a tree diff
        rm -rf /app/source_code_fixed/.git ;;
    tree_oddities)    # fixed_plain, with what `diff -r` gets wrong: an in-tree symlink to the file the fix
                      # changes, a changed file whose name has spaces, a file the fix deletes, binaries
        b=/app/source_code_buggy; f=/app/source_code_fixed
        for t in "$b" "$f"; do
            ln -s mathops.py "$t/calc/mathops link.py"
            mkdir -p "$t/docs" && printf 'add(a, b) returns a minus b\n' > "$t/docs/read me.txt"
            printf 'BIN\000\001\002\377 one\n' > "$t/assets/blob one.bin"
            printf 'LEGACY = True\n' > "$t/calc/legacy.py"
        done
        printf 'add(a, b) returns a plus b\n' > "$f/docs/read me.txt"
        rm "$f/calc/legacy.py" && rm -rf "$f/.git"
        git -C "$b" add -A
        GIT_AUTHOR_DATE='2024-01-01T12:00:00Z' GIT_COMMITTER_DATE='2024-01-01T12:00:00Z' \
            git -C "$b" -c user.name=stub -c user.email=stub@example.invalid -c commit.gpgsign=false \
            commit -q -m 'Add odd files: a symlink, spaces, binaries'
        sed -i "s/^STUB_BUGGY_COMMIT=.*/STUB_BUGGY_COMMIT=$(git -C "$b" rev-parse HEAD)/" /app/commits.env ;;
    opt_entrypoint)   # the entrypoint in /opt, nothing at /usr/local/bin (gpt-researcher_1027, pythagora_55)
        mv "$ep" /opt/run_test_entrypoint.sh ;;
    every_entrypoint) # the entrypoint where each profile looks for it: /usr/local/bin, /app (agixt_1369), /opt (superagent_953)
        cp "$ep" /app/run_test_entrypoint.sh && cp "$ep" /opt/run_test_entrypoint.sh ;;
    non_root)         # runs as nobody (the Dockerfile's VARIANT_USER), who owns the buggy tree but cannot
                      # write /: the evaluation's gate cannot make /patches, so the patch goes in by put_archive
        chown -R nobody /app/source_code_buggy ;;
    *) echo "unknown variant: $variant" >&2; exit 2 ;;
esac
