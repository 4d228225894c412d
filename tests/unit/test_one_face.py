"""The runner's one face for a newcomer: every command in --help, no flag taken by its prefix, the
closest flag named for a typo, and --jobs-dir treated the same way by every command that takes it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from runner.entry import COMMANDS
from tests.conftest import run_cli

NO_DOCKER = {"DOCKER_HOST": "unix:///nonexistent/docker.sock"}


def test_help_lists_every_command_with_its_line() -> None:
    done = run_cli("--help")
    assert done.returncode == 0
    for command in COMMANDS.values():
        line = f"  {command.name}"
        if command.hidden:
            assert f"{line}  " not in done.stdout
        else:
            assert any(row.strip().startswith(command.name) and command.summary in row for row in done.stdout.splitlines())
    for name in ("worker", "submit", "status", "cancel", "report", "audit"):
        assert name in COMMANDS and not COMMANDS[name].hidden


@pytest.mark.parametrize(
    ("argv", "typed", "meant"),
    [
        (["--precheck", "--eval-timout", "3"], "--eval-timout", "--eval-timeout"),
        (["submit", "--broker", "redis://127.0.0.1:1/0", "--suite", "s", "--prompts-dir", ".", "--modle", "m"],
         "--modle", "--model"),
        (["worker", "--broker", "redis://127.0.0.1:1/0", "--jobs-dir", ".", "--slot", "2"], "--slot", "--slots"),
        (["report", "--out", "r.html", "--jobs-dri", "."], "--jobs-dri", "--jobs-dir"),
    ],
)
def test_a_mistyped_flag_names_the_closest_real_one(argv: list[str], typed: str, meant: str) -> None:
    done = run_cli(*argv, env=NO_DOCKER)
    assert done.returncode == 2
    assert f"{typed}: did you mean {meant}?" in done.stderr


@pytest.mark.parametrize("argv", [["--precheck", "--agent-use", "bob"], ["--execute", "--job", "/tmp/j"],
                                  ["worker", "--broker", "redis://127.0.0.1:1/0", "--jobs-dir", ".", "--heartbeat", "3"]])
def test_no_flag_is_taken_by_its_prefix(argv: list[str]) -> None:
    """argparse's abbreviations read --agent-use X as --agent-user X; here an unknown flag is an error."""
    done = run_cli(*argv, env=NO_DOCKER)
    assert done.returncode == 2 and "unrecognized arguments" in done.stderr


def test_every_command_creates_a_missing_jobs_dir(tmp_path: Path) -> None:
    batch = tmp_path / "batch" / "jobs"
    done = run_cli("--execute", "--jobs-dir", str(batch), "--tag", "t_1", "--codex-bin", "codex", env=NO_DOCKER)
    assert batch.is_dir() and json.loads(done.stdout)["ran"] == 1  # the task itself is refused: no prompt
    report = tmp_path / "report" / "jobs"
    done = run_cli("report", "--jobs-dir", str(report), "--out", str(tmp_path / "r.html"))
    assert report.is_dir() and done.returncode == 2 and "no run-ledger.json" in done.stderr
    audit = tmp_path / "audit" / "jobs"
    done = run_cli("audit", "--tag", "t_1", "--jobs-dir", str(audit), env=NO_DOCKER)
    assert audit.is_dir() and done.returncode == 3  # then it needs Docker, and says so
    assert "Traceback" not in done.stderr
