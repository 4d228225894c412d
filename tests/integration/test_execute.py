"""``--execute`` on the stub image with the fake codex, against a real Docker Engine."""

from __future__ import annotations

import io
import json
import subprocess
import tarfile
from pathlib import Path

import pytest

from runner.pricing import shipped_rate_card

from reducers.guard import check_public
from runner.gitops import BASELINE_MESSAGE
from tests.conftest import make_job_root, read_json, run_cli, stub_args

pytestmark = [pytest.mark.docker, pytest.mark.usefixtures("no_leaked_containers")]

PUBLIC = ("benchmark_run.compact.json", "benchmark_result.compact.json", "real-result.public.json")
PHASES = ("prepare", "precheck", "extract", "baseline", "codex", "patch", "evaluate", "reduce")


def _git(tree: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(tree), *args], capture_output=True, text=True, check=True).stdout


def test_execute_resolves_and_writes_safe_compact_files(job_root: Path, stub_image: str) -> None:
    done = run_cli("--execute", *stub_args(job_root, stub_image))
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert (report["resolved"], report["verdict_untrusted"]) == (True, False)  # the trust beside the verdict
    noisy = [e for e in (json.loads(line) for line in done.stderr.splitlines() if line.startswith("{"))
             if e.get("level") in ("warning", "error", "critical")]
    assert not noisy, f"a normal run logs no warning: {noisy}"
    run = read_json(job_root / "benchmark_run.compact.json")
    result = read_json(job_root / "benchmark_result.compact.json")
    real = read_json(job_root / "real-result.public.json")
    assert run["schema_version"] == "benchmark_run_v0"
    assert result["schema_version"] == "benchmark_result_v0"
    assert run["official_task_score"] == {"kind": "agentissue_bench_single_tag_container_eval", "resolved": True, "value": 1}
    assert result["terminal_state"] == "resolved"
    assert real["result_summary"]["resolved"] is True
    assert run["apply_exit_code"] == 0 and run["patched_exit_code"] == 0
    assert run["evaluation"]["string_verdict"] is True and run["evaluation"]["verdicts_disagree"] is False
    apply_log = (job_root / "logs" / "eval-apply.log").read_text()
    test_log = (job_root / "logs" / "eval-test.log").read_text()
    assert "Patch applied successfully" in apply_log and "FIX CONFIRMED" not in apply_log
    assert "FIX CONFIRMED" in test_log and "Patch applied" not in test_log
    assert "runner-apply-exit" not in apply_log + test_log
    assert run["changed_file_count"] == 2 and run["added_file_count"] == 1
    assert run["image_id"].startswith("sha256:") and run["validation"]["selected_image_only"] is True
    assert set(run["log_sha256"]) == {
        "codex_stdout", "codex_stderr", "eval_apply", "eval_test", "eval_apply_stderr", "eval_test_stderr"
    }
    assert set(run["phase_durations_seconds"]) == set(PHASES) - {"reduce"}
    prompt_chars = len((job_root / "context" / "prompt.md").read_text())
    assert run["metrics"] == {
        "input_tokens": 2 * (1000 + prompt_chars), "cache_tokens": 500, "output_tokens": 240,
        "cache_write_tokens": 0, "reasoning_tokens": 0,
        # the fake codex names no model: its cost is unknown (not a made-up 0), on the shipped card
        "cost_usd": None, "cost_known": False, "rate_card_sha256": shipped_rate_card().sha256,
    }
    assert run["codex"]["version"] == "codex-cli 0.0.0-fake"
    for name in PUBLIC:
        text = (job_root / name).read_text()
        assert str(job_root) not in text and "diff --git" not in text
        check_public(name, read_json(job_root / name), private_texts=[str(job_root)])
    for phase in PHASES:
        assert read_json(job_root / "result-markers" / f"{phase}.json")["status"] == "ok"

    patch = (job_root / "Patches" / "stub_calc" / "attempt.patch").read_text()
    assert "--- /dev/null\n+++ b/calc/_impl.py" in patch
    assert "--- a/calc/mathops.py\n+++ b/calc/mathops.py" in patch
    assert (job_root / "codex-last-message.txt").read_text().startswith("fake codex finished")


def test_extracted_tree_holds_no_oracle(job_root: Path, stub_image: str, docker_client) -> None:
    done = run_cli("--execute", *stub_args(job_root, stub_image))
    assert done.returncode == 0, done.stderr
    source = job_root / "buggy-source"
    # The only history is the runner's own single baseline commit: the image's .git
    # (whose branch main holds the fix) never came out.
    assert _git(source, "log", "--all", "--format=%s").splitlines() == [BASELINE_MESSAGE]
    baseline_files = set(_git(source, "ls-tree", "-r", "--name-only", "HEAD").splitlines())
    assert baseline_files == {".gitignore", "README.md", "assets/logo.bin", "calc/__init__.py", "calc/mathops.py"}
    assert "add_impl" not in _git(source, "show", "HEAD:calc/mathops.py")
    assert not list(job_root.rglob("source_code_fixed")) and not list(job_root.rglob("reproduce.py"))
    # The binary file came out byte for byte.
    image_bytes = _image_file(docker_client, stub_image, "/app/source_code_buggy/assets/logo.bin")
    assert (source / "assets" / "logo.bin").read_bytes() == image_bytes


