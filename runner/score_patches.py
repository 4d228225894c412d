"""``python -m runner evaluate``: score patches made anywhere, as the official evaluation scores them.

What AgentIssue-Bench's ``eval_patches.py`` does (one ``docker run --rm ... apply_patch
&& test_patched`` per patch, the stdout string rule), done the runner's way:
- each patch is one unit: a fresh container of the tag's image, pinned by id for the
  whole call, the patch copied in, apply then test in that container (the evaluate
  phase's own ``run_apply_and_test``), the official verdict by ``runner.verdict``
  exactly as ``--execute`` scores, the exit-code verdict beside it, a disagreement
  flagged, the tag profile's network and refusals applied as in ``--execute``;
- the patch file is what is scored: one that applies only in part fails (GNU
  ``patch`` exits non-zero) and is never judged on the part that applied;
- units run ``--workers`` at a time; a unit's deadline kills its own container only;
  every container carries the call's run id, so an interrupt removes them all;
- each row is upserted into ``OUT/eval-ledger.json`` (the batch's journal scheme);
  a rerun skips the rows already scored with the same patch bytes and retries the
  ones an infrastructure failure ended; the apply/test logs stay private under
  ``OUT/.eval-logs``.

No codex, no extraction, no job root: nothing here reads a task's text.
"""

from __future__ import annotations

import argparse
import hashlib
import re
import sys
import threading
import time
from collections import Counter, defaultdict
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from contextlib import ExitStack
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any, ClassVar

import docker
import structlog
from docker.errors import DockerException
from requests.exceptions import RequestException

from reducers.models import Frozen
from reducers.passk import pass_at_markdown, suite_pass_at_summary, tag_pass_at
from runner.atomic import open_private
from runner.containment import signals
from runner.context import new_run_id
from runner.images import task_image
from runner.docker_utils import (
    LABEL_PHASE,
    LABEL_RUN,
    connect,
    image_identity,
    remove_labelled,
    runner_labels,
)
from runner.entry import RunnerArgumentParser, add_evaluation_flags, answer, evaluation_flags
from runner.errors import BadInputError, EnvironmentNotReadyError, ExitCode, ImageMissingError
from runner.ledger import JournaledLedger
from runner.lock import job_root_lock
from runner.logs import configure_logging
from runner.patch_sets import PatchUnit, discover, single
from runner.journal import default_state_dir
from runner.network_probe import NETWORK_PROBE_PHASE, NetworkProbe, probe_memory, probe_once
from runner.phases.evaluate import EvalSinks, run_apply_and_test
from runner.phases.precheck import layout_refusal
from runner.public import private_texts_for
from runner.settings import RunnerSettings
from runner.tags import read_tags_file
from runner.tasks.spec import ensure_dir, settings_for_tags
from runner.verdict import official_verdict, string_verdict

log = structlog.get_logger(__name__)

EVAL_JSON = "eval-ledger.json"
EVAL_MD = "eval-ledger.md"
EVAL_JOURNAL = "eval-ledger.journal.jsonl"
EVAL_LOGS = ".eval-logs"
EVAL_LOCK = ".evaluate.lock"
SCHEMA = "agentissue_patch_evaluation_v1"
PHASE = "evaluate-patch"
MAX_WORKERS = 64
_LOG_NAME = re.compile(r"[^A-Za-z0-9_.+-]")


class UnitState(StrEnum):
    SCORED = "scored"  # run: the official verdict stands
    REJECTED = "rejected"  # not run (empty, not a patch, too large): scored FAILED, as the official script would
    UNSCORABLE = "unscorable"  # the tag's profile or image says no verdict can be trusted; not counted
    INFRA_FAILED = "infra_failed"  # Docker or the image failed: not counted, retried by a rerun


COUNTED = frozenset({UnitState.SCORED, UnitState.REJECTED})


