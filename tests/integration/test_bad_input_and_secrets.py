"""Bad input refused before any work, hostile images, corrupt compact inputs, and secrets that never leak."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from tests.conftest import FAKE_CODEX, make_job_root, read_json, run_cli, stub_args

pytestmark = [pytest.mark.docker, pytest.mark.usefixtures("no_leaked_containers")]


def _hostile_args(job: Path, image: str, source: str) -> list[str]:
    return ["--job-root", str(job), "--tag", "hostile", "--image", image, "--codex-bin", str(FAKE_CODEX),
            "--source-dir", f"/app/hostile/{source}"]


@pytest.mark.parametrize(
    ("source", "why"),
    [
        ("abs_symlink", "AbsoluteLinkError"),
        ("escape_symlink", "LinkOutsideDestinationError"),
        ("device", "special file"),
        ("fifo", "special file"),
    ],
)
def test_a_hostile_tree_is_refused_and_nothing_lands(tmp_path: Path, hostile_image: str, source: str, why: str) -> None:
    job = make_job_root(tmp_path)
    before = sorted(str(p) for p in tmp_path.rglob("*"))
    done = run_cli("--execute", *_hostile_args(job, hostile_image, source))
    assert done.returncode == 1, done.stderr
    assert why in done.stderr and "not safe to extract" in done.stderr
    marker = read_json(job / "result-markers" / "extract.json")
    assert marker["status"] == "failed" and marker["reason"] == "unsafe_archive_entry"
    assert not (job / "buggy-source").exists() and not list(job.glob(".buggy-source*"))
    assert read_json(job / "benchmark_run.compact.json")["failure_attribution_labels"] == [
        "failed_extract_unsafe_archive_entry"
    ]
    created = sorted(str(p) for p in tmp_path.rglob("*"))
    assert all(path.startswith(str(job)) for path in set(created) - set(before))


def test_setuid_bits_and_nested_histories_do_not_come_out(tmp_path: Path, hostile_image: str) -> None:
    for source in ("setuid", "nested_git", "hardlink_out"):
        job = make_job_root(tmp_path / source, "fake-codex-mode: no-change\n")
        done = run_cli("--execute", *_hostile_args(job, hostile_image, source))
        assert read_json(job / "result-markers" / "extract.json")["status"] == "ok", done.stderr
        tree = job / "buggy-source"
        if source == "setuid":
            mode = (tree / "tool").stat().st_mode
            assert not mode & (stat.S_ISUID | stat.S_ISGID)
        if source == "nested_git":
            assert not (tree / "vendor" / "lib" / ".git").exists()
            assert read_json(job / "result-markers" / "extract.json")["details"]["oracle_entries_skipped"] >= 2
            # the only .git is the runner's own baseline repository
            assert (tree / ".git" / "HEAD").is_file()
        if source == "hardlink_out":
            assert (tree / "hostname_hardlink").is_file() and not (tree / "hostname_hardlink").is_symlink()


def test_a_non_empty_buggy_source_without_baseline_is_refused(job_root: Path, stub_image: str) -> None:
    work = job_root / "buggy-source" / "someones_work.py"
    work.parent.mkdir()
    work.write_text("precious = True\n")
    done = run_cli("--execute", *stub_args(job_root, stub_image))
    assert done.returncode == 2, done.stderr
    assert "not empty" in done.stderr and "move it aside" in done.stderr
    assert work.read_text() == "precious = True\n"
    assert sorted(p.name for p in (job_root / "buggy-source").iterdir()) == ["someones_work.py"]


@pytest.mark.parametrize(
    ("file", "edit", "named"),
    [
        ("result-markers/codex.json", lambda d: d.update(status="great"), "result-markers/codex.json: status"),
        ("result-markers/evaluate.json", lambda d: d["details"].update(resolved=[1]), "result-markers/evaluate.json: details"),
        ("result-markers/patch.json", None, "result-markers/patch.json: <root>: not readable JSON"),
    ],
)
def test_corrupt_markers_fed_to_reduce_are_named(job_root: Path, stub_image: str, file: str, edit, named: str) -> None:
    assert run_cli("--execute", *stub_args(job_root, stub_image)).returncode == 0
    target = job_root / file
    if edit is None:
        target.write_text('{"phase": "patch", ')
    else:
        data = json.loads(target.read_text())
        edit(data)
        target.write_text(json.dumps(data))
    public_before = (job_root / "real-result.public.json").read_bytes()
    done = run_cli("--reduce", "--job-root", str(job_root))
    assert done.returncode == 2
    assert named in done.stderr
    assert (job_root / "real-result.public.json").read_bytes() == public_before  # nothing lost


def test_planted_secrets_reach_no_public_file_log_or_container(tmp_path: Path, stub_image: str) -> None:
    home = tmp_path / "home"
    (home / ".codex").mkdir(parents=True)
    secrets = {
        "OPENAI_API_KEY": "sk-planted-openai-0123456789",
        "CODEX_ACCESS_TOKEN": "planted-codex-token-abcdef",
        "AWS_SECRET_ACCESS_KEY": "planted-aws-secret-xyz987",
    }
    auth_token = "planted-auth-json-token-555"
    (home / ".codex" / "auth.json").write_text(json.dumps({"tokens": {"access_token": auth_token}}))
    job = make_job_root(tmp_path)
    dump = "env; ls -la /root/.codex 2>&1; cat /root/.codex/auth.json 2>&1; /usr/local/bin/run_test_entrypoint.sh test_patched"
    done = run_cli("--execute", *stub_args(job, stub_image, "--test-cmd", dump), env={**secrets, "HOME": str(home)})
    assert done.returncode == 0, done.stderr
    planted = [*secrets.values(), auth_token]
    seen_by_container = (job / "logs" / "eval-test.log").read_text()
    assert "OPENAI_API_KEY=api-key" in seen_by_container  # the official placeholder only
    for value in planted:
        assert value not in seen_by_container, "a host secret reached the evaluation container"
        assert value not in done.stdout and value not in done.stderr, "a secret reached the logs"
        for name in ("benchmark_run.compact.json", "benchmark_result.compact.json", "real-result.public.json"):
            assert value not in (job / name).read_text()
        for marker in (job / "result-markers").iterdir():
            assert value not in marker.read_text()
    assert str(home) not in done.stderr and os.fspath(job) not in (job / "real-result.public.json").read_text()
