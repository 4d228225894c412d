"""``python -m runner submit | status | cancel``: put a suite on the queue, read its ledger, stop it.

A suite's units are tasks (``--prompts-dir``: an agent per tag and attempt) or evaluation
units (``--patches-dir``: one patch each, scored as ``python -m runner evaluate`` scores it).

Invariants: submitting is idempotent per (suite, tag, attempt) and per (suite, tag, patch
name, sha256) (a unit already queued, running or done is not queued again; the ledger's
transaction decides, so two submits racing queue it once); a patches dir is read and every
patch classified before anything is queued (``runner.patch_sets``'s errors, exactly); status
output passes the public guard; cancel drops queued messages and interrupts running units
through the child's cleanup; ``--dry-run`` writes nothing to the broker.

A suite's budget (``submit --suite-budget-usd``) is kept with the suite and replaced by the next
submit that names one; a resubmission queues again what the budget skipped (``skipped_budget``
is not an active state), so a rerun with a larger budget finishes what the smaller one left.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import redis
import structlog
from dramatiq import Message

from reducers.costs import cost_summary, estimate_cost
from reducers.guard import check_public
from reducers.compare import agent_comparison, comparison_markdown
from reducers.passk import pass_at_markdown, suite_pass_at_summary, tag_pass_at
from runner.budget import check_budget
from runner.entry import RunnerArgumentParser, add_task_flags, answer, task_flags
from runner.docker_utils import connect
from runner.errors import BadInputError, BrokerUnavailableError, DockerUnavailableError, ExitCode
from runner.fleet.broker import (
    DEFAULT_NAMESPACE,
    DEFAULT_QUEUE,
    Keys,
    check_queue,
    connect_redis,
    make_broker,
    task_message,
    where,
)
from runner.fleet.budget import FleetBudget
from runner.fleet.ledger import ACTIVE_STATES, LedgerRow, SuiteLedger, TaskState, now, summary
from runner.jobroot import PROMPT, SYNTHETIC_PROMPT_MARKER
from runner.ledger import cost_markdown
from runner.logs import configure_logging
from runner.public import private_texts_for
from runner.tags import check_attempts, check_tag, read_tags_file, unique_tags
from runner.tasks.protocol import (
    MAX_PROMPT_BYTES,
    MAX_QUEUED_PATCH_BYTES,
    EvalMessage,
    EvalUnit,
    TaskMessage,
    check_suite,
    eval_key,
    task_arm,
    task_key,
)
from runner.images import pin_names
from runner.tasks.spec import HostSettings, TaskSpec, resolve
from runner.tasks.spec import read_operator

if TYPE_CHECKING:  # the patch scoring's modules (docker, git) load only for an evaluation's submit or status
    from runner.patch_sets import PatchUnit

log = structlog.get_logger(__name__)


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--broker", required=True, help="redis://HOST:PORT/DB")
    parser.add_argument("--namespace", default=os.environ.get("RUNNER_FLEET_NAMESPACE", DEFAULT_NAMESPACE),
                        help="prefix of every Redis key (env RUNNER_FLEET_NAMESPACE)")


# -- submit ----------------------------------------------------------------------------------


def submit_parser() -> argparse.ArgumentParser:
    parser = RunnerArgumentParser(prog="python -m runner submit", description="Queue a suite: one task per tag and attempt "
                                  "(--prompts-dir), or one evaluation unit per patch of DIR/<tag>/*.patch (--patches-dir, "
                                  "scored as `python -m runner evaluate` scores it). "
                                  "Each unit carries the task flags as given (the same as a single run's); each "
                                  "worker fills the rest from the tag's own profile, as a single run does.")
    _common(parser)
    parser.add_argument("--suite", required=True, help="the suite's name (letters, digits, '_ . -')")
    parser.add_argument("--tag", action="append", help="a tag (repeatable)")
    parser.add_argument("--tags-file", type=Path, help="one tag a line, '#' comments")
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--prompts-dir", type=Path, help="prompts at DIR/<tag>/context/prompt.md: one task per tag and attempt")
    source.add_argument("--patches-dir", type=Path,
                        help="patches at DIR/<tag>/*.patch: one evaluation unit per patch (--tag/--tags-file: only those)")
    parser.add_argument("--attempts-as-patches", action="store_true",
                        help="with --patches-dir: each patch of a tag is one attempt of one agent (pass@k over them)")
    parser.add_argument("--attempts", type=int, default=1, help="independent attempts per tag (default 1)")
    parser.add_argument("--queue", default=DEFAULT_QUEUE, help=f"the queue (pool of hosts) to run on (default {DEFAULT_QUEUE})")
    parser.add_argument("--suite-budget-usd", type=float, metavar="DOLLARS",
                        help="with --prompts-dir: no task of the suite starts once its cost (finished tasks, plus the "
                        "running ones' so far, on every host) would pass this; the rest end skipped_budget, and a "
                        "submit with a larger budget queues them again (kept with the suite; replaces its earlier one)")
    parser.add_argument("--dry-run", action="store_true",
                        help="queue nothing: say what would be queued and, from the ledger's history (the same model's "
                        "priced attempts, per tag where the tag has some), what it should cost")
    add_task_flags(parser, many_tags=True)
    return parser


def _read_prompt(prompts_dir: Path, tag: str) -> str | None:
    """The tag's prompt, or None when it is missing, empty, too big or the synthetic placeholder."""
    try:
        data = (prompts_dir / tag / PROMPT).read_bytes()
    except OSError:
        return None
    if len(data) > MAX_PROMPT_BYTES:
        return None
    text = data.decode("utf-8", errors="replace")
    return text if text.strip() and SYNTHETIC_PROMPT_MARKER not in text else None


