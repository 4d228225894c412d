"""Agents side by side: one suite's rows grouped by the agent that made each attempt.

Pure: the rows' facts in, numbers out; the same pass@k and cost arithmetic as a suite of
one agent (``reducers.passk``, ``reducers.costs``), once per agent, and per tag which agent
resolved it.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from reducers.costs import cost_summary
from reducers.outcome import TaskFacts, TaskState
from reducers.passk import suite_pass_at_summary, tag_pass_at


def agent_comparison(rows: Iterable[tuple[str, str, TaskFacts]]) -> dict[str, Any]:
    """(tag, agent, facts) rows as ``{"agents": {agent: summary}, "tags": {tag: {agent: resolved}}}``.

    An agent's summary: its tasks, how many were scored and resolved, its resolved rate over
    the scored ones, pass@k over its tags, its tokens and its cost (per tag, per resolved task),
    and ``per_tag``: each tag's attempts, n, c, pass@k, tokens and cost for this agent alone.
    """
    by_agent: dict[str, list[tuple[str, TaskFacts]]] = {}
    tags: dict[str, dict[str, bool | None]] = {}
    for tag, agent, facts in rows:
        by_agent.setdefault(agent, []).append((tag, facts))
        tags.setdefault(tag, {})[agent] = facts.resolved
    agents: dict[str, Any] = {}
    for agent, own in sorted(by_agent.items()):
        ran = [(tag, facts) for tag, facts in own if facts.state is not TaskState.SKIPPED_BUDGET]
        scored = [facts for _tag, facts in ran if facts.scored]
        resolved = sum(bool(facts.resolved) for facts in scored)
        summaries = tag_pass_at([(tag, facts.scored, bool(facts.resolved)) for tag, facts in ran])
        cost = cost_summary(own)
        agents[agent] = {
            "tasks": len(own),
            "scored": len(scored),
            "resolved": resolved,
            "resolved_rate": round(resolved / len(scored), 4) if scored else None,
            "pass_at": suite_pass_at_summary(summaries),
            "input_tokens": sum(facts.input_tokens for _tag, facts in ran),
            "cached_input_tokens": sum(facts.cached_input_tokens for _tag, facts in ran),
            "output_tokens": sum(facts.output_tokens for _tag, facts in ran),
            "cost": cost,
            "per_tag": {item["tag"]: {**{k: v for k, v in item.items() if k != "tag"},
                                      **_tag_tokens(ran, item["tag"]),
                                      "cost_usd": cost["per_tag_usd"].get(item["tag"])} for item in summaries},
        }
    return {"agents": agents, "tags": {tag: dict(sorted(row.items())) for tag, row in sorted(tags.items())}}


def _tag_tokens(rows: list[tuple[str, TaskFacts]], tag: str) -> dict[str, int]:
    own = [facts for name, facts in rows if name == tag]
    return {"input_tokens": sum(facts.input_tokens for facts in own),
            "output_tokens": sum(facts.output_tokens for facts in own)}


def comparison_markdown(comparison: dict[str, Any]) -> list[str]:
    """The comparison as two Markdown tables: per agent, then per tag."""
    agents = comparison["agents"]
    lines = ["## Agents side by side", "", "| agent | tasks | scored | resolved | resolved rate | input tokens "
             "| output tokens | cost USD |", "|---|---|---|---|---|---|---|---|"]
    for agent, summary in agents.items():
        rate = "-" if summary["resolved_rate"] is None else f"{summary['resolved_rate']:.2%}"
        lines.append(f"| {agent} | {summary['tasks']} | {summary['scored']} | {summary['resolved']} | {rate} | "
                     f"{summary['input_tokens']} | {summary['output_tokens']} | {summary['cost']['total_usd']:.6f} |")
    names = list(agents)
    lines += ["", "| tag | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    for tag, row in comparison["tags"].items():
        cells = [{True: "resolved", False: "unresolved", None: "-"}[row.get(name)] for name in names]
        lines.append(f"| {tag} | " + " | ".join(cells) + " |")
    return lines
