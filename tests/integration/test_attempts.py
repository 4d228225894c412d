"""``--attempts K``: K independent attempts per tag, pass@k in the ledger, one extraction per image."""

from __future__ import annotations

import json
import time
from math import comb
from pathlib import Path

import pytest

from runner.docker_utils import LABEL_PHASE, LABEL_SESSION
from tests.conftest import FAKE_CODEX, TEST_SESSION, make_job_root, read_json, run_cli, stub_args

pytestmark = [pytest.mark.docker, pytest.mark.usefixtures("no_leaked_containers")]


def _pass_at(n: int, c: int, k: int) -> float:
    return 1.0 if n - c < k else 1 - comb(n - c, k) / comb(n, k)


def _extract_creates(docker_client, since: int) -> int:
    events = docker_client.events(
        since=since, until=int(time.time()) + 1, decode=True,
        filters={"type": "container", "event": "create",
                 "label": [f"{LABEL_PHASE}=extract", f"{LABEL_SESSION}={TEST_SESSION}"]},
    )
    return sum(1 for _ in events)


def _whole_second() -> int:
    time.sleep(1 - time.time() % 1 + 0.01)
    return int(time.time())


def test_a_batch_with_attempts_scores_pass_at_k_and_extracts_each_image_once(
    tmp_path: Path, stub_image: str, docker_client
) -> None:
    jobs = tmp_path / "jobs"
    for tag in ("t_a", "t_b"):
        (jobs / tag / "context").mkdir(parents=True)
        (jobs / tag / "context" / "prompt.md").write_text("fake-codex-mode: fix\n")
    # An attempt's own prompt wins over its tag's: attempt 2 of t_a makes the wrong fix.
    (jobs / "t_a" / "attempt-2" / "context").mkdir(parents=True)
    (jobs / "t_a" / "attempt-2" / "context" / "prompt.md").write_text("fake-codex-mode: wrong-fix\n")
    since = _whole_second()
    done = run_cli(
        "--execute", "--jobs-dir", str(jobs), "--tag", "t_a", "--tag", "t_b", "--image", stub_image,
        "--codex-bin", str(FAKE_CODEX), "--attempts", "3", "--workers", "3",
        env={"RUNNER_CACHE_MAX_GB": "1", "RUNNER_CACHE_DIR": str(tmp_path / "cache")},
    )
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    assert summary["tags"] == 2 and summary["attempts"] == 3 and summary["ran"] == 6 and summary["resolved"] == 5
    # One image: the first attempt extracts, the other five check the cache out.
    assert _extract_creates(docker_client, since) == 1
    sources = [read_json(jobs / tag / f"attempt-{i}" / "benchmark_run.compact.json")["source_from_cache"]
               for tag in ("t_a", "t_b") for i in (1, 2, 3)]
    assert sorted(sources) == [False] + [True] * 5

    ledger = read_json(jobs / "run-ledger.json")
    assert [(row["tag"], row["attempt"]) for row in ledger["rows"]] == [
        ("t_a", 1), ("t_a", 2), ("t_a", 3), ("t_b", 1), ("t_b", 2), ("t_b", 3)
    ]
    tasks = {item["tag"]: item for item in ledger["tasks"]}
    assert (tasks["t_a"]["scored"], tasks["t_a"]["resolved"]) == (3, 2)
    assert tasks["t_a"]["pass_at"] == {str(k): round(_pass_at(3, 2, k), 6) for k in (1, 2, 3)}
    assert tasks["t_a"]["pass_at"]["1"] == round(2 / 3, 6)  # pass@1 is the mean over attempts
    assert tasks["t_b"]["pass_at"] == {"1": 1.0, "2": 1.0, "3": 1.0}
    assert ledger["suite"]["mean_pass_at"]["1"] == round((2 / 3 + 1) / 2, 6)
    assert summary["tasks"] == ledger["tasks"] and summary["suite"] == ledger["suite"]
    markdown = (jobs / "run-ledger.md").read_text()
    assert "| t_a #2 | done | no |" in markdown and "| t_a | 3 | 3 | 2 | 0.667 | 1.000 | 1.000 |" in markdown
    for i in (1, 2, 3):
        assert (jobs / ".batch-logs" / f"t_a.attempt-{i}.log").stat().st_size > 0
        assert read_json(jobs / "t_a" / f"attempt-{i}" / "real-result.public.json")["result_summary"]["resolved"] is (i != 2)

    # The suite report reads the attempts' own compact files and shows pass@k per tag.
    report = run_cli("report", "--jobs-dir", str(jobs), "--out", str(tmp_path / "report.md"), "--format", "markdown")
    assert report.returncode == 0, report.stderr
    text = (tmp_path / "report.md").read_text()
    assert "| t_a | 3 | 3 | 2 | 66.7% | 100.0% | 100.0% |" in text
    assert "| 2 | 50.0% |" in text  # attempt 2's resolved rate: t_a's wrong fix, t_b's fix

    # A rerun skips every completed attempt.
    again = run_cli(
        "--execute", "--jobs-dir", str(jobs), "--tag", "t_a", "--tag", "t_b", "--image", stub_image,
        "--codex-bin", str(FAKE_CODEX), "--attempts", "3",
    )
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout)["skipped_completed"] == 6 and json.loads(again.stdout)["ran"] == 0


def test_execute_with_attempts_runs_them_under_the_job_root(tmp_path: Path, stub_image: str) -> None:
    job = make_job_root(tmp_path)
    done = run_cli("--execute", *stub_args(job, stub_image, "--attempts", "2", "--workers", "2"))
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["mode"] == "attempts" and report["tag"] == "stub_calc" and report["ran"] == 2
    assert report["tasks"][0]["pass_at"] == {"1": 1.0, "2": 1.0}
    for i in (1, 2):
        run = read_json(job / f"attempt-{i}" / "benchmark_run.compact.json")
        assert run["official_task_score"]["resolved"] is True
        assert (job / f"attempt-{i}" / "context" / "prompt.md").read_text() == (job / "context" / "prompt.md").read_text()
    rows = read_json(job / "run-ledger.json")["rows"]
    assert [(row["tag"], row["attempt"], row["state"]) for row in rows] == [
        ("stub_calc", 1, "done"), ("stub_calc", 2, "done")
    ]
    assert not (job / "benchmark_run.compact.json").exists()  # the job root itself is no attempt


def test_bad_attempts_are_refused_before_anything_runs(tmp_path: Path) -> None:
    job = make_job_root(tmp_path)
    for value, message in (("0", "--attempts must be between 1 and 100"), ("101", "between 1 and 100")):
        done = run_cli("--execute", "--job-root", str(job), "--attempts", value)
        assert done.returncode == 2 and message in done.stderr
    done = run_cli("--precheck", "--job-root", str(job), "--attempts", "2")
    assert done.returncode == 2 and "--attempts goes with --execute" in done.stderr
    assert sorted(p.name for p in job.iterdir()) == ["context"]
