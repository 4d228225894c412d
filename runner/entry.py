"""The runner's one face: its commands, the flags they share, and how every command answers.

``python -m runner NAME ...`` runs the command ``NAME`` of ``COMMANDS``; anything
else is the single-task CLI's flag modes (``runner.cli``). Every command:
- parses with ``RunnerArgumentParser``: no flag is ever taken by its prefix, and a
  mistyped one is answered with the closest real one;
- takes the task's flags from ``add_task_flags`` and the host's from ``add_host_flags``
  where it takes them at all, so a flag means the same for a single run, a batch,
  ``submit`` and ``worker``;
- answers through ``answer``: a refusal is one line on stderr and its exit code
  (``runner.errors.exit_code_of``), never a traceback; the report goes to stdout.
"""

from __future__ import annotations

import argparse
import difflib
import importlib
import json
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

import structlog

from runner.errors import REFUSALS, ExitCode, exit_code_of

log = structlog.get_logger(__name__)


@dataclass(frozen=True)
class Command:
    name: str
    module: str
    function: str
    summary: str  # one line for ``python -m runner --help``
    hidden: bool = False


COMMANDS: dict[str, Command] = {command.name: command for command in (
    Command("worker", "runner.fleet.worker", "main", "the daemon of one trusted host: take a fleet's tasks and run them"),
    Command("submit", "runner.fleet.commands", "submit_main", "put a suite (tags x attempts) on the fleet's queue"),
    Command("status", "runner.fleet.commands", "status_main", "a fleet suite's ledger across every host"),
    Command("cancel", "runner.fleet.commands", "cancel_main", "drop a suite's queued tasks, interrupt its running ones"),
    Command("report", "runner.report_command", "main", "an offline HTML (or Markdown) report: a batch, a suite, an evaluation"),
    Command("show", "runner.show_command", "show_main", "one attempt as a timeline, for the operator (private; --follow)"),
    Command("export", "runner.show_command", "export_main", "an attempt in Harbor's trajectory format (--format atif; private)"),
    Command("audit", "runner.audit", "main", "the gold-patch audit: which tags a run can trust"),
    Command("evaluate", "runner.score_patches", "main", "score patches made anywhere (DIR/<tag>/*.patch) by the official rule"),
    Command("task", "runner.tasks.process", "main", "a supervisor's child (not for operators)", hidden=True),
    Command("fork-server", "runner.tasks.fork_server", "main", "a supervisor's preloaded task starter (not for operators)",
            hidden=True),
)}


def commands_help() -> str:
    width = max(len(name) for name in COMMANDS)
    lines = [f"  {c.name.ljust(width)}  {c.summary}" for c in COMMANDS.values() if not c.hidden]
    return "commands (python -m runner COMMAND --help):\n" + "\n".join(lines)


def run_command(name: str, argv: list[str]) -> int:
    command = COMMANDS[name]
    return int(getattr(importlib.import_module(command.module), command.function)(argv))


