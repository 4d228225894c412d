"""The batch's run ledger: one row per task (a tag, or a tag's attempt), upserted after each, JSON plus Markdown.

Invariants: the ledger holds only public-safe compact facts (it passes the
public guard); both files are written atomically, so a crash leaves the old
ledger or the new one; rows are kept in tag order so reruns are stable.

An upsert appends one line to ``run-ledger.journal.jsonl`` (the row, through the
guard) instead of rewriting the whole ledger: rewriting 10,000 rows took 1.5 s a
task. The snapshot (``run-ledger.json``, same format as ever, and its Markdown)
is rewritten when the journal has grown by an eighth of the rows, when a minute
(and at least twenty times the last rewrite's duration) has passed, and when the
batch ends; so an upsert costs a constant amortized.
Loading replays the journal over the snapshot (a torn last line is ignored). Both are read
through ``runner.bounded_read`` (inside the jobs dir, regular files, bounded in size, depth
and line length), so a planted FIFO or a 600 MB line cannot hang or exhaust the batch.

With attempts (``--attempts K``) a row is one attempt (``tag`` + ``attempt``) and the
ledger adds a summary per tag: n attempts scored (``done``: the agent had its say, no
infrastructure failure ended it), c resolved, pass@1 (c/n, the mean over attempts) and pass@k (Chen et al.,
2021). A ledger without attempts keeps the bytes it always had.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any, ClassVar, Generic, TypeVar

from pydantic import ValidationError
from pydantic_core import from_json

from reducers.compare import agent_comparison, comparison_markdown
from reducers.costs import cost_summary
from reducers.markers import compact_input_error
from reducers.outcome import TaskFacts, TaskState
from reducers.passk import infra_label, pass_at_markdown, suite_pass_at_summary, tag_pass_at
from runner.atomic import write_bytes_atomic
from runner.bounded_read import UnreadableFileError, iter_bounded_lines, read_bounded_json
from runner.errors import CompactInputError
from reducers.guard import check_public
from runner.public import publish

LEDGER_JSON = "run-ledger.json"
LEDGER_MD = "run-ledger.md"
LEDGER_JOURNAL = "run-ledger.journal.jsonl"
COMPACT_FRACTION = 8  # rewrite the snapshot once the journal holds rows/8 entries
COMPACT_SECONDS = 60.0
SCHEMA = "benchmark_run_ledger_v1"
RowT = TypeVar("RowT")
# The states of a v0 row (how the task process ended), read and upgraded to the one TaskState.
V0_STATES = frozenset({"completed", "failed", "bad_input", "bad_environment", "interrupted"})
# Far above what the runner writes (a row is under 1 KB, a snapshot of 100,000 rows about 70 MB,
# a journal is compacted at an eighth of the rows), low enough that a planted file cannot exhaust
# memory: the snapshot is held whole, the journal streamed (a line at a time; reading 1 GiB takes a second).
LEDGER_MAX_BYTES = 256 << 20
LEDGER_MAX_DEPTH = 32
JOURNAL_LINE_MAX_BYTES = 64 << 10
JOURNAL_MAX_BYTES = 1 << 30


class LedgerRow(TaskFacts):
    """A batch task's row: the facts every ledger shares (``reducers.outcome``), keyed by tag and attempt."""

    tag: str
    attempt: int | None = None  # None: the tag's only run, job root DIR/<tag>; i: DIR/<tag>/attempt-<i>
    # The agent of a batch that compares agents (--agents): its job root is DIR/<tag>/<agent>.
    arm: str | None = None

    @classmethod
    def from_disk(cls, data: Any) -> LedgerRow:
        """A row as a ledger file holds it: this runner's, or (without ``infra_failure``) one that a
        runner before the one task contract wrote (``benchmark_run_ledger_v0``), upgraded."""
        return cls.model_validate(_upgraded_v0(data))

    @property
    def key(self) -> str:
        return row_key(self.tag, self.attempt, self.arm)

    def public(self) -> dict[str, Any]:
        """The row as the ledger files show it (no ``attempt`` key on a single-attempt row, no ``arm``
        outside a comparison of agents)."""
        dumped = self.model_dump(mode="json")
        for optional in ("attempt", "arm"):
            if dumped[optional] is None:
                del dumped[optional]
        return dumped


def _upgraded_v0(data: Any) -> Any:
    """A v0 row's state was how its process ended; v1's is the one ``TaskState`` (same rule, same labels)."""
    if not isinstance(data, dict) or "infra_failure" in data or data.get("state") not in V0_STATES:
        return data
    old, label = data["state"], data.get("failure_label")
    upgraded = {**data, "infra_failure": False}
    if old == "completed":
        upgraded["state"] = TaskState.DONE
    elif old == "interrupted":
        upgraded["state"] = TaskState.CANCELLED
    elif old == "bad_input":
        upgraded.update(state=TaskState.FAILED, failure_label=label or "bad_input")
    elif old == "failed" and label and not infra_label(label):
        upgraded.update(state=TaskState.DONE, resolved=False)
    else:
        fallback = "bad_environment" if old == "bad_environment" else f"exit_{data.get('exit_code')}"
        upgraded.update(state=TaskState.FAILED, infra_failure=True, failure_label=label or fallback)
    return upgraded


