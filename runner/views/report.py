"""The suite report: one self-contained HTML file (or Markdown) about a suite (``python -m runner report``).

Invariants: the file opens offline (no script, no link, no external URL; charts are
inline SVG from ``runner.views.render``); it is rendered from the public document,
so it shows what the ledger and the compact files may show and nothing else; the
HTML and the Markdown carry the same numbers.
"""

from __future__ import annotations

from typing import Any

import structlog

from reducers.costs import BudgetFigures
from runner.views.document import suite_document
from runner.views.model import TIMED_PHASES, TaskRow
from runner.views.pages import summary_cards, task_label, tasks_table, unreadable_rows, unreadable_section
from runner.views.render import bar_chart, esc, fmt_dollars, fmt_rate, fmt_seconds, grid_chart, page, stacked_bars, table

log = structlog.get_logger(__name__)

TOKEN_SEGMENTS = ["input (uncached)", "input (cached)", "output"]


def _token_segments(tokens: dict[str, int]) -> list[float]:
    cached = tokens.get("cached_input", 0)
    return [float(max(0, tokens.get("input", 0) - cached)), float(cached), float(tokens.get("output", 0))]


def _k_columns(doc: dict[str, Any]) -> list[str]:
    return list(doc["summary"]["pass_at"])


def _pass_table_rows(doc: dict[str, Any]) -> list[list[str]]:
    ks = _k_columns(doc)
    return [
        [tag["tag"], str(tag["attempts"]), str(tag["scored"]), str(tag["resolved"]),
         *(fmt_rate(tag["pass_at"].get(k)) for k in ks)]
        for tag in doc["tags"]
    ]


COST_HEADERS = ["total", "per task", "per resolved task", "priced tasks", "cost unknown"]


def _cost_rows(doc: dict[str, Any]) -> list[list[str]]:
    """The suite's cost (``reducers.costs``), one row for the HTML and the Markdown alike, then one per tag."""
    cost = doc["summary"]["cost"]
    return [[fmt_dollars(cost["total_usd"]), fmt_dollars(cost["per_task_usd"]), fmt_dollars(cost["per_resolved_usd"]),
             str(cost["tasks_priced"]), str(cost["tasks_cost_unknown"])]]


BUDGET_HEADERS = ["budget", "spent", "left", "skipped (budget)"]


def _budget_rows(doc: dict[str, Any]) -> list[list[str]]:
    """The suite budget's spent and left, when the suite has one (none: no row, no table)."""
    cost = doc["summary"]["cost"]
    if "budget_usd" not in cost:
        return []
    return [[fmt_dollars(cost["budget_usd"]), fmt_dollars(cost["spent_usd"]), fmt_dollars(cost["left_usd"]),
             str(cost["skipped_budget"])]]


def _cost_tag_rows(doc: dict[str, Any]) -> list[list[str]]:
    return [[tag, fmt_dollars(value)] for tag, value in doc["summary"]["cost"]["per_tag_usd"].items()]


def _grid_label(doc: dict[str, Any], row: dict[str, Any]) -> str:
    """A tag's line in the tag x attempt grid; one line per agent when the suite compares agents."""
    return f"{row['tag']} {row['agent']}" if doc["agents"] and row["agent"] else row["tag"]


def _agent_ks(doc: dict[str, Any]) -> list[str]:
    return sorted({k for side in doc["agents"]["agents"].values() for k in side["pass_at"]["mean_pass_at"]}, key=int)


def _agent_headers(doc: dict[str, Any]) -> list[str]:
    return ["agent", "tasks", "scored", "resolved", "resolved rate", *(f"pass@{k}" for k in _agent_ks(doc)),
            "tokens in", "tokens out", "cost", "per resolved task"]


def _agent_rows(doc: dict[str, Any]) -> list[list[str]]:
    """Per agent: the batch ledger's comparison (``reducers.compare``), as the report shows it."""
    ks = _agent_ks(doc)
    return [[agent, str(side["tasks"]), str(side["scored"]), str(side["resolved"]), fmt_rate(side["resolved_rate"]),
             *(fmt_rate(side["pass_at"]["mean_pass_at"].get(k)) for k in ks),
             f"{side['input_tokens']:,}", f"{side['output_tokens']:,}", fmt_dollars(side["cost"]["total_usd"]),
             fmt_dollars(side["cost"]["per_resolved_usd"])]
            for agent, side in doc["agents"]["agents"].items()]