def _queued_bytes(unit: PatchUnit) -> bytes:
    """The bytes a unit's message carries: none for a rejected patch (never opened, or nothing to apply).

    Raises: BadInputError, when the file changed since it was classified (or cannot be read any more)."""
    if unit.rejection is not None:
        return b""
    try:
        data = unit.path.read_bytes()
    except OSError as e:
        raise BadInputError(f"the patch {unit.key!r} cannot be read ({e.strerror or type(e).__name__})") from e
    if len(data) != unit.size or hashlib.sha256(data).hexdigest() != unit.sha256:
        raise BadInputError(f"the patch {unit.key!r} changed while it was submitted; submit again")
    return data


def submit_patches(args: argparse.Namespace, suite: str, queue: str, tags: list[str],
                   template: TaskSpec) -> tuple[dict[str, Any], int]:
    """One evaluation unit per patch; a unit already queued, running or scored with these bytes is skipped."""
    if args.attempts != 1:
        raise BadInputError("--attempts goes with --prompts-dir; with --patches-dir each patch is one unit "
                            "(--attempts-as-patches: a tag's patches are attempts)")
    if args.suite_budget_usd is not None:
        raise BadInputError("--suite-budget-usd goes with --prompts-dir: scoring a patch runs no agent and costs nothing")
    from runner.patch_sets import discover

    units = discover(args.patches_dir, tags=tags or None, attempts_as_patches=args.attempts_as_patches)
    large = [unit.key for unit in units if unit.rejection is None and unit.size > MAX_QUEUED_PATCH_BYTES]
    if large:
        raise BadInputError(f"{len(large)} patches are larger than the queue carries "
                            f"({MAX_QUEUED_PATCH_BYTES // (1024 * 1024)} MiB: {', '.join(large[:3])}); "
                            "score them with `python -m runner evaluate`")
    specs = {tag: template.for_tag(tag) for tag in dict.fromkeys(unit.tag for unit in units)}
    messages = [EvalMessage(suite=suite, spec=specs[unit.tag], data=base64.b64encode(_queued_bytes(unit)).decode(),
                            unit=EvalUnit(name=unit.name, directory=unit.directory, attempt=unit.attempt,
                                          sha256=unit.sha256, size=unit.size, rejection=unit.rejection))
                for unit in units]  # every patch read before anything is queued
    client = connect_redis(args.broker)
    keys = Keys(args.namespace)
    ledger = SuiteLedger(client, keys, suite)
    broker = make_broker(args.broker, args.namespace)
    queued = skipped = 0
    try:
        for message in messages:
            fresh = LedgerRow(kind="eval", tag=message.tag, attempt=message.attempt, patch=message.unit.name,
                              patch_sha256=message.unit.sha256, patch_bytes=message.unit.size,
                              state=TaskState.QUEUED, queue=queue, submitted_at=now())

            def change(cur: LedgerRow | None, fresh: LedgerRow = fresh) -> LedgerRow | None:
                same = cur is not None and cur.patch_sha256 == fresh.patch_sha256
                return None if same and cur.state in ACTIVE_STATES else fresh

            if args.dry_run:
                wanted = change(ledger.get(message.key)) is not None
                queued, skipped = queued + wanted, skipped + (not wanted)
            elif ledger.update(message.key, change):
                client.srem(keys.cancelled(suite), message.key)
                broker.enqueue(task_message(message, queue))
                queued += 1
            else:
                skipped += 1
    finally:
        _leave_no_heartbeat(client, keys, broker)
    report = {"mode": "submit", "suite": suite, "queue": queue, "kind": "eval", "units": len(messages),
              "queued": queued, "skipped_existing": skipped, "refused": 0,
              "rejected": sorted(m.key for m in messages if m.unit.rejection is not None),
              **({"dry_run": True} if args.dry_run else {})}
    log.info("suite_submitted", **{k: v for k, v in report.items() if k != "rejected"})
    return report, int(ExitCode.COMPLETED)


