"""The suite cleans up after itself and touches only what it made."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from runner.docker_utils import runner_labels
from tests.conftest import REPO, runner_containers

pytestmark = [pytest.mark.docker, pytest.mark.usefixtures("no_leaked_containers")]


def test_a_real_runs_containers_are_not_the_tests_business(stub_image: str, docker_client, monkeypatch) -> None:
    """A runner container made beside the suite (no test-session label, its owner gone) is
    neither counted as a leak nor removed by the suite's sweep."""
    monkeypatch.delenv("RUNNER_SESSION")
    labels = {**runner_labels(job_id="real-run", run_id="real-run", phase="evaluate"),
              "io.agentissue-runner.pid": "999999999"}  # an owner that is not alive
    monkeypatch.undo()
    real = docker_client.containers.create(stub_image, command=["true"], labels=labels)
    try:
        assert real.id not in {c.id for c in runner_containers(docker_client)}
        swept = subprocess.run([sys.executable, "-m", "runner", "--sweep"], cwd=REPO,
                               capture_output=True, text=True, timeout=120)
        assert swept.returncode == 0, swept.stderr
        real.reload()  # still there: the suite's sweep looks at its own session only
    finally:
        real.remove(force=True)


def _tree_size(root: Path) -> int:
    return sum(p.lstat().st_size for p in root.rglob("*") if p.is_file() and not p.is_symlink())


def test_a_session_leaves_no_job_roots_and_no_untagged_images(tmp_path: Path, docker_client) -> None:
    """A sub-session that builds its own stub image (on a base of its own) and runs a task."""
    base = f"runner-hygiene-base:{uuid.uuid4().hex[:8]}"
    parent = os.environ.get("STUB_BASE_IMAGE") or "runner-base:bookworm"
    docker_client.images.build(fileobj=io.BytesIO(f"FROM {parent}\nLABEL hygiene={base}\n".encode()), tag=base, rm=True)
    images_before = {image.id for image in docker_client.images.list(all=True)}
    temproot = tmp_path / "temproot"
    temproot.mkdir()
    try:
        done = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
             "tests/integration/test_execute.py::test_wrong_fix_ends_unresolved"],
            cwd=REPO, capture_output=True, text=True, timeout=600,
            env={**os.environ, "STUB_BASE_IMAGE": base, "PYTEST_DEBUG_TEMPROOT": str(temproot)},
        )
        assert done.returncode == 0, done.stdout[-3000:]
        left = [image.id for image in docker_client.images.list(all=True) if image.id not in images_before]
        assert left == [], f"{len(left)} image(s) left by the session (untagged build layers)"
        job_roots = [p.parent for p in temproot.rglob("result-markers")]
        assert job_roots == [], f"job roots left under the temp root: {len(job_roots)}"
        assert _tree_size(temproot) < 1024 * 1024
    finally:
        docker_client.images.remove(base)
