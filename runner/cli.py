"""``python -m runner``: plan (no mode), ``--precheck``, ``--execute``, ``--reduce``, and batches.

The operator's input is read once (``runner.tasks.spec.read_operator``: flags, then
the environment); ``--execute`` hands its one task to the same entry as a
supervisor's child (``runner.tasks.process.run``), a batch hands each of its tasks to
the supervisor. The report of each mode goes to stdout (JSON or markdown);
structured logs go to stderr. Exit codes are ``runner.errors.ExitCode``.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

import structlog

from reducers.markers import read_markers
from reducers.costs import estimate_cost
from runner.agents import agent_for
from runner.batch import BatchSummary, run_attempts, run_batch
from runner.ledger import RunLedger
from runner.containment import signals
from runner.containment.parent_death import follow_batch_parent
from runner.containment.standard_streams import guard_standard_streams
from runner.context import new_run_id
from runner.docker_utils import connect, runner_labels, sweep_strays
from runner.entry import (
    COMMANDS,
    RunnerArgumentParser,
    add_disk_flags,
    add_host_flags,
    add_task_flags,
    commands_help,
    disk_policy,
    host_flags,
    refused,
    render,
    run_command,
    task_flags,
)
from runner.errors import REFUSALS, BadInputError, ExitCode
from runner.jobroot import PUBLIC_FILES, JobRoot
from runner.journal import Journal, default_state_dir
from runner.logs import configure_logging
from runner.phases.precheck import run_precheck
from runner.phases.reduce import ReduceResult, reduce_job
from runner.pipeline import STEPS
from runner.plan import build_plan
from runner.profiles import list_tags
from runner.progress import progress_for
from runner.settings import OutputFormat, RunnerSettings
from runner.tags import check_attempts, check_tag, read_tags_file, unique_tags
from runner.tasks.process import run as run_task_here
from runner.tasks.protocol import TaskRequest
from runner.tasks.spec import OperatorInput, read_operator

log = structlog.get_logger(__name__)

STEP_PHASES = tuple(STEPS)


def build_parser() -> argparse.ArgumentParser:
    parser = RunnerArgumentParser(
        prog="python -m runner",
        description="Run one AgentIssue-Bench task: extract, Codex, patch, evaluate, compact public results. "
        "With no mode, print the plan and touch nothing.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=commands_help() + "\n\nExit codes: 0 completed (resolved or not) / healthy; 1 runner failure "
        "(a phase failed); 2 bad input; 3 bad environment (Docker, image or codex not usable); 130 interrupted.",
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
    mode.add_argument(
        "--images", choices=["list", "prune"],
        help="the images the runner pulled on this host: list them (name, digest, size, last use), or prune "
        "them to --image-budget-gb (default 0: all of them; never one a container uses)",
    )
    where = parser.add_argument_group("where, and how many")
    where.add_argument("--job-root", type=Path, help="private job root (env JOB_ROOT)")
    where.add_argument(
        "--tag", action="append", help="AgentIssue-Bench tag (env TAG; default lagent_239); repeat it for a batch"
    )
    where.add_argument("--tags-file", type=Path, help="batch: one tag a line, '#' comments")
    where.add_argument("--jobs-dir", type=Path,
                       help="batch: one job root per tag, DIR/<tag>, prompts at DIR/<tag>/context/prompt.md")
    where.add_argument("--workers", type=int, help="batch (or --attempts): tasks run at once (default 1)")
    where.add_argument(
        "--attempts", type=int,
        help="independent attempts per tag (default 1): each its own job root <job root>/attempt-<i> "
        "(a batch: DIR/<tag>/attempt-<i>), codex run, patch, evaluation and compact files",
    )
    where.add_argument(
        "--agents", metavar="NAME,NAME",
        help="batch: compare agents (codex,claude-code): every tag runs once per agent, DIR/<tag>/<agent>, "
        "the tag's prompt at DIR/<tag>/context/prompt.md; one ledger, with the agents side by side",
    )
    where.add_argument(
        "--suite-budget-usd", type=float, metavar="DOLLARS",
        help="batch (or --attempts): no task starts once the suite's cost (its ledger's finished tasks, plus the "
        "running ones' so far) would pass this; the rest end skipped_budget, and a rerun with a larger budget "
        "takes them",
    )
    add_disk_flags(where)
    add_task_flags(parser, many_tags=False)
    add_host_flags(parser)
    call = parser.add_argument_group("this call")
    call.add_argument(
        "--canary", action="store_true",
        help="with --precheck: run the whole pipeline on the stub task with the real codex and a built-in scripted model",
    )
    call.add_argument(
        "--canary-base-image", metavar="IMAGE",
        help="base of the stub image the canary builds when missing (default debian:bookworm-slim; "
        "needs bash, git, python3, patch)",
    )
    call.add_argument("--format", dest="output_format", choices=["json", "markdown"], help="report format (default json)")
    return parser


def _is_batch(args: argparse.Namespace) -> bool:
    if _is_attempts(args):
        return False
    return args.jobs_dir is not None or args.tags_file is not None or len(args.tag or []) > 1 or args.workers is not None


def _is_attempts(args: argparse.Namespace) -> bool:
    """``--execute --job-root J --attempts K`` (K > 1): one tag's attempts under J, ``--workers`` at once."""
    return (
        (args.attempts or 1) > 1 and args.jobs_dir is None and args.tags_file is None and len(args.tag or []) <= 1
    )


