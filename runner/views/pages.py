"""The live status page, and the parts of it the report reuses (cards, the tasks table).

Reads only a public document (``runner.views.document.suite_document``).
"""

from __future__ import annotations

from typing import Any

from runner.views.model import TIMED_PHASES, TaskState
from runner.views.render import (
    STATE_COLORS, badge, esc, fmt_dollars, fmt_rate, fmt_seconds, page, stacked_bars, table,
)


def summary_cards(doc: dict[str, Any]) -> str:
    s = doc["summary"]
    cards = [
        ("tasks", str(s["tasks"])),
        ("running", str(s["by_state"]["running"])),
        ("queued", str(s["by_state"]["queued"])),
        ("finished", str(s["finished"])),
        ("resolved", str(s["resolved"])),
        ("resolved rate", fmt_rate(s["resolved_rate"])),
        ("excl. infra failures", fmt_rate(s["resolved_rate_excluding_infra"])),
        ("infra failures", str(s["infra_failures"])),
        ("tokens in / out", f"{s['tokens']['input']:,} / {s['tokens']['output']:,}"),
        ("cost", fmt_dollars(s["cost"]["total_usd"]) if s["cost"]["tasks_priced"] else "-"),
    ]
    inner = "".join(
        f'<div class="card" data-card="{esc(name)}"><span class="muted">{esc(name)}</span><b>{esc(value)}</b></div>'
        for name, value in cards
    )
    return f'<div class="cards">{inner}</div>'


def states_chart(doc: dict[str, Any]) -> str:
    by_state = doc["summary"]["by_state"]
    states = [state.value for state in TaskState]
    return stacked_bars("tasks-by-state", [("tasks", [float(by_state[s]) for s in states])], states,
                        value_text=lambda v: f"{v:.0f}", colors=[STATE_COLORS[s] for s in states])


def tasks_table(doc: dict[str, Any]) -> str:
    headers = ["suite", "kind", "tag", "attempt / patch", "state", "host", "phase", "verdict", "failure label",
               *TIMED_PHASES, "wall", "tokens in", "tokens out", "cost", "agent", "image"]
    rows = []
    for row in doc["rows"]:
        cells = [
            esc(row["suite"]), esc(row.get("kind", "task")), esc(row["tag"]),
            esc(row["patch"] if row.get("patch") else row["attempt"]),
            esc(row["state"]), esc(row["host"] or "-"), esc(row["phase"] or "-"),
            badge(row["outcome"], row["outcome"]), esc(row["failure_label"] or row["unreadable"] or "-"),
            *(esc(fmt_seconds(row["phase_seconds"].get(phase))) for phase in TIMED_PHASES),
            esc(fmt_seconds(row["wall_seconds"])),
            esc(row["tokens"].get("input", 0)), esc(row["tokens"].get("output", 0)),
            esc(fmt_dollars(row.get("cost_usd"))), esc(row["agent"] or "-"), image_cell(row["image"]),
        ]
        rows.append(cells)
    return table(headers, rows, css_class="tasks", raw=True)


def short_image(image: str | None) -> str:
    """``sha256:`` and the first 12 hex digits, as ``docker images`` shows an id."""
    return image[:19] if image else "-"


def image_cell(image: str | None) -> str:
    """The short digest, the whole one in the cell's title (the document's rows carry it whole)."""
    if not image:
        return "-"
    return f'<span class="image" title="{esc(image)}" data-image="{esc(image)}">{esc(short_image(image))}</span>'


def task_label(row: dict[str, Any]) -> str:
    """The row's name in charts and tables, as the document made it (``runner.views.document``)."""
    return row["label"]


def unreadable_rows(doc: dict[str, Any]) -> list[list[str]]:
    """(task, reason) of every unreadable row: a file or a row of the jobs dir that was refused."""
    return [[task_label(row), row["unreadable"]] for row in doc["rows"] if row["unreadable"]]


def unreadable_section(doc: dict[str, Any]) -> str:
    rows = unreadable_rows(doc)
    if not rows:
        return ""
    return ('<h2>Unreadable</h2><p class="muted">files or rows refused (a FIFO, a link out of the jobs dir, too large, '
            "not UTF-8, nested too deep, a row that does not validate); the other rows stand</p>"
            + table(["task", "reason"], rows, css_class="unreadable"))


def health_section(doc: dict[str, Any]) -> str:
    health = doc["health"]
    if health is None:
        return ""
    status = {"ok": "taking work", "draining": "draining", "not_taking_work": "not taking work"}[health["status"]]
    checks = [
        [esc(check["name"]),
         '<span class="ok">ok</span>' if check["ok"] else '<span class="bad">failing</span>',
         esc(check["detail"] or "-")]
        for check in health["checks"]
    ]
    return (
        f'<h2>Host</h2><p data-health="{esc(health["status"])}">{esc(status)}; slots '
        f'{health["slots_busy"]} busy of {health["slots_total"]}</p>'
        + table(["check", "result", "detail"], checks, css_class="checks", raw=True)
    )


def render_status_page(doc: dict[str, Any], *, refresh_seconds: int = 5) -> str:
    body = (
        f"<h1>{esc(doc['title'])}</h1>"
        f'<p class="muted">updated {esc(doc["generated_at"])}; refreshes every {refresh_seconds} s</p>'
        + summary_cards(doc)
        + states_chart(doc)
        + health_section(doc)
        + unreadable_section(doc)
        + "<h2>Tasks</h2>"
        + tasks_table(doc)
    )
    return page(doc["title"], body, refresh_seconds=refresh_seconds)