class RunnerArgumentParser(argparse.ArgumentParser):
    """argparse, without prefix matching (``--agent X`` is never read as ``--agent-user X``),
    and naming the closest real flag when one is mistyped."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        if message.startswith("unrecognized arguments:"):
            known = [flag for action in self._actions for flag in action.option_strings]
            hints = []
            for word in message.removeprefix("unrecognized arguments:").split():
                if word.startswith("--"):
                    close = difflib.get_close_matches(word.split("=", 1)[0], known, n=1, cutoff=0.6)
                    if close:
                        hints.append(f"{word.split('=', 1)[0]}: did you mean {close[0]}?")
            if hints:
                message = f"{message} ({'; '.join(hints)})"
        super().error(message)


# -- the flags shared by the commands that take them ---------------------------------------------

TASK_FLAG_FIELDS = (
    "image", "image_repository", "agent", "codex_timeout", "extract_timeout", "eval_timeout", "eval_network",
    "source_dir", "apply_cmd", "test_cmd",
    "model", "codex_profile", "allow_unscorable", "max_tokens", "max_cost_usd",
)
TASK_LIST_FIELDS = ("codex_config", "patch_exclude", "eval_probe")
EVALUATION_FLAG_FIELDS = ("image", "image_repository", "allow_pull", "pull_timeout", "allow_unscorable", "eval_timeout", "eval_network", "source_dir",
                          "apply_cmd", "test_cmd")
_REPOSITORY_HELP = ("the repository of the tags' images: REPO:<tag> (env RUNNER_IMAGE_REPOSITORY; default "
                    "alfin06/agentissue-bench; a mirror, llmagents/agentissue-bench, a private registry's "
                    "HOST:PORT/NAME); a profile's image tag spelling is kept, --image wins over it")
_PULL_TIMEOUT_HELP = ("a pull that reports no progress for this long has stalled and fails as an infrastructure "
                      "failure (env RUNNER_PULL_TIMEOUT; default 1800)")
_PROBE_HELP = ("an endpoint the evaluation must reach, probed instead of the package index pypi.org:443 "
               "(repeatable: a mirror, a proxy; env RUNNER_EVAL_PROBE, comma-separated); recorded in the public results")
HOST_FLAG_FIELDS = ("codex_bin", "claude_bin", "bwrap_bin", "codex_home", "allow_pull", "pull_timeout", "state_dir",
                    "cache_dir", "cache_max_gb", "agent_user",
                    "rate_card")


def add_task_flags(parser: argparse.ArgumentParser, *, many_tags: bool) -> None:
    """What a task is: the same flags for ``--execute``, a batch and ``submit``."""
    group = parser.add_argument_group("the task (each tag's profile fills what is not given)")
    image_help = ("task image for every tag (default: the tag's profile's, else alfin06/agentissue-bench:<tag>)"
                  if many_tags else "task image (env IMAGE; default: the tag's profile's, else alfin06/agentissue-bench:<tag>)")
    group.add_argument("--image", help=image_help)
    group.add_argument("--image-repository", metavar="REPO", help=_REPOSITORY_HELP)
    group.add_argument("--codex-timeout", type=float, metavar="SECONDS",
                       help="codex deadline (env RUNNER_CODEX_TIMEOUT; default 3600)")
    group.add_argument("--extract-timeout", type=float, metavar="SECONDS",
                       help="deadline of extract, and again of baseline, each its own; past it the task fails as an "
                       "infrastructure failure, nothing kept (env RUNNER_EXTRACT_TIMEOUT; default 1800)")
    group.add_argument("--eval-timeout", type=float, metavar="SECONDS",
                       help="apply+test deadline (env RUNNER_EVAL_TIMEOUT; default: the profile's, else 300)")
    group.add_argument("--eval-network", choices=["none", "bridge", "host"],
                       help="evaluation network (env RUNNER_EVAL_NETWORK; default: the profile's, else bridge)")
    group.add_argument("--eval-probe", action="append", metavar="HOST:PORT", help=_PROBE_HELP)
    group.add_argument("--source-dir", help="buggy source in the image (env CONTAINER_BUGGY_SOURCE)")
    group.add_argument("--apply-cmd", help="apply command in the container (env PATCH_APPLY_SH)")
    group.add_argument("--test-cmd", help="test command in the container (env PATCH_TEST_SH)")
    group.add_argument(
        "--agent", metavar="NAME",
        help="the agent that makes the attempt: codex (the default) or claude-code (env RUNNER_AGENT)",
    )
    group.add_argument("--model", help="the model codex uses (env RUNNER_MODEL; default: codex's config)")
    group.add_argument("--codex-profile", help="codex profile, layered on its config (env RUNNER_CODEX_PROFILE)")
    group.add_argument(
        "--codex-config", action="append", metavar="KEY=VALUE",
        help="a codex -c override (repeatable; a dotted key, one line; the runner's guards cannot be overridden)",
    )
    group.add_argument(
        "--patch-exclude", action="append", metavar="PATTERN",
        help="leave paths matching this glob out of the patch, beside the built-in artefact list (repeatable)",
    )
    group.add_argument(
        "--allow-unscorable", action="store_true", default=None,
        help="evaluate a tag whose profile or image says it cannot be scored (env RUNNER_ALLOW_UNSCORABLE=1); "
        "recorded in the compact run",
    )
    group.add_argument(
        "--max-tokens", type=int, metavar="N",
        help="stop codex once the attempt's tokens (input + output, every model response) pass N; the work "
        "so far is patched and scored, budget_exceeded recorded (env RUNNER_MAX_TOKENS; default: no cap)",
    )
    group.add_argument(
        "--max-cost-usd", type=float, metavar="DOLLARS",
        help="the same, for the attempt's cost on the rate card (env RUNNER_MAX_COST_USD; default: no cap)",
    )


def add_host_flags(parser: argparse.ArgumentParser) -> None:
    """What the host running tasks has: the same flags for ``--execute``, a batch and ``worker``."""
    group = parser.add_argument_group("the host")
    group.add_argument("--codex-bin", help="codex executable (env CODEX_BIN; default codex)")
    group.add_argument("--claude-bin", help="Claude Code's executable, for --agent claude-code (env CLAUDE_BIN; default claude)")
    group.add_argument("--bwrap-bin", help="the bubblewrap that confines Claude Code (env RUNNER_BWRAP_BIN; default: "
                       "bwrap on PATH, else the one the Codex CLI ships)")
    group.add_argument("--codex-home", type=Path, help="codex's config and login (default: env CODEX_HOME, else ~/.codex)")
    group.add_argument("--allow-pull", action="store_true", default=None, help="pull a missing image (env ALLOW_DOCKER_PULL=1)")
    group.add_argument("--pull-timeout", type=float, metavar="SECONDS", help=_PULL_TIMEOUT_HELP)
    group.add_argument("--state-dir", type=Path, help="the runner's own records, outside every job root (env RUNNER_STATE_DIR)")
    group.add_argument(
        "--cache-dir", type=Path,
        help="the extraction cache's directory (env RUNNER_CACHE_DIR; default <state dir>/extract-cache)",
    )
    group.add_argument(
        "--cache-max-gb", type=float, metavar="GB",
        help="the extraction cache's size bound; least recently used entries go (env RUNNER_CACHE_MAX_GB; "
        "default 20; 0 turns the cache off)",
    )
    group.add_argument("--agent-user", help="run the agent as this unprivileged user; needs root (env RUNNER_AGENT_USER)")
    group.add_argument(
        "--rate-card", type=Path, metavar="FILE",
        help="prices per model, a TOML in the format of the shipped runner/data/rate_card.toml "
        "(env RUNNER_RATE_CARD; default: the shipped card)",
    )


def add_disk_flags(group: argparse._ArgumentGroup) -> None:
    """What a suite may leave on the host's disks: the same flags for a batch and ``worker``."""
    group.add_argument(
        "--keep-trees", choices=["all", "failed", "none"],
        help="after a task is scored, keep its private buggy-source/ (and baseline git): all (default), failed "
        "(only an unresolved attempt's), none; the patch, logs, markers and public files always stay",
    )
    group.add_argument(
        "--image-budget-gb", type=float, metavar="GB",
        help="after each task, remove the least recently used images the runner pulled itself until they fit "
        "in GB (never one a task here still needs, never one that was here before; default: off)",
    )


