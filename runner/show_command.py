"""``python -m runner show`` and ``python -m runner export``: what the agent did, for the operator.

Both read one attempt's private job root (``--job-root DIR``, or ``--jobs-dir DIR --tag T
[--attempt I]``) and write only to the operator's terminal (``show``) or to stdout / ``--out``
(``export``): never a public file, never through ``runner.public``. Read only: an attempt
still running is shown as far as it has got (``show --follow`` prints its steps as they come
and returns when it ends).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from collections.abc import Callable
from typing import Any, TextIO

from reducers.models import Phase
from runner.atomic import write_bytes_atomic
from runner.containment import signals
from runner.entry import RunnerArgumentParser, refused
from runner.errors import REFUSALS, BadInputError, EnvironmentNotReadyError, ExitCode
from runner.jobroot import PROMPT
from runner.logs import configure_logging
from runner.pricing import RateCard, load_rate_card
from runner.tags import check_tag
from runner.trajectory.atif import to_atif
from runner.trajectory.attempt import AttemptView, attempt_root, read_attempt, read_markers_tolerant
from runner.trajectory.timeline import Line, header_lines, item_lines, step_header, summary_lines, timeline


def _add_target(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--job-root", type=Path, help="one attempt's job root")
    parser.add_argument("--jobs-dir", type=Path, help="a batch's jobs dir (with --tag)")
    parser.add_argument("--tag", help="the tag in --jobs-dir")
    parser.add_argument("--attempt", type=int, help="the attempt of --tag (DIR/<tag>/attempt-<i>), when it has several")
    parser.add_argument("--rate-card", type=Path, metavar="FILE", help="prices per model (default: the shipped card)")


def target_root(args: argparse.Namespace) -> Path:
    """Raises: BadInputError (neither or both of --job-root and --jobs-dir, a bad tag)."""
    if (args.job_root is None) == (args.jobs_dir is None):
        raise BadInputError("give --job-root DIR, or --jobs-dir DIR --tag T [--attempt I]")
    if args.job_root is not None:
        if args.tag or args.attempt is not None:
            raise BadInputError("--tag and --attempt go with --jobs-dir, not --job-root")
        return args.job_root
    if not args.tag:
        raise BadInputError("--jobs-dir needs --tag T")
    if args.attempt is not None and args.attempt < 1:
        raise BadInputError("--attempt counts from 1")
    return attempt_root(args.jobs_dir, check_tag(args.tag, "--tag"), args.attempt)


class _Printer:
    """Styled lines to a terminal through rich; plain text to anything else."""

    def __init__(self, out: TextIO) -> None:
        self._out = out
        self._console = None
        if out.isatty():
            from rich.console import Console

            self._console = Console(file=out, highlight=False, soft_wrap=True)

    def __call__(self, lines: list[Line]) -> None:
        for line in lines:
            if self._console is not None:
                from rich.text import Text

                self._console.print(Text(line.text, style=line.style or ""))
            else:
                print(line.text, file=self._out)
        self._out.flush()


def follow(root: Path, card: RateCard, emit: _Printer, *, poll_seconds: float) -> AttemptView:
    """Print the attempt's steps as their items complete; return when it is no longer running."""
    view = read_attempt(root, card=card)
    emit(header_lines(view))
    printed, step_shown = 0, 0
    while True:
        running = view.running
        flat = [(step, item) for step in view.trajectory.steps for item in step.items] if view.trajectory else []
        while printed < len(flat):
            step, item = flat[printed]
            if running and not item.completed:
                break  # printed once it completes
            if step.number != step_shown:
                emit([step_header(step)])
                step_shown = step.number
            emit(item_lines(item))
            printed += 1
        if not running:
            emit(summary_lines(view))
            return view
        time.sleep(poll_seconds)
        view = read_attempt(root, card=card)


def show(args: argparse.Namespace) -> int:
    root = target_root(args)
    card = load_rate_card(args.rate_card)
    emit = _Printer(sys.stdout)
    if args.follow:
        follow(root, card, emit, poll_seconds=args.poll_seconds)
    else:
        emit(timeline(read_attempt(root, card=card, tail_lines=args.tail_lines)))
    return int(ExitCode.COMPLETED)


def show_parser() -> argparse.ArgumentParser:
    parser = RunnerArgumentParser(
        prog="python -m runner show",
        description="One attempt as a timeline: the prompt, each step's messages, commands (exit codes, durations) "
        "and file changes, tokens and cost, the patch, the evaluation with its log tails, verdicts and phase times. "
        "Private: for the operator's terminal only; reads the job root and writes nothing.",
    )
    _add_target(parser)
    parser.add_argument("--follow", action="store_true", help="print steps as they happen; return when the attempt ends")
    parser.add_argument("--poll-seconds", type=float, default=0.5, help="with --follow: how often to look (default 0.5)")
    parser.add_argument("--tail-lines", type=int, default=20, help="lines of each evaluation log (default 20)")
    return parser


