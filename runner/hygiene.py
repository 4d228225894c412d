"""Patch hygiene: build and cache artefacts never go into the patch.

A real agent runs the task's tests, which leaves bytecode and tool caches in the
tree. In the patch they are noise at best; at worst git binary diffs that GNU
``patch`` refuses, so a correct fix is scored unresolved. The patch phase leaves
out every path matching ``DEFAULT_EXCLUDES`` (plus the operator's
``--patch-exclude`` patterns) on top of the tree's own ``.gitignore``, whether
or not the baseline held such files (a tracked ``.pyc`` the tests rewrote is left
out too), and counts what it left out.

Patterns are git glob pathspecs; one without a ``/`` matches a name at any depth,
one ending in ``/`` a directory (and everything in it) at any depth.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

# Documented in the README ("Patch hygiene"); a name at any depth.
DEFAULT_EXCLUDES: tuple[str, ...] = (
    "__pycache__/", "*.pyc", "*.pyo", ".pytest_cache/", ".mypy_cache/", ".ruff_cache/", ".pytype/",
    ".pyre/", ".hypothesis/", ".tox/", ".nox/", ".eggs/", "*.egg-info/", ".coverage", ".coverage.*",
    "htmlcov/", ".ipynb_checkpoints/", "node_modules/", ".npm/", ".yarn-cache/", ".pnpm-store/",
    ".parcel-cache/", ".nyc_output/", ".DS_Store",
    # GNU patch's leftovers when an agent applies a diff by hand: the rejected hunks and the backups
    "*.rej", "*.orig",
)
_PATTERN = re.compile(r"[A-Za-z0-9_.*?\[\]!/+@-]{1,200}")


def check_pattern(pattern: str) -> str:
    """Raises ValueError: not a plain glob (no pathspec magic, no '..', one line)."""
    if not _PATTERN.fullmatch(pattern) or ".." in pattern.split("/") or pattern.startswith(":") or pattern == "/":
        raise ValueError("--patch-exclude takes a glob of letters, digits and '_ . * ? [ ] ! / + @ -', without '..'")
    return pattern


def _glob(pattern: str) -> list[str]:
    """The git glob pathspec(s) for one pattern."""
    anchored = pattern.startswith("/")
    body = pattern.strip("/")
    prefix = "" if anchored or "/" in body else "**/"
    if pattern.endswith("/"):
        return [f"{prefix}{body}/**"]
    return [f"{prefix}{body}", f"{prefix}{body}/**"]  # a file, or a directory of that name


def patterns(extra: Sequence[str] = ()) -> list[str]:
    return [glob for pattern in (*DEFAULT_EXCLUDES, *extra) for glob in _glob(pattern)]


def excluding(extra: Sequence[str] = ()) -> list[str]:
    """Pathspec arguments (after ``--``) for everything but the artefacts."""
    return [".", *(f":(exclude,glob){glob}" for glob in patterns(extra))]


def matching(extra: Sequence[str] = ()) -> list[str]:
    """Pathspec arguments (after ``--``) for the artefacts only."""
    return [f":(glob){glob}" for glob in patterns(extra)]


_WILD = re.compile(r"\*+|\?|\[[^\]]*\]?")


def needles(extra: Sequence[str] = ()) -> list[bytes] | None:
    """Text every path an artefact pattern matches must contain: each glob's longest literal run
    (``.pyc`` of ``**/*.pyc``). A path holding none of them is no artefact, so git need not be
    asked; None when some pattern has no literal run at all (it could match anything)."""
    found = []
    for glob in patterns(extra):
        runs = [run for run in _WILD.split(glob.removeprefix("**/").removesuffix("/**")) if run]
        if not runs:
            return None
        found.append(max(runs, key=len).encode())
    return found
