"""``python -m runner``: plan (no mode), ``--precheck``, ``--execute``, ``--reduce``.

The report of each mode goes to stdout (JSON or markdown); structured logs go
to stderr. Exit codes are ``runner.errors.ExitCode`` (and 130 on interrupt).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import structlog

from reducers.markers import read_markers
from runner import early_signals
from runner.batch import BatchSummary, run_attempts, run_batch
from runner.tags import check_attempts, check_tag, read_tags_file, unique_tags
from runner.context import new_run_id
from runner.docker_utils import connect, runner_labels, sweep_strays
from runner.errors import BadInputError, ExitCode, REFUSALS, exit_code_of
from runner.jobroot import PUBLIC_FILES, JobRoot
from runner.journal import Journal, default_state_dir
from runner.lifeline import follow_batch_parent
from runner.logs import configure_logging
from runner.pipeline import STEPS
from runner.phases.precheck import run_precheck
from runner.phases.reduce import ReduceResult, reduce_job
from runner.plan import build_plan
from runner.profiles import list_tags
from runner.progress import progress_for
from runner.settings import DEFAULT_TAG, IMAGE_REPOSITORY, OutputFormat, RunnerSettings, load_settings
from runner.streams import guard_standard_streams
from runner.supervisor import TaskRequest
from runner.task import host_settings, own_task
from runner.task_process import run as run_task_here

log = structlog.get_logger(__name__)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m runner",
        description="Run one AgentIssue-Bench task: extract, Codex, patch, evaluate, compact public results. "
        "With no mode, print the plan and touch nothing.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Exit codes: 0 completed (resolved or not) / healthy; 1 runner failure (a phase failed); "
        "2 bad input; 3 bad environment (Docker, image or codex not usable); 130 interrupted.",
    )
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--precheck", action="store_true", help="health probe: check codex, Docker, image, layout")
    mode.add_argument("--execute", action="store_true", help="the full run on --job-root")
    mode.add_argument("--reduce", action="store_true", help="rebuild the compact outputs of --job-root from its markers")
    mode.add_argument(
        "--sweep", action="store_true",
        help="maintenance: remove runner containers whose run died on this host (live runs are kept)",
    )
    mode.add_argument("--list-tags", action="store_true", help="print the profile of every known tag and exit")
    mode.add_argument(
        "--cache", choices=["list", "prune"],
        help="the host's extraction cache: list its entries, or prune it to --cache-max-gb",
    )
    parser.add_argument("--job-root", type=Path, help="private job root (env JOB_ROOT)")
    parser.add_argument(
        "--tag", action="append", help="AgentIssue-Bench tag (env TAG; default lagent_239); repeat it for a batch"
    )
    parser.add_argument("--tags-file", type=Path, help="batch: one tag a line, '#' comments")
    parser.add_argument("--jobs-dir", type=Path, help="batch: one job root per tag, DIR/<tag>, prompts at DIR/<tag>/context/prompt.md")
    parser.add_argument("--workers", type=int, help="batch (or --attempts): tasks run at once (default 1)")
    parser.add_argument(
        "--attempts", type=int,
        help="independent attempts per tag (default 1): each its own job root <job root>/attempt-<i> "
        "(a batch: DIR/<tag>/attempt-<i>), codex run, patch, evaluation and compact files",
    )
    parser.add_argument(
        "--cache-max-gb", type=float, metavar="GB",
        help="the extraction cache's size bound; least recently used entries go (env RUNNER_CACHE_MAX_GB; "
        "default 20; 0 turns the cache off)",
    )
    parser.add_argument(
        "--cache-dir", type=Path,
        help="the extraction cache's directory (env RUNNER_CACHE_DIR; default <state dir>/extract-cache)",
    )
    parser.add_argument("--image", help="task image (env IMAGE; default alfin06/agentissue-bench:<tag>)")
    parser.add_argument("--codex-bin", help="codex executable (env CODEX_BIN; default codex)")
    parser.add_argument("--allow-pull", action="store_true", default=None, help="pull a missing image (env ALLOW_DOCKER_PULL=1)")
    parser.add_argument("--codex-timeout", type=float, metavar="SECONDS", help="codex deadline (default 3600)")
    parser.add_argument("--eval-timeout", type=float, metavar="SECONDS", help="apply+test deadline (default 300)")
    parser.add_argument("--eval-network", choices=["none", "bridge", "host"], help="evaluation network (default bridge)")
    parser.add_argument("--source-dir", help="buggy source in the image (env CONTAINER_BUGGY_SOURCE)")
    parser.add_argument("--apply-cmd", help="apply command in the container (env PATCH_APPLY_SH)")
    parser.add_argument("--test-cmd", help="test command in the container (env PATCH_TEST_SH)")
    parser.add_argument("--state-dir", type=Path, help="the runner's own records, outside every job root (env RUNNER_STATE_DIR)")
    parser.add_argument("--agent-user", help="run the agent as this unprivileged user; needs root (env RUNNER_AGENT_USER)")
    parser.add_argument("--model", help="the model codex uses (env RUNNER_MODEL; default: codex's config)")
    parser.add_argument("--codex-profile", help="codex profile, layered on its config (env RUNNER_CODEX_PROFILE)")
    parser.add_argument(
        "--codex-config", action="append", metavar="KEY=VALUE",
        help="a codex -c override (repeatable; a dotted key, one line; the runner's guards cannot be overridden)",
    )
    parser.add_argument("--codex-home", type=Path, help="codex's config and login (default: env CODEX_HOME, else ~/.codex)")
    parser.add_argument(
        "--patch-exclude", action="append", metavar="PATTERN",
        help="leave paths matching this glob out of the patch, beside the built-in artefact list (repeatable)",
    )
    parser.add_argument(
        "--canary", action="store_true",
        help="with --precheck: run the whole pipeline on the stub task with the real codex and a built-in scripted model",
    )
    parser.add_argument(
        "--canary-base-image", metavar="IMAGE",
        help="base of the stub image the canary builds when missing (default debian:bookworm-slim; needs bash, git, python3, patch)",
    )
    parser.add_argument("--format", dest="output_format", choices=["json", "markdown"], help="report format (default json)")
    parser.add_argument(
        "--allow-unscorable", action="store_true", default=None,
        help="evaluate a tag whose profile or image says it cannot be scored (env RUNNER_ALLOW_UNSCORABLE=1); "
        "recorded in the compact run",
    )
    return parser


def _render(report: dict[str, Any], output_format: OutputFormat) -> str:
    if output_format is OutputFormat.JSON:
        return json.dumps(report, indent=2, sort_keys=True)
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




def _is_batch(args: argparse.Namespace) -> bool:
    if _is_attempts(args):
        return False
    return args.jobs_dir is not None or args.tags_file is not None or len(args.tag or []) > 1 or args.workers is not None


def _is_attempts(args: argparse.Namespace) -> bool:
    """``--execute --job-root J --attempts K`` (K > 1): one tag's attempts under J, ``--workers`` at once."""
    return (
        (args.attempts or 1) > 1 and args.jobs_dir is None and args.tags_file is None and len(args.tag or []) <= 1
    )


