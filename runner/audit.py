"""``python -m runner audit``: can a tag's verdict be trusted at all? The gold-patch audit.

For each tag, in containers of its image only (never in any agent's job root):
1. the tag's profile and the image's layout must allow an evaluation;
2. the **empty** patch is evaluated, exactly as the evaluate phase evaluates a
   patch, and must fail the official rule;
3. the **gold** patch, the diff from the image's buggy tree to its fixed tree
   (``/app/source_code_fixed``, or ``$FIXED_COMMIT`` reachable in the buggy tree's
   history), is evaluated the same way and must pass the official rule.
The label is ``valid``, ``gold_fails``, ``empty_passes``, ``apply_hangs`` or
``layout_unsupported`` (``not_audited`` when the host could not run it), with the
reason, the apply and test durations and the network fact.

Invariants: the gold patch is computed inside a container and held in memory
only; it never touches the host's disk and never appears in any output (its
sha256 and size do); every container is labelled and removed (the evaluation
uses the evaluate phase's own ``run_apply_and_test``); the ledger passes the
public guard.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import tempfile
import time
from collections import Counter
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import docker
import structlog
from docker.errors import DockerException
from pydantic import BaseModel, ConfigDict
from requests.exceptions import RequestException

from runner.atomic import open_private, write_bytes_atomic
from runner.tags import read_tags_file, unique_tags
from runner.context import new_run_id
from runner.images import task_image
from runner.docker_utils import (
    LABEL_PHASE,
    NO_LOG_DRIVER,
    connect,
    image_identity,
    managed_container,
    pumping_output,
    runner_labels,
    run_main_process,
)
from runner.containment import signals
from runner.entry import RunnerArgumentParser, add_evaluation_flags, answer, evaluation_flags
from runner.errors import BadInputError, EnvironmentNotReadyError, ExitCode
from runner.lock import job_root_lock
from runner.journal import default_state_dir
from runner.network_probe import NETWORK_PROBE_PHASE, probe_memory, probe_once
from runner.phases.evaluate import EvalRun, EvalSinks, run_apply_and_test
from runner.phases.patch import DIFF_OPTIONS, count_patch
from runner.phases.precheck import layout_refusal
from runner.public import private_texts_for, publish
from runner.logs import configure_logging
from runner.settings import RunnerSettings
from runner.tasks.spec import ensure_dir, settings_for_tags
from runner.verdict import official_verdict

log = structlog.get_logger(__name__)

LABELS = ("valid", "gold_fails", "empty_passes", "apply_hangs", "layout_unsupported", "not_audited")
# A profile's refusal, as the label an audit that ran would give (the rest: layout_unsupported).
PROFILE_REFUSAL_LABELS = {
    "apply_never_returns": "apply_hangs",
    "apply_ignores_patch": "gold_fails",
    "apply_always_fails": "gold_fails",
    "no_official_success_string": "gold_fails",
}
AUDIT_JSON = "audit-ledger.json"
AUDIT_MD = "audit-ledger.md"
AUDIT_LOGS = ".audit-logs"
AUDIT_LOCK = ".audit.lock"
SCHEMA = "agentissue_gold_patch_audit_v0"
FIXED_TREE = "/app/source_code_fixed"
GOLD_TIMEOUT = 120
GOLD_MAX_BYTES = 64 * 1024 * 1024
# Build and cache output that a tree snapshot must not carry (git diffs of commits never see it).
_SNAPSHOT_EXCLUDES = ".git node_modules __pycache__ *.pyc *.egg-info .pytest_cache .mypy_cache .tox venv .venv"
# The gold patch on stdout, in the form the patch phase exports an agent's work (git's diff with
# the patch phase's options: symlinks as symlinks, binary changes as binary hunks, new and deleted
# files included), so ``patch -p1`` in the buggy tree takes what it can take; how it was found on
# stderr. A plain fixed tree is snapshotted into a throw-away git index (``add -A``: the tree's own
# .gitignore and the excludes above apply), never diffed with ``diff -r``, which follows symlinks.
# 0: found; 10: no buggy tree; 11: no fixed tree and no reachable FIXED_COMMIT; 12: no git.
_GOLD_SCRIPT = r'''
set -f
src=$1; fixed=$2; excludes=$3; shift 3; opts="$*"
[ -d "$src" ] || exit 10
command -v git >/dev/null 2>&1 || exit 12
g() { git -c safe.directory='*' -c core.quotepath=false -c core.autocrlf=false "$@"; }
gd() { g -C "$src" diff $opts "$@"; }
commit_in_src() { g -C "$src" rev-parse -q --verify HEAD >/dev/null 2>&1 && g -C "$src" cat-file -e "$1^{commit}" 2>/dev/null; }
if [ -d "$fixed" ]; then
  if fc=$(g -C "$fixed" rev-parse -q --verify HEAD 2>/dev/null) && commit_in_src "$fc"; then
    echo fixed_tree_commit >&2; gd HEAD "$fc"; exit $?
  fi
  t=$(mktemp -d) && g init -q "$t" || exit 12
  export GIT_DIR="$t/.git"
  for x in $excludes; do printf '%s\n' "$x"; done > "$GIT_DIR/info/exclude"
  snapshot() { GIT_INDEX_FILE="$t/index.$1" GIT_WORK_TREE="$2" g -C "$2" add -A -- . \
               && GIT_INDEX_FILE="$t/index.$1" g write-tree; }
  a=$(snapshot buggy "$src") && b=$(snapshot fixed "$fixed") || exit 12
  echo fixed_tree_diff >&2; g diff $opts "$a" "$b"; rc=$?; rm -rf "$t"; exit "$rc"
fi
if [ -n "${FIXED_COMMIT:-}" ] && commit_in_src "$FIXED_COMMIT"; then
  echo fixed_commit >&2; gd HEAD "$FIXED_COMMIT"; exit $?
fi
exit 11
'''


class EvalFacts(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    official: bool
    exit_code_verdict: bool
    apply_exit_code: int | None
    test_exit_code: int | None
    timed_out: bool
    apply_seconds: float | None
    test_seconds: float | None


class AuditRow(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    tag: str
    image: str
    image_id: str | None = None
    audit: str
    reason: str
    tag_profile: str | None = None
    network: str = ""
    network_reachable: bool | None = None
    network_probed: list[str] | None = None  # the endpoints the probe tried
    needs_network: bool = False
    verdict_untrusted: bool = False
    gold_source: str | None = None
    gold_patch_sha256: str | None = None
    gold_patch_bytes: int | None = None
    # The patch phase's header counts of the gold patch (files changed/added/deleted, hunks, binary).
    gold_patch_counts: dict[str, int] | None = None
    empty: EvalFacts | None = None
    gold: EvalFacts | None = None
    wall_seconds: float = 0.0


class GoldPatch(BaseModel):
    model_config = ConfigDict(frozen=True)

    source: str
    data: bytes


def gold_patch(client: docker.DockerClient, *, image_id: str, source_dir: str, labels: dict[str, str]) -> GoldPatch | str:
    """The gold patch (in memory) from a container of the image, or why there is none."""
    out = bytearray()
    err = bytearray()
    too_big: list[bool] = []

    def feed(pair: tuple[bytes | None, bytes | None]) -> None:
        stdout, stderr = pair
        if stdout:
            if len(out) + len(stdout) > GOLD_MAX_BYTES:
                too_big.append(True)
            else:
                out.extend(stdout)
        if stderr and len(err) < 4096:
            err.extend(stderr)

    with managed_container(
        client, image=image_id, labels=labels,
        entrypoint=["/bin/sh", "-c", _GOLD_SCRIPT, "gold", source_dir, FIXED_TREE, _SNAPSHOT_EXCLUDES,
                    *DIFF_OPTIONS],
        command=[], network_disabled=True, log_config=NO_LOG_DRIVER,
    ) as container:
        with pumping_output(container, feed, demux=True):
            ended = run_main_process(container, timeout=GOLD_TIMEOUT)
    if ended.timed_out:
        return "the gold patch could not be computed in time"
    if ended.exit_code == 10:
        return "no buggy tree in the image"
    if ended.exit_code == 11:
        return "no fixed tree and no FIXED_COMMIT reachable in the buggy tree's history"
    if ended.exit_code == 12:
        return "the image has no working git to compute the gold patch with"
    if ended.exit_code != 0:
        return f"the gold patch could not be computed (exit {ended.exit_code})"
    if too_big:
        return f"the gold patch is larger than {GOLD_MAX_BYTES} bytes"
    if not out.strip():
        return "the buggy and fixed trees do not differ"
    source = err.decode(errors="replace").strip().splitlines()[:1]
    return GoldPatch(source=source[0] if source else "unknown", data=bytes(out))


def _evaluate(
    client: docker.DockerClient, settings: RunnerSettings, image_id: str, patch: bytes, labels: dict[str, str],
    logs: Path, name: str,
) -> EvalFacts:
    """One evaluation through the evaluate phase's own mechanism; logs are private, under ``logs``."""
    paths = {part: logs / f"{name}-{part}.log" for part in ("apply", "test", "apply.stderr", "test.stderr")}
    with ExitStack() as stack:
        sinks = {part: stack.enter_context(open_private(path)) for part, path in paths.items()}
        run: EvalRun = run_apply_and_test(
            client, image_id=image_id, labels=labels, patch=patch,
            apply_cmd=settings.apply_cmd, test_cmd=settings.test_cmd,
            network=settings.eval_network.value, timeout=settings.eval_timeout,
            sinks=EvalSinks(sinks["apply"], sinks["test"], sinks["apply.stderr"], sinks["test.stderr"]),
        )
    official = official_verdict(None if run.timed_out else run.container_exit_code, [paths["apply"], paths["test"]])
    return EvalFacts(
        official=official, exit_code_verdict=run.exit_code_verdict, apply_exit_code=run.apply_exit_code,
        test_exit_code=run.test_exit_code, timed_out=run.timed_out,
        apply_seconds=run.apply_seconds, test_seconds=run.test_seconds,
    )


