"""Suite numbers from task rows: totals, resolved rates, pass@1 and pass@k per tag.

Pure. Conventions, the same on the page, in /metrics and in the report:
- a rate counts finished tasks only (done or failed); queued, running and
  cancelled tasks are in no denominator;
- "excluding infrastructure failures" drops the finished tasks whose failure was
  the host's or the runner's (``reducers.passk.is_infra_failure``), not the agent's;
- pass@k counts, per tag, the attempts that finished without an infrastructure
  failure (n) and those resolved (c): an attempt the host broke says nothing of the agent.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from typing import Any

from reducers.compare import agent_comparison
from reducers.costs import BudgetFigures, cost_summary
from reducers.models import Frozen
from reducers.outcome import TaskFacts
from reducers.passk import attempt_counts, pass_at_table, suite_pass_at
from runner.views.model import FINISHED_STATES, TOKEN_KINDS, TaskRow, TaskState



class TagSummary(Frozen):
    suite: str
    tag: str
    attempts: int  # rows of this tag, any state
    scored: int  # n: finished without an infrastructure failure
    resolved: int  # c
    pass_at: dict[int, float]  # k -> pass@k, for every k in reducers.passk.K_VALUES with k <= n


class SuiteSummary(Frozen):
    tasks: int
    by_state: dict[str, int]
    finished: int
    resolved: int
    infra_failures: int
    resolved_rate: float | None
    resolved_rate_excluding_infra: float | None
    tokens: dict[str, int]
    cost: dict[str, Any]  # reducers.costs.cost_summary of the rows: the ledgers' own
    failure_labels: list[tuple[str, int]]  # (label, tasks) of the finished unresolved, most first
    pass_at: dict[int, float]  # k -> mean pass@k over tags with at least k scored attempts
    rate_by_attempt: dict[int, float]  # attempt -> resolved rate among its scored rows


def _is_infra(row: TaskRow) -> bool:
    return bool(row.infra_failure)


def scored(row: TaskRow) -> bool:
    """Does this row count in pass@k: the agent had its say (``done``, the ledgers' one rule)."""
    return row.state is TaskState.DONE


def tag_summaries(rows: list[TaskRow]) -> list[TagSummary]:
    counts = attempt_counts(((row.suite, row.tag), scored(row), bool(row.resolved)) for row in rows)
    return [
        TagSummary(suite=suite, tag=tag, attempts=attempts, scored=n, resolved=c, pass_at=pass_at_table(n, c))
        for (suite, tag), (attempts, n, c) in counts.items()
    ]


def summarize(rows: list[TaskRow], *, budget: BudgetFigures | None = None) -> SuiteSummary:
    """``budget``: the suite's, when it has one, so the cost says what is spent and left of it."""
    finished = [row for row in rows if row.state in FINISHED_STATES]
    resolved = sum(1 for row in finished if row.resolved)
    infra = sum(1 for row in finished if _is_infra(row))
    tokens = {kind: sum(row.tokens.get(kind, 0) for row in rows) for kind in TOKEN_KINDS}
    labels = Counter(row.failure_label or row.state.value for row in finished if not row.resolved)
    tags = tag_summaries(rows)
    counts = [(tag.scored, tag.resolved) for tag in tags]
    pass_at = suite_pass_at(counts)
    by_attempt: dict[int, list[TaskRow]] = defaultdict(list)
    for row in rows:
        if scored(row):
            by_attempt[row.attempt].append(row)
    return SuiteSummary(
        tasks=len(rows),
        by_state={state.value: sum(1 for row in rows if row.state is state) for state in TaskState},
        finished=len(finished),
        resolved=resolved,
        infra_failures=infra,
        resolved_rate=resolved / len(finished) if finished else None,
        resolved_rate_excluding_infra=resolved / n_scored if (n_scored := sum(1 for row in finished if scored(row))) else None,
        tokens=tokens,
        cost=cost_summary(((row.tag, row) for row in rows if row.kind == "task"),
                          budget_usd=budget.limit_usd if budget else None,
                          running_usd=budget.running_usd if budget else 0.0),
        failure_labels=labels.most_common(),
        pass_at=pass_at,
        rate_by_attempt={
            attempt: sum(1 for row in group if row.resolved) / len(group)
            for attempt, group in sorted(by_attempt.items())
        },
    )


def compared_agents(rows: list[TaskRow]) -> list[str]:
    """The agents a suite's task rows name, when there are two or more (a suite that compares them)."""
    agents = sorted({row.agent for row in rows if row.kind == "task" and row.agent})
    return agents if len(agents) > 1 else []


def agents_side_by_side(rows: list[TaskRow]) -> dict[str, Any] | None:
    """``reducers.compare.agent_comparison`` over the rows, the batch ledger's own arithmetic; None for one agent."""
    if not compared_agents(rows):
        return None
    facts = [
        (row.tag, row.agent, TaskFacts(
            state=row.state, resolved=row.resolved, infra_failure=bool(row.infra_failure), cost_usd=row.cost_usd,
            input_tokens=row.tokens.get("input", 0), cached_input_tokens=row.tokens.get("cached_input", 0),
            output_tokens=row.tokens.get("output", 0), agent=row.agent))
        for row in rows if row.kind == "task" and row.agent and row.state is not TaskState.UNREADABLE
    ]
    return agent_comparison(facts)
