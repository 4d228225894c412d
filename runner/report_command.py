"""``python -m runner report``: a batch's or a fleet suite's report, written to one file.

The command sits above both sources: the rows of a local batch come from
``runner.views.sources``, a suite's from the fleet's ledger (``runner.fleet.views``);
``runner.views.report`` renders either, and knows neither.
"""

from __future__ import annotations

import argparse
import os
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from reducers.costs import BudgetFigures
from runner.atomic import write_bytes_atomic
from runner.containment import signals
from runner.entry import RunnerArgumentParser, answer
from runner.errors import BadInputError, EnvironmentNotReadyError, ExitCode
from runner.logs import configure_logging
from runner.tasks.spec import ensure_dir
from runner.views.model import TaskRow
from runner.views.public import view_private_texts
from runner.views.report import build_report
from runner.views.sources import read_jobs_dir


def build_parser() -> argparse.ArgumentParser:
    parser = RunnerArgumentParser(
        prog="python -m runner report",
        description="A suite's report: one self-contained HTML file with charts (or the same numbers as Markdown).",
    )
    parser.add_argument("--jobs-dir", type=Path, help="a local batch: DIR/run-ledger.json and its journal")
    parser.add_argument("--suite", help="a daemon suite's name (with --broker)")
    parser.add_argument("--broker", help="the daemon's broker URL, redis://HOST:PORT/DB (with --suite)")
    parser.add_argument("--namespace", help="the fleet's key prefix (env RUNNER_FLEET_NAMESPACE)")
    parser.add_argument("--out", type=Path, required=True, help="the file to write (report.html or report.md)")
    parser.add_argument("--format", dest="output_format", choices=["html", "markdown"], default="html")
    parser.add_argument("--title", help="the report's title (default: the suite's name, 'local batch' or "
                        "'patch evaluation')")
    parser.add_argument("--private", action="store_true",
                        help="with --jobs-dir: the operator's private report: the suite report plus every attempt's "
                        "timeline, patch and evaluation log (--out must say private, e.g. private-report.html; "
                        "never publish it)")
    parser.add_argument("--rate-card", type=Path, metavar="FILE", help="with --private: prices per model "
                        "(default: the shipped card)")
    parser.add_argument("--ledger", choices=["auto", "runs", "eval"], default="auto",
                        help="with --jobs-dir: the batch's run ledger or evaluate's eval-ledger (auto: the one "
                        "the directory holds)")
    return parser


def _holds(jobs_dir: Path, names: tuple[str, ...]) -> bool:
    return any(os.path.lexists(jobs_dir / name) for name in names)


def _ledger_kind(args: argparse.Namespace, jobs_dir: Path) -> str:
    """Which ledger ``--jobs-dir`` means: a batch's, or an ``evaluate`` call's (``--ledger`` when it holds both)."""
    from runner.ledger import LEDGER_JOURNAL, LEDGER_JSON
    from runner.score_patches import EVAL_JOURNAL, EVAL_JSON

    if args.ledger != "auto":
        return args.ledger
    runs, evals = _holds(jobs_dir, (LEDGER_JSON, LEDGER_JOURNAL)), _holds(jobs_dir, (EVAL_JSON, EVAL_JOURNAL))
    if runs and evals:
        raise BadInputError("--jobs-dir holds a batch's run ledger and an evaluation's eval-ledger: "
                            "say which with --ledger runs or --ledger eval")
    return "eval" if evals else "runs"


def _eval_report(args: argparse.Namespace, jobs_dir: Path) -> tuple[str, int]:
    from runner.score_patches import EvalLedger
    from runner.views.eval_report import build_eval_report

    private = view_private_texts([str(jobs_dir)])
    ledger = EvalLedger(jobs_dir, private)  # read only: nothing is written to the jobs dir
    generated = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    text = build_eval_report(ledger.document(), title=args.title or "patch evaluation", generated_at=generated,
                             output_format=args.output_format, private_texts=private)
    return text, len(ledger.rows)


