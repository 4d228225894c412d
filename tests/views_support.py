"""Real job roots for the views' tests: markers written as the pipeline writes them, reduced
by the real reducer, recorded by the real batch ledger; plus private material planted beside
them (a prompt, a patch, a secret, an absolute path) that no view may show.
"""

from __future__ import annotations

import os
import shutil
import signal
import struct
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from reducers.models import Marker, MarkerStatus, Phase, marker_type
from runner.batch import Unit, _row
from runner.tasks.protocol import TaskOutcome
from runner.tasks.supervisor import TaskEnd
from runner.jobroot import JobRoot, written_run
from runner.ledger import RunLedger
from runner.journal import write_marker
from runner.phases.reduce import reduce_job
from runner.public import private_texts_for

IMAGE_ID = "sha256:" + "1" * 64
PROMPT_SENTINEL = "PROMPT-SENTINEL-fix the frobnicator in calc"
PATCH_SENTINEL = "PATCH-SENTINEL-return a + b"
SECRET_NAME = "OPENAI" + "_API_KEY"
SECRET_VALUE = "sk-planted-secret-4242424242"
CHROMIUM = shutil.which("chromium") or ("/usr/bin/chromium" if Path("/usr/bin/chromium").exists() else None)
IN_CI = os.environ.get("CI", "").lower() == "true"
REPO = Path(__file__).resolve().parents[1]


def _marker(phase: Phase, seconds: float, ok: bool = True, reason: str = "ok", exit_code: int | None = None,
            **details) -> Marker:
    return marker_type(phase)(phase=phase, status=MarkerStatus.OK if ok else MarkerStatus.FAILED,
                  started_at="2026-01-01T00:00:00.000+00:00", ended_at="2026-01-01T00:00:01.000+00:00",
                  duration_seconds=seconds, exit_code=exit_code, reason=reason, details=details)


# What each kind of task leaves: (markers up to where it stopped, the batch child's exit code).
KINDS = ("resolved", "unresolved", "agent_failure", "infra_failure", "bad_environment")


def _markers(kind: str, tag: str, scale: float) -> list[Marker]:
    if kind == "bad_environment":
        return []  # refused before prepare: no marker, no compact file
    markers = [
        _marker(Phase.PREPARE, 0.02, tag=tag, image=f"alfin06/agentissue-bench:{tag}"),
        _marker(Phase.PRECHECK, 0.8 * scale, codex_version="codex-cli 0.171.0", image_id=IMAGE_ID),
    ]
    if kind == "infra_failure":
        return markers + [_marker(Phase.EXTRACT, 3.1 * scale, ok=False, reason="docker_error", error_type="APIError")]
    markers += [
        _marker(Phase.EXTRACT, 4.2 * scale, image_id=IMAGE_ID, image_digest=None, oracle_entries_extracted=0),
        _marker(Phase.BASELINE, 1.3 * scale, baseline_commit="a" * 40),
    ]
    tokens = {"input_tokens": int(41000 * scale), "cached_input_tokens": int(30000 * scale),
              "output_tokens": int(2300 * scale)}
    if kind == "agent_failure":
        return markers + [_marker(Phase.CODEX, 600.0, ok=False, reason="codex_timeout", exit_code=None,
                                  timed_out=True, **tokens)]
    markers += [
        _marker(Phase.CODEX, 95.0 * scale, exit_code=0, stdout_sha256="c" * 64, stderr_sha256="d" * 64, **tokens),
        _marker(Phase.PATCH, 0.3, patch_sha256="e" * 64, patch_bytes=680, changed_file_count=2, hunk_count=2),
    ]
    resolved = kind == "resolved"
    return markers + [_marker(
        Phase.EVALUATE, 12.5 * scale, exit_code=0 if resolved else 1, image_id=IMAGE_ID, apply_exit_code=0,
        test_exit_code=0 if resolved else 1, timed_out=False, resolved=resolved, string_verdict=resolved,
        verdicts_disagree=False, network="bridge")]


