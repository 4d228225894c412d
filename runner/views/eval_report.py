"""The report of a patch evaluation (``python -m runner report --jobs-dir OUT`` on an ``evaluate`` jobs dir).

Same invariants as the suite report (``runner.views.report``): one file that opens
offline, inline SVG charts from ``runner.views.render``, rendered from the public
document only (the evaluation's document, through ``public_document``). The Markdown
is the evaluation's own (``eval-ledger.md``'s renderer), so both carry the same numbers.
"""

from __future__ import annotations

from typing import Any

from runner.views.public import public_document
from runner.views.render import bar_chart, badge, esc, fmt_rate, fmt_seconds, grid_chart, page, stacked_bars, table

UNIT_STATES = ["scored", "rejected", "unscorable", "infra_failed"]


def outcome(row: dict[str, Any]) -> str:
    """One word per patch, with the suite report's colours: resolved, unresolved (scored or rejected), infra,
    or unscorable."""
    if row["state"] in ("scored", "rejected"):
        return "resolved" if row["resolved"] else "unresolved"
    return "infra" if row["state"] == "infra_failed" else "cancelled"  # unscorable: grey, not counted


def _cards(doc: dict[str, Any]) -> str:
    suite = doc["suite"]
    states = suite["states"]
    cards = [
        ("tags", suite["tags"]), ("patches", suite["patches"]), ("counted", suite["counted"]),
        ("successes", suite["successes"]),
        ("score", fmt_rate(suite["score"])), ("tags with a success", suite["tags_with_a_success"]),
        ("rejected", states.get("rejected", 0)), ("unscorable", states.get("unscorable", 0)),
        ("infra failed", states.get("infra_failed", 0)), ("verdicts disagree", suite["verdicts_disagree"]),
    ]
    inner = "".join(f'<div class="card" data-card="{esc(name)}"><span class="muted">{esc(name)}</span>'
                    f"<b>{esc(value)}</b></div>" for name, value in cards)
    return f'<div class="cards">{inner}</div>'


def _grid(doc: dict[str, Any]) -> tuple[str, str]:
    """Tag x patch name: the patch names are numbered (a name is one agent's row in the paper's table)."""
    names = sorted({row["patch"] for row in doc["rows"]})
    number = {name: i + 1 for i, name in enumerate(names)}
    cells = {(row["tag"], number[row["patch"]]): outcome(row) for row in doc["rows"]}
    tags = [tag["tag"] for tag in doc["tags"]]
    legend = table(["column", "patch", "tags", "successes"], [
        [str(number[name]), name, str(sum(1 for r in doc["rows"] if r["patch"] == name)),
         str(sum(1 for r in doc["rows"] if r["patch"] == name and r["resolved"]))] for name in names
    ], css_class="patch-names")
    return grid_chart("patch-by-tag", tags, list(number.values()), cells), legend


def _rows_table(doc: dict[str, Any]) -> str:
    headers = ["tag", "patch", "state", "verdict", "label", "exit-code verdict", "disagree", "apply exit",
               "test exit", "timed out", "apply", "test", "wall", "sha256", "bytes", "untrusted"]
    rows = []
    for r in doc["rows"]:
        rows.append([
            esc(r["tag"]), esc(r["patch"]), esc(r["state"]), badge(outcome(r), outcome(r)), esc(r["label"] or "-"),
            esc({True: "yes", False: "no", None: "-"}[r["exit_code_verdict"]]), esc("yes" if r["verdicts_disagree"] else "no"),
            esc("-" if r["apply_exit_code"] is None else r["apply_exit_code"]),
            esc("-" if r["test_exit_code"] is None else r["test_exit_code"]), esc("yes" if r["timed_out"] else "no"),
            esc(fmt_seconds(r["apply_seconds"])), esc(fmt_seconds(r["test_seconds"])), esc(fmt_seconds(r["wall_seconds"])),
            esc(r["patch_sha256"][:12]), esc(r["patch_bytes"]), esc("yes" if r["verdict_untrusted"] else "no"),
        ])
    return table(headers, rows, css_class="patches", raw=True)