def pin_specs(specs: dict[str, TaskSpec]) -> dict[str, TaskSpec]:
    """Each tag's image pinned at submit time (a registry lookup through the daemon, no pull; a local
    image is pinned by its id), so every host evaluates the same image whatever is pushed meanwhile.
    No daemon here: the tasks go unpinned, and each host uses the name as it finds it (logged)."""
    try:
        client = connect()
    except DockerUnavailableError:
        log.warning("images_not_pinned", why="no Docker daemon where submit runs: each host resolves the name")
        return specs
    try:
        names = {tag: resolve(spec, HostSettings()).image_name for tag, spec in specs.items()}
        pins = pin_names(client, names, allow_pull=True)
    finally:
        client.close()
    return {tag: spec.pinned(pins[tag].ref if tag in pins else None) for tag, spec in specs.items()}


def _leave_no_heartbeat(client: redis.Redis, keys: Keys, broker: Any) -> None:
    try:  # each broker call is a heartbeat: a submit is no worker, so leave none behind
        client.zrem(f"{keys.dramatiq}:__heartbeats__", broker.broker_id)
    except redis.RedisError:
        pass
    broker.close()
    client.close()


def history_estimate(client: redis.Redis, keys: Keys, model: str | None, tags: list[str]) -> dict[str, Any]:
    """The expected cost of one attempt per entry of ``tags``, from every suite's priced attempts in the
    ledger (of ``model`` only, when the submit names one; otherwise of any)."""
    history = [(row.tag, row) for name in sorted(raw.decode() for raw in client.smembers(keys.suites))
               for row in SuiteLedger(client, keys, name).rows() if row.kind == "task"]
    return estimate_cost(history, tags, model=model)


