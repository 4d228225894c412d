"""The official rule to the letter, the shipped tag profiles, their precedence, and the audit's records."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from reducers.compact import reduce_markers
from runner.audit import AuditLedger, AuditRow, EvalFacts, read_audit_labels
from runner.batch import BatchSummary
from runner.profiles import DEFECTS, list_tags, profile_for, profile_table
from runner.settings import DEFAULT_APPLY_CMD
from runner.tasks.spec import load_settings, read_operator, resolve
from runner.verdict import SUCCESS_STRINGS, official_verdict
from tests.conftest import run_cli
from tests.unit.test_reducers import _marker, _run_until
from reducers.models import Phase

_REPO = Path(__file__).resolve().parents[2]
# The tag survey, where this workspace keeps it beside the clone (optional: the count holds without it).
_SURVEY_PARTS = ("sha" + "red", "reference", "agentissue_tags.md")  # spelt apart: the clone must not point outside
SURVEY = next((p.joinpath(*_SURVEY_PARTS) for p in (_REPO.parent, _REPO.parent.parent)
               if p.joinpath(*_SURVEY_PARTS).is_file()), None)


def _logs(tmp_path: Path, *texts: str) -> list[Path]:
    paths = []
    for index, text in enumerate(texts):
        path = tmp_path / f"stdout{index}.log"
        path.write_text(text)
        paths.append(path)
    return paths


# --- the official rule ----------------------------------------------------------------------

@pytest.mark.parametrize(
    ("exit_code", "apply", "test", "expected"),
    [
        (0, "applied\n", "FIX CONFIRMED\n", True),
        (1, "applied\n", "FIX CONFIRMED\n", False),  # exit code first
        (None, "applied\n", "FIX CONFIRMED\n", False),  # killed at the deadline
        (0, "applied\n", "FIX CONFIRMED\n1 FAILED\n", False),  # FAILED anywhere in stdout
        (0, "patch FAILED to stat\n", "FIX CONFIRMED\n", False),  # apply's stdout counts too
        (0, "applied\n", "--- Test script executed successfully (exit code 0) ---\n", False),  # not in the list
        (0, "applied\n", "", False),  # exit 0, no string
        (0, "applied\n", "fix confirmed\npatched succeeded\n", False),  # case-sensitive; the copy's extra string is not official
        (0, "PATCH SUCCEEDED\n", "all good\n", True),  # apply's stdout is the command's stdout too
        (0, "...FIX CON", "FIRMED\n", True),  # one stream: a string cut between apply and test
        (0, "FIX CONFIRMED FAI", "LED\n", False),
        *[(0, "", f"✅ {s}\n", True) for s in SUCCESS_STRINGS],
    ],
)
def test_official_verdict(tmp_path: Path, exit_code: int | None, apply: str, test: str, expected: bool) -> None:
    assert official_verdict(exit_code, _logs(tmp_path, apply, test)) is expected


def test_stderr_is_never_read(tmp_path: Path) -> None:
    """Only the stdout logs are handed in; a success string elsewhere cannot count."""
    stdout = _logs(tmp_path, "applied\n", "")
    (tmp_path / "stderr.log").write_text("FIX CONFIRMED\n")
    assert official_verdict(0, stdout) is False


def test_a_huge_stdout_is_read_in_pieces(tmp_path: Path) -> None:
    big = tmp_path / "big.log"
    big.write_bytes(b"x" * ((1 << 20) - 5) + b"PATCH VERIFIED\n" + b"y" * (3 << 20))
    assert official_verdict(0, [big]) is True


# --- the reducer ------------------------------------------------------------------------------

def test_the_headline_is_the_official_score_and_the_exit_code_verdict_stands_beside_it() -> None:
    run, result = reduce_markers(_run_until(resolved=False, exit_code_verdict=True, string_verdict=False,
                                            verdicts_disagree=True))
    assert run["official_task_score"]["resolved"] is False and result["terminal_state"] == "evaluated_unresolved"
    assert run["evaluation"]["exit_code_verdict"] is True and run["evaluation"]["verdicts_disagree"] is True


def test_untrusted_and_scorability_reach_the_compact_run() -> None:
    markers = _run_until(verdict_untrusted=True, needs_network=True, network_reachable=False, network_probe="unreachable")
    markers[Phase.PRECHECK] = _marker(Phase.PRECHECK, codex_version="x", tag_profile="lagent_239", refusal=None,
                                      unscorable_override=False)
    run, _ = reduce_markers(markers)
    assert run["verdict_untrusted"] is True and run["evaluation"]["network_reachable"] is False
    assert run["scorability"] == {"tag_profile": "lagent_239", "refusal": None, "unscorable_override": False}


# --- the profiles -------------------------------------------------------------------------------

def test_every_tag_of_the_survey_has_a_profile() -> None:
    table = profile_table()
    assert len(table.profiles) == 83  # the survey's "83 tag names in all"
    if SURVEY is not None:  # the count above holds without it
        rows = re.findall(r"^\| ([a-z][A-Za-z0-9_.-]+)(?: \(dir ([A-Za-z0-9_.-]+)[^)]*\))? \|", SURVEY.read_text(), re.M)
        tags = [(tag, directory) for tag, directory in rows if tag not in ("list", "family", "tag")]
        assert len(tags) >= 70
        for tag, directory in tags:
            assert profile_for(tag) is not None or profile_for(directory) is not None, tag
    for name in ("evo.ninja_445", "gpt-researcher-1027", "swe_agent_741", "openmanus_11099", "crewai_2708"):
        assert profile_for(name) is not None, name


def test_profiles_know_the_layouts_that_break_the_defaults() -> None:
    assert profile_for("evo.ninja_445").image == "alfin06/agentissue-bench:evoninja_445"
    assert profile_for("gpt-researcher-1027").image_tag == "gpt-researcher_1027"
    assert profile_for("agixt_1369").eval_network == "host"
    assert profile_for("agixt_1369").apply_cmd.startswith("/app/run_test_entrypoint.sh apply_patch ")
    for tag in ("pythagora_55", "superagent_953", "gpt-researcher_1027"):
        assert profile_for(tag).entrypoint == "/opt/run_test_entrypoint.sh"
    assert profile_for("mle_agent_173").source_dir == "/app"
    assert profile_for("lagent_239").needs_network is True
    refusals = {tag: profile_for(tag).refusal for tag in profile_table().profiles}
    assert refusals["crewai_2102"] == refusals["crewai_2150"] == "apply_never_returns"
    assert refusals["sweagent_362"] == "apply_ignores_patch"
    assert refusals["ai_6510"] == "apply_always_fails"
    assert refusals["crewai_2127"] == "layout_unsupported: no apply_patch"
    assert refusals["ai_2705"] == "no_official_success_string"
    assert refusals["lagent_239"] is None and refusals["agixt_1369"] is None  # some stored version can be scored
    assert all(d in DEFECTS for p in profile_table().profiles.values() for d in (*p.defects, *p.possible_defects))


def test_a_profile_fills_only_what_the_operator_did_not_give(monkeypatch: pytest.MonkeyPatch) -> None:
    settings = load_settings(tag="agixt_1369")
    assert settings.eval_network.value == "host" and settings.eval_timeout == 3600
    assert settings.apply_cmd.startswith("/app/run_test_entrypoint.sh")
    flagged = load_settings(tag="agixt_1369", eval_network="none", apply_cmd="x apply_patch y")
    assert flagged.eval_network.value == "none" and flagged.apply_cmd == "x apply_patch y"
    assert flagged.test_cmd.startswith("/app/run_test_entrypoint.sh")  # what the flags left, from the profile
    monkeypatch.setenv("PATCH_APPLY_SH", "from-env apply_patch z")
    assert load_settings(tag="agixt_1369").apply_cmd == "from-env apply_patch z"  # the environment wins too
    monkeypatch.delenv("PATCH_APPLY_SH")
    unknown = load_settings(tag="not_a_known_tag")
    assert unknown.apply_cmd == DEFAULT_APPLY_CMD and unknown.profile_fields == ()
    assert unknown.resolved_image == "alfin06/agentissue-bench:not_a_known_tag"
    assert load_settings(tag="evo.ninja_445").resolved_image == "alfin06/agentissue-bench:evoninja_445"


def test_a_batch_passes_only_the_operators_settings_so_each_task_gets_its_profile(tmp_path: Path) -> None:
    operator = read_operator({"eval_timeout": 9, "allow_unscorable": True}, environ={})
    spec = operator.spec.for_tag("agixt_1369")
    assert spec.eval_timeout == 9.0 and spec.allow_unscorable is True
    assert (spec.eval_network, spec.apply_cmd, spec.test_cmd, spec.source_dir) == (None, None, None, None)
    task = resolve(spec, operator.host)
    profiled = load_settings(tag="agixt_1369")
    assert "eval_network" in profiled.profile_fields  # the tag's own profile fills what the operator left
    assert (task.eval_network, task.apply_cmd, task.eval_timeout) == (profiled.eval_network, profiled.apply_cmd, 9.0)
    assert read_operator({"eval_network": "none"}, environ={}).spec.for_tag("t").eval_network.value == "none"


def test_list_tags_shows_every_profile() -> None:
    done = run_cli("--list-tags")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["count"] == 83 == len(report["tags"]) == len(list_tags())
    row = next(r for r in report["tags"] if r["tag"] == "crewai_2102")
    assert row["refusal"] == "apply_never_returns" and row["needs_network"] is True
    markdown = run_cli("--list-tags", "--format", "markdown")
    assert markdown.returncode == 0 and "evoninja_445" in markdown.stdout


# --- the audit's records and the summary over valid tags ---------------------------------------

def _facts(official: bool) -> EvalFacts:
    return EvalFacts(official=official, exit_code_verdict=official, apply_exit_code=0, test_exit_code=0 if official else 1,
                     timed_out=False, apply_seconds=0.1, test_seconds=0.2)


def test_the_audit_ledger_is_public_safe_json_and_markdown(tmp_path: Path) -> None:
    ledger = AuditLedger(tmp_path)
    ledger.upsert(AuditRow(tag="b_1", image="img:b", audit="valid", reason="ok", gold_patch_sha256="a" * 64,
                           gold_patch_bytes=10, empty=_facts(False), gold=_facts(True)))
    ledger.upsert(AuditRow(tag="a_1", image="img:a", audit="gold_fails", reason="the test failed",
                           empty=_facts(False), gold=_facts(False)))
    document = json.loads((tmp_path / "audit-ledger.json").read_text())
    assert document["audit"] == {"a_1": "gold_fails", "b_1": "valid"}
    assert document["counts"] == {"gold_fails": 1, "valid": 1}
    assert "| b_1 | valid | ok |" in (tmp_path / "audit-ledger.md").read_text()
    assert read_audit_labels(tmp_path) == {"a_1": "gold_fails", "b_1": "valid"}
    assert AuditLedger(tmp_path).rows["a_1"].audit == "gold_fails"


def test_a_suites_summary_gives_the_resolved_rate_over_valid_tags() -> None:
    summary = BatchSummary(
        tags=4, skipped_completed=0, ran=4, resolved=2, failures_by_label={}, states={"done": 4},
        wall_seconds=1.0, phase_seconds={}, interrupted=False,
        audit_labels={"a": "valid", "b": "valid", "c": "gold_fails"},
        resolved_tags=("a", "c"), ran_tags=("a", "b", "c", "d"),
    )
    report = summary.report()
    assert report["resolved_rate"] == 0.5
    assert report["audit"] == {"valid_tags_ran": 2, "resolved_valid": 1, "resolved_rate_valid": 0.5,
                               "labels_of_ran_tags": {"valid": 2, "gold_fails": 1, "not_audited": 1}}
    no_audit = BatchSummary(tags=1, skipped_completed=0, ran=1, resolved=1, failures_by_label={}, states={},
                            wall_seconds=1.0, phase_seconds={}, interrupted=False)
    assert "audit" not in no_audit.report()
