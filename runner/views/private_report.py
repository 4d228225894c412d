"""The private report (``python -m runner report --private``): the suite report, then every
attempt's timeline, patch (a coloured diff) and evaluation logs, in one offline HTML file.

Invariants:
- it is private and says so: its file name (refused without "private" in it), its first line
  (an HTML comment) and its page title;
- it is never written through ``runner.public`` and no public output names it: the public
  views (status page, ``worker --http``, the public report, ``/metrics``) import nothing of this
  module, and ``tests/integration/test_trajectory_views.py`` checks a planted secret appears here
  and nowhere public;
- it opens offline as the public report does (the same page, CSP and no script); every text is
  escaped; the diff is coloured by pygments with inline styles (no stylesheet to fetch).
"""

from __future__ import annotations

from pathlib import Path

from pygments import highlight
from pygments.formatters import HtmlFormatter
from pygments.lexers import DiffLexer

from reducers.costs import BudgetFigures
from runner.errors import BadInputError, NotAJobRootError
from runner.pricing import RateCard
from runner.trajectory.attempt import AttemptView, attempt_root, read_attempt
from runner.trajectory.timeline import Line, timeline
from runner.views.document import suite_document
from runner.views.model import TaskRow
from runner.views.render import esc, page
from runner.views.report import report_body

PRIVATE_WORD = "private"
FIRST_LINE = ("<!-- PRIVATE runner report: prompts, agent messages, commands' output, patches and evaluation logs "
              "of a trusted host. Never publish or upload it. -->\n")
PATCH_SHOWN_BYTES = 1 << 20  # of each patch, coloured; the rest is counted, not shown
_STYLE_CSS = {"bold": "font-weight:bold", "dim": "color:#757575", "red": "color:#c62828", "green": "color:#2e7d32",
              "yellow": "color:#a86b00", "cyan": "color:#00838f", "magenta": "color:#6a1b9a"}
CSS = """
.private-banner { background: #b71c1c; color: #fff; padding: 6px 12px; font-weight: bold; border-radius: 4px; }
section.attempt { border-top: 2px solid #e0e0e0; margin-top: 18px; }
pre { background: #fafafa; border: 1px solid #eee; padding: 8px; overflow-x: auto; font-size: 12px; }
pre.timeline span { white-space: pre-wrap; }
"""


def check_private_name(out: Path) -> Path:
    """Raises: BadInputError when the file name does not say it is private."""
    if PRIVATE_WORD not in out.name.lower():
        raise BadInputError(f"--out {out.name}: the private report's file name must say so "
                            f"(e.g. private-report.html)")
    return out


def _style(style: str) -> str:
    return ";".join(_STYLE_CSS[word] for word in style.split() if word in _STYLE_CSS)


def timeline_html(lines: list[Line]) -> str:
    spans = "\n".join(f'<span style="{_style(line.style)}">{esc(line.text)}</span>' if line.style
                      else esc(line.text) for line in lines)
    return f'<pre class="timeline">{spans}</pre>'


def diff_html(patch: bytes) -> str:
    text = patch[:PATCH_SHOWN_BYTES].decode("utf-8", errors="replace")
    note = (f'<p class="muted">first {PATCH_SHOWN_BYTES:,} of {len(patch):,} bytes</p>'
            if len(patch) > PATCH_SHOWN_BYTES else "")
    return note + highlight(text, DiffLexer(), HtmlFormatter(noclasses=True, cssclass="patch"))


def attempt_section(row: TaskRow, view: AttemptView | None, anchor: str) -> str:
    title = f"{row.tag} attempt {row.attempt}"
    if view is None:
        return f'<section class="attempt" id="{esc(anchor)}"><h2>{esc(title)}</h2><p class="muted">no job root</p></section>'
    parts = [f'<section class="attempt" id="{esc(anchor)}" data-tag="{esc(row.tag)}" data-attempt="{row.attempt}">',
             f"<h2>{esc(title)}</h2>", "<h3>Timeline</h3>", timeline_html(timeline(view)), "<h3>Patch</h3>"]
    parts.append(f'<div class="patch-block">{diff_html(view.patch.text)}</div>' if view.patch and view.patch.text
                 else '<p class="muted">no patch</p>')
    parts.append("<h3>Evaluation log</h3>")
    logs = view.evaluation.log_tails if view.evaluation else {}
    if logs:
        for name, text in logs.items():
            parts.append(f'<h4>{esc(name)}</h4><pre class="eval-log" data-log="{esc(name)}">{esc(text)}</pre>')
    else:
        parts.append('<p class="muted">not evaluated</p>')
    parts.append("</section>")
    return "".join(parts)


def build_private_report(jobs_dir: Path, rows: list[TaskRow], *, title: str, private_texts: list[str],
                         card: RateCard, budget: BudgetFigures | None = None, tail_lines: int = 200) -> str:
    """The whole private report's HTML (its first line says it is private)."""
    doc = suite_document(title, rows, private_texts, budget=budget)
    sections, index = [], []
    for row in sorted(rows, key=lambda r: (r.tag, r.attempt)):
        if row.kind != "task" or row.unreadable is not None:
            continue
        anchor = f"attempt-{row.tag}-{row.attempt}"
        try:
            view = read_attempt(attempt_root(jobs_dir, row.tag, row.attempt), card=card, tail_lines=tail_lines)
        except NotAJobRootError:
            view = None
        sections.append(attempt_section(row, view, anchor))
        index.append(f'<li><a href="#{esc(anchor)}">{esc(row.tag)} attempt {row.attempt}</a></li>')
    body = (
        '<p class="private-banner">PRIVATE: this report holds prompts, agent messages, patches and logs. '
        "Keep it on the trusted host; never publish it.</p>"
        + f"<style>{CSS}</style>"
        + report_body(doc)
        + "<h2>Attempts</h2><ul class=\"attempt-index\">" + "".join(index) + "</ul>"
        + "".join(sections)
    )
    return FIRST_LINE + page(f"PRIVATE: {title}", body)