def submit(args: argparse.Namespace) -> tuple[dict[str, Any], int]:
    suite = check_suite(args.suite)
    queue = check_queue(args.queue)
    check_attempts(args.attempts)
    budget_usd = check_budget(args.suite_budget_usd)
    tags = [check_tag(tag, "--tag") for tag in args.tag or []]
    if args.tags_file is not None:
        tags += read_tags_file(args.tags_file)
    if args.patches_dir is not None:  # no tag named: every tag directory of the patches dir
        template = read_operator(task_flags(args), env_skipped=frozenset({"tag", "image"})).spec
        return submit_patches(args, suite, queue, list(dict.fromkeys(tags)), template)
    tags = unique_tags(tags)
    if args.attempts_as_patches:
        raise BadInputError("--attempts-as-patches goes with --patches-dir")
    # What the operator said, read once (flags, then the environment, as a batch reads them);
    # each tag's profile is applied by the worker's task process, never here.
    template = read_operator(task_flags(args), env_skipped=frozenset({"tag", "image"})).spec
    specs = {tag: template.for_tag(tag) for tag in tags}
    arm = task_arm(template.agent)  # another agent's attempts of a tag are rows of their own
    if not args.dry_run:  # each tag on the image its name means now, whichever host runs it, whenever
        specs = pin_specs(specs)
    client = connect_redis(args.broker)
    keys = Keys(args.namespace)
    ledger = SuiteLedger(client, keys, suite)
    broker = make_broker(args.broker, args.namespace)
    queued = skipped = refused = 0
    would_queue: list[str] = []
    try:
        if budget_usd is not None and not args.dry_run:  # before any task is queued: a worker never sees it without
            FleetBudget(client, keys, ttl=0).set_limit(suite, budget_usd)
        for tag in tags:
            prompt = _read_prompt(args.prompts_dir, tag)
            for attempt in range(1, args.attempts + 1):
                key = task_key(tag, attempt, arm)
                if prompt is None:
                    row = LedgerRow(tag=tag, attempt=attempt, arm=arm, state=TaskState.FAILED, queue=queue, submitted_at=now(),
                                    finished_at=now(), failure_label="bad_input_prompt",
                                    error=f"no usable prompt: {PROMPT} of this tag in --prompts-dir is missing, empty or a placeholder")
                    if args.dry_run:
                        current = ledger.get(key)
                        refused, skipped = (refused, skipped + 1) if current and current.state in ACTIVE_STATES \
                            else (refused + 1, skipped)
                    elif ledger.update(key, lambda cur, row=row: None if cur and cur.state in ACTIVE_STATES else row):
                        refused += 1
                    else:
                        skipped += 1
                    continue
                task = TaskMessage(suite=suite, attempt=attempt, prompt=prompt, spec=specs[tag])
                fresh = LedgerRow(tag=tag, attempt=attempt, arm=arm, state=TaskState.QUEUED, queue=queue, submitted_at=now())
                if args.dry_run:
                    current = ledger.get(key)
                    if current is not None and current.state in ACTIVE_STATES:
                        skipped += 1
                    else:
                        queued += 1
                        would_queue.append(tag)
                elif ledger.update(key, lambda cur, fresh=fresh: None if cur and cur.state in ACTIVE_STATES else fresh):
                    client.srem(keys.cancelled(suite), key)
                    broker.enqueue(task_message(task, queue))
                    queued += 1
                else:
                    skipped += 1
        estimate = history_estimate(client, keys, template.model, would_queue) if args.dry_run else None
        if estimate is not None:  # beside it, what the suite's budget (this one, else its own) has left
            limit = budget_usd if budget_usd is not None else FleetBudget(client, keys, ttl=0).limit(suite)
            if limit is not None:
                budget = FleetBudget(client, keys, ttl=0)
                cost = cost_summary(((row.tag, row) for row in ledger.rows() if row.kind == "task"),
                                    budget_usd=limit, running_usd=budget.running_usd(suite))
                estimate["budget"] = {k: cost[k] for k in ("budget_usd", "spent_usd", "left_usd")}
    finally:
        _leave_no_heartbeat(client, keys, broker)
    report = {"mode": "submit", "suite": suite, "queue": queue, "kind": "task", "tasks": len(tags) * args.attempts,
              "queued": queued, "skipped_existing": skipped, "refused": refused,
              **({"suite_budget_usd": budget_usd} if budget_usd is not None else {})}
    if estimate is not None:  # nothing was written: "queued" is what a submit would queue now
        report |= {"dry_run": True, "estimate": estimate}
        log.info("suite_dry_run", **{k: v for k, v in report.items() if k != "estimate"},
                 expected_usd=estimate["expected_usd"])
    else:
        log.info("suite_submitted", **report)
    return report, int(ExitCode.BAD_INPUT if refused else ExitCode.COMPLETED)


# -- status ----------------------------------------------------------------------------------


def status_parser() -> argparse.ArgumentParser:
    parser = RunnerArgumentParser(prog="python -m runner status", description="A suite's ledger across every host.")
    _common(parser)
    parser.add_argument("--suite", help="one suite (default: every suite)")
    parser.add_argument("--format", dest="output_format", choices=["json", "markdown"], default="json")
    return parser