EXIT = {"resolved": 0, "unresolved": 0, "agent_failure": 1, "infra_failure": 1, "bad_environment": 3}


@dataclass(frozen=True)
class Batch:
    jobs_dir: Path
    kinds: dict[str, str]  # tag -> kind


def make_batch(jobs_dir: Path, kinds: dict[str, str], *, scale: float = 1.0) -> Batch:
    """A jobs dir as ``--execute --jobs-dir`` leaves it, with private files planted in every job root."""
    jobs_dir.mkdir(parents=True, exist_ok=True)
    ledger = RunLedger(jobs_dir, private_texts_for(jobs_dir))
    for tag, kind in kinds.items():
        root = jobs_dir / tag
        (root / "context").mkdir(parents=True, exist_ok=True)
        (root / "context" / "prompt.md").write_text(f"{PROMPT_SENTINEL}\n")
        job = JobRoot.at(root, tag)
        job.patch.parent.mkdir(parents=True, exist_ok=True)
        job.patch.write_text(f"diff --git a/calc.py b/calc.py\n+    {PATCH_SENTINEL}\n")
        job.last_message.write_text(f"I fixed it. {SECRET_VALUE}\n")
        for marker in _markers(kind, tag, scale):
            write_marker(job.markers, marker)
        if kind != "bad_environment":
            reduce_job(job)
        wall = sum(m.duration_seconds for m in _markers(kind, tag, scale)) + 1.5
        outcome = TaskOutcome(exit_code=EXIT[kind], run=written_run(root))
        ledger.upsert(_row(Unit(tag, None, root), TaskEnd(returncode=EXIT[kind], outcome=outcome), wall))
    return Batch(jobs_dir=jobs_dir, kinds=kinds)


def assert_nothing_private(text: str, *private: str) -> None:
    for needle in (PROMPT_SENTINEL, PATCH_SENTINEL, SECRET_VALUE, "diff --git", *private):
        assert needle not in text, f"{needle[:40]!r} leaked into a view"


def chromium_or_skip() -> str:
    if CHROMIUM is None:
        if IN_CI:
            pytest.fail("CI=true and chromium is missing: .ci/run installs Debian's chromium")
        pytest.skip("no chromium on PATH (apt-get install chromium); the browser tests need it")
    return CHROMIUM


def chromium(url: str, user_dir: Path, *extra: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """Headless Debian chromium, with everything that would reach the network off."""
    argv = [CHROMIUM or "chromium", "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
            "--disable-background-networking", "--disable-component-update", "--disable-sync",
            "--hide-scrollbars", f"--user-data-dir={user_dir}", *extra, url]
    # its own process group, so a hung chromium is ended with all its helper processes
    process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               start_new_session=True)
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.communicate()
        raise
    return subprocess.CompletedProcess(argv, process.returncode, stdout, stderr)


def dump_dom(url: str, user_dir: Path) -> str:
    result = chromium(url, user_dir, "--dump-dom", "--virtual-time-budget=2000")
    assert result.returncode == 0, result.stderr[-2000:]
    return result.stdout


def screenshot(url: str, user_dir: Path, out: Path, size: tuple[int, int]) -> tuple[int, int]:
    """A PNG of the rendered page; returns its (width, height) read from the PNG header."""
    result = chromium(url, user_dir, f"--screenshot={out}", f"--window-size={size[0]},{size[1]}")
    assert result.returncode == 0 and out.is_file(), result.stderr[-2000:]
    head = out.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    return struct.unpack(">II", head[16:24])


def keep_for_readme(png: Path, name: str) -> None:
    """With UPDATE_README_SCREENSHOTS=1 the browser run refreshes docs/img/ (the README's pictures)."""
    if os.environ.get("UPDATE_README_SCREENSHOTS") == "1":
        target = REPO / "docs" / "img" / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(png, target)