def _hung_in_apply(facts: EvalFacts) -> bool:
    return facts.timed_out and facts.apply_exit_code is None


def audit_tag(settings: RunnerSettings, client: docker.DockerClient, logs: Path) -> AuditRow:
    """The audit of one tag. Raises: EnvironmentNotReadyError (image missing), DockerException."""
    started = time.monotonic()
    profile = settings.profile
    base: dict[str, Any] = {
        "tag": settings.tag, "image": settings.resolved_image,
        "tag_profile": profile.name if profile else None, "network": settings.eval_network.value,
        "needs_network": bool(profile and profile.needs_network),
    }

    def row(label: str, reason: str, **more: Any) -> AuditRow:
        return AuditRow(**base, audit=label, reason=reason, wall_seconds=round(time.monotonic() - started, 3), **more)

    refusal = profile.refusal if profile else None
    if refusal and not settings.allow_unscorable:  # the profile alone decides: no image needed
        return row(PROFILE_REFUSAL_LABELS.get(refusal, "layout_unsupported"), f"profile: {refusal}")
    image_id, _digest = image_identity(task_image(client, settings))
    base["image_id"] = image_id
    labels = runner_labels(job_id=f"audit-{settings.tag}"[:64], run_id=new_run_id(), phase="audit")
    layout = layout_refusal(client, settings, image_id, labels)
    if layout is not None:
        return row("layout_unsupported", f"image: {layout}")
    gold = gold_patch(client, image_id=image_id, source_dir=settings.source_dir, labels=labels)
    if isinstance(gold, str):
        return row("layout_unsupported", gold)
    probe = probe_once(
        client, probe_memory(settings.state_dir or default_state_dir()), needs_network=base["needs_network"],
        image_id=image_id, network=settings.eval_network.value, labels={**labels, LABEL_PHASE: NETWORK_PROBE_PHASE},
        endpoints=settings.probe_endpoints,
    )
    base.update(
        network_reachable=probe.reachable,
        network_probed=list(probe.endpoints),
        verdict_untrusted=bool(base["needs_network"] and probe.reachable is not True),
        gold_source=gold.source,
        gold_patch_sha256=hashlib.sha256(gold.data).hexdigest(),
        gold_patch_bytes=len(gold.data),
        gold_patch_counts=count_patch(gold.data),
    )
    empty = _evaluate(client, settings, image_id, b"", labels, logs, "empty")
    if _hung_in_apply(empty):
        return row("apply_hangs", "the empty patch's apply did not return before --eval-timeout", empty=empty)
    gold_facts = _evaluate(client, settings, image_id, gold.data, labels, logs, "gold")
    del gold  # held no longer than needed
    if empty.official:
        return row("empty_passes", "the empty patch passes the official rule", empty=empty, gold=gold_facts)
    if _hung_in_apply(gold_facts):
        return row("apply_hangs", "the gold patch's apply did not return before --eval-timeout", empty=empty, gold=gold_facts)
    if not gold_facts.official:
        why = "timed out" if gold_facts.timed_out else (
            "apply failed" if gold_facts.apply_exit_code != 0 else
            "exit code 0, but stdout fails the official string rule" if gold_facts.exit_code_verdict else "the test failed")
        return row("gold_fails", f"the gold patch fails the official rule ({why})", empty=empty, gold=gold_facts)
    return row("valid", "the empty patch fails and the gold patch passes", empty=empty, gold=gold_facts)


