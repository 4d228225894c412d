"""Task rows and health to one public document, which the page and the report render.

Invariant: renderers read only this document, and it has passed the public guard
(``runner.views.public.public_document``); nothing else reaches the HTML.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from reducers.costs import BudgetFigures
from runner.views.model import HealthReport, TaskRow, TaskState
from runner.views.public import public_document
from runner.views.stats import agents_side_by_side, summarize, tag_summaries


def outcome(row: TaskRow) -> str:
    """One word for a row: resolved, unresolved, infra, failed, queued, running, cancelled or unreadable."""
    if row.state is TaskState.DONE:
        return "resolved" if row.resolved else "unresolved"
    if row.state is TaskState.FAILED:
        return "infra" if row.infra_failure else "failed"
    return row.state.value


def _label(row: TaskRow, *, with_agent: bool) -> str:
    """How charts and tables name a row: ``tag #attempt``, a patch's name, or a place in a file
    (attempt 0, ``ledger-row-3``); with the agent when the suite compares agents."""
    if row.patch:
        return f"{row.tag} {row.patch}"
    base = f"{row.tag} #{row.attempt}" if row.attempt else row.tag
    return f"{base} {row.agent}" if with_agent and row.agent else base


def _row_view(row: TaskRow, *, with_agent: bool = False) -> dict[str, Any]:
    return {
        "label": _label(row, with_agent=with_agent),
        "suite": row.suite,
        "kind": row.kind,
        "tag": row.tag,
        "attempt": row.attempt,
        "patch": row.patch,
        "state": row.state.value,
        "outcome": outcome(row),
        "host": row.host,
        "phase": row.phase.value if row.phase else None,
        "resolved": row.resolved,
        "infra_failure": row.infra_failure,
        "failure_label": row.failure_label,
        "phase_seconds": dict(row.phase_seconds),
        "wall_seconds": row.wall_seconds,
        "tokens": dict(row.tokens),
        "cost_usd": row.cost_usd,
        "agent": row.agent,
        "image": row.image,
        "unreadable": row.unreadable.value if row.unreadable is not None else None,
    }


def health_view(health: HealthReport) -> dict[str, Any]:
    return {
        "status": "ok" if health.healthy else ("draining" if health.draining else "not_taking_work"),
        "taking_work": health.taking_work,
        "draining": health.draining,
        "slots_busy": health.slots_busy,
        "slots_total": health.slots_total,
        "slots_free": max(0, health.slots_total - health.slots_busy),
        "checks": [check.model_dump() for check in health.checks],
        "failing": [check.name for check in health.failing],
    }


def _str_keys(mapping: dict[int, float]) -> dict[str, float]:
    return {str(key): value for key, value in mapping.items()}


def suite_document(
    title: str, rows: list[TaskRow], private_texts: list[str], *, health: HealthReport | None = None,
    budget: BudgetFigures | None = None,
) -> dict[str, Any]:
    """The public document of a suite (or a batch): totals, per-tag pass@k, one entry per task."""
    rows = sorted(rows, key=lambda row: row.key)
    summary = summarize(rows, budget=budget)
    agents = agents_side_by_side(rows)
    document = {
        "title": title,
        "generated_at": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC"),
        "health": health_view(health) if health is not None else None,
        "summary": {
            **summary.model_dump(exclude={"pass_at", "rate_by_attempt"}),
            "pass_at": _str_keys(summary.pass_at),
            "rate_by_attempt": _str_keys(summary.rate_by_attempt),
        },
        "tags": [
            {**tag.model_dump(exclude={"pass_at"}), "pass_at": _str_keys(tag.pass_at)}
            for tag in tag_summaries(rows)
        ],
        "agents": agents,
        "rows": [_row_view(row, with_agent=agents is not None) for row in rows],
    }
    return public_document(title, document, private_texts)
