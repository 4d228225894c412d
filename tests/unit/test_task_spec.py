"""One task contract: a TaskSpec (what the operator said), HostSettings (what the host has), and the one
place a tag's profile is applied (resolve), whichever driver hands the task over."""

from __future__ import annotations

from pathlib import Path

import pytest

from runner.errors import BadInputError
from runner.settings import RunnerSettings
from runner.tasks.protocol import TaskMessage, TaskRequest
from runner.tasks.spec import (
    DERIVED_FIELDS,
    PLACEMENT_FIELDS,
    CallSettings,
    HostSettings,
    TaskSpec,
    load_settings,
    read_operator,
    resolve,
)


def test_every_setting_belongs_to_the_task_the_host_or_the_call() -> None:
    parts = [set(TaskSpec.model_fields), set(HostSettings.model_fields), set(CallSettings.model_fields),
             set(PLACEMENT_FIELDS), set(DERIVED_FIELDS)]
    for i, one in enumerate(parts):
        for other in parts[i + 1:]:
            assert not one & other
    assert set().union(*parts) == set(RunnerSettings.model_fields), (
        "a setting no part carries (add it to TaskSpec, HostSettings or CallSettings)"
    )


GIVEN = {
    "tag": "t_1", "image": "stub:1", "codex_bin": "/opt/codex", "codex_timeout": 70, "eval_timeout": 9,
    "eval_network": "none", "source_dir": "/src/x", "apply_cmd": "a apply_patch b", "test_cmd": "a test_patched b",
    "model": "m-1", "codex_profile": "ci", "codex_config": ("a=1",), "patch_exclude": ("dist/",),
    "allow_unscorable": True, "allow_pull": True, "cache_max_gb": 3, "agent_user": "agent",
    "eval_probe": ("mirror.internal:3141", "10.0.0.2:80"),
}


def test_one_execute_hands_over_every_setting_it_was_given(tmp_path: Path) -> None:
    flags = {**GIVEN, "job_root": tmp_path / "job", "state_dir": tmp_path / "state", "cache_dir": tmp_path / "cache",
             "codex_home": tmp_path / "ch"}
    operator = read_operator(flags, environ={})
    request = TaskRequest(spec=operator.spec, job_root=operator.job_root, host=operator.host)
    sent = TaskRequest.model_validate_json(request.model_dump_json())
    again = resolve(sent.spec, sent.host, job_root=sent.job_root)
    assert again == operator.settings()
    assert {name: getattr(again, name) for name in flags} == {
        **flags, "eval_network": again.eval_network, "codex_timeout": 70.0, "eval_timeout": 9.0, "cache_max_gb": 3.0}


def test_a_spec_holds_only_what_was_said() -> None:
    spec = read_operator({"tag": "agixt_1369"}, environ={}).spec
    assert spec.model_dump(exclude_defaults=True) == {"tag": "agixt_1369"}
    assert spec.eval_network is None and spec.apply_cmd is None and spec.eval_timeout is None


def test_the_environment_is_read_once_by_the_driver_and_never_by_a_task(monkeypatch: pytest.MonkeyPatch) -> None:
    """A worker host's RUNNER_EVAL_TIMEOUT must not change a fleet task that said nothing of it."""
    monkeypatch.setenv("RUNNER_EVAL_TIMEOUT", "17")
    assert read_operator({}).spec.eval_timeout == 17.0  # the operator's environment: what it said
    spec = TaskSpec(tag="agixt_1369")  # a message's spec, said nothing of the timeout
    assert resolve(spec, HostSettings()).eval_timeout == 3600.0  # its profile's, not the worker's variable


def test_a_tag_without_given_settings_gets_its_own_profile() -> None:
    template = read_operator({}, environ={}).spec  # a batch's operator said nothing
    task = resolve(template.for_tag("agixt_1369"), HostSettings())
    assert task.apply_cmd == load_settings(tag="agixt_1369").apply_cmd == "/app/run_test_entrypoint.sh apply_patch /patches/attempt.patch"
    assert (task.eval_network.value, task.eval_timeout) == ("host", 3600.0)


