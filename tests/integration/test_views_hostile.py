"""``python -m runner report`` on a hostile or damaged jobs dir (issue 21, item 3).

Each case is planted in a real batch's jobs dir and the report is a real process. It must
end on its own (no hang), with no traceback, never echo the hostile value, write the report
and show the bad file's row as unreadable with a short reason. The report runs with its
address space capped at 1 GiB and its peak memory read from the kernel (``wait4``), so a
reader that reads without bound fails here (and cannot take the shared machine down).
"""

from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import REPO, cli_environment
from tests.views_support import KINDS, SECRET_NAME, SECRET_VALUE, assert_nothing_private, make_batch

ADDRESS_SPACE = 1 << 30
MEMORY_BOUND_MIB = 200  # the report of a small batch peaks near 60 MiB


@dataclass(frozen=True)
class Ran:
    returncode: int
    stdout: str
    stderr: str
    max_rss_mib: float


def _cap_address_space() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_SPACE, ADDRESS_SPACE))


def run_report(jobs_dir: Path, out: Path, *extra: str, timeout: float = 60) -> Ran:
    """``python -m runner report`` as ``tests.conftest.run_cli`` runs it, plus a memory cap and its peak RSS."""
    argv = [sys.executable, "-m", "runner", "report", "--jobs-dir", str(jobs_dir), "--out", str(out), *extra]
    with tempfile.TemporaryFile("w+") as stdout, tempfile.TemporaryFile("w+") as stderr:
        process = subprocess.Popen(argv, cwd=REPO, env=cli_environment({SECRET_NAME: SECRET_VALUE}), text=True,
                                   stdout=stdout, stderr=stderr, preexec_fn=_cap_address_space)
        deadline = time.monotonic() + timeout
        while True:
            pid, status, usage = os.wait4(process.pid, os.WNOHANG)
            if pid:
                break
            if time.monotonic() > deadline:
                process.kill()
                os.wait4(process.pid, 0)
                process.returncode = -9
                pytest.fail(f"the report was still running after {timeout} s")
            time.sleep(0.02)
        process.returncode = os.waitstatus_to_exitcode(status)
        stdout.seek(0)
        stderr.seek(0)
        return Ran(process.returncode, stdout.read(), stderr.read(), usage.ru_maxrss / 1024)


@pytest.fixture
def jobs_dir(tmp_path: Path) -> Path:
    return make_batch(tmp_path / "jobs", {f"t{i}_{kind}": kind for i, kind in enumerate(KINDS)}).jobs_dir


def assert_reported(ran: Ran, out: Path, jobs_dir: Path, unreadable: dict[str, str], *hostile: str) -> str:
    """Exit 0, no traceback, nothing hostile or private echoed, the report written with these unreadable rows."""
    assert ran.returncode == 0, ran.stderr[-3000:]
    assert "Traceback" not in ran.stderr, ran.stderr[-3000:]
    summary = json.loads(ran.stdout)
    assert summary["unreadable"] == len(unreadable)
    html = out.read_text()
    for task, reason in unreadable.items():
        assert f"<tr><td>{task}</td><td>{reason}</td></tr>" in html, (task, reason)
    for text in (ran.stdout, ran.stderr, html):
        for value in hostile:
            assert value not in text, f"{value[:40]!r} echoed"
        assert_nothing_private(text, str(jobs_dir))
    assert ran.max_rss_mib < MEMORY_BOUND_MIB, f"peak RSS {ran.max_rss_mib:.0f} MiB"
    return html


@pytest.mark.parametrize("where", ["t0_resolved/benchmark_run.compact.json", "run-ledger.json"])
def test_a_fifo_is_an_unreadable_row_and_the_report_finishes(jobs_dir: Path, tmp_path: Path, where: str) -> None:
    (jobs_dir / where).unlink()
    os.mkfifo(jobs_dir / where)
    out = tmp_path / "report.html"
    ran = run_report(jobs_dir, out, timeout=30)
    if where == "run-ledger.json":
        assert_reported(ran, out, jobs_dir, {"run-ledger.json": "not_a_regular_file"})
    else:  # the views read the ledger only (a row carries every fact they show): the FIFO is never opened
        html = assert_reported(ran, out, jobs_dir, {})
        assert "<td>t0_resolved</td>" in html and "<td>t1_unresolved</td>" in html


