"""GitPython, isolated from the host's git configuration.

Invariant: the runner's git commands ignore the system and global config (no
host hooks, excludes, prefixes or signing), so a baseline and a patch come out
the same on every host.
"""

from __future__ import annotations

import os
from pathlib import Path

from git import Repo

BASELINE_MESSAGE = "agentissue-runner baseline: buggy source as extracted"
IDENTITY = ("agentissue-runner", "runner@example.invalid")
_ISOLATION = {"GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": os.devnull, "GIT_TERMINAL_PROMPT": "0"}


def isolated(repo: Repo) -> Repo:
    repo.git.update_environment(**_ISOLATION)
    return repo


def open_repo(path: Path) -> Repo:
    return isolated(Repo(path))


def init_repo(path: Path) -> Repo:
    repo = isolated(Repo.init(path))
    with repo.config_writer() as config:
        config.set_value("user", "name", IDENTITY[0])
        config.set_value("user", "email", IDENTITY[1])
        config.set_value("commit", "gpgsign", "false")
        config.set_value("core", "autocrlf", "false")
        config.set_value("core", "hooksPath", os.devnull)
    return repo
