"""HTML and inline SVG for the status page and the report: no script, no external asset.

Invariants: every text goes through ``html.escape``; charts are plain SVG drawn
here (``<svg class="chart" data-chart=NAME>`` holding ``<rect class="bar">``
elements), so a page opens offline and a test can find the charts in the DOM.
"""

from __future__ import annotations

from html import escape

STATE_COLORS = {
    "resolved": "#2e7d32", "unresolved": "#c62828", "infra": "#ef6c00", "failed": "#6a1b9a",
    "queued": "#9e9e9e", "running": "#1565c0", "cancelled": "#616161", "done": "#2e7d32",
    "unreadable": "#795548", "skipped_budget": "#bdbdbd",
}
# Nothing may be fetched: the page is whole as written (a report opens offline).
CSP = "default-src 'none'; style-src 'unsafe-inline'"
PALETTE = ("#1565c0", "#2e7d32", "#ef6c00", "#6a1b9a", "#00838f", "#c62828", "#5d4037", "#9e9d24")

CSS = """
body { font: 14px/1.4 system-ui, sans-serif; margin: 20px; color: #212121; background: #fff; }
h1 { font-size: 20px; margin: 0 0 4px 0; } h2 { font-size: 16px; margin: 22px 0 8px 0; }
.muted { color: #757575; font-size: 12px; }
table { border-collapse: collapse; margin: 6px 0; }
th, td { border: 1px solid #e0e0e0; padding: 3px 7px; text-align: left; font-size: 12px; white-space: nowrap; }
th { background: #f5f5f5; } td.num { text-align: right; font-variant-numeric: tabular-nums; }
.cards { display: flex; gap: 12px; flex-wrap: wrap; margin: 10px 0; }
.card { border: 1px solid #e0e0e0; border-radius: 6px; padding: 8px 14px; min-width: 120px; }
.card b { display: block; font-size: 20px; }
.badge { display: inline-block; padding: 0 6px; border-radius: 8px; color: #fff; font-size: 12px; }
.ok { color: #2e7d32; } .bad { color: #c62828; }
svg.chart { display: block; margin: 6px 0 14px 0; }
svg.chart text { font: 12px system-ui, sans-serif; fill: #424242; }
"""


def esc(value: object) -> str:
    return escape("" if value is None else str(value), quote=True)


