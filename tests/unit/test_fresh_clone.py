"""A fresh clone runs its own tests: its set-up lives in the repository, not beside it."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.conftest import DOCKER_UNAVAILABLE, REPO

FOREIGN = (".." + "/shared", "/work" + "/shared", "shared" + "/tools")  # spelt apart: this file is scanned too
SCRIPTS = ("scripts/docker-up.sh", "scripts/build-base-image.sh", "scripts/setup.sh")


def _tracked_files() -> list[Path]:
    done = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True)
    return [REPO / name for name in done.stdout.decode().split("\0") if name]


def test_nothing_points_outside_the_repository() -> None:
    offenders = []
    for path in _tracked_files():
        if not path.is_file() or path.suffix in (".bin", ".patch"):
            continue
        text = path.read_text(errors="replace")
        if any(needle in text for needle in FOREIGN):
            offenders.append(path.relative_to(REPO).as_posix())
    assert offenders == [], f"files pointing at a folder outside the clone: {offenders}"


@pytest.mark.parametrize("script", SCRIPTS)
def test_the_set_up_scripts_are_in_the_repository_and_parse(script: str) -> None:
    path = REPO / script
    assert path.is_file() and os.access(path, os.X_OK)
    assert subprocess.run(["bash", "-n", str(path)]).returncode == 0


def test_ci_and_readme_use_them() -> None:
    ci = (REPO / ".ci" / "run").read_text()
    assert "scripts/docker-up.sh" in ci and "scripts/build-base-image.sh" in ci
    readme = (REPO / "README.md").read_text()
    assert "scripts/setup.sh" in readme and ".venv/bin/python -m pytest" in readme
    assert "python3 -m pip install -e" not in readme  # refused outside a venv on Debian (PEP 668)


@pytest.mark.skipif(DOCKER_UNAVAILABLE is not None, reason=DOCKER_UNAVAILABLE or "")
def test_the_scripts_do_nothing_where_the_engine_and_the_base_image_are_there() -> None:
    up = subprocess.run(["bash", "scripts/docker-up.sh"], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert up.returncode == 0 and "answers" in up.stdout, up.stderr
    base = os.environ.get("STUB_BASE_IMAGE") or "runner-base:bookworm"
    built = subprocess.run(["bash", "scripts/build-base-image.sh", base], cwd=REPO, capture_output=True, text=True,
                           timeout=60)
    if built.returncode != 0 or "exists" not in built.stdout:
        pytest.fail(f"{base} missing: build it with scripts/build-base-image.sh ({built.stderr.strip()})")