class AuditLedger:
    """One row per tag, upserted after each, JSON (through the public guard) and Markdown."""

    def __init__(self, directory: Path) -> None:
        self.json_path, self.md_path = directory / AUDIT_JSON, directory / AUDIT_MD
        self._private = private_texts_for(directory)
        self.rows: dict[str, AuditRow] = {}
        if self.json_path.exists():
            try:
                raw = json.loads(self.json_path.read_text(encoding="utf-8"))
                self.rows = {r["tag"]: AuditRow.model_validate(r) for r in raw["rows"]}
            except (OSError, ValueError, KeyError, TypeError) as e:
                raise BadInputError(f"{AUDIT_JSON} is unreadable ({type(e).__name__}); move it aside") from e

    def upsert(self, row: AuditRow) -> None:
        self.rows[row.tag] = row
        document = audit_document(list(self.rows.values()))
        publish(self.json_path, document, private_texts=self._private)
        write_bytes_atomic(self.md_path, render_markdown(document).encode())


def audit_document(rows: list[AuditRow]) -> dict[str, Any]:
    ordered = sorted(rows, key=lambda r: r.tag)
    return {
        "schema_version": SCHEMA,
        "mode": "audit",
        "audit": {r.tag: r.audit for r in ordered},
        "counts": dict(sorted(Counter(r.audit for r in ordered).items())),
        "rows": [r.model_dump(mode="json") for r in ordered],
    }


