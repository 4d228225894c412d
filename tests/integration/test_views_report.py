"""``python -m runner report`` as an operator runs it: files written, numbers right, nothing private."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import run_cli
from tests.views_support import KINDS, SECRET_NAME, SECRET_VALUE, assert_nothing_private, make_batch


@pytest.fixture
def jobs_dir(tmp_path: Path) -> Path:
    return make_batch(tmp_path / "jobs", {f"t{i}_{kind}": kind for i, kind in enumerate(KINDS)}).jobs_dir


def test_html_report_is_one_self_contained_file(jobs_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "report.html"
    result = run_cli("report", "--jobs-dir", str(jobs_dir), "--out", str(out), env={SECRET_NAME: SECRET_VALUE})
    assert result.returncode == 0, result.stderr
    assert '"tasks": 5' in result.stdout and str(tmp_path) not in result.stdout
    html = out.read_text()
    for external in ("http://", "https://", "<script", "<link", " src=", "url("):
        assert external not in html, external
    assert "Content-Security-Policy" in html and "default-src 'none'" in html  # and it may fetch nothing
    for chart in ("resolved-by-tag-attempt", "resolved-rate-by-attempt", "pass-at-k", "failure-labels",
                  "phase-time", "tokens"):
        assert f'data-chart="{chart}"' in html
    assert_nothing_private(html, str(jobs_dir), str(tmp_path))


def test_markdown_report_carries_the_same_numbers(jobs_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "report.md"
    result = run_cli("report", "--jobs-dir", str(jobs_dir), "--out", str(out), "--format", "markdown",
                     env={SECRET_NAME: SECRET_VALUE})
    assert result.returncode == 0, result.stderr
    md = out.read_text()
    # 5 tasks, 3 done (the agent's failure is scored), 2 failed, none unreadable; 1 resolved of 5 finished,
    # of the 3 scored
    assert "| 5 | 0 | 0 | 3 | 2 | 0 | 0 | 0 | 1 | 20.0% | 33.3% | 2 | 123000 | 90000 | 6900 |" in md
    assert "## Unreadable" not in md
    assert "| failed_extract_docker_error | 1 |" in md and "| bad_environment | 1 |" in md
    assert "| t0_resolved #1 | resolved | 0.0 s | 0.8 s | 4.2 s | 1.3 s | 1.6 min | 0.3 s | 12.5 s | 1.9 min |" in md
    assert "| all tags | 33.3% |" in md
    assert_nothing_private(md, str(jobs_dir), str(tmp_path))


def test_report_refuses_bad_input_clearly(jobs_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "r.html"
    both = run_cli("report", "--jobs-dir", str(jobs_dir), "--suite", "s", "--broker", "redis://127.0.0.1:6379/0",
                   "--out", str(out))
    assert both.returncode == 2 and "not both" in both.stderr
    neither = run_cli("report", "--out", str(out))
    assert neither.returncode == 2 and "--jobs-dir DIR, or both --suite NAME and --broker URL" in neither.stderr
    empty = tmp_path / "empty"
    empty.mkdir()
    no_ledger = run_cli("report", "--jobs-dir", str(empty), "--out", str(out))
    assert no_ledger.returncode == 2 and "has no run-ledger.json" in no_ledger.stderr
    suite = run_cli("report", "--suite", "s", "--broker", "redis://127.0.0.1:1/0", "--out", str(out))
    assert suite.returncode == 3 and "does not answer" in suite.stderr
    unsafe = run_cli("report", "--suite", "s;id", "--broker", "redis://127.0.0.1:1/0", "--out", str(out))
    assert unsafe.returncode == 2 and ";id" not in unsafe.stderr
    assert not out.exists()
    corrupt = tmp_path / "corrupt"
    corrupt.mkdir()
    (corrupt / "run-ledger.json").write_text('{"rows": [{"tag": 1}]}')
    # a ledger row that does not validate is no bad input to the report: it is its unreadable row
    bad = run_cli("report", "--jobs-dir", str(corrupt), "--out", str(out))
    assert bad.returncode == 0 and "Traceback" not in bad.stderr and str(corrupt) not in bad.stderr
    assert "<tr><td>ledger-row-1</td><td>invalid_row</td></tr>" in out.read_text()
