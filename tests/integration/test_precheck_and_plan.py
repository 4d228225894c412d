"""``--precheck`` (the health probe) and plan mode, against a real Docker Engine."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import FAKE_CODEX, run_cli

pytestmark = [pytest.mark.docker, pytest.mark.usefixtures("no_leaked_containers")]

CHECKS = [
    "codex_binary",
    "codex_login",
    "git_binary",
    "docker_daemon",
    "image_present",
    "image_has_source_dir",
    "entrypoint_knows_apply_patch",
    "entrypoint_knows_test_patched",
    "tag_scorable",
]


def _precheck(*args: str, env: dict[str, str] | None = None) -> tuple[int, dict]:
    done = run_cli("--precheck", *args, env=env)
    return done.returncode, json.loads(done.stdout)


def test_precheck_healthy(stub_image: str) -> None:
    code, report = _precheck("--image", stub_image, "--codex-bin", str(FAKE_CODEX))
    assert code == 0
    assert report["healthy"] is True
    assert [check["name"] for check in report["checks"]] == CHECKS
    assert all(check["ok"] for check in report["checks"])
    assert report["codex_version"] == "codex-cli 0.0.0-fake"


def test_precheck_from_the_reference_environment_variables(stub_image: str) -> None:
    code, report = _precheck(env={"PRECHECK_ONLY": "1", "IMAGE": stub_image, "CODEX_BIN": str(FAKE_CODEX)})
    assert code == 0 and report["image"] == stub_image


def test_precheck_unhealthy_for_a_missing_image(docker_client) -> None:
    code, report = _precheck("--image", "agentissue-runner-absent:none", "--codex-bin", str(FAKE_CODEX))
    assert code == 3
    assert report["healthy"] is False
    failed = {check["name"]: check["detail"] for check in report["checks"] if not check["ok"]}
    assert list(failed) == ["image_present"]
    assert "--allow-pull" in failed["image_present"]


def test_precheck_unhealthy_for_a_missing_codex(stub_image: str, tmp_path: Path) -> None:
    code, report = _precheck("--image", stub_image, "--codex-bin", str(tmp_path / "no-codex-here"))
    assert code == 3
    failed = [check["name"] for check in report["checks"] if not check["ok"]]
    assert failed == ["codex_binary", "codex_login"]  # the login cannot be asked without codex
    assert report["codex_version"] is None


def test_precheck_unhealthy_for_a_wrong_source_dir(stub_image: str) -> None:
    code, report = _precheck("--image", stub_image, "--codex-bin", str(FAKE_CODEX), "--source-dir", "/app/missing")
    assert code == 3
    failed = {check["name"]: check["detail"] for check in report["checks"] if not check["ok"]}
    assert list(failed) == ["image_has_source_dir"] and "--source-dir" in failed["image_has_source_dir"]


def test_plan_mode_creates_no_container_and_no_file(docker_client, tmp_path: Path) -> None:
    before = {c.id for c in docker_client.containers.list(all=True)}
    job = tmp_path / "job"
    done = run_cli("--job-root", str(job), "--tag", "lagent_239")
    assert done.returncode == 0, done.stderr
    plan = json.loads(done.stdout)
    assert [p["phase"] for p in plan["phases"]] == [
        "prepare", "precheck", "extract", "baseline", "codex", "patch", "evaluate", "reduce"
    ]
    assert plan["image"] == "alfin06/agentissue-bench:lagent_239"
    codex = next(p for p in plan["phases"] if p["phase"] == "codex")["argv"]
    assert codex[-1] == "-" and "--add-dir" not in codex and "buggy-source" in codex
    assert plan["job_root_layout"]["patch"] == "Patches/lagent_239/attempt.patch"
    assert not job.exists() and list(tmp_path.iterdir()) == []
    # Nothing new (a container of an earlier test may still be going away meanwhile).
    assert {c.id for c in docker_client.containers.list(all=True)} - before == set()
    assert str(tmp_path) not in done.stdout
