"""The status page and the report rendered by headless Debian chromium: the DOM after render
(rows, charts) and screenshots, from a real batch's files with private material planted beside them.

With ``UPDATE_README_SCREENSHOTS=1`` the screenshots also go to docs/img/ for the README.
"""

from __future__ import annotations

from collections import Counter
from html.parser import HTMLParser
from pathlib import Path

import pytest

from reducers.models import Phase
from runner.views.model import HealthReport, HostCheck, SnapshotSource, TaskRow, TaskState
from runner.views.public import view_private_texts
from runner.views.report import build_report
from runner.views.server import BackgroundServer
from runner.views.sources import rows_from_jobs_dir
from tests.views_support import (
    SECRET_NAME, SECRET_VALUE, assert_nothing_private, chromium_or_skip, dump_dom, keep_for_readme, make_batch,
    screenshot,
)

pytestmark = pytest.mark.browser

# Six tags, three attempts: what each attempt of each tag did.
ATTEMPTS = {
    1: {"lagent_239": "resolved", "autogen_1174": "unresolved", "crewai_1323": "resolved",
        "gpt_engineer_1197": "agent_failure", "llama_index_9555": "infra_failure", "metagpt_1313": "resolved"},
    2: {"lagent_239": "resolved", "autogen_1174": "resolved", "crewai_1323": "unresolved",
        "gpt_engineer_1197": "unresolved", "llama_index_9555": "resolved", "metagpt_1313": "resolved"},
    3: {"lagent_239": "unresolved", "autogen_1174": "unresolved", "crewai_1323": "resolved",
        "gpt_engineer_1197": "bad_environment", "llama_index_9555": "resolved", "metagpt_1313": "agent_failure"},
}


class _Dom(HTMLParser):
    """What the tests look for in the rendered DOM: task rows, charts and their bars, cards."""

    def __init__(self) -> None:
        super().__init__()
        self.charts: Counter[str] = Counter()  # chart name -> bars drawn in it
        self.chart_names: list[str] = []
        self.task_rows: list[list[str]] = []
        self.cards: dict[str, str] = {}
        self._chart: str | None = None
        self._table: str | None = None
        self._row: list[str] | None = None
        self._cell: list[str] | None = None
        self._card: str | None = None
        self._in_b = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if tag == "svg" and "chart" in (a.get("class") or ""):
            self._chart = a.get("data-chart")
            self.chart_names.append(self._chart or "")
        elif tag == "rect" and self._chart and "bar" in (a.get("class") or "").split():
            self.charts[self._chart] += 1
        elif tag == "table":
            self._table = a.get("class")
        elif tag == "tr" and self._table == "tasks":
            self._row = []
        elif tag == "td" and self._row is not None:
            self._cell = []
        elif tag == "div" and a.get("data-card"):
            self._card = a["data-card"]
        elif tag == "b" and self._card:
            self._in_b = True

    def handle_endtag(self, tag: str) -> None:
        if tag == "svg":
            self._chart = None
        elif tag == "table":
            self._table = None
        elif tag == "td" and self._row is not None and self._cell is not None:
            self._row.append("".join(self._cell).strip())
            self._cell = None
        elif tag == "tr" and self._row is not None:
            if self._row:
                self.task_rows.append(self._row)
            self._row = None
        elif tag == "b" and self._in_b:
            self._in_b = False
            self._card = None

    def handle_data(self, data: str) -> None:
        if self._cell is not None:
            self._cell.append(data)
        if self._in_b and self._card:
            self.cards[self._card] = self.cards.get(self._card, "") + data


def _dom(text: str) -> _Dom:
    parsed = _Dom()
    parsed.feed(text)
    return parsed


def _suite_rows(tmp_path: Path) -> tuple[list[TaskRow], list[Path]]:
    rows, dirs = [], []
    for attempt, kinds in ATTEMPTS.items():
        jobs = make_batch(tmp_path / f"jobs-{attempt}", kinds, scale=0.6 + 0.35 * attempt).jobs_dir
        dirs.append(jobs)
        rows += [row.model_copy(update={"suite": "demo", "attempt": attempt, "host": f"host-{attempt % 2 + 1}"})
                 for row in rows_from_jobs_dir(jobs)]
    return rows, dirs


def _png_ok(png: Path, size: tuple[int, int], dims: tuple[int, int]) -> None:
    assert dims == size, f"screenshot is {dims}, asked for {size}"
    # a blank or near-blank page of this size compresses to a few KB; a page with rows and charts does not
    assert png.stat().st_size > 25_000, f"screenshot only {png.stat().st_size} bytes: nothing rendered?"


