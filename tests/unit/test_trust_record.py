"""The runner's own record (journal), trees without recursion, containment: no Docker needed."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from reducers.models import EvaluateResult, Phase, PrepareResult
from runner.containment.agent import agent_process, pid_namespaces_available
from runner.jobroot import JOB_ID_FILE, JobRoot
from runner.journal import Journal, PhaseClock, write_marker
from runner.containment.runner_files import RunnerFilesSnapshot
from runner.errors import TamperCheckError
from runner.trees import remove_tree, walk
from tests.conftest import agent_gone, remove_deep_chain


def _deep(root: Path, depth: int) -> Path:
    root.mkdir()
    fd = os.open(root, os.O_RDONLY)
    try:
        for _ in range(depth):
            os.mkdir("d", dir_fd=fd)
            child = os.open("d", os.O_RDONLY, dir_fd=fd)
            os.close(fd)
            fd = child
        os.close(os.open("leaf", os.O_CREAT | os.O_WRONLY, 0o644, dir_fd=fd))
    finally:
        os.close(fd)
    return root


def test_trees_1500_levels_deep_are_walked_and_removed_without_recursion(tmp_path: Path) -> None:
    root = _deep(tmp_path / "deep", 1500)
    entries = list(walk(root))
    assert len(entries) == 1501 and entries[-1][0].endswith("/leaf")
    remove_tree(root)
    assert not root.exists()


def test_the_tamper_check_sees_past_a_deep_tree_and_fails_closed(tmp_path: Path) -> None:
    job = tmp_path / "job"
    (job / "result-markers").mkdir(parents=True)
    (job / "result-markers" / "prepare.json").write_text("{}\n")
    snapshot = RunnerFilesSnapshot.capture(job)
    _deep(job / "buggy-source", 1200)  # the agent's own tree: never walked
    _deep(job / "result-markers" / "planted", 1200)  # planted among the runner's files: removed
    (job / "result-markers" / "evaluate.json").write_text('{"status": "ok"}\n')
    assert snapshot.restore() == ["result-markers/evaluate.json", "result-markers/planted/" + "d/" * 1200 + "leaf"]
    assert sorted(p.name for p in (job / "result-markers").iterdir()) == ["planted", "prepare.json"]
    # Planted deeper than a path can name: the walk itself fails, and the attempt is not trusted.
    _deep(job / "result-markers" / "abyss", 2100)
    try:
        with pytest.raises(TamperCheckError) as caught:
            snapshot.restore()
        assert caught.value.reason == "tamper_check_failed" and "not trusted" in str(caught.value)
    finally:
        for top in (job / "result-markers" / "abyss", job / "result-markers" / "planted", job / "buggy-source"):
            remove_deep_chain(top)


def _job(tmp_path: Path, name: str = "job") -> JobRoot:
    root = tmp_path / name
    (root / "result-markers").mkdir(parents=True)
    return JobRoot.at(root, "demo_1")


def test_a_marker_file_the_journal_did_not_record_is_replaced(tmp_path: Path) -> None:
    state = tmp_path / "state"
    job = _job(tmp_path)
    journal = Journal.open(state, job)
    marker = PhaseClock(Phase.PREPARE).marker(PrepareResult())
    journal.record(marker)
    write_marker(job.markers, marker)
    forged = PhaseClock(Phase.EVALUATE).marker(EvaluateResult(resolved=True))
    write_marker(job.markers, forged)
    (job.markers / "prepare.json").write_text("{}")
    again = Journal.open(state, job)
    assert again.job_id == journal.job_id
    assert sorted(again.sync_files(job.markers, (Phase.PREPARE, Phase.EVALUATE))) == ["evaluate.json", "prepare.json"]
    assert not (job.markers / "evaluate.json").exists()
    assert again.marker(Phase.PREPARE) == marker and again.marker(Phase.EVALUATE) is None
    assert (state.stat().st_mode & 0o777) == 0o700


def test_a_copied_job_root_gets_an_id_of_its_own_and_a_moved_one_keeps_its(tmp_path: Path) -> None:
    state = tmp_path / "state"
    original = _job(tmp_path, "a")
    first = Journal.open(state, original)
    first.record(PhaseClock(Phase.PREPARE).marker(PrepareResult()))
    subprocess.run(["cp", "-a", str(original.root), str(tmp_path / "copy")], check=True)
    copy = Journal.open(state, JobRoot.at(tmp_path / "copy", "demo_1"))
    assert copy.job_id != first.job_id and copy.marker(Phase.PREPARE) is None
    assert (tmp_path / "copy" / JOB_ID_FILE).read_text().strip() == copy.job_id
    assert Journal.open(state, original).job_id == first.job_id
    (tmp_path / "a").rename(tmp_path / "moved")
    moved = Journal.open(state, JobRoot.at(tmp_path / "moved", "demo_1"))
    assert moved.job_id == first.job_id and moved.marker(Phase.PREPARE) is not None


def test_the_journal_never_lives_in_the_job_root(tmp_path: Path) -> None:
    from runner.errors import BadInputError

    job = _job(tmp_path)
    with pytest.raises(BadInputError, match="--state-dir"):
        Journal.open(job.root / "state", job)


@pytest.mark.skipif(not pid_namespaces_available(), reason="no PID namespaces here (needs CAP_SYS_ADMIN)")
def test_fork_chains_end_with_the_contained_process(tmp_path: Path) -> None:
    tree = tmp_path / "tree"
    tree.mkdir()
    chains = (
        "import os, time\n"
        "for _ in range(16):\n"
        "    if os.fork() == 0:\n"
        "        os.setsid()\n"
        "        end = time.monotonic() + 30\n"
        "        while time.monotonic() < end:\n"
        "            if os.fork() != 0: os._exit(0)\n"
        "        os._exit(0)\n"
        "time.sleep(0.5)\n"
    )
    with agent_process([sys.executable, "-c", chains], journal=None, run_id="t", agent=None, cwd=tree) as child:
        child.wait(timeout=30)
    assert agent_gone(tree, seconds=0.5)  # gone when the block ends: no wait, no race