def read_audit_labels(directory: Path) -> dict[str, str] | None:
    """``{tag: label}`` from an audit ledger in ``directory``, or None when there is none."""
    path = directory / AUDIT_JSON
    if not path.is_file():
        return None
    try:
        labels = json.loads(path.read_text(encoding="utf-8")).get("audit")
    except (OSError, ValueError):
        return None
    return {str(k): str(v) for k, v in labels.items()} if isinstance(labels, dict) else None


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def render_markdown(document: dict[str, Any]) -> str:
    lines = [
        "# Gold-patch audit", "",
        "| tag | audit | reason | network | reachable | untrusted | empty: official / apply s / test s "
        "| gold: official / apply s / test s | gold sha256 |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for row in document["rows"]:
        cells = []
        for key in ("empty", "gold"):
            facts = row.get(key)
            cells.append("-" if not facts else
                         f"{'pass' if facts['official'] else 'fail'} / {_seconds(facts['apply_seconds'])} / "
                         f"{_seconds(facts['test_seconds'])}")
        reachable = {True: "yes", False: "no", None: "-"}[row["network_reachable"]]
        lines.append(
            f"| {row['tag']} | {row['audit']} | {row['reason']} | {row['network'] or '-'} | {reachable} | "
            f"{'yes' if row['verdict_untrusted'] else 'no'} | {cells[0]} | {cells[1]} | "
            f"{(row['gold_patch_sha256'] or '-')[:12]} |"
        )
    counts = ", ".join(f"{k}: {v}" for k, v in document["counts"].items())
    return "\n".join(lines) + f"\n\n{counts}\n"


def build_parser() -> argparse.ArgumentParser:
    parser = RunnerArgumentParser(
        prog="python -m runner audit",
        description="Gold-patch audit: the empty patch must fail and the image's own fix must pass the "
        "official rule, in containers of the image only. Labels: " + ", ".join(LABELS[:-1]) + ".",
        epilog="Exit codes: 0 every tag audited (whatever its label); 2 bad input; 3 bad environment; 130 interrupted.",
    )
    parser.add_argument("--tag", action="append", help="tag to audit (repeatable)")
    parser.add_argument("--tags-file", type=Path, help="one tag a line, '#' comments")
    parser.add_argument("--jobs-dir", type=Path, help="where the audit ledger (and private logs) go")
    add_evaluation_flags(parser)
    parser.add_argument("--format", dest="output_format", choices=["json", "markdown"])
    return parser


def _settings_for(tags: list[str], args: argparse.Namespace) -> list[RunnerSettings]:
    return settings_for_tags(tags, evaluation_flags(args))


def _audit_one(settings: RunnerSettings, client: docker.DockerClient, logs: Path) -> AuditRow:
    try:
        return audit_tag(settings, client, logs)
    except EnvironmentNotReadyError as e:
        return AuditRow(tag=settings.tag, image=settings.resolved_image, audit="not_audited", reason=e.reason)
    except (DockerException, RequestException) as e:
        return AuditRow(tag=settings.tag, image=settings.resolved_image, audit="not_audited",
                        reason=f"docker_error: {type(e).__name__}")


def run_audit(args: argparse.Namespace) -> tuple[dict[str, Any], int]:
    """Raises: BadInputError, DockerUnavailableError."""
    tags = list(args.tag or [])
    if args.tags_file is not None:
        tags += read_tags_file(args.tags_file)
    tags = unique_tags(tags)
    if args.image and len(tags) > 1:
        raise BadInputError("--image goes with one --tag; each tag of a list gets its own image")
    settings = _settings_for(tags, args)  # every tag validated before any work
    jobs_dir: Path | None = None
    if args.jobs_dir is not None:
        jobs_dir = ensure_dir(args.jobs_dir, "--jobs-dir")
    elif len(tags) > 1:
        raise BadInputError("auditing many tags needs --jobs-dir DIR for the audit ledger")
    client = connect()
    rows: list[AuditRow] = []
    try:
        with ExitStack() as stack:
            if jobs_dir is not None:
                stack.enter_context(job_root_lock(jobs_dir, name=AUDIT_LOCK, what="audit"))
                ledger: AuditLedger | None = AuditLedger(jobs_dir)
            else:
                ledger = None
            for one in settings:
                if jobs_dir is not None:
                    logs = jobs_dir / AUDIT_LOGS / one.tag
                else:
                    logs = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="runner-audit-")))
                log.info("audit_started", tag=one.tag)
                row = _audit_one(one, client, logs)
                log.info("audit_finished", tag=one.tag, audit=row.audit, reason=row.reason)
                rows.append(row)
                if ledger is not None:
                    ledger.upsert(row)
    finally:
        client.close()
    document = audit_document(rows)
    code = ExitCode.BAD_ENVIRONMENT if any(r.audit == "not_audited" for r in rows) else ExitCode.COMPLETED
    return document, int(code)


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    configure_logging()
    signals.interrupt_from_now_on()
    return answer("runner audit", lambda: run_audit(args), args.output_format or "json", markdown=render_markdown,
                  interrupted="audit interrupted; the ledger holds every tag finished so far")