def _settings_from(args: argparse.Namespace) -> RunnerSettings:
    flags = {
        key: getattr(args, key)
        for key in (
            "job_root", "image", "codex_bin", "allow_pull", "codex_timeout", "eval_timeout",
            "eval_network", "source_dir", "apply_cmd", "test_cmd", "output_format", "state_dir", "agent_user",
            "model", "codex_profile", "codex_home", "canary_base_image", "allow_unscorable",
            "cache_dir", "cache_max_gb",
        )
    }
    for key in ("codex_config", "patch_exclude"):
        values = getattr(args, key)
        flags[key] = tuple(values) if values else None
    single_tag = args.tag[0] if args.tag and len(args.tag) == 1 and not _is_batch(args) else None
    if _is_batch(args):
        # A batch takes its tags and image from flags only (README); TAG and IMAGE are not read,
        # so a stale or bad one in the environment cannot refuse it. Each tag is validated below.
        flags["image"] = args.image or f"{IMAGE_REPOSITORY}:{DEFAULT_TAG}"
        single_tag = DEFAULT_TAG
    return load_settings(tag=single_tag, **flags)


def _mode(args: argparse.Namespace, settings: RunnerSettings) -> str:
    for name in ("precheck", "execute", "reduce", "sweep", "list_tags", "cache"):
        if getattr(args, name):
            return name
    return "precheck" if settings.precheck_only else "plan"