def _operator(args: argparse.Namespace) -> OperatorInput:
    """What the operator said: flags, then the environment, read once here for every mode."""
    many = _is_batch(args)
    single_tag = args.tag[0] if args.tag and len(args.tag) == 1 and not many else None
    flags = {
        **task_flags(args), **host_flags(args), "tag": single_tag, "job_root": args.job_root,
        "output_format": args.output_format, "canary_base_image": args.canary_base_image,
    }
    # A batch takes its tags and image from flags only (README): TAG and IMAGE are not read,
    # so a stale or bad one in the environment cannot refuse it. Each tag is validated below.
    return read_operator(flags, env_skipped=frozenset({"tag", "image"}) if many else frozenset())


def _mode(args: argparse.Namespace, precheck_only: bool) -> str:
    for name in ("precheck", "execute", "reduce", "sweep", "list_tags", "cache", "images"):
        if getattr(args, name):
            return name
    return "precheck" if precheck_only else "plan"


def _precheck(settings: RunnerSettings) -> tuple[dict[str, Any], int]:
    report = run_precheck(settings, labels=runner_labels(job_id="precheck", run_id=new_run_id(), phase="precheck"))
    code = ExitCode.COMPLETED if report.healthy else ExitCode.BAD_ENVIRONMENT
    return {"mode": "precheck", "tag": settings.tag, "image": settings.resolved_image, **report.model_dump()}, code


def _execute(operator: OperatorInput) -> tuple[dict[str, Any], int]:
    if operator.job_root is None:
        raise BadInputError("--execute needs --job-root DIR (or JOB_ROOT)")
    outcome = run_task_here(TaskRequest(spec=operator.spec, job_root=operator.job_root, host=operator.host))
    run = outcome.run
    report = {
        "mode": "execute", "tag": operator.spec.tag, "exit_code": int(outcome.exit_code),
        **_reduced_fields(outcome.reduced),
        "verdict_untrusted": run.verdict_untrusted if run is not None else False,
        "message": outcome.message, "public_files": list(PUBLIC_FILES),
    }
    return report, int(outcome.exit_code)


def _reduced_fields(result: ReduceResult | None) -> dict[str, Any]:
    """What ``--execute`` and ``--reduce`` report of a run: its reduce marker's result."""
    result = result or ReduceResult()
    return result.model_dump(mode="json", include={"resolved", "terminal_state", "first_failed_phase", "failure_label"})