def row_key(tag: str, attempt: int | None, arm: str | None = None) -> str:
    """The row's key, which is also its job root under the jobs dir: ``<tag>[/<agent>][/attempt-<i>]``."""
    base = tag if arm is None else f"{tag}/{arm}"
    return base if attempt is None else f"{base}/attempt-{attempt}"


def _order(row: LedgerRow) -> tuple[str, str, int]:
    return (row.tag, row.arm or "", row.attempt or 0)


class JournaledLedger(Generic[RowT]):
    """A ledger of public rows, keyed by ``row.key``: a journal appended per upsert, a snapshot now and then.

    The batch's ledger and the patch evaluation's (``runner.score_patches``) are the two kinds; each
    names its files, its row model and how its document and Markdown are made.
    """

    json_name: ClassVar[str]
    md_name: ClassVar[str]
    journal_name: ClassVar[str]
    schema: ClassVar[str]
    row_type: ClassVar[type[Any]]

    def __init__(self, jobs_dir: Path, private_texts: list[str]) -> None:
        self.jobs_dir = jobs_dir
        self.json_path = jobs_dir / self.json_name
        self.md_path = jobs_dir / self.md_name
        self.journal_path = jobs_dir / self.journal_name
        self._private = private_texts
        self.rows: dict[str, RowT] = self._load()
        self._journal_entries = self._replay()
        self._compacted_at = time.monotonic()
        self._compact_seconds = 0.0

    def parse_row(self, data: Any) -> RowT:
        return self.row_type.model_validate(data)

    def public_row(self, row: RowT) -> dict[str, Any]:
        return row.model_dump(mode="json")  # type: ignore[attr-defined]

    def document(self) -> dict[str, Any]:
        raise NotImplementedError

    def markdown(self, document: dict[str, Any]) -> str:
        raise NotImplementedError

    def _load(self) -> dict[str, RowT]:
        if not os.path.lexists(self.json_path):
            return {}
        try:
            raw = read_bounded_json(self.json_path, root=self.jobs_dir, max_bytes=LEDGER_MAX_BYTES,
                                    max_depth=LEDGER_MAX_DEPTH)
            rows = [self.parse_row(row) for row in raw["rows"]]  # the summaries are derived
        except UnreadableFileError as e:
            raise CompactInputError(self.json_name, "", f"unreadable ({e.unreadable.value}); move it aside") from e
        except (KeyError, TypeError) as e:
            raise CompactInputError(self.json_name, "rows", f"unreadable ({type(e).__name__}); move it aside") from e
        except ValidationError as e:
            raise compact_input_error(self.json_name, e) from e
        return {row.key: row for row in rows}  # type: ignore[attr-defined]

    def _replay(self) -> int:
        """Rows appended since the last snapshot; a torn line (a crash mid-append) or an overlong one is skipped.

        Raises:
            CompactInputError: the journal is not a regular file in the jobs dir, or is far too large.
        """
        if not os.path.lexists(self.journal_path):
            return 0
        entries = 0
        try:
            for line in iter_bounded_lines(self.journal_path, root=self.jobs_dir, max_line_bytes=JOURNAL_LINE_MAX_BYTES,
                                           max_total_bytes=JOURNAL_MAX_BYTES):
                if line.data is None:
                    continue  # an overlong line: skipped like a torn one
                try:
                    row = self.parse_row(from_json(line.data))  # pydantic-core's parser: bounded depth
                except ValueError:  # not JSON, or not a row (ValidationError is a ValueError)
                    continue
                self.rows[row.key] = row  # type: ignore[attr-defined]
                entries += 1
        except UnreadableFileError as e:
            raise CompactInputError(self.journal_name, "", f"unreadable ({e.unreadable.value}); move it aside") from e
        return entries

    def upsert(self, row: RowT) -> None:
        """Append the row (guarded) to the journal; rewrite the snapshot now and then."""
        check_public(self.json_name, {"schema_version": self.schema, "rows": [self.public_row(row)]},
                     private_texts=self._private)
        fd = os.open(self.journal_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            os.write(fd, row.model_dump_json().encode() + b"\n")  # type: ignore[attr-defined]
            os.fsync(fd)
        finally:
            os.close(fd)
        self.rows[row.key] = row  # type: ignore[attr-defined]
        self._journal_entries += 1
        due = self._journal_entries >= max(1, len(self.rows) // COMPACT_FRACTION)
        # By time too, so the snapshot never lags for long; but never more than 1/20 of the wall
        # time goes to it, however large the ledger (a rewrite of 10,000 rows takes seconds).
        waited = time.monotonic() - self._compacted_at
        if due or waited > max(COMPACT_SECONDS, 20 * self._compact_seconds):
            self.compact()

    @property
    def journal_entries(self) -> int:
        """Rows not yet in the snapshot."""
        return self._journal_entries

    def compact(self) -> None:
        """The snapshot and its Markdown from every row, then an empty journal."""
        started = time.monotonic()
        document = self.document()
        publish(self.json_path, document, private_texts=self._private)
        write_bytes_atomic(self.md_path, self.markdown(document).encode())
        self.journal_path.unlink(missing_ok=True)  # a crash before this: replaying it again is harmless
        self._journal_entries = 0
        self._compacted_at = time.monotonic()
        self._compact_seconds = self._compacted_at - started


class RunLedger(JournaledLedger[LedgerRow]):
    json_name, md_name, journal_name, schema = LEDGER_JSON, LEDGER_MD, LEDGER_JOURNAL, SCHEMA
    row_type = LedgerRow
    budget_usd: float | None = None  # the running batch's --suite-budget-usd: its cost summary says what is left

    def parse_row(self, data: Any) -> LedgerRow:
        return LedgerRow.from_disk(data)

    def public_row(self, row: LedgerRow) -> dict[str, Any]:
        return row.public()

    def markdown(self, document: dict[str, Any]) -> str:
        return render_markdown(document)

    def evaluated(self, tag: str, attempt: int | None, arm: str | None = None) -> bool:
        row = self.rows.get(row_key(tag, attempt, arm))
        return row is not None and row.evaluated

    def document(self) -> dict[str, Any]:
        rows = sorted(self.rows.values(), key=_order)
        document: dict[str, Any] = {"schema_version": SCHEMA, "rows": [row.public() for row in rows]}
        if any(row.attempt is not None for row in rows):
            summaries = tag_pass_at([(row.tag, row.scored, bool(row.resolved)) for row in rows])
            document["tasks"] = summaries
            document["suite"] = suite_pass_at_summary(summaries)
        document["cost"] = cost_summary(((row.tag, row) for row in rows), budget_usd=self.budget_usd)
        if any(row.arm is not None for row in rows):
            document["comparison"] = agent_comparison((row.tag, row.arm or row.agent or "codex", row) for row in rows)
        return document


def render_markdown(document: dict[str, Any]) -> str:
    lines = [
        "# Run ledger",
        "",
        "| tag | state | resolved | first failed phase | wall s | patch sha256 | patch bytes | image digest (or id) "
        "| exit-code verdict | verdict untrusted |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in document["rows"]:
        resolved = {True: "yes", False: "no", None: "-"}[row["resolved"]]
        tag = row["tag"] if row.get("arm") is None else f"{row['tag']} ({row['arm']})"
        tag = tag if row.get("attempt") is None else f"{tag} #{row['attempt']}"
        sha = (row["patch_sha256"] or "-")[:12]
        lines.append(
            f"| {tag} | {row['state']} | {resolved} | {row['first_failed_phase'] or '-'} | "
            f"{row['wall_seconds'] or 0:.1f} | {sha} | {row['patch_bytes'] if row['patch_bytes'] is not None else '-'} | "
            f"{row['image_digest'] or row['image_id'] or '-'} | "
            f"{ {True: 'yes', False: 'no', None: '-'}[row.get('exit_code_verdict')] } | "
            f"{'yes' if row.get('verdict_untrusted') else 'no'} |"
        )
    if "tasks" in document:
        lines += ["", *pass_at_markdown(document["tasks"], document["suite"])]
    if "cost" in document:
        lines += ["", *cost_markdown(document["cost"])]
    if "comparison" in document:
        lines += ["", *comparison_markdown(document["comparison"])]
    return "\n".join(lines) + "\n"


def cost_markdown(cost: dict[str, Any]) -> list[str]:
    """The cost summary (``reducers.costs``) as a few Markdown lines."""
    def dollars(value: float | None) -> str:
        return "-" if value is None else f"${value:.4f}"

    lines = [
        "## Cost",
        "",
        f"- total: {dollars(cost['total_usd'])} over {cost['tasks_priced']} priced tasks"
        + (f" ({cost['tasks_cost_unknown']} of a model the rate card lacks, not counted)" if cost["tasks_cost_unknown"] else ""),
        f"- per task: {dollars(cost['per_task_usd'])}; per resolved task: {dollars(cost['per_resolved_usd'])}",
    ]
    if "budget_usd" in cost:
        lines.append(f"- budget: {dollars(cost['budget_usd'])}, spent {dollars(cost['spent_usd'])}, "
                     f"left {dollars(cost['left_usd'])}, {cost['skipped_budget']} tasks skipped for it")
    if cost["per_tag_usd"]:
        lines += ["", "| tag | cost |", "|---|---|", *(f"| {tag} | {dollars(v)} |" for tag, v in cost["per_tag_usd"].items())]
    return lines