def _agent_tag_rows(doc: dict[str, Any]) -> list[list[str]]:
    """Per tag, each agent's c of n resolved, its pass@1, tokens and cost ('-': the agent did not run the tag)."""
    sides = doc["agents"]["agents"]
    tags = sorted({tag for side in sides.values() for tag in side["per_tag"]})
    rows = []
    for tag in tags:
        cells = [tag]
        for side in sides.values():
            own = side["per_tag"].get(tag)
            cells.append("-" if own is None else
                         f"{own['resolved']}/{own['scored']} resolved, pass@1 {fmt_rate(own['pass_at'].get('1'))}, "
                         f"tokens {own['input_tokens']:,} in / {own['output_tokens']:,} out, {fmt_dollars(own['cost_usd'])}")
        rows.append(cells)
    return rows


def _agents_html(doc: dict[str, Any]) -> str:
    if not doc["agents"]:
        return ""
    rates = [(agent, side["resolved_rate"] or 0.0, f"{agent}: {fmt_rate(side['resolved_rate'])} resolved")
             for agent, side in doc["agents"]["agents"].items()]
    return ("<h2>Agents side by side</h2>"
            + bar_chart("resolved-rate-by-agent", rates, maximum=1.0, value_text=fmt_rate, color="#00838f")
            + table(_agent_headers(doc), _agent_rows(doc), css_class="agents")
            + table(["tag", *doc["agents"]["agents"]], _agent_tag_rows(doc), css_class="agents-per-tag"))


def _pass_headers(doc: dict[str, Any]) -> list[str]:
    return ["tag", "attempts", "scored (n)", "resolved (c)", *(f"pass@{k}" for k in _k_columns(doc))]


def render_html(doc: dict[str, Any]) -> str:
    return page(doc["title"], report_body(doc))


def report_body(doc: dict[str, Any]) -> str:
    """The report's HTML body (the private report puts its attempts after it)."""
    rows = doc["rows"]
    summary = doc["summary"]
    tags = sorted({_grid_label(doc, row) for row in rows})
    attempts = sorted({row["attempt"] for row in rows})
    cells = {(_grid_label(doc, row), row["attempt"]): row["outcome"] for row in rows}
    by_attempt = [(f"attempt {k}", v, f"attempt {k}: {fmt_rate(v)} resolved") for k, v in summary["rate_by_attempt"].items()]
    pass_bars = [(f"pass@{k}", v, f"pass@{k} = {fmt_rate(v)}") for k, v in summary["pass_at"].items()]
    labels = [(label, float(count), f"{label}: {count}") for label, count in summary["failure_labels"]]
    phase_rows = [(task_label(r), [float(r["phase_seconds"].get(p, 0.0)) for p in TIMED_PHASES]) for r in rows
                  if r["phase_seconds"]]
    token_rows = [(task_label(r), _token_segments(r["tokens"])) for r in rows if any(r["tokens"].values())]
    body = (
        f"<h1>{esc(doc['title'])}</h1><p class=\"muted\">generated {esc(doc['generated_at'])}; "
        "rates count finished tasks; pass@k uses the unbiased estimator 1 - C(n-c,k)/C(n,k) over the attempts "
        "without an infrastructure failure</p>"
        + summary_cards(doc)
        + _agents_html(doc)
        + "<h2>Resolved per tag and attempt</h2>"
        + grid_chart("resolved-by-tag-attempt", tags, attempts, cells)
        + '<p class="muted">resolved rate by attempt (scored attempts only)</p>'
        + bar_chart("resolved-rate-by-attempt", by_attempt, maximum=1.0, value_text=fmt_rate)
        + "<h2>pass@1 and pass@k</h2>"
        + bar_chart("pass-at-k", pass_bars, maximum=1.0, value_text=fmt_rate, color="#2e7d32")
        + table(_pass_headers(doc), _pass_table_rows(doc), css_class="pass-at-k")
        + "<h2>Failure labels</h2>"
        + bar_chart("failure-labels", labels, value_text=lambda v: f"{v:.0f}", color="#c62828")
        + "<h2>Time per phase per task</h2>"
        + stacked_bars("phase-time", phase_rows, list(TIMED_PHASES), value_text=fmt_seconds)
        + "<h2>Tokens per task</h2>"
        + stacked_bars("tokens", token_rows, TOKEN_SEGMENTS, value_text=lambda v: f"{v:,.0f}")
        + "<h2>Cost</h2>"
        + table(COST_HEADERS, _cost_rows(doc), css_class="cost")
        + (table(BUDGET_HEADERS, _budget_rows(doc), css_class="budget") if _budget_rows(doc) else "")
        + table(["tag", "cost"], _cost_tag_rows(doc), css_class="cost-per-tag")
        + unreadable_section(doc)
        + "<h2>Tasks</h2>"
        + tasks_table(doc)
    )
    return body


