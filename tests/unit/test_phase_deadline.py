"""The phase deadline of extract and baseline (runner/deadline.py, issue 24): the watchdog, the check,
what an error past the deadline becomes, and git killed at the deadline (a real git, made slow by
a ``git`` earlier on PATH, since a real one cannot hang on demand)."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

from runner.context import JobContext
from runner.deadline import PhaseDeadline
from runner.errors import ExitCode, PhaseTimeoutError, UnsafeArchiveError
from runner.jobroot import JobRoot
from runner.phases.baseline import baseline
from runner.tasks.spec import load_settings
from tests.conftest import git_processes_of, hanging_git_dir


def test_the_watchdog_wakes_a_blocked_read_and_the_error_names_the_phase() -> None:
    woken = threading.Event()
    started = time.monotonic()
    with pytest.raises(PhaseTimeoutError) as caught:
        with PhaseDeadline("extract", 1, flag="--extract-timeout") as deadline:
            with deadline.on_expiry(woken.set):
                assert woken.wait(10), "the watchdog never ran the cancel"  # a read blocked until cancelled
                raise UnsafeArchiveError("<stream>", "truncated archive")  # what the cut stream raises
    assert 0.9 < time.monotonic() - started < 5
    error = caught.value
    assert error.reason == "extract_timeout" and error.exit_code is ExitCode.BAD_ENVIRONMENT
    assert str(error).startswith("extract: the extract phase passed its deadline of 1s (--extract-timeout)")
    assert isinstance(error.__cause__, UnsafeArchiveError)


def test_a_stream_that_keeps_coming_is_cut_by_the_check() -> None:
    chunks = 0
    with pytest.raises(PhaseTimeoutError):
        with PhaseDeadline("extract", 1, flag="--extract-timeout") as deadline:
            while True:  # bytes never stop: nothing blocks, so only the check ends it
                deadline.check()
                chunks += 1
                time.sleep(0.01)
    assert chunks > 10


def test_before_the_deadline_errors_and_results_are_left_alone() -> None:
    with pytest.raises(UnsafeArchiveError):
        with PhaseDeadline("extract", 30, flag="--extract-timeout"):
            raise UnsafeArchiveError("x", "device")
    with PhaseDeadline("baseline", 30, flag="--extract-timeout") as deadline:
        deadline.check()
    assert deadline.remaining() > 0


def test_an_interrupt_past_the_deadline_stays_an_interrupt() -> None:
    with pytest.raises(KeyboardInterrupt):
        with PhaseDeadline("extract", 1, flag="--extract-timeout"):
            time.sleep(1.2)
            raise KeyboardInterrupt



def _ctx(tmp_path: Path, files: int = 50) -> JobContext:
    job = JobRoot.at(tmp_path / "job", "demo_1")
    (job.root / "context").mkdir(parents=True)
    for i in range(files):
        (job.buggy_source / f"d{i % 5}").mkdir(parents=True, exist_ok=True)
        (job.buggy_source / f"d{i % 5}" / f"f{i}.py").write_text(f"x = {i}\n")
    return JobContext(settings=load_settings(tag="demo_1", extract_timeout=2.0), job=job)


def test_a_hung_git_add_is_killed_at_the_baseline_deadline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", f"{hanging_git_dir(tmp_path)}{os.pathsep}{os.environ['PATH']}")
    ctx = _ctx(tmp_path)
    started = time.monotonic()
    with pytest.raises(PhaseTimeoutError) as caught:
        baseline(ctx)
    assert 1.9 < time.monotonic() - started < 15
    assert caught.value.reason == "baseline_timeout" and "baseline phase" in str(caught.value)
    assert "--extract-timeout" in str(caught.value)
    assert git_processes_of(ctx.job.root) == []  # the hung git and its child, killed
    assert not ctx.job.baseline_git_dir.exists()  # no half-made baseline for the rerun to meet
    assert (ctx.job.buggy_source / "d0" / "f0.py").exists()  # the extracted tree is extract's, kept


def test_the_same_baseline_with_a_working_git_is_unaffected(tmp_path: Path) -> None:
    ctx = _ctx(tmp_path)
    result = baseline(ctx)
    assert result.tracked_file_count == 50 and result.baseline_commit