def test_sigterm_ends_the_report(jobs_dir: Path, tmp_path: Path) -> None:
    """A report that takes long (here: the FIFO of the old code) ends at SIGTERM, exit 130, nothing half-written."""
    (jobs_dir / "t0_resolved/benchmark_run.compact.json").unlink()
    os.mkfifo(jobs_dir / "t0_resolved/benchmark_run.compact.json")
    out = tmp_path / "report.html"
    process = subprocess.Popen(
        [sys.executable, "-m", "runner", "report", "--jobs-dir", str(jobs_dir), "--out", str(out)],
        cwd=REPO, env=cli_environment(None), text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )
    try:
        # Once the runner's first SIGTERM handler is in (python -m runner installs it first thing), signal it.
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            status = Path(f"/proc/{process.pid}/status").read_text()
            caught = int(next(line for line in status.splitlines() if line.startswith("SigCgt:")).split()[1], 16)
            if caught & (1 << (signal.SIGTERM - 1)):
                break
            time.sleep(0.002)
        process.send_signal(signal.SIGTERM)
        stdout, stderr = process.communicate(timeout=15)
    except subprocess.TimeoutExpired:
        process.kill()
        process.communicate()
        pytest.fail("the report did not end at SIGTERM")
    assert process.returncode == 130, stderr[-3000:]
    assert "Traceback" not in stderr and "interrupted" in stderr
    assert not out.exists() and not list(tmp_path.glob(".report.html.*"))


@pytest.mark.parametrize("where", ["t0_resolved/benchmark_run.compact.json", "run-ledger.json"])
def test_a_link_to_dev_zero_is_an_unreadable_row_never_read(jobs_dir: Path, tmp_path: Path, where: str) -> None:
    (jobs_dir / where).unlink()
    (jobs_dir / where).symlink_to("/dev/zero")
    out = tmp_path / "report.html"
    ran = run_report(jobs_dir, out)
    if where == "run-ledger.json":
        assert_reported(ran, out, jobs_dir, {"run-ledger.json": "outside_jobs_dir"}, "/dev/zero")
    else:  # never opened: the views read the ledger only
        assert "<td>t0_resolved</td>" in assert_reported(ran, out, jobs_dir, {}, "/dev/zero")


def test_a_ledger_that_is_not_utf8_is_one_unreadable_row(jobs_dir: Path, tmp_path: Path) -> None:
    ledger = jobs_dir / "run-ledger.json"
    ledger.write_bytes(ledger.read_bytes().replace(b'"t1_unresolved"', b'"t1_\xff\xfe_unresolved"'))
    out = tmp_path / "report.html"
    assert_reported(run_report(jobs_dir, out), out, jobs_dir, {"run-ledger.json": "not_utf8"})


def test_a_ledger_nested_100000_deep_is_one_unreadable_row(jobs_dir: Path, tmp_path: Path) -> None:
    (jobs_dir / "run-ledger.json").write_text('{"rows": ' + "[" * 100_000 + "]" * 100_000 + "}")
    out = tmp_path / "report.html"
    assert_reported(run_report(jobs_dir, out), out, jobs_dir, {"run-ledger.json": "too_deep"})


@pytest.mark.parametrize(
    ("field", "value", "task"),
    [
        ("tag", "../../../../etc", "ledger-row-2"),  # no safe tag to show: the row's place stands in
        ("failure_label", "evil" * 25_000, "t1_unresolved #1"),  # 100 KB
        ("tag", 1, "ledger-row-2"),  # not even a string
    ],
)
def test_a_hostile_ledger_row_is_unreadable_and_never_echoed(
    jobs_dir: Path, tmp_path: Path, field: str, value: object, task: str
) -> None:
    ledger = jobs_dir / "run-ledger.json"
    document = json.loads(ledger.read_text())
    assert document["rows"][1]["tag"] == "t1_unresolved"
    document["rows"][1][field] = value
    ledger.write_text(json.dumps(document))
    out = tmp_path / "report.html"
    hostile = ["../../", "evilevilevil"]
    html = assert_reported(run_report(jobs_dir, out), out, jobs_dir, {task: "invalid_row"}, *hostile)
    assert "<td>t0_resolved</td>" in html and "<td>t2_agent_failure</td>" in html  # the other rows stand


def test_a_600_mb_journal_line_is_skipped_in_bounded_memory(jobs_dir: Path, tmp_path: Path) -> None:
    """One line of 600 MB (sparse: no disk), then a good row: the line is unreadable, the row after it counts."""
    good = json.loads((jobs_dir / "run-ledger.json").read_text())["rows"][0]
    journal = jobs_dir / "run-ledger.journal.jsonl"
    with journal.open("wb") as handle:
        handle.write(b'{"tag": "')
        handle.seek(600 * 1024 * 1024)
        handle.write(b'"}\n' + json.dumps({**good, "tag": "late_1"}).encode() + b"\n")
    out = tmp_path / "report.html"
    ran = run_report(jobs_dir, out)
    html = assert_reported(ran, out, jobs_dir, {"journal-line-1": "too_large"})
    assert "<td>late_1</td>" in html and json.loads(ran.stdout)["tasks"] == 7
