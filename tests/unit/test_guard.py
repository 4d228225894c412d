"""The public guard refuses each kind of private material and names where it sits."""

from __future__ import annotations

import pytest

from reducers.guard import FORBIDDEN_KEYS, FORBIDDEN_TEXTS, check_public, secret_values
from runner.errors import PublicSafetyError

SAFE = {
    "schema_version": "benchmark_run_v0",
    "selected_image": "alfin06/agentissue-bench:lagent_239",
    "patch_sha256": "ab" * 32,
    "evidence_files": ["Patches/lagent_239/attempt.patch", "benchmark_run.compact.json"],
    "validation": {"no_upload": True, "credential_values_recorded": False},
    "duration": 1.5,
    "nothing": None,
}


def _refused(payload: dict, **kwargs) -> PublicSafetyError:
    with pytest.raises(PublicSafetyError) as caught:
        check_public("doc.json", payload, **kwargs)
    return caught.value


def test_a_compact_document_passes() -> None:
    check_public("doc.json", SAFE, private_texts=["/tmp/job-root-xyz"])


@pytest.mark.parametrize("key", sorted(FORBIDDEN_KEYS))
def test_each_forbidden_key_is_refused_with_its_path(key: str) -> None:
    error = _refused({**SAFE, "validation": {"nested": [{key.upper(): 1}]}})
    assert error.key_path == f"validation.nested[0].{key.upper()}"
    assert "forbidden key" in error.rule
    assert f"validation.nested[0].{key.upper()}" in str(error)


@pytest.mark.parametrize("text", FORBIDDEN_TEXTS)
def test_each_forbidden_text_is_refused(text: str) -> None:
    error = _refused({**SAFE, "note": f"see {text} here"})
    assert error.key_path == "note"
    assert error.rule == f"forbidden text {text!r}"  # refused for this text, not by another rule


def test_a_planted_secret_value_is_refused() -> None:
    secrets = secret_values({"OPENAI_API_KEY": "sk-planted-123456", "PATH": "/usr/bin", "SHORT_TOKEN": "abc"})
    assert secrets == ["sk-planted-123456"]
    error = _refused({**SAFE, "trials": [{"exception_type": "x sk-planted-123456"}]}, private_texts=secrets)
    assert error.key_path == "trials[0].exception_type"
    assert error.rule.startswith("private host text")
    assert "sk-planted" not in str(error)


@pytest.mark.parametrize(
    "value",
    ["/home/operator/jobs/lagent_239", "ran in /tmp/x", "C:\\Users\\op", "~/jobs", "path=/var/lib/x"],
)
def test_a_planted_absolute_path_is_refused(value: str) -> None:
    error = _refused({**SAFE, "where": value})
    assert error.key_path == "where"
    assert error.rule == "absolute host path"


def test_the_job_root_itself_is_refused_even_when_relative_looking() -> None:
    error = _refused({**SAFE, "x": "jobs/private-root-name"}, private_texts=["private-root-name"])
    assert "private host text" in error.rule


@pytest.mark.parametrize(
    ("value", "rule"),
    [("diff --git a/x b/x", "raw patch or log content"), ("@@ -1,2 +1,2 @@", "raw patch or log content"),
     ("Traceback (most recent call last)", "raw patch or log content"),
     ("line one\nline two", "raw content (strings must be one line"), ("x" * 600, "raw content (strings must be one line")],
)
def test_raw_patch_or_log_content_is_refused(value: str, rule: str) -> None:
    error = _refused({**SAFE, "summary": value})
    assert error.key_path == "summary" and error.rule.startswith(rule)  # refused by this rule, not another


def test_keys_are_checked_too() -> None:
    error = _refused({**SAFE, "/etc/passwd": 1})
    assert error.key_path == "/etc/passwd" and error.rule.startswith("key:")


def test_values_of_other_types_are_refused() -> None:
    error = _refused({**SAFE, "blob": b"bytes"})
    assert error.key_path == "blob" and "type" in error.rule