def suite_status(client: redis.Redis, keys: Keys, suite: str) -> dict[str, Any]:
    rows = SuiteLedger(client, keys, suite).rows()
    tasks = [row for row in rows if row.kind == "task"]
    tags = tag_pass_at([(row.tag, row.scored, bool(row.resolved)) for row in tasks])
    budget = FleetBudget(client, keys, ttl=0)
    limit = budget.limit(suite)
    cost = cost_summary(((row.tag, row) for row in tasks), budget_usd=limit,
                        running_usd=budget.running_usd(suite) if limit is not None else 0.0)
    document = {
        "suite": suite, "summary": summary(rows), "tasks": tags, "suite_pass_at": suite_pass_at_summary(tags),
        "cost": cost, "rows": [row.model_dump(mode="json", exclude={"evaluation"}) for row in rows],
    }
    if any(row.arm is not None for row in tasks):  # two agents' attempts: side by side, as a batch's --agents
        document["comparison"] = agent_comparison((row.tag, row.arm or row.agent or "codex", row) for row in tasks)
    from runner.score_patches import EvalRow, evaluation_document

    scored = [EvalRow.model_validate(row.evaluation) for row in rows if row.kind == "eval" and row.evaluation]
    if scored:  # evaluate's own summary (per tag successes / patches, pass@k) of the units scored so far
        evaluation = evaluation_document(scored)
        evaluation["units"] = sum(1 for row in rows if row.kind == "eval")
        document["evaluation"] = evaluation
    return document


def status(args: argparse.Namespace) -> tuple[dict[str, Any], int]:
    client = connect_redis(args.broker)
    keys = Keys(args.namespace)
    try:
        if args.suite is not None:
            suites = [check_suite(args.suite)]
            if not client.sismember(keys.suites, args.suite):
                raise BadInputError(f"no suite {args.suite!r} on this broker (namespace {args.namespace}); "
                                    "`python -m runner status` lists the suites it has")
        else:
            suites = sorted(name.decode() for name in client.smembers(keys.suites))
        document = {"schema_version": "runner_fleet_status_v0", "suites": [suite_status(client, keys, s) for s in suites]}
    finally:
        client.close()
    check_public("status", document, private_texts=private_texts_for(Path.cwd()))
    return document, int(ExitCode.COMPLETED)


