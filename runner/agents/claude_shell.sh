#!/bin/sh
# Claude Code's shell prefix (CLAUDE_CODE_SHELL_PREFIX, set by runner/agents/claude_code.py):
# every command the agent runs is handed here as one argument, and runs without the
# provider's credentials in its environment. Read-only to the agent: it lives in the
# runner's package, outside the only directories the agent may write.
unset ANTHROPIC_API_KEY ANTHROPIC_AUTH_TOKEN
exec /bin/bash -c "$1"