def _precheck(settings: RunnerSettings) -> tuple[dict[str, Any], int]:
    report = run_precheck(settings, labels=runner_labels(job_id="precheck", run_id=new_run_id(), phase="precheck"))
    code = ExitCode.COMPLETED if report.healthy else ExitCode.BAD_ENVIRONMENT
    return {"mode": "precheck", "tag": settings.tag, "image": settings.resolved_image, **report.model_dump()}, code


def _execute(settings: RunnerSettings) -> tuple[dict[str, Any], int]:
    outcome = run_task_here(TaskRequest(spec=own_task(settings), host=host_settings(settings)))
    report = {"mode": "execute", "tag": settings.tag, "exit_code": int(outcome.exit_code),
              **_reduced_fields(outcome.reduced), "message": outcome.message, "public_files": list(PUBLIC_FILES)}
    return report, int(outcome.exit_code)


def _reduced_fields(result: ReduceResult) -> dict[str, Any]:
    """What ``--execute`` and ``--reduce`` report of a run: its reduce marker's result."""
    return result.model_dump(mode="json", include={"resolved", "terminal_state", "first_failed_phase", "failure_label"})


def _batch(args: argparse.Namespace, settings: RunnerSettings) -> tuple[dict[str, Any], int]:
    if not args.execute:
        raise BadInputError("--jobs-dir, --tags-file, --workers and repeated --tag go with --execute")
    if args.jobs_dir is None:
        raise BadInputError("a batch needs --jobs-dir DIR (one job root per tag under it)")
    if settings.job_root is not None:
        raise BadInputError("give --jobs-dir for a batch or --job-root for one task, not both")
    if args.workers is not None and args.workers < 1:
        raise BadInputError("--workers must be between 1 and 64")
    tags = [check_tag(tag, "--tag") for tag in args.tag or []]
    if args.tags_file is not None:
        tags += read_tags_file(args.tags_file)
    tags = unique_tags(tags)
    try:
        if early_signals.pending() is not None:
            raise KeyboardInterrupt("signal before start")
        with progress_for(len(tags)) as progress:
            summary = run_batch(
                settings, tags, args.jobs_dir, args.workers or 1, progress, image=args.image, attempts=args.attempts or 1
            )
    except KeyboardInterrupt:  # before any task started: still a summary, and 130
        summary = BatchSummary.not_started(len(tags))
    return summary.report(), summary.exit_code


def _attempts(args: argparse.Namespace, settings: RunnerSettings) -> tuple[dict[str, Any], int]:
    if settings.job_root is None:
        raise BadInputError("--attempts needs --job-root DIR (attempts go to DIR/attempt-<i>) or a batch's --jobs-dir")
    try:
        if early_signals.pending() is not None:
            raise KeyboardInterrupt("signal before start")
        with progress_for(args.attempts) as progress:
            summary = run_attempts(settings, settings.job_root, args.attempts, args.workers or 1, progress)
    except KeyboardInterrupt:
        summary = BatchSummary.not_started(1)
    report = summary.report()
    report["mode"] = "attempts"
    report["tag"] = settings.tag
    return report, summary.exit_code


def _reduce(settings: RunnerSettings) -> tuple[dict[str, Any], int]:
    if settings.job_root is None:
        raise BadInputError("--reduce needs --job-root DIR (or JOB_ROOT)")
    if not settings.job_root.is_dir():
        raise BadInputError("--job-root does not exist")
    job = JobRoot.at(settings.job_root, settings.tag)
    read_markers(job.markers)  # a corrupt marker is named first (file and field)
    journal = Journal.find(settings.state_dir or default_state_dir(), job)
    untrusted = journal.untrusted_files(job.markers, STEP_PHASES) if journal is not None else []
    if untrusted:  # never publish what the runner did not record; --execute restores its own copies
        raise BadInputError(
            f"result-markers/{untrusted[0]} is not what the runner recorded for this job root; "
            "run --execute on it again, which puts the runner's own markers back"
        )
    result = reduce_job(job)
    report = {"mode": "reduce", **_reduced_fields(result), "public_files": list(PUBLIC_FILES)}
    return report, ExitCode.COMPLETED