class EvalRow(Frozen):
    """One patch's score: public facts only (hashes, sizes, verdicts, exit codes, ids)."""

    tag: str
    patch: str
    directory: str | None = None  # the tag directory's name when it was a spelling of ``tag``
    patch_sha256: str
    patch_bytes: int
    attempt: int | None = None
    state: UnitState
    label: str | None = None  # why not scored, or the rejection
    resolved: bool | None = None  # the official score
    exit_code_verdict: bool | None = None
    string_verdict: bool | None = None
    verdicts_disagree: bool = False
    apply_exit_code: int | None = None
    test_exit_code: int | None = None
    timed_out: bool = False
    apply_seconds: float | None = None
    test_seconds: float | None = None
    wall_seconds: float = 0.0
    image: str
    image_id: str | None = None
    image_digest: str | None = None
    network: str
    network_reachable: bool | None = None
    network_probed: list[str] | None = None  # the endpoints the probe tried
    needs_network: bool = False
    verdict_untrusted: bool = False

    @property
    def key(self) -> str:
        return f"{self.tag}/{self.patch}"

    @property
    def counted(self) -> bool:
        return self.state in COUNTED


class EvalLedger(JournaledLedger[EvalRow]):
    json_name, md_name, journal_name, schema = EVAL_JSON, EVAL_MD, EVAL_JOURNAL, SCHEMA
    row_type = EvalRow

    def scored(self, unit: PatchUnit) -> bool:
        """Already has its verdict for these very bytes (an infrastructure failure or a refused tag is tried again:
        the image may be back, ``--allow-unscorable`` given)."""
        row = self.rows.get(unit.key)
        return row is not None and row.patch_sha256 == unit.sha256 and row.counted

    def document(self) -> dict[str, Any]:
        return evaluation_document(list(self.rows.values()))

    def markdown(self, document: dict[str, Any]) -> str:
        return render_markdown(document)


def _rate(successes: int, patches: int) -> float | None:
    return round(successes / patches, 6) if patches else None


def evaluation_document(rows: list[EvalRow]) -> dict[str, Any]:
    """Rows, the per-tag official score, per patch name, and pass@k over attempts.

    A score is successes / counted patches: scored ones and rejected ones (FAILED, as the official
    script would have it); an unscorable or infrastructure-failed patch has no verdict, so it is shown
    (``patches``, ``states``) but not counted, and a rerun retries it.
    """
    ordered = sorted(rows, key=lambda r: (r.tag, r.attempt or 0, r.patch))
    by_tag: dict[str, list[EvalRow]] = defaultdict(list)
    by_name: dict[str, list[EvalRow]] = defaultdict(list)
    for row in ordered:
        by_tag[row.tag].append(row)
        by_name[row.patch].append(row)
    tags = []
    for tag, members in by_tag.items():
        states = Counter(r.state.value for r in members)
        successes = sum(1 for r in members if r.resolved)
        counted = sum(1 for r in members if r.counted)
        tags.append({
            "tag": tag, "patches": len(members), "counted": counted, "successes": successes,
            "score": _rate(successes, counted),
            "states": dict(sorted(states.items())),
            "exit_code_successes": sum(1 for r in members if r.exit_code_verdict),
            "verdicts_disagree": sum(1 for r in members if r.verdicts_disagree),
            "verdict_untrusted": any(r.verdict_untrusted for r in members),
        })
    successes = sum(1 for r in ordered if r.resolved)
    counted = sum(1 for r in ordered if r.counted)
    document: dict[str, Any] = {
        "schema_version": SCHEMA,
        "mode": "evaluate",
        "suite": {
            "tags": len(by_tag), "patches": len(ordered), "counted": counted, "successes": successes,
            "score": _rate(successes, counted),
            "tags_with_a_success": sum(1 for t in tags if t["successes"]),
            "states": dict(sorted(Counter(r.state.value for r in ordered).items())),
            "verdicts_disagree": sum(1 for r in ordered if r.verdicts_disagree),
        },
        "tags": tags,
        # One name across tags is one agent's patches (Patches/<tag>/agentless.patch): the paper's rows.
        "patch_names": [
            {"patch": name, "tags": len(members), "successes": sum(1 for r in members if r.resolved)}
            for name, members in sorted(by_name.items()) if len(members) > 1
        ],
        "tag_directories": {r.directory: r.tag for r in ordered if r.directory},
        "rows": [r.model_dump(mode="json") for r in ordered],
    }
    attempts = [r for r in ordered if r.attempt is not None]
    if attempts:
        summaries = tag_pass_at([(r.tag, r.counted, bool(r.resolved)) for r in attempts])
        document["pass_at"] = {"tasks": summaries, "suite": suite_pass_at_summary(summaries)}
    return document


def _yes(value: bool | None) -> str:
    return {True: "yes", False: "no", None: "-"}[value]


