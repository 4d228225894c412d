"""The suite budget's one rule (``runner.budget.admit``), shared by the batch and the fleet, and the
dry run's estimate (``reducers.costs.estimate_cost``, the plan mode's too)."""

from __future__ import annotations

from pathlib import Path

import pytest

from reducers.costs import cost_summary, estimate_cost
from reducers.outcome import TaskFacts, TaskState
from runner.budget import SuiteBudget, admit, check_budget, spent_costs
from runner.errors import BadInputError

P = 0.000628  # one task of the integration tests' scripted model


def test_nothing_known_yet_admits_while_nothing_is_spent() -> None:
    assert admit(3.5 * P, [], []).admitted
    assert admit(3.5 * P, [], [0.0, 0.0]).admitted  # the first ones start together: no estimate yet
    assert not admit(3.5 * P, [], [3.5 * P]).admitted  # spent is the budget: nothing more


def test_a_budget_enough_for_three_starts_three_whatever_the_workers() -> None:
    assert admit(3.5 * P, [P], [0.0]).admitted  # 1 done + 1 running (counted at the mean) + 1 more = 3
    assert not admit(3.5 * P, [P, P], [0.0]).admitted  # a fourth would pass it
    assert not admit(3.5 * P, [P], [0.0, 0.0]).admitted
    verdict = admit(3.5 * P, [P, P], [0.0])
    assert verdict.spent_usd == pytest.approx(2 * P) and verdict.estimate_usd == pytest.approx(P)


def test_a_running_task_counts_its_live_cost_when_it_is_more_than_the_mean() -> None:
    assert admit(4 * P, [P], [P]).admitted
    assert not admit(4 * P, [P], [2.5 * P]).admitted  # 1 + 2.5 + 1 > 4
    assert admit(10 * P, [P, P, P], [0.5 * P]).admitted  # 3 + max(0.5, 1) + 1 = 5


def test_the_batch_budget_applies_the_same_rule(tmp_path: Path) -> None:
    budget = SuiteBudget(3.5 * P)
    assert budget.try_start("a", tmp_path) and budget.try_start("b", tmp_path)  # no live usage files: 0 each
    budget.finished("a", P)
    assert budget.try_start("c", tmp_path)
    budget.finished("b", P)
    assert not budget.try_start("d", tmp_path)
    budget.finished("c", None)  # a model the card lacks counts nothing
    assert budget.estimate_usd == pytest.approx(P) and budget.spent_usd() == pytest.approx(2 * P)


def test_spent_costs_leave_out_what_is_running_queued_again_or_skipped() -> None:
    rows = [TaskFacts(state=TaskState.DONE, cost_usd=P), TaskFacts(state=TaskState.FAILED, cost_usd=P),
            TaskFacts(state=TaskState.CANCELLED, cost_usd=P / 2), TaskFacts(state=TaskState.QUEUED, cost_usd=P),
            TaskFacts(state=TaskState.RUNNING), TaskFacts(state=TaskState.SKIPPED_BUDGET),
            TaskFacts(state=TaskState.DONE, cost_usd=None)]
    assert spent_costs(rows) == [P, P, P / 2]


@pytest.mark.parametrize("value", [0.0, -1.0, 2e9])
def test_a_budget_is_a_positive_number_of_dollars(value: float) -> None:
    with pytest.raises(BadInputError, match="--suite-budget-usd"):
        check_budget(value)
    assert check_budget(None) is None and check_budget(1.5) == 1.5


def test_spent_counts_the_running_tasks_live_usage() -> None:
    rows = [("t1", TaskFacts(state=TaskState.DONE, cost_usd=P, resolved=True)),
            ("t2", TaskFacts(state=TaskState.SKIPPED_BUDGET))]
    cost = cost_summary(rows, budget_usd=3 * P, running_usd=P / 2)
    assert cost["total_usd"] == pytest.approx(P) and cost["spent_usd"] == pytest.approx(1.5 * P)
    assert cost["left_usd"] == pytest.approx(1.5 * P) and cost["skipped_budget"] == 1


def test_the_estimate_takes_a_tag_s_own_history_else_every_attempt_s() -> None:
    def done(cost: float) -> TaskFacts:
        return TaskFacts(state=TaskState.DONE, cost_usd=cost, resolved=False)

    history = [("a", done(1.0)), ("a", done(3.0)), ("b", done(4.0)),
               ("b", TaskFacts(state=TaskState.RUNNING, cost_usd=100.0))]  # running: not yet the suite's cost
    estimate = estimate_cost(history, ["a", "c"])
    assert estimate["expected_usd"] == pytest.approx(2.0 + 8 / 3)  # a: its mean; c: the mean of all
    assert estimate["low_usd"] == pytest.approx(1.0 + 1.0) and estimate["high_usd"] == pytest.approx(3.0 + 4.0)
    assert estimate["units"] == 2 and estimate["tags_with_own_history"] == 1 and estimate["attempts_in_history"] == 3
    twice = estimate_cost(history, ["a", "a", "c"])  # the dry run's way: one entry per attempt it would queue
    assert twice["units"] == 3 and twice["tags"] == 2 and twice["expected_usd"] == pytest.approx(4.0 + 8 / 3)
    unknown = estimate_cost([], ["a"])
    assert unknown["expected_usd"] is None and unknown["low_usd"] is None and unknown["units"] == 1
