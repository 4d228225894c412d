"""``python -m runner report --jobs-dir OUT`` on an ``evaluate`` jobs dir: the eval-ledger as a report.

The ledger is written by the evaluation's own ledger class (journal and snapshot, as a run
leaves them); the report runs as a real process. What is checked: the numbers in the HTML
(bars, cards, grid cells) and in the Markdown are the ledger's; nothing private reaches the
file; nothing is written into the jobs dir; a dir with both ledgers, or a damaged one, is refused.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

from runner.score_patches import EVAL_JOURNAL, EVAL_JSON, EvalLedger, EvalRow, UnitState
from tests.conftest import run_cli

SHA = "ab" * 32


def _row(tag: str, patch: str, state: UnitState, resolved: bool | None, **extra) -> EvalRow:
    ran = state is UnitState.SCORED
    return EvalRow(
        tag=tag, patch=patch, patch_sha256=SHA, patch_bytes=120, state=state, resolved=resolved,
        exit_code_verdict=resolved if ran else None, string_verdict=resolved if ran else None,
        apply_exit_code=0 if ran else None, test_exit_code=(0 if resolved else 1) if ran else None,
        apply_seconds=0.5 if ran else None, test_seconds=2.0 if ran else None, wall_seconds=3.0,
        image=f"agentissue-bench/{tag}", network="none", **extra,
    )


def _ledger(jobs: Path, *, snapshot: bool) -> None:
    jobs.mkdir(parents=True, exist_ok=True)
    ledger = EvalLedger(jobs, [str(jobs)])
    for row in [
        _row("stub_a", "agentless.patch", UnitState.SCORED, True),
        _row("stub_a", "swe-agent.patch", UnitState.SCORED, False),
        _row("stub_a", "empty.patch", UnitState.REJECTED, False, label="empty_patch"),
        _row("stub_b", "agentless.patch", UnitState.SCORED, False),
        _row("stub_b", "swe-agent.patch", UnitState.INFRA_FAILED, None, label="image_missing"),
        _row("evo.ninja_445", "agentless.patch", UnitState.SCORED, True, directory="evo-ninja-445"),
    ]:
        ledger.upsert(row)
    if not snapshot:  # as a SIGKILL mid-run can leave it: every row in the journal, no snapshot yet
        lines = "".join(row.model_dump_json() + "\n" for row in ledger.rows.values())
        (jobs / EVAL_JSON).unlink()
        (jobs / "eval-ledger.md").unlink()
        (jobs / EVAL_JOURNAL).write_text(lines)


def _report(jobs: Path, out: Path, *extra: str) -> tuple[int, dict, str]:
    done = run_cli("report", "--jobs-dir", str(jobs), "--out", str(out), *extra, timeout=60)
    return done.returncode, (json.loads(done.stdout) if done.stdout.strip() else {}), done.stderr


def _bars(html: str, chart: str) -> dict[str, float]:
    svg = re.search(rf'<svg class="chart" data-chart="{chart}".*?</svg>', html, re.S)
    assert svg, f"no chart {chart}"
    return {m[0]: float(m[1]) for m in re.findall(r'<rect class="bar" data-label="([^"]+)" data-value="([^"]+)"',
                                                   svg.group(0))}


def test_the_report_of_an_evaluation_carries_the_ledgers_numbers(tmp_path: Path) -> None:
    jobs = tmp_path / "eval-out"
    _ledger(jobs, snapshot=True)
    before = sorted(os.listdir(jobs))
    out = tmp_path / "report.html"
    code, answer, stderr = _report(jobs, out)
    assert code == 0, stderr
    assert answer["ledger"] == "eval" and answer["patches"] == 6 and answer["out"] == "report.html"
    html = out.read_text()
    # per tag: successes / counted patches: the rejected patch counts as FAILED, the infra failure has no verdict
    # and is not counted (stub_b: 0 of 1, not 0 of 2)
    ledger = json.loads((jobs / EVAL_JSON).read_text())
    expected = {t["tag"]: t["score"] for t in ledger["tags"]}
    assert _bars(html, "score-by-tag") == {"evo.ninja_445": 1.0, "stub_a": round(1 / 3, 6), "stub_b": 0.0}
    assert _bars(html, "score-by-tag") == {k: v or 0.0 for k, v in expected.items()}
    assert re.search(r'data-card="successes"><span class="muted">successes</span><b>2</b>', html)
    assert re.search(r'data-card="patches"><span class="muted">patches</span><b>6</b>', html)
    assert re.search(r'data-card="counted"><span class="muted">counted</span><b>5</b>', html)
    assert re.search(r'data-card="infra failed"><span class="muted">infra failed</span><b>1</b>', html)
    cells = dict(re.findall(r'data-label="(stub_a)" data-attempt="(\d+)" data-outcome="resolved"', html))
    assert cells  # the grid colours stub_a's agentless patch as resolved
    assert html.count('data-outcome="infra"') == 1
    assert "evo-ninja-445 &rarr; evo.ninja_445" in html  # the tag directory's spelling, and what it mapped to
    assert _bars(html, "labels") == {"empty_patch": 1.0, "image_missing": 1.0}
    assert str(tmp_path) not in html and "<script" not in html
    assert sorted(os.listdir(jobs)) == before  # the report writes only --out


def test_the_markdown_report_has_the_same_numbers_and_reads_a_journal_alone(tmp_path: Path) -> None:
    jobs = tmp_path / "killed"
    _ledger(jobs, snapshot=False)  # a SIGKILLed evaluate leaves its journal only
    assert not (jobs / EVAL_JSON).exists()
    out = tmp_path / "report.md"
    code, answer, stderr = _report(jobs, out, "--format", "markdown", "--title", "Codex vs the paper")
    assert code == 0, stderr
    text = out.read_text()
    assert text.startswith("# Codex vs the paper\n")
    assert "2 of 5 counted patches (6 in all) pass the official rule over 3 tags (2 tags with a passing patch)" in text
    assert "| stub_a | 3 | 3 | 1 | 0.333 |" in text and "| stub_b | 2 | 1 | 0 | 0.000 |" in text
    assert "| agentless.patch | 3 | 2 |" in text  # one agent's row across the tags
    assert not (jobs / EVAL_JSON).exists()


def test_a_dir_with_both_ledgers_asks_which_and_a_damaged_one_is_refused(tmp_path: Path) -> None:
    jobs = tmp_path / "both"
    _ledger(jobs, snapshot=True)
    (jobs / "run-ledger.json").write_text(json.dumps({"schema_version": "benchmark_run_ledger_v1", "rows": []}))
    out = tmp_path / "r.html"
    code, _answer, stderr = _report(jobs, out)
    assert code == 2 and "--ledger runs or --ledger eval" in stderr and not out.exists()
    code, answer, stderr = _report(jobs, out, "--ledger", "eval")
    assert code == 0 and answer["patches"] == 6, stderr
    code, answer, stderr = _report(jobs, tmp_path / "runs.html", "--ledger", "runs")
    assert code == 0 and answer["tasks"] == 0, stderr

    damaged = tmp_path / "damaged"
    damaged.mkdir()
    (damaged / EVAL_JSON).write_text('{"schema_version": "agentissue_patch_evaluation_v1", "rows": [{"tag": 1}]}')
    code, _answer, stderr = _report(damaged, tmp_path / "d.html")
    assert code == 2 and EVAL_JSON in stderr and not (tmp_path / "d.html").exists(), stderr
