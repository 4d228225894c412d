"""The suite budget on the fleet: two workers (two hosts) on a real Redis and Docker, the real codex
against the scripted model priced on the test rate card (each task 628 µ$, as in ``test_money``).

A budget enough for three and a half tasks: exactly three start across both hosts, the other three
end ``skipped_budget``; a resubmission with a larger budget finishes those without redoing the first.
``submit --dry-run`` then estimates a suite from that history and queues nothing.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from runner.canary.model_server import KEY_VARIABLE, ScriptedModel, message, turn, write_codex_home
from runner.canary.run import fix_call
from runner.fleet.broker import Keys
from runner.fleet.budget import FleetBudget
from tests.conftest import log_events, run_cli
from tests.fleet_support import Fleet
from tests.integration.test_real_codex import COST_PER_RESPONSE, SCRIPTED_CARD, real_codex  # noqa: F401 (a fixture)

pytestmark = [pytest.mark.docker, pytest.mark.redis, pytest.mark.real_codex,
              pytest.mark.usefixtures("no_leaked_containers")]

TAGS = [f"t_money_{i}" for i in range(1, 7)]
PER_TASK = 2 * COST_PER_RESPONSE


def _tags(tags: list[str]) -> list[str]:
    return [arg for tag in tags for arg in ("--tag", tag)]


def test_two_workers_start_only_what_the_budget_covers_and_a_larger_one_finishes_the_rest(
    fleet: Fleet, tmp_path: Path, real_codex: Path  # noqa: F811
) -> None:
    for tag in TAGS:
        fleet.prompt(tag, "Fix calc.mathops.add so that it returns the sum.\n")
    card = tmp_path / "card.toml"
    card.write_text(SCRIPTED_CARD)
    with ScriptedModel([turn(fix_call()), turn(message("fixed"))], per_conversation=True) as model:
        home = write_codex_home(tmp_path / "scripted-home", model.base_url)
        flags = ("--codex-bin", str(real_codex), f"--codex-home={home}", f"--rate-card={card}")
        env = {KEY_VARIABLE: "sk-scripted-fleet-money", "CODEX_HOME": str(home)}
        workers = [fleet.worker(name, fleet.jobs(name), *flags, env=env) for name in ("host-a", "host-b")]

        done = fleet.submit("money", *_tags(TAGS), "--codex-timeout=120", f"--suite-budget-usd={3.5 * PER_TASK}")
        assert done.returncode == 0, done.stderr[-3000:]
        assert json.loads(done.stdout)["queued"] == 6
        fleet.wait("every task ended", lambda: all(
            row["state"] in ("done", "skipped_budget") for row in fleet.rows("money").values()
        ) and len(fleet.rows("money")) == 6, timeout=300)
        rows = fleet.rows("money")
        done_keys = sorted(key for key, row in rows.items() if row["state"] == "done")
        assert len(done_keys) == 3 and model.requests == 6, rows
        assert {rows[key]["host"] for key in done_keys} == {"host-a", "host-b"}, "both hosts took tasks at once"
        assert all(rows[key]["cost_usd"] == pytest.approx(PER_TASK) and rows[key]["resolved"] for key in done_keys)
        skipped = [row for row in rows.values() if row["state"] == "skipped_budget"]
        assert len(skipped) == 3 and all(row["cost_usd"] is None and row["retries"] == 0 for row in skipped)
        assert not any((fleet.tmp / name / "money" / row["tag"]).exists() for row in skipped
                       for name in ("host-a", "host-b")), "a skipped task never started"

        status = json.loads(fleet.status("--suite", "money").stdout)["suites"][0]
        assert status["summary"]["states"] == {"done": 3, "skipped_budget": 3}
        cost = status["cost"]
        assert cost["total_usd"] == pytest.approx(3 * PER_TASK) and cost["spent_usd"] == pytest.approx(3 * PER_TASK)
        assert cost["left_usd"] == pytest.approx(0.5 * PER_TASK) and cost["skipped_budget"] == 3
        assert cost["per_resolved_usd"] == pytest.approx(PER_TASK)
        assert "## Cost" in fleet.status("--suite", "money", "--format", "markdown").stdout
        report = run_cli("report", "--suite", "money", "--broker", fleet.url, "--namespace", fleet.namespace,
                         "--format", "markdown", "--out", str(tmp_path / "suite.md"))
        assert report.returncode == 0, report.stderr[-2000:]
        assert f"| ${3.5 * PER_TASK:.4f} | ${3 * PER_TASK:.4f} | ${0.5 * PER_TASK:.4f} | 3 |" in \
            (tmp_path / "suite.md").read_text(), "the suite report shows the budget's spent and left"
        first = {key: rows[key]["finished_at"] for key in done_keys}

        again = fleet.submit("money", *_tags(TAGS), "--codex-timeout=120", f"--suite-budget-usd={7 * PER_TASK}")
        assert again.returncode == 0, again.stderr[-3000:]
        assert json.loads(again.stdout)["queued"] == 3 and json.loads(again.stdout)["skipped_existing"] == 3
        fleet.wait("the rest done", lambda: all(row["state"] == "done" for row in fleet.rows("money").values()),
                   timeout=300)
        assert model.requests == 12, "only the skipped three ran"
    rows = fleet.rows("money")
    assert all(rows[key]["finished_at"] == at for key, at in first.items()), "the first three were not redone"
    cost = json.loads(fleet.status("--suite", "money").stdout)["suites"][0]["cost"]
    assert cost["total_usd"] == pytest.approx(6 * PER_TASK) and cost["left_usd"] == pytest.approx(PER_TASK)
    logs = []
    for worker in workers:
        code, _stdout, stderr = fleet.stop(worker)
        assert code == 0, stderr[-2000:]
        logs.append(stderr)
    assert sum(len(log_events(stderr, "task_started")) for stderr in logs) == 6
    assert sum(len(log_events(stderr, "task_skipped_budget")) for stderr in logs) == 3

    # The dry run: the history above (six priced attempts, 628 µ$ each) estimates the next suite.
    fleet.prompt("t_new", "Fix calc.mathops.add so that it returns the sum.\n")
    dry = fleet.submit("next", *_tags([TAGS[0], "t_new"]), "--attempts", "2", "--dry-run")
    assert dry.returncode == 0, dry.stderr[-3000:]
    report = json.loads(dry.stdout)
    assert report["dry_run"] is True and report["queued"] == 4
    estimate = report["estimate"]
    assert estimate["units"] == 4 and estimate["tags"] == 2 and estimate["attempts_in_history"] == 6
    assert estimate["tags_with_own_history"] == 1 and estimate["known"] is True
    assert estimate["expected_usd"] == pytest.approx(4 * PER_TASK)
    assert estimate["low_usd"] == pytest.approx(4 * PER_TASK) and estimate["high_usd"] == pytest.approx(4 * PER_TASK)
    assert "next" not in fleet.status().stdout, "a dry run writes nothing"
    assert fleet.client.llen(f"{fleet.namespace}:dq:runner") == 0
    raised = json.loads(fleet.submit("money", *_tags(TAGS), f"--suite-budget-usd={8 * PER_TASK}", "--dry-run").stdout)
    assert raised["queued"] == 0 and raised["estimate"]["expected_usd"] == 0
    assert raised["estimate"]["budget"] == {"budget_usd": pytest.approx(8 * PER_TASK),
                                            "spent_usd": pytest.approx(6 * PER_TASK), "left_usd": pytest.approx(2 * PER_TASK)}
    assert FleetBudget(fleet.client, Keys(fleet.namespace), ttl=0).limit("money") == pytest.approx(7 * PER_TASK)
    other_model = json.loads(fleet.submit("next", "--tag", "t_new", "--model", "another-model", "--dry-run").stdout)
    assert other_model["estimate"]["expected_usd"] is None and other_model["estimate"]["attempts_in_history"] == 0
