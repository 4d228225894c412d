"""The official score, tag profiles, early refusals, the network fact and the gold-patch audit,
on the stub image and its variants (containers/variants), against a real Docker Engine."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from tests.conftest import make_job_root, read_json, run_cli, stub_args

pytestmark = [pytest.mark.docker, pytest.mark.usefixtures("no_leaked_containers")]

NO_NET = ("--eval-network", "none")


def _audit(*args: str) -> tuple[int, dict, str]:
    done = run_cli("audit", *args)
    return done.returncode, (json.loads(done.stdout) if done.stdout.strip() else {}), done.stderr


# --- the official score ----------------------------------------------------------------------

@pytest.mark.parametrize(
    ("variant", "where"),
    [
        ("stderr_only", "the success string is on stderr only"),
        ("failed_exit0", "stdout says FAILED with exit 0"),
        ("unlisted_string", "a success line that is not in the official list"),
        ("no_string", "exit 0 and no string"),
    ],
)
def test_exit_zero_without_the_official_strings_is_not_resolved(
    tmp_path: Path, variant_image, variant: str, where: str
) -> None:
    job = make_job_root(tmp_path)
    done = run_cli("--execute", *stub_args(job, variant_image(variant), *NO_NET))
    assert done.returncode == 0, done.stderr
    run = read_json(job / "benchmark_run.compact.json")
    assert run["official_task_score"]["resolved"] is False, where
    assert run["evaluation"]["exit_code_verdict"] is True, where
    assert run["evaluation"]["verdicts_disagree"] is True
    assert run["apply_exit_code"] == 0 and run["patched_exit_code"] == 0
    assert read_json(job / "real-result.public.json")["result_summary"]["resolved"] is False
    assert read_json(job / "benchmark_result.compact.json")["terminal_state"] == "evaluated_unresolved"
    assert {"eval_apply_stderr", "eval_test_stderr"} <= set(run["log_sha256"])
    if variant == "stderr_only":  # the streams stayed apart all the way
        assert "FIX CONFIRMED" in (job / "logs" / "eval-test.stderr.log").read_text()
        assert "FIX CONFIRMED" not in (job / "logs" / "eval-test.log").read_text()


def test_the_stub_resolves_by_the_official_rule_and_records_the_network(job_root: Path, stub_image: str) -> None:
    done = run_cli("--execute", *stub_args(job_root, stub_image, *NO_NET))
    assert done.returncode == 0, done.stderr
    run = read_json(job_root / "benchmark_run.compact.json")
    assert run["official_task_score"]["resolved"] is True
    evaluation = run["evaluation"]
    assert evaluation["exit_code_verdict"] is True and evaluation["verdicts_disagree"] is False
    assert evaluation["network"] == "none" and evaluation["network_reachable"] is False
    assert evaluation["network_probe"] == "skipped_network_none"
    assert evaluation["verdict_untrusted"] is False  # stub_calc has no profile: nothing says it needs the network
    assert evaluation["apply_seconds"] >= 0 and evaluation["test_seconds"] > 0
    assert run["validation"]["verdict_from_official_rule"] is True
    assert run["scorability"] == {"tag_profile": None, "refusal": None, "unscorable_override": False}


def test_the_network_probe_goes_through_the_evaluations_network_mode(stub_image: str, docker_client) -> None:
    from runner.docker_utils import runner_labels
    from runner.network_probe import probe_network

    labels = runner_labels(job_id="probe-test", run_id="probe-test", phase="evaluate")
    image_id = docker_client.images.get(stub_image).id
    bridge = probe_network(docker_client, image_id=image_id, network="bridge", labels=labels)
    assert bridge.detail in ("reachable", "unreachable") and bridge.reachable is (bridge.detail == "reachable")
    none = probe_network(docker_client, image_id=image_id, network="none", labels=labels)
    assert (none.reachable, none.detail) == (False, "skipped_network_none")


# --- refusing early ----------------------------------------------------------------------------

def test_precheck_refuses_a_tag_whose_profile_says_apply_never_returns(stub_image: str) -> None:
    done = run_cli("--precheck", "--tag", "crewai_2102", "--image", stub_image, "--codex-bin", "true")
    assert done.returncode == 3, done.stderr
    report = json.loads(done.stdout)
    assert report["healthy"] is False and report["refusal"] == "apply_never_returns"
    assert report["tag_profile"] == "crewai_2102"
    scorable = next(c for c in report["checks"] if c["name"] == "tag_scorable")
    assert scorable["ok"] is False and "--allow-unscorable" in scorable["detail"]
    allowed = run_cli("--precheck", "--tag", "crewai_2102", "--image", stub_image, "--codex-bin", "true",
                      "--allow-unscorable")
    assert allowed.returncode == 0, allowed.stdout
    assert json.loads(allowed.stdout)["unscorable_override"] is True


def test_precheck_refuses_an_image_without_apply_patch(variant_image) -> None:
    done = run_cli("--precheck", "--tag", "some_tag", "--image", variant_image("no_apply"), "--codex-bin", "true")
    assert done.returncode == 3
    assert json.loads(done.stdout)["refusal"] == "layout_unsupported: no apply_patch"


def test_execute_refuses_before_codex_and_the_override_is_recorded(tmp_path: Path, stub_image: str) -> None:
    refused = make_job_root(tmp_path / "refused")
    done = run_cli("--execute", *stub_args(refused, stub_image, *NO_NET)[:2], "--tag", "crewai_2102",
                   "--image", stub_image, "--codex-bin", stub_args(refused, stub_image)[-1])
    assert done.returncode == 3, done.stderr
    assert "apply_never_returns" in done.stderr
    assert not (refused / "result-markers" / "codex.json").exists()  # no token spent
    run = read_json(refused / "benchmark_run.compact.json")
    assert run["first_failed_phase"] == "precheck" and run["codex"]["invoked"] is False
    assert run["scorability"]["refusal"] == "apply_never_returns"
    assert run["scorability"]["unscorable_override"] is False

    # Overridden: it runs; its profile says it needs the network, evaluated without: untrusted.
    allowed = make_job_root(tmp_path / "allowed")
    done = run_cli("--execute", "--job-root", str(allowed), "--tag", "crewai_2102", "--image", stub_image,
                   "--codex-bin", stub_args(allowed, stub_image)[-1], "--allow-unscorable", *NO_NET)
    assert done.returncode == 0, done.stderr
    run = read_json(allowed / "benchmark_run.compact.json")
    assert run["scorability"] == {"tag_profile": "crewai_2102", "refusal": "apply_never_returns",
                                  "unscorable_override": True}
    assert run["official_task_score"]["resolved"] is True
    assert run["verdict_untrusted"] is True and run["evaluation"]["needs_network"] is True
    assert run["evaluation"]["network_reachable"] is False


def test_a_profile_supplies_the_entrypoint_and_a_flag_wins(tmp_path: Path, variant_image) -> None:
    image = variant_image("opt_entrypoint")  # the entrypoint in /opt, as gpt-researcher_1027's
    job = make_job_root(tmp_path)
    done = run_cli("--execute", "--job-root", str(job), "--tag", "gpt-researcher-1027", "--image", image,
                   "--codex-bin", stub_args(job, image)[-1], *NO_NET)
    assert done.returncode == 0, done.stderr
    assert read_json(job / "benchmark_run.compact.json")["official_task_score"]["resolved"] is True
    unknown = run_cli("--precheck", "--tag", "unknown_1", "--image", image, "--codex-bin", "true")
    assert unknown.returncode == 3 and json.loads(unknown.stdout)["refusal"] == "layout_unsupported: no apply_patch"
    flag = run_cli("--precheck", "--tag", "gpt-researcher_1027", "--image", image, "--codex-bin", "true",
                   "--apply-cmd", "/usr/local/bin/run_test_entrypoint.sh apply_patch /patches/attempt.patch")
    assert flag.returncode == 3 and json.loads(flag.stdout)["refusal"] == "layout_unsupported: no apply_patch"


# --- the gold-patch audit ----------------------------------------------------------------------

@pytest.mark.parametrize(
    ("variant", "extra", "label", "reason"),
    [
        (None, (), "valid", "gold patch passes"),
        ("fixed_plain", (), "valid", "gold patch passes"),
        ("tree_oddities", (), "valid", "gold patch passes"),
        ("no_fixed", (), "layout_unsupported", "no fixed tree"),
        ("no_apply", (), "layout_unsupported", "layout_unsupported: no apply_patch"),
        ("apply_ignores", (), "gold_fails", "apply failed"),
        ("stderr_only", (), "gold_fails", "stdout fails the official string rule"),
        ("offline_lies", (), "empty_passes", "empty patch passes"),
        ("apply_hangs", ("--eval-timeout", "4"), "apply_hangs", "did not return"),
    ],
)
def test_audit_labels(
    tmp_path: Path, stub_image: str, variant_image, variant: str | None, extra: tuple, label: str, reason: str
) -> None:
    image = variant_image(variant) if variant else stub_image
    code, report, stderr = _audit("--tag", "stub_calc", "--image", image, *NO_NET, *extra)
    assert code == 0, stderr
    row = report["rows"][0]
    assert report["audit"] == {"stub_calc": label} and row["audit"] == label
    assert reason in row["reason"]
    text = json.dumps(report)
    assert "add_impl" not in text and "diff --git" not in text  # the gold patch stays private
    if label in ("valid", "gold_fails", "empty_passes"):
        assert len(row["gold_patch_sha256"]) == 64 and row["gold_patch_bytes"] > 0
        assert row["empty"]["apply_seconds"] is not None and row["gold"]["test_seconds"] is not None
    if label == "valid":
        assert row["empty"]["official"] is False and row["gold"]["official"] is True
        plain = variant in ("fixed_plain", "tree_oddities")
        assert row["gold_source"] == ("fixed_tree_diff" if plain else "fixed_tree_commit")


def _in_image(docker_client, image: str, script: str) -> tuple[int, bytes]:
    """A script in a throw-away container of the image, as an operator would run it by hand."""
    container = docker_client.containers.create(image, entrypoint=["/bin/bash", "-c", script], network_disabled=True)
    try:
        container.start()
        code = container.wait(timeout=120)["StatusCode"]
        return code, container.logs(stdout=True, stderr=False)
    finally:
        container.remove(force=True)


def test_the_gold_patch_is_the_whole_git_diff_of_the_fix(stub_image: str, docker_client) -> None:
    """Byte for byte the ``git diff BUGGY FIXED`` an operator gets with the patch phase's options
    (full blob ids: the abbreviated ones are why a gold patch once came out 132 bytes short)."""
    from runner.phases.patch import DIFF_OPTIONS

    code, report, stderr = _audit("--tag", "stub_calc", "--image", stub_image, *NO_NET)
    assert code == 0, stderr
    row = report["rows"][0]
    rc, by_hand = _in_image(docker_client, stub_image, ". /app/commits.env && cd /app/source_code_buggy && "
                            f"git diff {' '.join(DIFF_OPTIONS)} $STUB_BUGGY_COMMIT $STUB_FIXED_COMMIT")
    assert rc == 0 and by_hand.startswith(b"diff --git a/calc/_impl.py")
    assert row["gold_patch_bytes"] == len(by_hand)
    assert row["gold_patch_sha256"] == hashlib.sha256(by_hand).hexdigest()
    assert row["gold_patch_counts"] == {"changed_file_count": 2, "added_file_count": 1, "deleted_file_count": 0,
                                        "hunk_count": 2, "binary_change_count": 0, "sensitive_file_count": 0}


def test_a_symlink_spaces_and_binaries_in_a_plain_fixed_tree(variant_image, docker_client) -> None:
    """The old tree diff (``diff -ruN``) follows the in-tree symlink, and GNU patch refuses its hunk;
    the gold patch keeps the link a link, carries the spaced name and the deletion, and applies."""
    image = variant_image("tree_oddities")
    code, report, stderr = _audit("--tag", "stub_calc", "--image", image, *NO_NET)
    assert code == 0, stderr
    row = report["rows"][0]
    assert row["audit"] == "valid" and row["gold_source"] == "fixed_tree_diff", row
    assert row["gold_patch_counts"] == {"changed_file_count": 4, "added_file_count": 1, "deleted_file_count": 1,
                                        "hunk_count": 4, "binary_change_count": 0, "sensitive_file_count": 0}
    rc, out = _in_image(docker_client, image, "mkdir /tmp/d && cd /tmp/d && ln -s /app/source_code_buggy a && "
                        "ln -s /app/source_code_fixed b && diff -ruN -x .git a/ b/ > /tmp/p; "
                        "cd /app/source_code_buggy && patch -p1 --batch --forward < /tmp/p")
    assert rc != 0 and b"not a regular file" in out  # what the audit used to do labels it gold_fails


def test_audit_of_a_profile_known_hang_runs_nothing(stub_image: str) -> None:
    code, report, stderr = _audit("--tag", "crewai_2102", "--image", stub_image)
    assert code == 0, stderr
    assert report["rows"][0]["audit"] == "apply_hangs" and report["rows"][0]["reason"] == "profile: apply_never_returns"
    assert report["rows"][0]["empty"] is None
    code, report, stderr = _audit("--tag", "ai_2705", "--image", stub_image)  # no official success string
    assert code == 0, stderr
    assert report["audit"] == {"ai_2705": "gold_fails"} and report["rows"][0]["reason"] == "profile: no_official_success_string"


def test_audit_of_many_tags_keeps_a_ledger(tmp_path: Path, stub_image: str) -> None:
    jobs = tmp_path / "jobs"
    jobs.mkdir()
    tags = tmp_path / "tags.txt"
    tags.write_text("ai_5380\nunknown_tag_1\n")  # profile: no apply_patch; no image for the second
    code, report, _stderr = _audit("--tags-file", str(tags), "--jobs-dir", str(jobs))
    assert code == 3  # one tag could not be audited on this host: said, not hidden
    assert report["audit"] == {"ai_5380": "layout_unsupported", "unknown_tag_1": "not_audited"}
    ledger = read_json(jobs / "audit-ledger.json")
    assert ledger["audit"] == report["audit"] and ledger["schema_version"] == "agentissue_gold_patch_audit_v0"
    markdown = (jobs / "audit-ledger.md").read_text()
    assert "| ai_5380 | layout_unsupported | profile: layout_unsupported: no apply_patch |" in markdown
    assert "| unknown_tag_1 | not_audited | image_missing |" in markdown
    # One more tag, into the same ledger: upserted, not rewritten from scratch.
    code, _report, stderr = _audit("--tag", "stub_calc", "--image", stub_image, "--jobs-dir", str(jobs), *NO_NET)
    assert code == 0, stderr
    assert read_json(jobs / "audit-ledger.json")["audit"] == {
        "ai_5380": "layout_unsupported", "stub_calc": "valid", "unknown_tag_1": "not_audited"
    }
    assert str(tmp_path) not in (jobs / "audit-ledger.json").read_text()