def render_markdown(document: dict[str, Any]) -> str:
    lines: list[str] = []
    for suite in document["suites"]:
        s = suite["summary"]
        lines += [
            f"# Suite {suite['suite']}", "",
            f"{s['tasks']} tasks: " + ", ".join(f"{n} {state}" for state, n in s["states"].items())
            + f"; resolved {s['resolved']}/{s['finished']} ({s['resolved_rate']:.1%}), "
            f"without infrastructure failures {s['resolved_rate_without_infra']:.1%}; retries {s['retries']}; "
            f"tokens in {s['input_tokens']}, out {s['output_tokens']}", "",
            "| kind | tag | attempt | patch | state | host | phase | resolved | failure | retries | wall s |",
            "|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for row in suite["rows"]:
            resolved = {True: "yes", False: "no", None: "-"}[row["resolved"]]
            wall = f"{row['wall_seconds']:.1f}" if row["wall_seconds"] is not None else "-"
            tag = row["tag"] if row.get("arm") is None else f"{row['tag']} ({row['arm']})"
            lines.append(f"| {row['kind']} | {tag} | {row['attempt']} | {row['patch'] or '-'} | {row['state']} | "
                         f"{row['host'] or '-'} | {row['phase'] or '-'} | {resolved} | {row['failure_label'] or '-'} | "
                         f"{row['retries']} | {wall} |")
        if suite["tasks"]:
            lines += ["", *pass_at_markdown(suite["tasks"], suite["suite_pass_at"])]
        if "comparison" in suite:
            lines += ["", *comparison_markdown(suite["comparison"])]
        if suite["cost"]["tasks_priced"] or suite["cost"]["tasks_cost_unknown"] or "budget_usd" in suite["cost"]:
            lines += ["", *cost_markdown(suite["cost"])]
        if "evaluation" in suite:
            evaluation = suite["evaluation"]
            lines += ["", "## Evaluation units (scored as `python -m runner evaluate` scores them)", "",
                      "| tag | patches | successes | score |", "|---|---|---|---|"]
            for tag in evaluation["tags"]:
                score = "-" if tag["score"] is None else f"{tag['score']:.3f}"
                lines.append(f"| {tag['tag']} | {tag['patches']} | {tag['successes']} | {score} |")
            if "pass_at" in evaluation:
                lines += ["", *pass_at_markdown(evaluation["pass_at"]["tasks"], evaluation["pass_at"]["suite"])]
        lines.append("")
    return "\n".join(lines) if lines else "No suite in the ledger.\n"


# -- cancel ----------------------------------------------------------------------------------


def cancel_parser() -> argparse.ArgumentParser:
    parser = RunnerArgumentParser(prog="python -m runner cancel", description="Drop a suite's queued tasks, interrupt its running ones.")
    _common(parser)
    parser.add_argument("--suite", required=True)
    parser.add_argument("--tag", action="append", help="only this tag (repeatable; every attempt)")
    return parser


def _drop_queued(client: redis.Redis, keys: Keys, queue: str, suite: str, wanted: set[str]) -> int:
    """Remove the suite's messages from a queue (Dramatiq's list and hash; see its dispatch.lua)."""
    queue_key = keys.queue(queue)
    dropped = 0
    for redis_id, data in client.hgetall(f"{queue_key}.msgs").items():
        try:
            message = Message.decode(data)
            task = message.args[0]
        except Exception:  # not one of ours: leave it to the worker, which rejects it with a row
            continue
        spec = task.get("spec") if isinstance(task, dict) else None
        tag = spec.get("tag") if isinstance(spec, dict) else None
        unit = task.get("unit") if isinstance(task, dict) and task.get("kind") == "eval" else None
        agent = spec.get("agent") if isinstance(spec, dict) else None
        key = eval_key(str(tag), str(unit.get("name"))) if isinstance(unit, dict) \
            else task_key(str(tag), task.get("attempt"), task_arm(agent)) if isinstance(task, dict) else None
        if isinstance(task, dict) and task.get("suite") == suite and key in wanted:
            if client.lrem(queue_key, 0, redis_id):  # still waiting: not fetched by a worker yet
                client.hdel(f"{queue_key}.msgs", redis_id)
                dropped += 1
    return dropped


def cancel(args: argparse.Namespace) -> tuple[dict[str, Any], int]:
    suite = check_suite(args.suite)
    client = connect_redis(args.broker)
    keys = Keys(args.namespace)
    ledger = SuiteLedger(client, keys, suite)
    try:
        rows = [row for row in ledger.rows() if not args.tag or row.tag in args.tag]
        wanted = {row.key for row in rows if row.state in (TaskState.QUEUED, TaskState.RUNNING)}
        if wanted:
            client.sadd(keys.cancelled(suite), *wanted)  # workers: skip these, interrupt the running ones
        dropped = 0
        for queue in sorted({row.queue for row in rows}):
            dropped += _drop_queued(client, keys, queue, suite, wanted)
        cancelled = 0
        for row in rows:
            if row.state is TaskState.QUEUED and ledger.update(
                row.key, lambda cur: cur.model_copy(update={"state": TaskState.CANCELLED, "finished_at": now()})
                if cur is not None and cur.state is TaskState.QUEUED else None
            ):
                cancelled += 1
        running = sum(1 for row in rows if row.state is TaskState.RUNNING)
    finally:
        client.close()
    report = {"mode": "cancel", "suite": suite, "cancelled_queued": cancelled, "dropped_messages": dropped,
              "interrupting_running": running}
    return report, int(ExitCode.COMPLETED)


# -- entry points ----------------------------------------------------------------------------


def _main(parser: argparse.ArgumentParser, command: Callable[[argparse.Namespace], tuple[dict[str, Any], int]],
          argv: list[str]) -> int:
    args = parser.parse_args(argv)
    configure_logging()

    def run() -> tuple[dict[str, Any], int]:
        try:
            return command(args)
        except redis.RedisError as e:  # the broker went away during the command: the environment's
            raise BrokerUnavailableError(where(args.broker), f"{type(e).__name__} during the command; run it again") from e

    return answer(f"runner {parser.prog.split()[-1]}", run, getattr(args, "output_format", "json"), markdown=render_markdown)


def submit_main(argv: list[str]) -> int:
    return _main(submit_parser(), submit, argv)


def status_main(argv: list[str]) -> int:
    return _main(status_parser(), status, argv)


def cancel_main(argv: list[str]) -> int:
    return _main(cancel_parser(), cancel, argv)