def _sweep(_settings: RunnerSettings) -> tuple[dict[str, Any], int]:
    client = connect()
    try:
        removed, kept = sweep_strays(client)
    finally:
        client.close()
    return {"mode": "sweep", "removed": removed, "kept_live": kept}, ExitCode.COMPLETED


def _cache(settings: RunnerSettings, action: str) -> tuple[dict[str, Any], int]:
    """List or prune the extraction cache: hashes, sizes and counts only (no host path)."""
    from runner.extraction_cache import ExtractionCache

    cache = ExtractionCache.for_settings(settings)  # 0 GB here: prune removes every entry
    removed = cache.prune() if action == "prune" else []
    entries = cache.entries()
    report = {
        "mode": "cache",
        "action": action,
        "max_bytes": cache.max_bytes,
        "total_bytes": sum(item.disk_bytes for item in entries),
        "entry_count": len(entries),
        "entries": [item.public() for item in entries],
        "removed": removed,
    }
    return report, ExitCode.COMPLETED


def _list_tags(_settings: RunnerSettings) -> tuple[dict[str, Any], int]:
    rows = list_tags()
    return {"mode": "list-tags", "count": len(rows), "tags": rows}, ExitCode.COMPLETED


MODES = {"precheck": _precheck, "execute": _execute, "reduce": _reduce, "sweep": _sweep, "list_tags": _list_tags}
# ``python -m runner <subcommand> ...``: modules with their own ``main(argv) -> int``.
SUBCOMMANDS = {"audit": "runner.audit"}


def _subcommand(name: str, argv: list[str]) -> int:
    import importlib

    configure_logging()
    early_signals.interrupt_from_now_on()
    return int(importlib.import_module(SUBCOMMANDS[name]).main(argv))


STEP_PHASES = tuple(STEPS)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] and argv[0] in SUBCOMMANDS:
        return _subcommand(argv[0], argv[1:])
    guard_standard_streams()  # a reader of our output going away must never end the run
    args = build_parser().parse_args(argv)
    configure_logging()
    early_signals.interrupt_from_now_on()
    follow_batch_parent()
    output_format = OutputFormat(args.output_format or "json")
    try:
        if early_signals.pending() is not None and not (_is_batch(args) or _is_attempts(args)):
            early_signals.raise_interrupt(early_signals.pending() or 0, None)
        settings = _settings_from(args)
        output_format = settings.output_format
        mode = _mode(args, settings)
        if args.attempts is not None:
            check_attempts(args.attempts)
            if mode != "execute":
                raise BadInputError("--attempts goes with --execute (or with submit, for the fleet)")
        if args.canary:
            if mode != "precheck" or _is_batch(args):
                raise BadInputError("--canary goes with --precheck (one host check, not a task run)")
            from runner.canary.run import run_canary

            report, code = run_canary(settings)
        elif _is_batch(args):
            report, code = _batch(args, settings)
        elif _is_attempts(args):
            report, code = _attempts(args, settings)
        elif mode == "plan":
            report, code = build_plan(settings), ExitCode.COMPLETED
        elif mode == "cache":
            report, code = _cache(settings, args.cache)
        else:
            report, code = MODES[mode](settings)
    except REFUSALS as e:
        log.error("runner_refused", reason=e.reason, exit_code=int(exit_code_of(e)))
        print(f"runner: {e}", file=sys.stderr)
        return int(exit_code_of(e))
    except KeyboardInterrupt:
        print("runner: interrupted; run the same command again to resume", file=sys.stderr)
        if _is_batch(args) or _is_attempts(args):  # stopped while reading its input: a batch still answers with its summary
            print(_render(BatchSummary.not_started(len(args.tag or [])).report(), output_format))
        return int(ExitCode.INTERRUPTED)
    print(_render(report, output_format))
    if report.get("message"):
        print(f"runner: {report['message']}", file=sys.stderr)
    return int(code)