def _md_table(headers: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(cell.replace("|", "/") for cell in row) + " |" for row in rows]
    return lines + [""]


def render_markdown(doc: dict[str, Any]) -> str:
    s = doc["summary"]
    lines = [f"# {doc['title']}", "", f"generated {doc['generated_at']}", "", "## Totals", ""]
    lines += _md_table(["tasks", *s["by_state"], "resolved", "resolved rate", "excl. infra failures",
                        "infra failures", *(f"tokens {k}" for k in s["tokens"])],
                       [[str(s["tasks"]), *(str(v) for v in s["by_state"].values()), str(s["resolved"]),
                         fmt_rate(s["resolved_rate"]), fmt_rate(s["resolved_rate_excluding_infra"]),
                         str(s["infra_failures"]), *(str(v) for v in s["tokens"].values())]])
    if doc["agents"]:
        lines += ["## Agents side by side", ""]
        lines += _md_table(_agent_headers(doc), _agent_rows(doc))
        lines += _md_table(["tag", *doc["agents"]["agents"]], _agent_tag_rows(doc))
    lines += ["## Resolved rate by attempt", ""]
    lines += _md_table(["attempt", "resolved rate"], [[k, fmt_rate(v)] for k, v in s["rate_by_attempt"].items()])
    lines += ["## pass@k", ""]
    lines += _md_table(["suite", *(f"pass@{k}" for k in s["pass_at"])],
                       [["all tags", *(fmt_rate(v) for v in s["pass_at"].values())]])
    lines += _md_table(_pass_headers(doc), _pass_table_rows(doc))
    lines += ["## Failure labels", ""]
    lines += _md_table(["label", "tasks"], [[label, str(count)] for label, count in s["failure_labels"]])
    lines += ["## Time per phase per task", ""]
    lines += _md_table(["task", "outcome", *TIMED_PHASES, "wall"],
                       [[task_label(r), r["outcome"], *(fmt_seconds(r["phase_seconds"].get(p)) for p in TIMED_PHASES),
                         fmt_seconds(r["wall_seconds"])] for r in doc["rows"]])
    if any(r["image"] for r in doc["rows"]):
        lines += ["## Images", ""]
        lines += _md_table(["task", "agent", "image"],
                           [[task_label(r), r["agent"] or "-", r["image"] or "-"] for r in doc["rows"]])
    lines += ["## Tokens per task", ""]
    lines += _md_table(["task", "input", "cached input", "output", "cost"],
                       [[task_label(r), *(str(r["tokens"].get(k, 0)) for k in ("input", "cached_input", "output")),
                         fmt_dollars(r.get("cost_usd"))] for r in doc["rows"]])
    lines += ["## Cost", ""]
    lines += _md_table(COST_HEADERS, _cost_rows(doc))
    if _budget_rows(doc):
        lines += _md_table(BUDGET_HEADERS, _budget_rows(doc))
    if _cost_tag_rows(doc):
        lines += _md_table(["tag", "cost"], _cost_tag_rows(doc))
    if unreadable_rows(doc):
        lines += ["## Unreadable", ""]
        lines += _md_table(["task", "reason"], unreadable_rows(doc))
    return "\n".join(lines)


def build_report(rows: list[TaskRow], *, title: str, output_format: str, private_texts: list[str],
                 budget: BudgetFigures | None = None) -> str:
    doc = suite_document(title, rows, private_texts, budget=budget)
    return render_markdown(doc) if output_format == "markdown" else render_html(doc)