def test_a_fleet_message_carries_the_spec_unchanged() -> None:
    spec = read_operator(GIVEN, environ={}).spec
    message = TaskMessage(suite="s", attempt=2, prompt="fix", spec=spec)
    assert TaskMessage.model_validate_json(message.model_dump_json()).spec == spec
    request = message.request(Path("/srv/jobs/s/t_1/attempt-2"), HostSettings(codex_bin="codex"))
    assert (request.spec, request.attempt, request.host.codex_bin) == (spec, 2, "codex")  # the host's own codex


def test_bad_values_are_named_as_typed() -> None:
    with pytest.raises(BadInputError, match="--eval-timeout"):
        read_operator({"eval_timeout": 0}, environ={})
    with pytest.raises(BadInputError, match="RUNNER_EVAL_TIMEOUT"):
        read_operator({}, environ={"RUNNER_EVAL_TIMEOUT": "soon"})
    with pytest.raises(BadInputError, match="--tag"):
        read_operator({}, environ={}).spec.for_tag("no;pe")


def test_a_batch_names_a_bad_repeated_tag_as_typed(tmp_path: Path) -> None:
    from tests.conftest import run_cli

    done = run_cli("--execute", "--jobs-dir", str(tmp_path), "--tag", "ok_1", "--tag", "no;pe")
    assert done.returncode == 2 and "--tag: 'no;pe' is not a safe tag" in done.stderr
    assert list(tmp_path.iterdir()) == []  # refused before any task or ledger


SAMPLE = {"TAG": "t_9", "IMAGE": "img:9", "CODEX_BIN": "/x/codex", "ALLOW_DOCKER_PULL": "1", "PRECHECK_ONLY": "1",
          "CLAUDE_BIN": "/x/claude", "RUNNER_AGENT": "claude-code", "RUNNER_BWRAP_BIN": "/x/bwrap",
          "RUNNER_CODEX_TIMEOUT": "91", "RUNNER_EXTRACT_TIMEOUT": "93", "RUNNER_EVAL_TIMEOUT": "92",
          "RUNNER_EVAL_NETWORK": "none",
          "CONTAINER_BUGGY_SOURCE": "/src/9", "PATCH_APPLY_SH": "apply 9", "PATCH_TEST_SH": "test 9",
          "RUNNER_FORMAT": "markdown", "JOB_ROOT": "/jobs/9", "RUNNER_STATE_DIR": "/state/9",
          "RUNNER_CACHE_DIR": "/cache/9", "RUNNER_CACHE_MAX_GB": "9", "RUNNER_AGENT_USER": "agent9",
          "RUNNER_MODEL": "model-9", "RUNNER_CODEX_PROFILE": "p9", "CODEX_HOME": "/home/9/.codex",
          "RUNNER_CANARY_BASE_IMAGE": "base:9", "RUNNER_ALLOW_UNSCORABLE": "1",
          "RUNNER_EVAL_PROBE": "mirror9.internal:3141, 10.0.0.9:80", "RUNNER_MAX_TOKENS": "9000",
          "RUNNER_MAX_COST_USD": "0.9", "RUNNER_RATE_CARD": "/cards/9.toml",
          "RUNNER_IMAGE_REPOSITORY": "127.0.0.1:5009/mirror9", "RUNNER_PULL_TIMEOUT": "99"}


def test_one_table_names_every_settings_variable() -> None:
    """The operator's input reads exactly the variables ENV_OF_FIELD names; the lists a task, the
    canary and the tests' children are kept from derive from it, so none can drift."""
    from runner.settings import ENV_OF_FIELD, REFERENCE_ENV, TASK_ENV
    from runner.tasks.protocol import task_environment

    assert set(SAMPLE) == set(ENV_OF_FIELD.values())
    settings = read_operator({}, environ=SAMPLE).settings()
    defaults = read_operator({}, environ={}).settings()
    ignored = {field for field, variable in ENV_OF_FIELD.items() if getattr(settings, field) == getattr(defaults, field)}
    assert not ignored, f"variables of the table that nothing reads: {ignored}"
    assert TASK_ENV <= REFERENCE_ENV <= set(ENV_OF_FIELD.values())
    environ = SAMPLE | {"PATH": "/bin"}
    assert set(task_environment(environ)) == set(environ) - {"TAG", "IMAGE", "JOB_ROOT", "PRECHECK_ONLY"}