def disk_policy(args: argparse.Namespace) -> Any:  # runner.disk_policy.DiskPolicy (imported when used)
    """Raises: BadInputError (a budget that is not a positive number)."""
    from runner.disk_policy import DiskPolicy, KeepTrees

    return DiskPolicy(keep_trees=KeepTrees(args.keep_trees or "all"), image_budget_gb=args.image_budget_gb)


def add_evaluation_flags(parser: argparse.ArgumentParser) -> None:
    """How a tag's patches are evaluated, for the commands that evaluate without an agent (``evaluate``)."""
    group = parser.add_argument_group("the evaluation (each tag's profile fills what is not given)")
    group.add_argument("--image", help="task image (one tag only; default: the tag's profile's, else "
                       "alfin06/agentissue-bench:<tag>)")
    group.add_argument("--image-repository", metavar="REPO", help=_REPOSITORY_HELP)
    group.add_argument("--allow-pull", action="store_true", default=None, help="pull a missing image (env ALLOW_DOCKER_PULL=1)")
    group.add_argument("--pull-timeout", type=float, metavar="SECONDS", help=_PULL_TIMEOUT_HELP)
    group.add_argument("--allow-unscorable", action="store_true", default=None,
                       help="evaluate even a tag whose profile or image says it cannot be scored")
    group.add_argument("--eval-timeout", type=float, metavar="SECONDS",
                       help="apply+test deadline per patch (default: the profile's, else 300)")
    group.add_argument("--eval-network", choices=["none", "bridge", "host"],
                       help="evaluation network (default: the profile's, else bridge)")
    group.add_argument("--eval-probe", action="append", metavar="HOST:PORT", help=_PROBE_HELP)
    group.add_argument("--source-dir", help="buggy source in the image")
    group.add_argument("--apply-cmd", help="apply command in the container")
    group.add_argument("--test-cmd", help="test command in the container")