def _image_file(client, image: str, path: str) -> bytes:
    container = client.containers.create(image, labels={"purpose": "test-read-image-file"})
    try:
        stream, _ = container.get_archive(path)
        with tarfile.open(fileobj=io.BytesIO(b"".join(stream))) as archive:
            member = archive.getmembers()[0]
            return archive.extractfile(member).read()  # type: ignore[union-attr]
    finally:
        container.remove(force=True)


def test_wrong_fix_ends_unresolved(tmp_path: Path, stub_image: str) -> None:
    job = make_job_root(tmp_path, "Fix calc.add.\nfake-codex-mode: wrong-fix\n")
    done = run_cli("--execute", *stub_args(job, stub_image))
    assert done.returncode == 0, done.stderr
    run = read_json(job / "benchmark_run.compact.json")
    assert run["official_task_score"]["resolved"] is False
    assert run["apply_exit_code"] == 0 and run["patched_exit_code"] not in (0, None)
    assert run["failure_attribution_labels"] == ["unresolved_single_tag_eval_compact_result"]
    assert run["evaluation"]["string_verdict"] is False
    assert read_json(job / "benchmark_result.compact.json")["terminal_state"] == "evaluated_unresolved"


def test_no_change_ends_with_the_empty_patch_failure(tmp_path: Path, stub_image: str) -> None:
    job = make_job_root(tmp_path, "Fix calc.add.\nfake-codex-mode: no-change\n")
    done = run_cli("--execute", *stub_args(job, stub_image))
    assert done.returncode == 1, done.stderr
    assert "empty" in done.stderr
    run = read_json(job / "benchmark_run.compact.json")
    assert run["first_failed_phase"] == "patch"
    assert run["failure_attribution_labels"] == ["failed_patch_empty_patch"]
    assert run["evaluation"]["ran"] is False
    assert read_json(job / "result-markers" / "patch.json")["reason"] == "empty_patch"
    assert not (job / "result-markers" / "evaluate.json").exists()
    assert (job / "real-result.public.json").exists()


def test_eval_container_keeps_image_env_and_workdir_and_gets_only_placeholders(
    job_root: Path, stub_image: str
) -> None:
    probe = (
        'test "$STUB_TASK" = calc_add && test "$PWD" = /app && test "$OPENAI_API_KEY" = api-key '
        '&& test "$OPENAI_API_BASE" = api-base-url && ! test -e /markers '
        "&& /usr/local/bin/run_test_entrypoint.sh test_patched"
    )
    done = run_cli(
        "--execute", *stub_args(job_root, stub_image, "--test-cmd", probe, "--eval-network", "none"),
        env={"OPENAI_API_KEY": "sk-host-real-secret-value"},
    )
    assert done.returncode == 0, done.stderr
    run = read_json(job_root / "benchmark_run.compact.json")
    assert run["official_task_score"]["resolved"] is True
    assert run["evaluation"]["network"] == "none"
    for name in PUBLIC:
        assert "sk-host-real-secret-value" not in (job_root / name).read_text()
    assert "sk-host-real-secret-value" not in done.stderr + done.stdout


def test_reduce_reproduces_the_compact_outputs(job_root: Path, stub_image: str) -> None:
    assert run_cli("--execute", *stub_args(job_root, stub_image)).returncode == 0
    written = {name: (job_root / name).read_bytes() for name in PUBLIC}
    for name in PUBLIC:
        (job_root / name).unlink()
    done = run_cli("--reduce", "--job-root", str(job_root), env={"DOCKER_HOST": "unix:///nonexistent.sock"})
    assert done.returncode == 0, done.stderr
    for name in PUBLIC:
        assert (job_root / name).read_bytes() == written[name], name


def test_rerun_resumes_from_ok_markers(job_root: Path, stub_image: str) -> None:
    assert run_cli("--execute", *stub_args(job_root, stub_image)).returncode == 0
    markers = job_root / "result-markers"
    before = {p.name: read_json(p)["started_at"] for p in markers.glob("*.json")}
    (markers / "evaluate.json").unlink()
    done = run_cli("--execute", *stub_args(job_root, stub_image))
    assert done.returncode == 0, done.stderr
    after = {p.name: read_json(p)["started_at"] for p in markers.glob("*.json")}
    for name in ("prepare.json", "precheck.json", "extract.json", "baseline.json", "codex.json", "patch.json"):
        assert after[name] == before[name], f"{name} was rerun"
    assert after["evaluate.json"] != before["evaluate.json"]
    assert done.stderr.count('"phase_skipped"') == 6
    assert read_json(job_root / "benchmark_run.compact.json")["official_task_score"]["resolved"] is True


def test_missing_source_dir_names_the_flag(job_root: Path, stub_image: str) -> None:
    done = run_cli("--execute", *stub_args(job_root, stub_image, "--source-dir", "/app/nowhere"))
    assert done.returncode == 3
    assert "--source-dir" in done.stderr
    run = read_json(job_root / "benchmark_run.compact.json")
    assert run["first_failed_phase"] == "precheck"
    assert not (job_root / "buggy-source").exists()
