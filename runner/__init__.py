"""The runner: one AgentIssue-Bench task, end to end, on a trusted host."""

import os

# Without a git binary GitPython raises ImportError at import, so even ``--help`` died;
# quiet, the import works and the precheck's git check says what is missing.
os.environ.setdefault("GIT_PYTHON_REFRESH", "quiet")

__version__ = "0.1.0"
