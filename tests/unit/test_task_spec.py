"""A task (TaskSpec) apart from its host (HostSettings): together they carry every setting a run uses."""

from __future__ import annotations

from pathlib import Path

import pytest

from runner.errors import BadInputError
from runner.settings import RunnerSettings, load_settings
from runner.supervisor import TaskRequest
from runner.task import CALL_SETTINGS, HostSettings, TaskSpec, host_settings, own_task, task_settings, task_spec


def test_every_setting_belongs_to_the_task_the_host_or_the_call() -> None:
    task_fields = set(TaskSpec.model_fields) - {"job_root", "attempt"}
    host_fields = set(HostSettings.model_fields)
    assert not task_fields & host_fields
    carried = task_fields | host_fields | {"job_root"}
    assert carried | set(CALL_SETTINGS) == set(RunnerSettings.model_fields), (
        "a setting neither a task nor its host carries (add it to TaskSpec or HostSettings, or to CALL_SETTINGS)"
    )


def test_one_execute_hands_over_every_setting_it_was_given(tmp_path: Path) -> None:
    given = load_settings(
        tag="t_1", job_root=tmp_path / "job", image="stub:1", codex_bin="/opt/codex", codex_timeout=70,
        eval_timeout=9, eval_network="none", source_dir="/src/x", apply_cmd="a apply_patch b",
        test_cmd="a test_patched b", model="m-1", codex_profile="ci", codex_config=("a=1",),
        patch_exclude=("dist/",), allow_unscorable=True, allow_pull=True, state_dir=tmp_path / "state",
        cache_dir=tmp_path / "cache", cache_max_gb=3, agent_user="agent", codex_home=tmp_path / "ch",
    )
    request = TaskRequest(spec=own_task(given), host=host_settings(given))
    sent = TaskRequest.model_validate_json(request.model_dump_json())
    again = task_settings(sent.spec, sent.host)
    differs = {name for name in RunnerSettings.model_fields
               if name not in CALL_SETTINGS and getattr(again, name) != getattr(given, name)}
    assert not differs


def test_a_tag_without_given_settings_gets_its_own_profile(tmp_path: Path) -> None:
    batch = load_settings()  # the batch's default tag, nothing given
    spec = task_spec(batch, "agixt_1369", tmp_path / "agixt_1369")
    assert task_settings(spec, host_settings(batch)).apply_cmd == load_settings(tag="agixt_1369").apply_cmd


def test_execute_without_a_job_root_is_refused() -> None:
    with pytest.raises(BadInputError, match="--job-root"):
        own_task(load_settings(tag="t_1"))


def test_a_batch_names_a_bad_repeated_tag_as_typed(tmp_path: Path) -> None:
    from tests.conftest import run_cli

    done = run_cli("--execute", "--jobs-dir", str(tmp_path), "--tag", "ok_1", "--tag", "no;pe")
    assert done.returncode == 2 and "--tag: 'no;pe' is not a safe tag" in done.stderr
    assert list(tmp_path.iterdir()) == []  # refused before any task or ledger


def test_one_table_names_every_settings_variable() -> None:
    """The settings read exactly the variables ENV_OF_FIELD names; the lists a task, the canary and
    the tests' children are kept from derive from it, so none can drift."""
    from runner.settings import ENV_OF_FIELD, REFERENCE_ENV, TASK_ENV
    from runner.supervisor import task_environment

    read = {field: [name for name in info.validation_alias.choices if name.isupper()]
            for field, info in RunnerSettings.model_fields.items()}
    assert {field: names[0] for field, names in read.items() if names} == ENV_OF_FIELD
    assert TASK_ENV <= REFERENCE_ENV <= set(ENV_OF_FIELD.values())
    environ = {name: "x" for name in ENV_OF_FIELD.values()} | {"PATH": "/bin"}
    assert set(task_environment(environ)) == set(environ) - {"TAG", "IMAGE", "JOB_ROOT", "PRECHECK_ONLY"}