def _batch_tags(args: argparse.Namespace, operator: OperatorInput) -> list[str]:
    if args.jobs_dir is None:
        raise BadInputError("a batch needs --jobs-dir DIR (one job root per tag under it)")
    if operator.job_root is not None:
        raise BadInputError("give --jobs-dir for a batch or --job-root for one task, not both")
    if args.workers is not None and args.workers < 1:
        raise BadInputError("--workers must be between 1 and 64")
    tags = [check_tag(tag, "--tag") for tag in args.tag or []]
    if args.tags_file is not None:
        tags += read_tags_file(args.tags_file)
    return unique_tags(tags)


def _batch_plan(args: argparse.Namespace, operator: OperatorInput) -> tuple[dict[str, Any], int]:
    """A batch's plan: its tasks, and what they should cost from the jobs dir's ledger; runs nothing."""
    tags = _batch_tags(args, operator)
    ledger = RunLedger(args.jobs_dir, []) if args.jobs_dir.is_dir() else None
    rows = list(ledger.rows.values()) if ledger is not None else []
    todo = [tag for tag in tags if not any(row.tag == tag and row.evaluated for row in rows)]
    report = {
        "mode": "plan",
        "touches_nothing": True,
        "batch": {"tags": len(tags), "already_evaluated": len(tags) - len(todo), "to_run": len(todo),
                  "attempts_per_tag": args.attempts or 1, "workers": args.workers or 1},
        "suite_budget_usd": args.suite_budget_usd,
        "max_tokens": operator.spec.max_tokens,
        "max_cost_usd": operator.spec.max_cost_usd,
        "estimate": estimate_cost(((row.tag, row) for row in rows), todo, model=operator.spec.model,
                                  attempts=args.attempts or 1),
    }
    return report, ExitCode.COMPLETED


def _agents(args: argparse.Namespace) -> tuple[str, ...]:
    """``--agents A,B``: the agents a batch compares (each named once, each known)."""
    if not args.agents:
        return ()
    if args.agent is not None:
        raise BadInputError("--agents names every agent of the batch; leave out --agent")
    names = tuple(dict.fromkeys(name.strip() for name in args.agents.split(",") if name.strip()))
    for name in names:
        agent_for(name)
    return names


def _batch(args: argparse.Namespace, operator: OperatorInput) -> tuple[dict[str, Any], int]:
    if not args.execute:
        raise BadInputError("--jobs-dir, --tags-file, --workers and repeated --tag go with --execute")
    tags = _batch_tags(args, operator)
    try:
        if signals.pending() is not None:
            raise KeyboardInterrupt("signal before start")
        with progress_for(len(tags)) as progress:
            summary = run_batch(operator.spec, operator.host, tags, args.jobs_dir, args.workers or 1, progress,
                                attempts=args.attempts or 1, suite_budget_usd=args.suite_budget_usd,
                                agents=_agents(args), disk=disk_policy(args))
    except KeyboardInterrupt:  # before any task started: still a summary, and 130
        summary = BatchSummary.not_started(len(tags))
    return summary.report(), summary.exit_code


def _attempts(args: argparse.Namespace, operator: OperatorInput) -> tuple[dict[str, Any], int]:
    if operator.job_root is None:
        raise BadInputError("--attempts needs --job-root DIR (attempts go to DIR/attempt-<i>) or a batch's --jobs-dir")
    try:
        if signals.pending() is not None:
            raise KeyboardInterrupt("signal before start")
        with progress_for(args.attempts) as progress:
            summary = run_attempts(operator.spec, operator.host, operator.job_root, args.attempts, args.workers or 1,
                                   progress, suite_budget_usd=args.suite_budget_usd, disk=disk_policy(args))
    except KeyboardInterrupt:
        summary = BatchSummary.not_started(1)
    report = summary.report()
    report["mode"] = "attempts"
    report["tag"] = operator.spec.tag
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