def test_status_page_in_chromium(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    chromium_or_skip()
    monkeypatch.setenv(SECRET_NAME, SECRET_VALUE)
    rows, dirs = _suite_rows(tmp_path)
    live = [
        TaskRow(suite="demo", tag="openhands_5270", attempt=1, state=TaskState.RUNNING, host="host-1",
                phase=Phase.CODEX, phase_seconds={"prepare": 0.02, "precheck": 0.9, "extract": 4.4, "baseline": 1.2}),
        TaskRow(suite="demo", tag="openhands_5270", attempt=2, state=TaskState.RUNNING, host="host-2",
                phase=Phase.EVALUATE, phase_seconds={"prepare": 0.02, "precheck": 0.8, "extract": 4.0}),
        TaskRow(suite="demo", tag="openhands_5270", attempt=3, state=TaskState.QUEUED),
    ]
    health = HealthReport(
        checks=[HostCheck(name="docker", ok=True, detail="engine 20.10.24 answers"),
                HostCheck(name="disk", ok=True, detail=f"212 GB free under {dirs[0]}"),
                HostCheck(name="codex_login", ok=True, detail="logged in"), HostCheck(name="broker", ok=True)],
        taking_work=True, slots_busy=2, slots_total=4,
    )
    source = SnapshotSource(health, rows + live)
    with BackgroundServer(source, private_texts=[str(tmp_path)], title="suite demo") as views:
        dom_text = dump_dom(views.url + "/", tmp_path / "chromium-dom")
        png = tmp_path / "status.png"
        dims = screenshot(views.url + "/", tmp_path / "chromium-shot", png, (1280, 900))

    dom = _dom(dom_text)
    assert '<meta http-equiv="refresh" content="5">' in dom_text  # it reloads itself
    assert len(dom.task_rows) == 21  # 6 tags x 3 attempts + 2 running + 1 queued
    assert {r[1] for r in dom.task_rows} == {"task"}  # the unit kind column: no evaluation units in this suite
    running = [r for r in dom.task_rows if r[4] == "running"]
    assert sorted((r[5], r[6]) for r in running) == [("host-1", "codex"), ("host-2", "evaluate")]
    # an agent's failure is scored (unresolved), as every ledger scores it; "failed" is a refused input only
    assert {r[7] for r in dom.task_rows} == {"resolved", "unresolved", "infra", "running", "queued"}
    assert dom.charts["tasks-by-state"] == 4  # queued, running, done, failed (cancelled is 0: no bar)
    assert dom.cards["tasks"] == "21" and dom.cards["resolved"] == "9"
    assert dom.cards["resolved rate"] == "50.0%"  # 9 of 18 finished
    assert dom.cards["excl. infra failures"] == "56.2%"  # 9 of 16 (2 infra failures)
    assert_nothing_private(dom_text, str(tmp_path))
    _png_ok(png, (1280, 900), dims)
    keep_for_readme(png, "status-page.png")


def test_report_in_chromium(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    chromium_or_skip()
    monkeypatch.setenv(SECRET_NAME, SECRET_VALUE)
    rows, _ = _suite_rows(tmp_path)
    report = tmp_path / "report.html"
    report.write_text(build_report(rows, title="suite demo: report", output_format="html",
                                   private_texts=view_private_texts([str(tmp_path)])))
    url = report.as_uri()
    dom_text = dump_dom(url, tmp_path / "chromium-dom")
    png = tmp_path / "report.png"
    dims = screenshot(url, tmp_path / "chromium-shot", png, (1280, 1700))

    dom = _dom(dom_text)
    assert dom.chart_names == ["resolved-by-tag-attempt", "resolved-rate-by-attempt", "pass-at-k",
                               "failure-labels", "phase-time", "tokens"]
    assert dom.charts["resolved-by-tag-attempt"] == 18  # one cell per tag and attempt
    assert dom.charts["resolved-rate-by-attempt"] == 3
    assert dom.charts["pass-at-k"] == 3  # pass@1, @2, @3 (pass@3 over the tags with three scored attempts)
    # unresolved, codex timeout, docker error in extract, bad environment
    assert dom.charts["failure-labels"] == 4
    assert dom.charts["phase-time"] > 18 * 2  # several phases per task
    assert dom.charts["tokens"] >= 3 * 14  # three kinds for every task that ran codex
    assert len(dom.task_rows) == 18
    assert_nothing_private(dom_text, str(tmp_path))
    assert_nothing_private(report.read_text(), str(tmp_path))
    _png_ok(png, (1280, 1700), dims)
    keep_for_readme(png, "report.png")