def _rows(args: argparse.Namespace) -> tuple[list[TaskRow], BudgetFigures | None, list[str], str]:
    if args.jobs_dir is not None:
        if args.suite or args.broker:
            raise BadInputError("give --jobs-dir DIR, or --suite NAME --broker URL, not both")
        jobs_dir = ensure_dir(args.jobs_dir, "--jobs-dir")
        local = read_jobs_dir(jobs_dir)
        return local.rows, local.budget, [str(jobs_dir)], "local batch"
    if not (args.suite and args.broker):
        raise BadInputError("report needs --jobs-dir DIR, or both --suite NAME and --broker URL")
    from runner.fleet.broker import DEFAULT_NAMESPACE
    from runner.fleet.views import suite_from_broker
    from runner.tasks.protocol import check_suite

    namespace = args.namespace or os.environ.get("RUNNER_FLEET_NAMESPACE") or DEFAULT_NAMESPACE
    rows, budget = suite_from_broker(args.broker, check_suite(args.suite), namespace)
    return rows, budget, [args.broker], f"suite {args.suite}"


def _private_report(args: argparse.Namespace) -> tuple[str, int, int]:
    """The private report of a local batch: never a suite's from the broker (its job roots are on other hosts)."""
    from runner.pricing import load_rate_card
    from runner.views.private_report import build_private_report, check_private_name

    check_private_name(args.out)
    if args.jobs_dir is None or args.suite or args.broker:
        raise BadInputError("report --private needs --jobs-dir DIR (the job roots are read from this host)")
    if args.output_format != "html":
        raise BadInputError("report --private is HTML only")
    rows, budget, private, default_title = _rows(args)
    text = build_private_report(ensure_dir(args.jobs_dir, "--jobs-dir"), rows, title=args.title or default_title,
                                private_texts=view_private_texts(private), card=load_rate_card(args.rate_card),
                                budget=budget)
    return text, len(rows), sum(1 for row in rows if row.unreadable is not None)


def report(args: argparse.Namespace) -> tuple[dict[str, Any], int]:
    """Raises: BadInputError, BrokerUnavailableError, EnvironmentNotReadyError (``--out`` cannot be written),
    CompactInputError (an eval-ledger that cannot be read)."""
    if signals.pending() is not None:  # a signal while the runner started: python -m runner kept it until now
        signals.raise_interrupt(signals.pending() or 0, None)
    jobs_dir = ensure_dir(args.jobs_dir, "--jobs-dir") if args.jobs_dir is not None and not args.private else None
    if args.private:
        (text, count, unreadable), kind = _private_report(args), "runs"
    elif jobs_dir is not None and _ledger_kind(args, jobs_dir) == "eval":
        if args.suite or args.broker:
            raise BadInputError("give --jobs-dir DIR, or --suite NAME --broker URL, not both")
        (text, count), unreadable, kind = _eval_report(args, jobs_dir), 0, "eval"
    else:
        rows, budget, private, default_title = _rows(args)
        text = build_report(rows, title=args.title or default_title, output_format=args.output_format,
                            private_texts=view_private_texts(private), budget=budget)
        count, unreadable, kind = len(rows), sum(1 for row in rows if row.unreadable is not None), "runs"
    try:  # the private report too is the operator's file (0600), never a public one
        write_bytes_atomic(args.out.expanduser(), text.encode("utf-8"), mode=0o600 if args.private else 0o644)
    except OSError as e:
        raise EnvironmentNotReadyError(f"cannot write --out ({e.strerror or type(e).__name__})") from e
    counted = {"patches": count} if kind == "eval" else {"tasks": count}
    return ({"mode": "report", **({"private": True} if args.private else {}), "ledger": kind,
             "format": args.output_format, **counted, "unreadable": unreadable, "out": args.out.name},
            int(ExitCode.COMPLETED))


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    configure_logging()
    signals.interrupt_from_now_on()  # SIGTERM and SIGINT end the report (exit 130), as every command
    return answer("runner report", lambda: report(args), interrupted="interrupted; nothing was written")
