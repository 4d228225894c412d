#!/bin/sh
# Claude Code's shell prefix (CLAUDE_CODE_SHELL_PREFIX, set by runner/agents/claude_code.py):
# every command the agent runs is handed here as one argument, and runs without the
# provider's credentials in its environment and without network: in a network namespace
# of its own (no interface but a loopback that is down), while Claude Code itself keeps
# the host's network to reach its model. Where no namespace can be made, the command is
# not run at all (fail closed). Read-only to the agent: it lives in the runner's package,
# outside the only directories the agent may write.
unset ANTHROPIC_API_KEY ANTHROPIC_AUTH_TOKEN
unshare=$(PATH=/usr/bin:/bin:/usr/sbin:/sbin command -v unshare) || unshare=""
if [ -z "$unshare" ] || ! "$unshare" --user --map-current-user --net true 2>/dev/null; then
    echo "runner: command not run: no network namespace can be made for it here, and the runner runs" \
        "the agent's commands only without network" >&2
    exit 126
fi
exec "$unshare" --user --map-current-user --net -- /bin/bash -c "$1"