def _pass_at(doc: dict[str, Any]) -> str:
    if "pass_at" not in doc:
        return ""
    per_tag, suite = doc["pass_at"]["tasks"], doc["pass_at"]["suite"]
    ks = sorted({int(k) for item in per_tag for k in item["pass_at"]})
    bars = [(f"pass@{k}", v, f"mean pass@{k} = {fmt_rate(v)}") for k, v in suite["mean_pass_at"].items()]
    rows = [[item["tag"], str(item["attempts"]), str(item["scored"]), str(item["resolved"]),
             *(fmt_rate(item["pass_at"].get(str(k))) for k in ks)] for item in per_tag]
    return ("<h2>pass@k over the attempts</h2>"
            + bar_chart("pass-at-k", bars, maximum=1.0, value_text=fmt_rate, color="#2e7d32")
            + table(["tag", "attempts", "scored (n)", "resolved (c)", *(f"pass@{k}" for k in ks)], rows,
                    css_class="pass-at-k"))


def render_html(doc: dict[str, Any]) -> str:
    scores = [(t["tag"], t["score"] or 0.0, f"{t['tag']}: {t['successes']} of {t['counted']}") for t in doc["tags"]]
    states = [(t["tag"], [float(t["states"].get(s, 0)) for s in UNIT_STATES]) for t in doc["tags"]]
    labels: dict[str, int] = {}
    for row in doc["rows"]:
        if row["label"]:
            labels[row["label"]] = labels.get(row["label"], 0) + 1
    times = [(f"{r['tag']} {r['patch']}", [r["apply_seconds"] or 0.0, r["test_seconds"] or 0.0]) for r in doc["rows"]
             if r["apply_seconds"] is not None or r["test_seconds"] is not None]
    grid, legend = _grid(doc)
    mapped = "".join(f"<li>{esc(d)} &rarr; {esc(t)}</li>" for d, t in sorted(doc["tag_directories"].items()))
    body = (
        f"<h1>{esc(doc['title'])}</h1><p class=\"muted\">generated {esc(doc['generated_at'])}; a tag's score is "
        "successes / patches under the official rule (a rejected patch counts as FAILED, an unscorable or "
        "infrastructure-failed one is not counted)</p>"
        + _cards(doc)
        + "<h2>Score per tag</h2>"
        + bar_chart("score-by-tag", scores, maximum=1.0, value_text=fmt_rate, color="#2e7d32")
        + "<h2>Patches per tag and patch name</h2>" + grid + legend
        + (f"<p class=\"muted\">tag directories mapped</p><ul class=\"mapped\">{mapped}</ul>" if mapped else "")
        + _pass_at(doc)
        + "<h2>States per tag</h2>"
        + stacked_bars("states-by-tag", states, UNIT_STATES, value_text=lambda v: f"{v:.0f}")
        + "<h2>Labels</h2>"
        + bar_chart("labels", sorted(((k, float(v), f"{k}: {v}") for k, v in labels.items()), key=lambda i: -i[1]),
                    value_text=lambda v: f"{v:.0f}", color="#c62828")
        + "<h2>Apply and test time per patch</h2>"
        + stacked_bars("patch-time", times, ["apply", "test"], value_text=fmt_seconds)
        + "<h2>Patches</h2>" + _rows_table(doc)
    )
    return page(doc["title"], body)


def build_eval_report(document: dict[str, Any], *, title: str, generated_at: str, output_format: str,
                      private_texts: list[str]) -> str:
    """``document`` is ``runner.score_patches.evaluation_document``'s; it passes the public guard here."""
    from runner.score_patches import render_markdown  # the ledger's Markdown: one renderer for both

    doc = public_document(title, {**document, "title": title, "generated_at": generated_at}, private_texts)
    if output_format == "markdown":
        return f"# {title}\n\ngenerated {generated_at}\n\n" + render_markdown(doc)
    return render_html(doc)