def _command(prog: str, parser: argparse.ArgumentParser, body: Callable[[argparse.Namespace], int],
             argv: list[str] | None) -> int:
    """Both commands answer alike: a refusal is one line and its exit code; Ctrl-C is 130."""
    args = parser.parse_args(argv)
    configure_logging()
    signals.interrupt_from_now_on()
    try:
        return body(args)
    except REFUSALS as e:
        return refused(prog, e)
    except KeyboardInterrupt:
        return int(ExitCode.INTERRUPTED)


def show_main(argv: list[str] | None = None) -> int:
    return _command("runner show", show_parser(), show, argv)


# -- export -------------------------------------------------------------------------------------------

def _codex_version(root: Path) -> str | None:
    precheck = read_markers_tolerant(root / "result-markers").get(Phase.PRECHECK)
    return getattr(precheck.details, "codex_version", None) if precheck is not None else None


def export_one(root: Path, card: RateCard) -> dict[str, Any]:
    view = read_attempt(root, card=card)
    return to_atif(view, codex_version=_codex_version(view.root))


def _jobs_dir_roots(jobs_dir: Path) -> list[tuple[str, Path]]:
    """Every attempt of a jobs dir: (file stem, job root)."""
    found = []
    for tag_dir in sorted(p for p in jobs_dir.iterdir() if p.is_dir() and not p.name.startswith(".")):
        attempts = sorted((p for p in tag_dir.glob("attempt-*") if p.is_dir()), key=lambda p: p.name)
        if attempts:
            found += [(f"{tag_dir.name}.{p.name}", p) for p in attempts]
        elif (tag_dir / PROMPT).exists() or (tag_dir / "logs").is_dir():
            found.append((tag_dir.name, tag_dir))
    return found


def _write(path: Path, document: dict[str, Any]) -> None:
    try:
        write_bytes_atomic(path, (json.dumps(document, indent=2, ensure_ascii=False) + "\n").encode(), mode=0o600)
    except OSError as e:
        raise EnvironmentNotReadyError(f"cannot write {path.name} ({e.strerror or type(e).__name__})") from e


def export_documents(args: argparse.Namespace) -> dict[str, Any]:
    card = load_rate_card(args.rate_card)
    if args.jobs_dir is not None and not args.tag:
        if args.out is None:
            raise BadInputError("export of a whole --jobs-dir needs --out DIR (one <tag>.trajectory.json per attempt)")
        jobs_dir = args.jobs_dir.expanduser()
        if not jobs_dir.is_dir():
            raise BadInputError(f"--jobs-dir {jobs_dir.name} is not a directory")
        args.out.mkdir(parents=True, exist_ok=True, mode=0o700)
        written, skipped = [], []
        for stem, root in _jobs_dir_roots(jobs_dir):
            try:
                _write(args.out / f"{stem}.trajectory.json", export_one(root, card))
                written.append(stem)
            except BadInputError as e:  # an attempt codex never ran: said, not fatal
                skipped.append({"attempt": stem, "why": str(e)})
        return {"mode": "export", "format": args.format, "written": written, "skipped": skipped}
    document = export_one(target_root(args), card)
    if args.out is None:
        print(json.dumps(document, indent=2, ensure_ascii=False))
        return {}
    _write(args.out, document)
    return {"mode": "export", "format": args.format, "written": [args.out.name]}


def export_parser() -> argparse.ArgumentParser:
    parser = RunnerArgumentParser(
        prog="python -m runner export",
        description="An attempt (or every attempt of a jobs dir) in Harbor's Agent Trajectory Interchange Format "
        "(ATIF v1.4), validated before it is written. Private: it holds the prompt, messages and outputs.",
    )
    _add_target(parser)
    parser.add_argument("--format", choices=["atif"], default="atif", help="the format (atif)")
    parser.add_argument("--out", type=Path, help="a file (one attempt; default stdout) or, for a whole --jobs-dir, "
                        "a directory")
    return parser


def export(args: argparse.Namespace) -> int:
    report = export_documents(args)
    if report:  # what was written goes to stderr: stdout is the document when there is no --out
        print(json.dumps(report), file=sys.stderr)
    return int(ExitCode.COMPLETED)


def export_main(argv: list[str] | None = None) -> int:
    return _command("runner export", export_parser(), export, argv)