def _images(settings: RunnerSettings, action: str, budget_gb: float | None) -> tuple[dict[str, Any], int]:
    """List or prune the images the runner pulled here: names, digests, sizes, last use (no host path)."""
    from runner.disk_policy import check_image_budget
    from runner.images import PulledImages, gigabytes, images_report

    state_dir = settings.state_dir or default_state_dir()
    removed: list[str] = []
    if action == "prune":
        client = connect()
        try:
            limit = 0 if budget_gb is None else gigabytes(check_image_budget(budget_gb))
            removed = [entry.name for entry in PulledImages(state_dir).evict(client, limit)]
        finally:
            client.close()
    images = images_report(state_dir)
    return {"mode": "images", "action": action, "count": len(images), "total_bytes": sum(i["size_bytes"] for i in images),
            "images": images, "removed": removed}, ExitCode.COMPLETED


def _list_tags(_settings: RunnerSettings) -> tuple[dict[str, Any], int]:
    rows = list_tags()
    return {"mode": "list-tags", "count": len(rows), "tags": rows}, ExitCode.COMPLETED


MODES = {"precheck": _precheck, "reduce": _reduce, "sweep": _sweep, "list_tags": _list_tags}


def _run(args: argparse.Namespace) -> tuple[dict[str, Any], int]:
    if signals.pending() is not None and not (_is_batch(args) or _is_attempts(args)):
        signals.raise_interrupt(signals.pending() or 0, None)
    operator = _operator(args)
    mode = _mode(args, operator.call.precheck_only)
    if args.attempts is not None:
        check_attempts(args.attempts)
        if mode != "execute":
            raise BadInputError("--attempts goes with --execute (or with submit, for the fleet)")
    if args.canary:
        if mode != "precheck" or _is_batch(args):
            raise BadInputError("--canary goes with --precheck (one host check, not a task run)")
        from runner.canary.run import run_canary

        return run_canary(operator.settings())
    if args.suite_budget_usd is not None and not (_is_batch(args) or _is_attempts(args)):
        raise BadInputError("--suite-budget-usd goes with a batch (--jobs-dir) or --attempts (or with submit)")
    if (args.keep_trees is not None or args.image_budget_gb is not None) and mode != "images" \
            and not (_is_batch(args) or _is_attempts(args)):
        raise BadInputError("--keep-trees and --image-budget-gb go with a batch (--jobs-dir) or --attempts "
                            "(or with worker); --image-budget-gb also with --images prune")
    if args.agents is not None and not _is_batch(args):
        raise BadInputError("--agents goes with a batch (--jobs-dir); one run takes --agent")
    if _is_batch(args) and mode == "plan":
        return _batch_plan(args, operator)
    if _is_batch(args):
        return _batch(args, operator)
    if _is_attempts(args):
        return _attempts(args, operator)
    if mode == "execute":
        return _execute(operator)
    settings = operator.settings()
    if mode == "plan":
        return build_plan(settings), ExitCode.COMPLETED
    if mode == "cache":
        return _cache(settings, args.cache)
    if mode == "images":
        return _images(settings, args.images, args.image_budget_gb)
    return MODES[mode](settings)


def _format_of(args: argparse.Namespace) -> str:
    """The report's format: the flag, else RUNNER_FORMAT, else JSON (as the call settings read it)."""
    chosen = args.output_format or os.environ.get("RUNNER_FORMAT") or OutputFormat.JSON.value
    return chosen if chosen in {f.value for f in OutputFormat} else OutputFormat.JSON.value


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] and argv[0] in COMMANDS:
        return run_command(argv[0], argv[1:])
    guard_standard_streams()  # a reader of our output going away must never end the run
    args = build_parser().parse_args(argv)
    configure_logging()
    signals.interrupt_from_now_on()
    follow_batch_parent()
    try:
        report, code = _run(args)
    except REFUSALS as e:
        return refused("runner", e)
    except KeyboardInterrupt:
        print("runner: interrupted; run the same command again to resume", file=sys.stderr)
        if _is_batch(args) or _is_attempts(args):  # stopped while reading its input: a batch still answers with its summary
            print(render(BatchSummary.not_started(len(args.tag or [])).report(), _format_of(args)))
        return int(ExitCode.INTERRUPTED)
    print(render(report, _format_of(args)))
    if report.get("message"):
        print(f"runner: {report['message']}", file=sys.stderr)
    return int(code)