def task_flags(args: argparse.Namespace) -> dict[str, object]:
    """The task's flags as given (``None``: not given), for ``runner.tasks.spec.read_operator``."""
    flags: dict[str, object] = {field: getattr(args, field) for field in TASK_FLAG_FIELDS}
    for field in TASK_LIST_FIELDS:
        values = getattr(args, field)
        flags[field] = tuple(values) if values else None
    return flags


def evaluation_flags(args: argparse.Namespace) -> dict[str, object]:
    """``add_evaluation_flags``' flags as given, for ``runner.tasks.spec.settings_for_tags``."""
    flags: dict[str, object] = {field: getattr(args, field) for field in EVALUATION_FLAG_FIELDS}
    flags["eval_probe"] = tuple(args.eval_probe) if args.eval_probe else None
    return flags


def host_flags(args: argparse.Namespace) -> dict[str, object]:
    return {field: getattr(args, field) for field in HOST_FLAG_FIELDS}


# -- how every command answers -----------------------------------------------------------------


def render(report: dict[str, Any], output_format: str, markdown: Callable[[dict[str, Any]], str] | None = None) -> str:
    """A command's report: JSON, or Markdown (the command's own renderer, else a plain list)."""
    if output_format != "markdown":
        return json.dumps(report, indent=2, sort_keys=True)
    if markdown is not None:
        return markdown(report)
    lines = [f"# runner: {report.get('mode')}", ""]
    for key, value in report.items():
        if key == "mode":
            continue
        if isinstance(value, list) and value and isinstance(value[0], dict):
            lines.append(f"## {key}")
            for item in value:
                lines.append("- " + "; ".join(f"{k}: {v}" for k, v in item.items()))
            lines.append("")
        else:
            lines.append(f"- **{key}**: {json.dumps(value) if isinstance(value, (dict, list)) else value}")
    return "\n".join(lines)


def refused(prog: str, error: BaseException) -> int:
    """A refusal, as every command answers it: logged, one line on stderr, its exit code."""
    code = exit_code_of(error)  # type: ignore[arg-type]
    log.error("runner_refused", command=prog, reason=getattr(error, "reason", "runner_error"), exit_code=int(code))
    print(f"{prog}: {error}", file=sys.stderr)
    return int(code)


def answer(
    prog: str,
    command: Callable[[], tuple[dict[str, Any], int]],
    output_format: Callable[[], str] | str = "json",
    *,
    markdown: Callable[[dict[str, Any]], str] | None = None,
    interrupted: str | None = None,
) -> int:
    """Run ``command`` (its report and exit code), print the report, and answer refusals the one way.

    ``interrupted``: what to say on Ctrl-C (exit 130); without it an interrupt is not caught here.
    """
    try:
        report, code = command()
    except REFUSALS as e:
        return refused(prog, e)
    except KeyboardInterrupt:
        if interrupted is None:
            raise
        print(f"{prog}: {interrupted}", file=sys.stderr)
        return int(ExitCode.INTERRUPTED)
    chosen = output_format() if callable(output_format) else output_format
    print(render(report, chosen, markdown))
    if isinstance(report.get("message"), str) and report["message"]:
        print(f"{prog}: {report['message']}", file=sys.stderr)
    return int(code)
