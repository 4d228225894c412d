"""Money on a batch: the real codex against the scripted model, priced on a test rate card.

Each task spends two responses (a fix, then a closing message) of 120 tokens each: 628
millionths of a dollar on the test card. A suite budget enough for three starts exactly three;
a rerun with a larger budget finishes the rest without redoing the first.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from runner.canary.model_server import KEY_VARIABLE, ScriptedModel, message, turn, write_codex_home
from runner.canary.run import fix_call
from tests.conftest import log_events, read_json, run_cli
from tests.integration.test_real_codex import COST_PER_RESPONSE, SCRIPTED_CARD, real_codex  # noqa: F401 (a fixture)

pytestmark = [pytest.mark.docker, pytest.mark.real_codex, pytest.mark.usefixtures("no_leaked_containers")]

TAGS = [f"t_money_{i}" for i in range(1, 7)]
PER_TASK = 2 * COST_PER_RESPONSE


def _suite(tmp_path: Path) -> Path:
    jobs = tmp_path / "jobs"
    for tag in TAGS:
        (jobs / tag / "context").mkdir(parents=True)
        (jobs / tag / "context" / "prompt.md").write_text("Fix calc.mathops.add so that it returns the sum.\n")
    return jobs


def _batch(tmp_path: Path, jobs: Path, image: str, codex: Path, budget: float, *extra: str):
    card = tmp_path / "card.toml"
    card.write_text(SCRIPTED_CARD)
    with ScriptedModel([turn(fix_call()), turn(message("fixed"))], per_conversation=True) as model:
        home = write_codex_home(tmp_path / "codex-home", model.base_url)
        done = run_cli(
            "--execute", "--jobs-dir", str(jobs), *[arg for tag in TAGS for arg in ("--tag", tag)],
            "--image", image, "--codex-bin", str(codex), f"--codex-home={home}", f"--rate-card={card}",
            "--codex-timeout=120", f"--suite-budget-usd={budget}", *extra,
            env={KEY_VARIABLE: "sk-scripted-money"},
        )
        return done, model.requests


def test_a_suite_budget_starts_exactly_the_tasks_that_fit_and_a_rerun_finishes_the_rest(
    tmp_path: Path, stub_image: str, real_codex: Path  # noqa: F811
) -> None:
    jobs = _suite(tmp_path)
    done, requests = _batch(tmp_path, jobs, stub_image, real_codex, 3.5 * PER_TASK)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(done.stdout)
    assert summary["ran"] == 3 and summary["resolved"] == 3 and requests == 6
    assert summary["states"] == {"done": 3, "skipped_budget": 3}
    cost = summary["cost"]
    assert cost["total_usd"] == pytest.approx(3 * PER_TASK) and cost["tasks_priced"] == 3
    assert cost["per_resolved_usd"] == pytest.approx(PER_TASK) and cost["skipped_budget"] == 3
    assert cost["left_usd"] == pytest.approx(0.5 * PER_TASK)
    rows = {row["tag"]: row for row in read_json(jobs / "run-ledger.json")["rows"]}
    ran = sorted(tag for tag, row in rows.items() if row["state"] == "done")
    assert ran == TAGS[:3]  # in order: the first three fit, no fourth started
    assert all(rows[tag]["state"] == "skipped_budget" and rows[tag]["cost_usd"] is None for tag in TAGS[3:])
    assert all(not (jobs / tag / "result-markers").exists() for tag in TAGS[3:])
    assert all(rows[tag]["cost_usd"] == pytest.approx(PER_TASK) for tag in ran)
    assert len(log_events(done.stderr, "task_skipped_budget")) == 3
    assert read_json(jobs / "run-ledger.json")["cost"] == cost  # the ledger says what is spent and left
    ledger_md = (jobs / "run-ledger.md").read_text()
    assert "- budget: $0.0022" in ledger_md and "left $0.0003" in ledger_md
    first = {tag: (jobs / tag / "result-markers" / "codex.json").read_bytes() for tag in ran}
    # the report says what the budget has spent and left, as the ledger does
    assert run_cli("report", "--jobs-dir", str(jobs), "--out", str(tmp_path / "budget.md"), "--format",
                   "markdown").returncode == 0
    budget_row = f"| ${3.5 * PER_TASK:.4f} | ${3 * PER_TASK:.4f} | ${0.5 * PER_TASK:.4f} | 3 |"
    assert "| budget | spent | left | skipped (budget) |" in (tmp_path / "budget.md").read_text()
    assert budget_row in (tmp_path / "budget.md").read_text()
    assert run_cli("report", "--jobs-dir", str(jobs), "--out", str(tmp_path / "budget.html")).returncode == 0
    assert 'class="budget"' in (tmp_path / "budget.html").read_text()

    # the plan (no mode) prices what is left from the ledger's history, and runs nothing
    plan = run_cli("--jobs-dir", str(jobs), *[arg for tag in TAGS for arg in ("--tag", tag)], "--image", stub_image)
    assert plan.returncode == 0, plan.stderr
    planned = json.loads(plan.stdout)
    assert planned["batch"] == {"tags": 6, "already_evaluated": 3, "to_run": 3, "attempts_per_tag": 1, "workers": 1}
    estimate = planned["estimate"]
    assert estimate["known"] is True and estimate["attempts_in_history"] == 3
    assert estimate["expected_usd"] == pytest.approx(3 * PER_TASK) == estimate["low_usd"] == estimate["high_usd"]
    assert estimate["mean_tokens_per_attempt"] == 240
    assert all(not (jobs / tag / "result-markers").exists() for tag in TAGS[3:])

    again, requests = _batch(tmp_path, jobs, stub_image, real_codex, 7 * PER_TASK)
    assert again.returncode == 0, again.stderr[-3000:]
    summary = json.loads(again.stdout)
    assert summary["skipped_completed"] == 3 and summary["ran"] == 3 and requests == 6
    assert summary["states"] == {"done": 3}
    assert summary["cost"]["total_usd"] == pytest.approx(6 * PER_TASK)
    assert all((jobs / tag / "result-markers" / "codex.json").read_bytes() == marker for tag, marker in first.items())
    rows = {row["tag"]: row for row in read_json(jobs / "run-ledger.json")["rows"]}
    assert all(row["state"] == "done" and row["resolved"] for row in rows.values())
    # the report shows the suite's total, per resolved task, per tag and per task
    report = run_cli("report", "--jobs-dir", str(jobs), "--out", str(tmp_path / "report.md"), "--format", "markdown")
    assert report.returncode == 0, report.stderr
    text = (tmp_path / "report.md").read_text()
    total, each = f"${6 * PER_TASK:.4f}", f"${PER_TASK:.4f}"
    assert f"| {total} | {each} | {each} | 6 | 0 |" in text
    assert all(f"| {tag} | {each} |" in text for tag in TAGS)
    html = run_cli("report", "--jobs-dir", str(jobs), "--out", str(tmp_path / "report.html"))
    assert html.returncode == 0 and total in (tmp_path / "report.html").read_text()
    assert f"| ${7 * PER_TASK:.4f} | {total} | {each} | 0 |" in text  # the larger budget, 6 spent


def test_with_two_workers_the_budget_still_starts_only_what_fits(tmp_path: Path, stub_image: str, real_codex: Path) -> None:  # noqa: F811
    """The first two start at once (nothing is known yet); then each start counts the mean cost of a task."""
    jobs = _suite(tmp_path)
    done, requests = _batch(tmp_path, jobs, stub_image, real_codex, 3.5 * PER_TASK, "--workers=2")
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(done.stdout)
    assert summary["states"] == {"done": 3, "skipped_budget": 3} and requests == 6
    assert summary["cost"]["total_usd"] == pytest.approx(3 * PER_TASK)


def test_a_model_not_on_the_card_is_unpriced_and_warned_of_once(tmp_path: Path, stub_image: str, real_codex: Path) -> None:  # noqa: F811
    jobs = _suite(tmp_path)
    with ScriptedModel([turn(fix_call()), turn(message("fixed"))], per_conversation=True) as model:
        home = write_codex_home(tmp_path / "codex-home", model.base_url)
        done = run_cli("--execute", "--jobs-dir", str(jobs), "--tag", TAGS[0], "--tag", TAGS[1], "--image", stub_image,
                       "--codex-bin", str(real_codex), f"--codex-home={home}", "--codex-timeout=120",
                       env={KEY_VARIABLE: "sk-scripted-money"})
    assert done.returncode == 0, done.stderr[-3000:]
    cost = json.loads(done.stdout)["cost"]
    assert cost["tasks_priced"] == 0 and cost["tasks_cost_unknown"] == 2 and cost["total_usd"] == 0
    assert len(log_events(done.stderr, "suite_cost_unknown")) == 1
    rows = read_json(jobs / "run-ledger.json")["rows"]
    assert [row["cost_usd"] for row in rows] == [None, None] and rows[0]["model"] == "runner-scripted-model"


def test_a_batch_refuses_a_bad_rate_card_before_any_task(tmp_path: Path, stub_image: str) -> None:
    jobs = _suite(tmp_path)
    card = tmp_path / "card.toml"
    card.write_text("version = \"1\"\nmodels = 3\n")
    done = run_cli("--execute", "--jobs-dir", str(jobs), "--tag", TAGS[0], "--tag", TAGS[1], "--image", stub_image,
                   f"--rate-card={card}")
    assert done.returncode == 2 and "card.toml: models" in done.stderr
    assert not (jobs / "run-ledger.json").exists() and not (jobs / TAGS[0] / "result-markers").exists()
