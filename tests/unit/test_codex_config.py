"""The codex guards, the operator's codex settings, CODEX_HOME, and the active provider."""

from __future__ import annotations

from pathlib import Path

import pytest

from runner.codex_config import (
    GUARD_OVERRIDES,
    active_provider,
    guard_arguments,
    overrides_sha256,
    resolve_codex_home,
)
from runner.errors import BadInputError
from runner.agents.codex import child_environment, codex_argv
from runner.tasks.spec import load_settings


def test_the_guards_come_after_the_operators_overrides(tmp_path: Path) -> None:
    argv = codex_argv("codex", tmp_path, tmp_path / "m.txt", model="gpt-x", profile="fast",
                      overrides=('model_reasoning_effort="low"',))
    assert argv[-1] == "-"
    assert argv.index('model_reasoning_effort="low"') < min(argv.index(a) for a in guard_arguments() if a != "-c")
    keys = {key for key, _ in GUARD_OVERRIDES}
    assert {"sandbox_workspace_write.exclude_slash_tmp", "sandbox_workspace_write.exclude_tmpdir_env_var",
            "shell_environment_policy.inherit", "allow_login_shell", "features.shell_snapshot"} <= keys


@pytest.mark.parametrize(
    "item",
    ["no_equals", "a..b=1", "bad key=1", "x=1\ny=2", "sandbox_workspace_write.exclude_slash_tmp=false",
     "shell_environment_policy.inherit=all", "approval_policy=on-request", "features.shell_snapshot=true",
     "k=" + "v" * 1001],
)
def test_bad_or_guard_overrides_are_refused(item: str) -> None:
    with pytest.raises(BadInputError, match="codex-config"):
        load_settings(codex_config=(item,))


def test_good_settings_pass() -> None:
    settings = load_settings(model="gpt-5.1-codex", codex_profile="ci", codex_config=("model_reasoning_effort=low",
                                                                                     "features.web_search=false"))
    assert settings.codex_config == ("model_reasoning_effort=low", "features.web_search=false")


@pytest.mark.parametrize("flags", [{"model": "a b"}, {"model": "x;rm"}, {"codex_profile": "../x"}])
def test_bad_model_or_profile_is_refused(flags: dict) -> None:
    with pytest.raises(BadInputError):
        load_settings(**flags)


def test_codex_home_order(tmp_path: Path) -> None:
    flag, env_home, operator = tmp_path / "flag", tmp_path / "env", tmp_path / "op"
    assert resolve_codex_home(flag, {"CODEX_HOME": str(env_home)}, operator) == flag
    assert resolve_codex_home(None, {"CODEX_HOME": str(env_home)}, operator) == env_home
    assert resolve_codex_home(None, {}, operator) == operator / ".codex"


def test_the_active_provider_and_its_key_variable(tmp_path: Path) -> None:
    (tmp_path / "config.toml").write_text(
        'model = "m1"\nmodel_provider = "local"\n[model_providers.local]\nenv_key = "LOCAL_KEY"\n'
        '[model_providers.other]\nenv_key = "OTHER_KEY"\n'
    )
    (tmp_path / "alt.config.toml").write_text('model_provider = "other"\n')
    assert active_provider(tmp_path, None, ()) == active_provider(tmp_path, None, ())
    assert active_provider(tmp_path, None, ()).env_key == "LOCAL_KEY"
    assert active_provider(tmp_path, None, ()).model == "m1"
    assert active_provider(tmp_path, "alt", ()).env_key == "OTHER_KEY"
    assert active_provider(tmp_path, None, ('model_provider="other"',)).env_key == "OTHER_KEY"
    assert active_provider(tmp_path / "absent", None, ()).env_key is None  # openai: codex login


def test_the_environment_carries_the_provider_key_and_a_private_home(tmp_path: Path) -> None:
    environ = {"PATH": "/bin", "HOME": "/root", "LOCAL_KEY": "k", "OTHER_SECRET": "s", "OPENAI_API_KEY": "o"}
    env = child_environment(environ, provider_key="LOCAL_KEY", home=tmp_path / "h", codex_home=tmp_path / "c")
    assert env["LOCAL_KEY"] == "k" and "OTHER_SECRET" not in env
    assert env["HOME"] == str(tmp_path / "h") and env["CODEX_HOME"] == str(tmp_path / "c")


def test_the_overrides_hash_depends_on_order_and_content() -> None:
    assert overrides_sha256(("a=1", "b=2")) != overrides_sha256(("b=2", "a=1"))
    assert len(overrides_sha256(())) == 64


def test_a_batch_passes_the_codex_settings_to_every_task(tmp_path: Path) -> None:
    from runner.cli import _operator, build_parser
    from runner.tasks.protocol import TaskRequest
    from runner.tasks.spec import resolve

    args = build_parser().parse_args([
        "--model", "gpt-x", "--codex-profile", "ci", "--codex-config", "a.b=1", "--codex-config", "c=2",
        "--codex-home", str(tmp_path), "--patch-exclude", "dist/", "--patch-exclude", "*.log",
        "--jobs-dir", str(tmp_path), "--tag", "t_0", "--tag", "t_1",
    ])
    operator = _operator(args)
    request = TaskRequest(spec=operator.spec.for_tag("t_1"), job_root=tmp_path / "t_1", host=operator.host)
    sent = TaskRequest.model_validate_json(request.model_dump_json())
    again = resolve(sent.spec, sent.host, job_root=sent.job_root)
    assert (again.model, again.codex_profile, again.codex_home) == ("gpt-x", "ci", tmp_path)
    assert again.codex_config == ("a.b=1", "c=2") and again.patch_exclude == ("dist/", "*.log")