def render_markdown(document: dict[str, Any]) -> str:
    suite = document["suite"]
    lines = [
        "# Patch evaluation", "",
        f"{suite['successes']} of {suite['counted']} counted patches ({suite['patches']} in all) pass the official "
        f"rule over {suite['tags']} tags "
        f"({suite['tags_with_a_success']} tags with a passing patch); states: "
        + (", ".join(f"{k} {v}" for k, v in suite["states"].items()) or "none"), "",
        "| tag | patches | counted | successes | score | exit-code successes | disagreements | untrusted |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for tag in document["tags"]:
        score = "-" if tag["score"] is None else f"{tag['score']:.3f}"
        lines.append(f"| {tag['tag']} | {tag['patches']} | {tag['counted']} | {tag['successes']} | {score} | "
                     f"{tag['exit_code_successes']} | {tag['verdicts_disagree']} | {_yes(tag['verdict_untrusted'])} |")
    lines += ["", "| tag | patch | state | label | resolved | exit-code verdict | disagree | apply exit | test exit "
              "| timed out | seconds | sha256 | bytes |", "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for row in document["rows"]:
        lines.append(
            f"| {row['tag']} | {row['patch']} | {row['state']} | {row['label'] or '-'} | {_yes(row['resolved'])} | "
            f"{_yes(row['exit_code_verdict'])} | {'yes' if row['verdicts_disagree'] else 'no'} | "
            f"{'-' if row['apply_exit_code'] is None else row['apply_exit_code']} | "
            f"{'-' if row['test_exit_code'] is None else row['test_exit_code']} | {_yes(row['timed_out'])} | "
            f"{row['wall_seconds']:.1f} | {row['patch_sha256'][:12]} | {row['patch_bytes']} |"
        )
    if document["patch_names"]:
        lines += ["", "## By patch name (one agent's patches across tags)", "", "| patch | tags | successes |",
                  "|---|---|---|"]
        lines += [f"| {n['patch']} | {n['tags']} | {n['successes']} |" for n in document["patch_names"]]
    if document["tag_directories"]:
        lines += ["", "Tag directories mapped: "
                  + ", ".join(f"{d} -> {t}" for d, t in sorted(document["tag_directories"].items()))]
    if "pass_at" in document:
        lines += ["", *pass_at_markdown(document["pass_at"]["tasks"], document["pass_at"]["suite"])]
    return "\n".join(lines) + "\n"


# -- scoring ---------------------------------------------------------------------------------


@dataclass
class TagPlan:
    """What a tag's units share: settings, the pinned image, why it cannot be scored, the network fact."""

    settings: RunnerSettings
    image_id: str | None = None
    digest: str | None = None
    refusal: tuple[UnitState, str] | None = None  # (UNSCORABLE | INFRA_FAILED, label)
    probe: Future[NetworkProbe] | None = None

    @property
    def needs_network(self) -> bool:
        return bool(self.settings.profile and self.settings.profile.needs_network)


class Scorer:
    """Runs units on a pool of threads, each with its own Docker client; the main thread writes the ledger."""

    def __init__(self, *, jobs_dir: Path, ledger: EvalLedger, workers: int, run_id: str) -> None:
        self.jobs_dir, self.ledger, self.workers, self.run_id = jobs_dir, ledger, workers, run_id
        self.cancel = threading.Event()
        self._local = threading.local()
        self._clients: list[docker.DockerClient] = []
        self._clients_lock = threading.Lock()

    def client(self) -> docker.DockerClient:
        client = getattr(self._local, "client", None)
        if client is None:
            client = connect()
            self._local.client = client
            with self._clients_lock:
                self._clients.append(client)
        return client

    def close(self) -> None:
        for client in self._clients:
            client.close()

    def labels(self, job: str, phase: str = PHASE) -> dict[str, str]:
        return runner_labels(job_id=f"evaluate-{self.run_id}-{job}"[:64], run_id=self.run_id, phase=phase)

    # A tag, once: its image, its refusals, its network.
    def plan(self, settings: RunnerSettings, probes: ThreadPoolExecutor) -> TagPlan:
        plan = TagPlan(settings=settings)
        profile = settings.profile
        if profile and profile.refusal and not settings.allow_unscorable:
            plan.refusal = (UnitState.UNSCORABLE, f"profile: {profile.refusal}")
            return plan
        try:
            client = self.client()
            plan.image_id, plan.digest = image_identity(
                task_image(client, settings))
            labels = self.labels(f"plan-{settings.tag}", phase="evaluate-layout-probe")
            layout = layout_refusal(client, settings, plan.image_id, labels)
            if layout is not None and not settings.allow_unscorable:
                plan.refusal = (UnitState.UNSCORABLE, f"image: {layout}")
                return plan
            plan.probe = probes.submit(self._probe, settings, plan.image_id, {**labels, LABEL_PHASE: NETWORK_PROBE_PHASE})
        except ImageMissingError:
            plan.refusal = (UnitState.INFRA_FAILED, "image_missing")
        except EnvironmentNotReadyError as e:
            plan.refusal = (UnitState.INFRA_FAILED, e.reason)
        except (DockerException, RequestException) as e:
            plan.refusal = (UnitState.INFRA_FAILED, f"docker_error: {type(e).__name__}")
        return plan

    def _probe(self, settings: RunnerSettings, image_id: str, labels: dict[str, str]) -> NetworkProbe:
        return probe_once(self.client(), probe_memory(settings.state_dir or default_state_dir()),
                          needs_network=bool(settings.profile and settings.profile.needs_network),
                          image_id=image_id, network=settings.eval_network.value, labels=labels,
                          endpoints=settings.probe_endpoints)

    def _row(self, unit: PatchUnit, plan: TagPlan, **facts: Any) -> EvalRow:
        return EvalRow(
            tag=unit.tag, patch=unit.name, directory=unit.directory, patch_sha256=unit.sha256,
            patch_bytes=unit.size, attempt=unit.attempt, image=plan.settings.resolved_image,
            image_id=plan.image_id, image_digest=plan.digest, network=plan.settings.eval_network.value,
            needs_network=plan.needs_network, **facts,
        )

    def without_a_run(self, unit: PatchUnit, plan: TagPlan) -> EvalRow | None:
        """The row of a unit that needs no container (rejected, or its tag refused), else None."""
        if plan.refusal is not None:
            state, label = plan.refusal
            return self._row(unit, plan, state=state, label=label)
        if unit.rejection is not None:
            return self._row(unit, plan, state=UnitState.REJECTED, label=unit.rejection, resolved=False,
                             exit_code_verdict=False, string_verdict=False)
        return None

    def score(self, index: int, unit: PatchUnit, plan: TagPlan) -> EvalRow | None:
        """One unit in its own container; None when the call was cancelled before it started."""
        if self.cancel.is_set():
            return None
        started = time.monotonic()
        settings = plan.settings
        try:
            data = unit.path.read_bytes() if unit.path.stat().st_size == unit.size else b""
        except OSError:
            data = b""
        if hashlib.sha256(data).hexdigest() != unit.sha256:
            return self._row(unit, plan, state=UnitState.INFRA_FAILED, label="patch_changed_while_scoring")
        logs = self.jobs_dir / EVAL_LOGS / unit.tag / _LOG_NAME.sub("_", unit.name)
        logs.mkdir(parents=True, exist_ok=True)
        paths = {part: logs / f"{part}.log" for part in ("apply", "test", "apply.stderr", "test.stderr")}
        try:
            with ExitStack() as stack:
                sinks = {part: stack.enter_context(open_private(path)) for part, path in paths.items()}
                run = run_apply_and_test(
                    self.client(), image_id=plan.image_id or "", labels=self.labels(str(index)), patch=data,
                    apply_cmd=settings.apply_cmd, test_cmd=settings.test_cmd, network=settings.eval_network.value,
                    timeout=settings.eval_timeout,
                    sinks=EvalSinks(sinks["apply"], sinks["test"], sinks["apply.stderr"], sinks["test.stderr"]),
                )
        except ImageMissingError:
            return self._row(unit, plan, state=UnitState.INFRA_FAILED, label="image_missing")
        except (DockerException, RequestException) as e:
            return self._row(unit, plan, state=UnitState.INFRA_FAILED, label=f"docker_error: {type(e).__name__}")
        stdout_logs = [paths["apply"], paths["test"]]  # the official command's stdout, in order
        by_strings = string_verdict(stdout_logs)
        by_exit = run.exit_code_verdict
        probe = plan.probe.result() if plan.probe is not None else NetworkProbe(None, "probe_failed")
        return self._row(
            unit, plan, state=UnitState.SCORED, label="eval_timeout" if run.timed_out else None,
            resolved=official_verdict(None if run.timed_out else run.container_exit_code, stdout_logs),
            exit_code_verdict=by_exit, string_verdict=by_strings, verdicts_disagree=by_exit != by_strings,
            apply_exit_code=run.apply_exit_code, test_exit_code=run.test_exit_code, timed_out=run.timed_out,
            apply_seconds=run.apply_seconds, test_seconds=run.test_seconds,
            wall_seconds=round(time.monotonic() - started, 3), network_reachable=probe.reachable,
            network_probed=list(probe.endpoints), verdict_untrusted=plan.needs_network and probe.reachable is not True,
        )

    def run(self, units: list[PatchUnit], settings: dict[str, RunnerSettings], progress: Progress) -> list[EvalRow]:
        """Score ``units``, upserting each row as it comes. On an interrupt: cancel, remove every container, re-raise."""
        rows: list[EvalRow] = []
        futures: dict[Future[EvalRow | None], PatchUnit] = {}
        planned: dict[str, Future[TagPlan]] = {}
        tags = list(dict.fromkeys(unit.tag for unit in units))
        with (ThreadPoolExecutor(max_workers=max(1, min(len(tags), 8)), thread_name_prefix="probe") as probes,
              ThreadPoolExecutor(max_workers=self.workers, thread_name_prefix="evaluate") as pool):
            try:
                planned = {tag: pool.submit(self.plan, settings[tag], probes) for tag in tags}
                plans = {tag: future.result() for tag, future in planned.items()}
                for index, unit in enumerate(units):
                    row = self.without_a_run(unit, plans[unit.tag])
                    if row is not None:
                        self._record(row, rows, progress)
                    else:
                        futures[pool.submit(self.score, index, unit, plans[unit.tag])] = unit
                pending = set(futures)
                while pending:
                    done, pending = wait(pending, timeout=1.0, return_when=FIRST_COMPLETED)
                    for future in done:
                        row = future.result()
                        if row is not None:
                            self._record(row, rows, progress)
            except BaseException:
                self.cancel.set()
                with signals.deferred():
                    self._remove_all([*futures, *planned.values()])
                raise
        return rows

    def _record(self, row: EvalRow, rows: list[EvalRow], progress: Progress) -> None:
        self.ledger.upsert(row)
        rows.append(row)
        progress.advance(row)

    def _remove_all(self, futures: list[Future[Any]]) -> None:
        """Every container of this call, until no unit runs any more (a create may answer late)."""
        for future in futures:
            future.cancel()
        client = self.client()
        removed = 0
        while True:
            removed += remove_labelled(client, {LABEL_RUN: self.run_id})
            if all(future.done() for future in futures):
                break
            wait(futures, timeout=0.2)
        removed += remove_labelled(client, {LABEL_RUN: self.run_id})
        log.info("evaluate_interrupted", containers_removed=removed)


class Progress:
    """Rows as they come: a bar on a terminal (rich), a log line each elsewhere."""

    def __init__(self, total: int, skipped: int) -> None:
        self.total, self.done = total, 0
        self._bar: Any = None
        log.info("evaluate_started", units=total, skipped_as_scored=skipped)
        if sys.stderr.isatty() and total:
            from rich.progress import Progress as RichBar

            self._bar = RichBar(transient=False)
            self._task = self._bar.add_task("scoring patches", total=total)

    def __enter__(self) -> Progress:
        if self._bar is not None:
            self._bar.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._bar is not None:
            self._bar.stop()

    def advance(self, row: EvalRow) -> None:
        self.done += 1
        log.info("patch_scored", unit=row.key, state=row.state.value, label=row.label, resolved=row.resolved,
                 done=self.done, total=self.total)
        if self._bar is not None:
            self._bar.advance(self._task)


# -- the command -----------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = RunnerArgumentParser(
        prog="python -m runner evaluate",
        description="Score patches made anywhere by the official rule, each in a fresh container of its tag's image: "
        "the layout DIR/<tag>/*.patch (as AgentIssue-Bench's Patches/), or one --patch FILE --tag T.",
        epilog="Exit codes: 0 every patch has its verdict; 2 bad input; 3 some patches could not be run "
        "(Docker, the image): rerun to retry them; 130 interrupted (rerun resumes).",
    )
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--patches-dir", type=Path, help="the folder holding <tag>/*.patch")
    source.add_argument("--patch", type=Path, help="one patch file (with one --tag)")
    parser.add_argument("--tag", action="append", help="only this tag (repeatable); with --patch, its tag")
    parser.add_argument("--tags-file", type=Path, help="only these tags: one a line, '#' comments")
    parser.add_argument("--jobs-dir", type=Path, required=True, help="where the ledger and private logs go (created)")
    parser.add_argument("--workers", type=int, default=1, help=f"patches scored at once (1 to {MAX_WORKERS}; default 1)")
    parser.add_argument("--attempts-as-patches", action="store_true",
                        help="each patch of a tag is one attempt of one agent: pass@k over them")
    add_evaluation_flags(parser)
    parser.add_argument("--format", dest="output_format", choices=["json", "markdown"], default="json")
    return parser


def _units(args: argparse.Namespace) -> list[PatchUnit]:
    tags = list(args.tag or [])
    if args.tags_file is not None:
        tags += read_tags_file(args.tags_file)
    if args.patch is not None:
        if len(tags) != 1:
            raise BadInputError("--patch goes with exactly one --tag (the tag whose image scores it)")
        return single(args.patch, tags[0])
    return discover(args.patches_dir, tags=tags or None, attempts_as_patches=args.attempts_as_patches)


def score_units(
    jobs_dir: Path, units: list[PatchUnit], settings: dict[str, RunnerSettings], *, workers: int = 1
) -> tuple[EvalLedger, list[EvalRow], int]:
    """Score ``units`` into ``jobs_dir``'s eval ledger under its lock: (the ledger, the rows scored now, how many
    were skipped as already scored). The one scoring path of ``evaluate`` and of a fleet worker's evaluation unit.

    Raises: JobRootBusyError, DockerUnavailableError; KeyboardInterrupt after every container is removed.
    """
    connect().close()  # no daemon: refused before the ledger is touched
    with job_root_lock(jobs_dir, name=EVAL_LOCK, what="evaluate"):
        ledger = EvalLedger(jobs_dir, private_texts_for(jobs_dir))
        todo = [unit for unit in units if not ledger.scored(unit)]
        scorer = Scorer(jobs_dir=jobs_dir, ledger=ledger, workers=workers, run_id=new_run_id())
        try:
            with Progress(len(todo), len(units) - len(todo)) as progress:
                rows = scorer.run(todo, settings, progress)
        finally:
            ledger.compact()
            scorer.close()
    return ledger, rows, len(units) - len(todo)


def run_evaluate(args: argparse.Namespace) -> tuple[dict[str, Any], int]:
    """Raises: BadInputError, JobRootBusyError, DockerUnavailableError."""
    if not 1 <= args.workers <= MAX_WORKERS:
        raise BadInputError(f"--workers must be between 1 and {MAX_WORKERS}")
    units = _units(args)  # every patch read and classified before any work
    tags = list(dict.fromkeys(unit.tag for unit in units))
    if args.image and len(tags) > 1:
        raise BadInputError("--image goes with one tag; each tag of a patches dir gets its own image")
    settings = {one.tag: one for one in settings_for_tags(tags, evaluation_flags(args))}
    jobs_dir = ensure_dir(args.jobs_dir, "--jobs-dir")
    ledger, rows, skipped = score_units(jobs_dir, units, settings, workers=args.workers)
    document = ledger.document()
    keys = {unit.key for unit in units}
    mine = [row for row in ledger.rows.values() if row.key in keys]
    failed = [row for row in mine if row.state is UnitState.INFRA_FAILED]
    rejected = sorted(row.key for row in mine if row.state is UnitState.REJECTED)
    messages = []
    if rejected:
        messages.append(f"{len(rejected)} patches were not run and count as FAILED ({', '.join(rejected[:5])})")
    if failed:
        messages.append(f"{len(failed)} patches could not be run ({failed[0].label}); rerun to retry them")
    document["call"] = {"units": len(units), "scored_now": len(rows), "skipped_as_scored": skipped}
    document["message"] = "; ".join(messages)
    return document, int(ExitCode.BAD_ENVIRONMENT if failed else ExitCode.COMPLETED)


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    configure_logging()
    signals.interrupt_from_now_on()
    return answer("runner evaluate", lambda: run_evaluate(args), args.output_format, markdown=render_markdown,
                  interrupted="evaluate interrupted; every container is removed and the ledger holds every patch "
                  "scored so far: rerun to resume")