def fmt_rate(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


def fmt_dollars(value: float | None) -> str:
    """A cost as the ledgers' Markdown shows it (``runner.ledger.cost_markdown``): four decimals."""
    return "-" if value is None else f"${value:.4f}"


def fmt_seconds(value: float | None) -> str:
    if value is None:
        return "-"
    if value >= 3600:
        return f"{value / 3600:.1f} h"
    if value >= 60:
        return f"{value / 60:.1f} min"
    return f"{value:.1f} s"


def badge(text: str, color_key: str) -> str:
    color = STATE_COLORS.get(color_key, "#616161")
    return f'<span class="badge" style="background:{color}">{esc(text)}</span>'


def table(headers: list[str], rows: list[list[str]], *, css_class: str = "", raw: bool = False) -> str:
    """A table; cells are escaped unless ``raw`` (the caller escaped them already)."""
    head = "".join(f"<th>{esc(h)}</th>" for h in headers)
    body = []
    for row in rows:
        cells = "".join(f"<td>{cell if raw else esc(cell)}</td>" for cell in row)
        body.append(f"<tr>{cells}</tr>")
    return f'<table class="{esc(css_class)}"><thead><tr>{head}</tr></thead><tbody>{"".join(body)}</tbody></table>'


def page(title: str, body: str, *, refresh_seconds: int | None = None) -> str:
    refresh = f'<meta http-equiv="refresh" content="{int(refresh_seconds)}">' if refresh_seconds else ""
    return (
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
        f'<meta http-equiv="Content-Security-Policy" content="{CSP}">'
        f"{refresh}<title>{esc(title)}</title><style>{CSS}</style></head>"
        f"<body>{body}</body></html>\n"
    )


def _legend(items: list[tuple[str, str]], y: float) -> str:
    parts, x = [], 0.0
    for name, color in items:
        parts.append(
            f'<rect class="legend" x="{x:.0f}" y="{y:.0f}" width="10" height="10" fill="{color}"></rect>'
            f'<text x="{x + 14:.0f}" y="{y + 9:.0f}">{esc(name)}</text>'
        )
        x += 24 + 7 * len(name)
    return "".join(parts)


def bar_chart(name: str, items: list[tuple[str, float, str]], *, maximum: float | None = None,
              value_text=lambda v: f"{v:g}", color: str = PALETTE[0], width: int = 760) -> str:
    """Horizontal bars: ``items`` are (label, value, tooltip)."""
    if not items:
        return f'<p class="muted" data-chart-empty="{esc(name)}">nothing to chart yet</p>'
    label_w, bar_h, gap = 280, 16, 6
    top = max(maximum or 0.0, *(value for _, value, _ in items)) or 1.0
    plot_w = width - label_w - 80
    height = len(items) * (bar_h + gap) + gap
    parts = [f'<svg class="chart" data-chart="{esc(name)}" role="img" width="{width}" height="{height}" '
             f'viewBox="0 0 {width} {height}"><title>{esc(name)}</title>']
    for i, (label, value, tip) in enumerate(items):
        y = gap + i * (bar_h + gap)
        w = max(1.0, plot_w * value / top) if value > 0 else 0.0
        parts.append(
            f'<text x="{label_w - 6}" y="{y + 12}" text-anchor="end">{esc(label[:44])}</text>'
            f'<rect class="bar" data-label="{esc(label)}" data-value="{value:g}" x="{label_w}" y="{y}" '
            f'width="{w:.1f}" height="{bar_h}" fill="{color}"><title>{esc(tip)}</title></rect>'
            f'<text x="{label_w + w + 6:.1f}" y="{y + 12}">{esc(value_text(value))}</text>'
        )
    parts.append("</svg>")
    return "".join(parts)


def stacked_bars(name: str, rows: list[tuple[str, list[float]]], segments: list[str], *,
                 value_text=lambda v: f"{v:g}", colors: list[str] | None = None, width: int = 760) -> str:
    """Horizontal stacked bars: each row is (label, one value per segment)."""
    if not rows:
        return f'<p class="muted" data-chart-empty="{esc(name)}">nothing to chart yet</p>'
    label_w, bar_h, gap = 280, 14, 5
    colors = colors or [PALETTE[i % len(PALETTE)] for i in range(len(segments))]
    top = max((sum(values) for _, values in rows), default=0.0) or 1.0
    plot_w = width - label_w - 90
    height = len(rows) * (bar_h + gap) + gap + 24
    parts = [f'<svg class="chart" data-chart="{esc(name)}" role="img" width="{width}" height="{height}" '
             f'viewBox="0 0 {width} {height}"><title>{esc(name)}</title>']
    for i, (label, values) in enumerate(rows):
        y = gap + i * (bar_h + gap)
        parts.append(f'<text x="{label_w - 6}" y="{y + 11}" text-anchor="end">{esc(label[:44])}</text>')
        x = float(label_w)
        for segment, value, color in zip(segments, values, colors):
            if value <= 0:
                continue
            w = plot_w * value / top
            parts.append(
                f'<rect class="bar" data-label="{esc(label)}" data-segment="{esc(segment)}" data-value="{value:g}" '
                f'x="{x:.1f}" y="{y}" width="{max(w, 0.5):.1f}" height="{bar_h}" fill="{color}">'
                f"<title>{esc(f'{label} {segment}: {value_text(value)}')}</title></rect>"
            )
            x += w
        parts.append(f'<text x="{x + 6:.1f}" y="{y + 11}">{esc(value_text(sum(values)))}</text>')
    parts.append(_legend(list(zip(segments, colors)), height - 16))
    parts.append("</svg>")
    return "".join(parts)


def grid_chart(name: str, labels: list[str], columns: list[int], cells: dict[tuple[str, int], str],
               *, width: int = 760) -> str:
    """A tag x attempt grid: each cell coloured by its outcome (a ``STATE_COLORS`` key)."""
    if not labels or not columns:
        return f'<p class="muted" data-chart-empty="{esc(name)}">nothing to chart yet</p>'
    label_w, cell, gap = 280, 18, 3
    height = 20 + len(labels) * (cell + gap) + 28
    width = max(width, label_w + len(columns) * (cell + gap) + 20)
    parts = [f'<svg class="chart" data-chart="{esc(name)}" role="img" width="{width}" height="{height}" '
             f'viewBox="0 0 {width} {height}"><title>{esc(name)}</title>']
    for j, column in enumerate(columns):
        parts.append(f'<text x="{label_w + j * (cell + gap) + cell / 2:.0f}" y="13" text-anchor="middle">{column}</text>')
    for i, label in enumerate(labels):
        y = 20 + i * (cell + gap)
        parts.append(f'<text x="{label_w - 6}" y="{y + 13}" text-anchor="end">{esc(label[:44])}</text>')
        for j, column in enumerate(columns):
            outcome = cells.get((label, column))
            if outcome is None:
                continue
            parts.append(
                f'<rect class="bar cell" data-label="{esc(label)}" data-attempt="{column}" data-outcome="{esc(outcome)}" '
                f'x="{label_w + j * (cell + gap)}" y="{y}" width="{cell}" height="{cell}" '
                f'fill="{STATE_COLORS.get(outcome, "#bdbdbd")}">'
                f'<title>{esc(f"{label} attempt {column}: {outcome}")}</title></rect>'
            )
    used = sorted({outcome for outcome in cells.values()})
    parts.append(_legend([(outcome, STATE_COLORS.get(outcome, "#bdbdbd")) for outcome in used], height - 16))
    parts.append("</svg>")
    return "".join(parts)
