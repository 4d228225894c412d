"""The rate card's arithmetic, the cost summary and the estimate: pure functions, exact figures."""

from __future__ import annotations

from pathlib import Path

import pytest

from reducers.costs import cost_summary, estimate_cost
from reducers.outcome import TaskFacts, TaskState
from runner.budget import SuiteBudget
from runner.errors import BadInputError
from runner.codex_usage import TokenCounts
from runner.pricing import ModelRates, cost_usd, load_rate_card, price, shipped_rate_card


def test_openai_usage_counts_cached_input_and_reasoning_inside_their_totals() -> None:
    rates = ModelRates(input_per_million=2.0, cached_input_per_million=0.5, output_per_million=8.0,
                       reasoning_per_million=16.0)
    usage = TokenCounts(input_tokens=1_000_000, cached_input_tokens=400_000, output_tokens=100_000,
                        reasoning_output_tokens=40_000)
    # 600k fresh x 2 + 400k cached x 0.5 + 60k plain output x 8 + 40k reasoning x 16
    assert cost_usd(usage, rates) == pytest.approx(1.2 + 0.2 + 0.48 + 0.64)


def test_disjoint_usage_prices_every_count_on_its_own() -> None:
    rates = ModelRates(input_per_million=3.0, cached_input_per_million=0.3, cache_write_per_million=3.75,
                       output_per_million=15.0, usage="disjoint")
    usage = TokenCounts(input_tokens=1000, cached_input_tokens=10_000, cache_write_input_tokens=2000,
                        output_tokens=500, reasoning_output_tokens=0)
    assert cost_usd(usage, rates) == pytest.approx((1000 * 3 + 10_000 * 0.3 + 2000 * 3.75 + 500 * 15) / 1e6)


def test_the_shipped_card_loads_and_a_model_it_lacks_has_no_price() -> None:
    card = shipped_rate_card()
    assert len(card.sha256) == 64 and card.rates("gpt-5") is not None
    assert price(TokenCounts(input_tokens=10), "no-such-model", card) is None
    assert price(TokenCounts(input_tokens=10), None, card) is None


@pytest.mark.parametrize(("text", "problem"), [
    ("not toml [", "not a TOML rate card"),
    ('version = "1"\n[models.m]\ninput_per_million = 1\n', "cached_input_per_million"),
    ('version = "1"\n[models.m]\ninput_per_million = "a"\ncached_input_per_million = 0\noutput_per_million = 1\n',
     "input_per_million"),
])
def test_a_bad_card_is_refused_naming_the_file_and_the_field(tmp_path: Path, text: str, problem: str) -> None:
    card = tmp_path / "mine.toml"
    card.write_text(text)
    with pytest.raises(BadInputError, match=problem) as raised:
        load_rate_card(card)
    assert "mine.toml" in str(raised.value) and str(tmp_path) not in str(raised.value)


def _facts(cost: float | None, resolved: bool = True, model: str | None = "m", state=TaskState.DONE) -> TaskFacts:
    return TaskFacts(state=state, resolved=resolved, cost_usd=cost, model=model, input_tokens=100, output_tokens=20)


def test_the_summary_counts_unknown_costs_apart_and_what_is_left_of_a_budget() -> None:
    rows = [("a", _facts(1.0)), ("a", _facts(2.0, resolved=False)), ("b", _facts(None)),
            ("c", TaskFacts(state=TaskState.SKIPPED_BUDGET))]
    summary = cost_summary(rows, budget_usd=5.0)
    assert summary["total_usd"] == 3.0 and summary["tasks_priced"] == 2 and summary["tasks_cost_unknown"] == 1
    assert summary["per_task_usd"] == 1.5 and summary["per_resolved_usd"] == 1.5  # two resolved: a#1 and b
    assert summary["per_tag_usd"] == {"a": 3.0}
    assert summary["left_usd"] == 2.0 and summary["skipped_budget"] == 1


def test_the_estimate_uses_a_tags_own_history_and_the_mean_for_the_others() -> None:
    history = [("a", _facts(1.0)), ("a", _facts(3.0)), ("b", _facts(5.0)), ("z", _facts(100.0, model="other"))]
    estimate = estimate_cost(history, ["a", "new"], model="m", attempts=2)
    # a: its own mean 2 (range 1..3); new: the mean over every tag of model m, 3 (range 1..5)
    assert estimate["expected_usd"] == pytest.approx(2 * 2 + 2 * 3)
    assert (estimate["low_usd"], estimate["high_usd"]) == (pytest.approx(2 * 1 + 2 * 1), pytest.approx(2 * 3 + 2 * 5))
    assert estimate["tags_with_own_history"] == 1 and estimate["attempts_in_history"] == 3
    assert estimate_cost(history, ["a"], model="unseen")["known"] is False


def test_the_budget_admits_what_fits_counting_the_mean_for_each_running_task(tmp_path: Path) -> None:
    budget = SuiteBudget(3.5)
    assert budget.try_start("t1", tmp_path) and budget.try_start("t2", tmp_path)  # nothing known yet
    budget.finished("t1", 1.0)
    assert budget.try_start("t3", tmp_path)  # 1 done + t2 at the mean 1 + t3's 1 = 3 <= 3.5
    assert not budget.try_start("t4", tmp_path)  # 1 + 1 + 1 + 1 = 4
    budget.finished("t2", 1.0)
    budget.finished("t3", 1.0)
    assert not budget.try_start("t5", tmp_path) and budget.spent_usd() == 3.0


def test_a_running_tasks_live_cost_counts_before_it_ends(tmp_path: Path) -> None:
    from runner.codex_meter import write_live_usage

    logs = tmp_path / "logs"
    budget = SuiteBudget(1.0)
    assert budget.try_start("t1", logs)
    write_live_usage(logs / "codex.usage.json", TokenCounts(input_tokens=10), 1.2)
    assert budget.spent_usd() == 1.2 and not budget.try_start("t2", tmp_path)
    (logs / "codex.usage.json").write_text("{not json")  # unreadable: counted as nothing, never a crash
    assert budget.spent_usd() == 0.0
