"""``--keep-trees``: a scored task's private tree goes per the policy, everything public stays, and
``--reduce`` and the report still work on a job root without its tree (batch and worker)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from reducers.outcome import TaskFacts, TaskState
from runner.disk_policy import DiskPolicy, KeepTrees
from runner.errors import BadInputError
from tests.conftest import FAKE_CODEX, run_cli
from tests.fleet_support import Fleet

pytestmark = [pytest.mark.docker, pytest.mark.usefixtures("no_leaked_containers")]

MODES = {"t_ok": "fix", "t_wrong": "wrong-fix", "t_ok2": "fix"}
KEPT = ("Patches", "result-markers", "logs", "benchmark_run.compact.json", "benchmark_result.compact.json",
        "real-result.public.json")


def _batch(jobs: Path, image: str, policy: str) -> dict:
    for tag, mode in MODES.items():
        (jobs / tag / "context").mkdir(parents=True, exist_ok=True)
        (jobs / tag / "context" / "prompt.md").write_text(f"Fix calc.add.\nfake-codex-mode: {mode}\n")
    done = run_cli("--execute", "--jobs-dir", str(jobs), *[a for tag in MODES for a in ("--tag", tag)],
                   "--image", image, "--codex-bin", str(FAKE_CODEX), "--eval-network", "none", "--keep-trees", policy)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


def test_keep_trees_failed_removes_only_the_resolved_trees_and_reduce_still_works(tmp_path: Path, stub_image: str) -> None:
    jobs = tmp_path / "jobs"
    summary = _batch(jobs, stub_image, "failed")
    assert summary["resolved"] == 2 and summary["states"] == {"done": 3}
    for tag in ("t_ok", "t_ok2"):
        assert not (jobs / tag / "buggy-source").exists() and not (jobs / tag / ".baseline.git").exists()
        assert all((jobs / tag / name).exists() for name in KEPT), tag
    assert (jobs / "t_wrong" / "buggy-source" / "calc").is_dir()  # unresolved: kept to look at
    assert (jobs / "t_wrong" / ".baseline.git").is_dir()

    before = {name: (jobs / "t_ok" / name).read_bytes() for name in KEPT if name.endswith(".json")}
    reduced = run_cli("--reduce", "--job-root", str(jobs / "t_ok"), "--tag", "t_ok")
    assert reduced.returncode == 0, reduced.stderr[-2000:]
    assert {name: (jobs / "t_ok" / name).read_bytes() for name in before} == before  # byte-stable without the tree
    report = run_cli("report", "--jobs-dir", str(jobs), "--out", str(tmp_path / "report.md"), "--format", "markdown")
    assert report.returncode == 0 and "t_ok" in (tmp_path / "report.md").read_text()
    again = run_cli("--execute", "--jobs-dir", str(jobs), *[a for tag in MODES for a in ("--tag", tag)],
                    "--image", stub_image, "--codex-bin", str(FAKE_CODEX), "--keep-trees", "failed")
    assert again.returncode == 0 and json.loads(again.stdout)["skipped_completed"] == 3  # nothing redone


def test_keep_trees_none_removes_every_scored_tree_and_all_keeps_them(tmp_path: Path, stub_image: str) -> None:
    _batch(tmp_path / "none", stub_image, "none")
    assert not any((tmp_path / "none" / tag / "buggy-source").exists() for tag in MODES)
    _batch(tmp_path / "all", stub_image, "all")
    assert all((tmp_path / "all" / tag / "buggy-source" / "calc").is_dir() for tag in MODES)


def test_a_worker_applies_its_tree_policy(fleet: Fleet) -> None:
    fleet.prompt("t_tree", "Fix calc.add.\nfake-codex-mode: fix\n")
    jobs = fleet.jobs("host-t")
    worker = fleet.worker("host-t", jobs, "--keep-trees", "none")
    assert fleet.submit("trees", "--tag", "t_tree").returncode == 0
    row = fleet.wait_state("trees", "t_tree/1", "done")
    assert row["resolved"] is True
    job = jobs / "trees" / "t_tree" / "attempt-1"
    # the row is recorded first (the verdict lands), the tree removed just after it
    fleet.wait("the scored tree removed", lambda: not (job / "buggy-source").exists(), timeout=30)
    assert (job / "benchmark_run.compact.json").exists() and (job / "result-markers").is_dir()
    code, _out, stderr = fleet.stop(worker)
    assert code == 0, stderr[-2000:]
    assert "tree_removed" in stderr


@pytest.mark.parametrize("state, resolved, policy, goes", [
    (TaskState.DONE, True, "failed", True), (TaskState.DONE, False, "failed", False),
    (TaskState.DONE, False, "none", True), (TaskState.DONE, True, "all", False),
    # a failed or cancelled task is resumed by its rerun or its retry: its tree always stays
    (TaskState.FAILED, None, "none", False), (TaskState.CANCELLED, None, "none", False),
])
def test_only_a_scored_task_s_tree_may_go(state: TaskState, resolved: bool | None, policy: str, goes: bool) -> None:
    assert DiskPolicy(keep_trees=KeepTrees(policy)).tree_goes(TaskFacts(state=state, resolved=resolved)) is goes


def test_a_bad_image_budget_is_refused_before_anything_starts(tmp_path: Path) -> None:
    with pytest.raises(BadInputError):
        DiskPolicy(image_budget_gb=0)
    done = run_cli("--execute", "--jobs-dir", str(tmp_path), "--tag", "t_a", "--tag", "t_b", "--image-budget-gb", "-1")
    assert done.returncode == 2 and "--image-budget-gb" in done.stderr
    single = run_cli("--execute", "--job-root", str(tmp_path / "j"), "--keep-trees", "none")
    assert single.returncode == 2 and "--keep-trees" in single.stderr
