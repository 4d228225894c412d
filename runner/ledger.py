"""The batch's run ledger: one row per tag, upserted after each task, JSON plus a Markdown view.

Invariants: the ledger holds only public-safe compact facts (it passes the
public guard); both files are written atomically, so a crash leaves the old
ledger or the new one; rows are kept in tag order so reruns are stable.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from reducers.markers import compact_input_error
from runner.atomic import write_bytes_atomic
from runner.errors import CompactInputError
from runner.public import publish

LEDGER_JSON = "run-ledger.json"
LEDGER_MD = "run-ledger.md"
SCHEMA = "benchmark_run_ledger_v0"


class LedgerRow(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    tag: str
    state: str  # completed | failed | bad_input | bad_environment | interrupted
    exit_code: int
    resolved: bool | None
    first_failed_phase: str | None
    failure_label: str | None
    wall_seconds: float
    phase_durations_seconds: dict[str, float]
    patch_sha256: str | None
    patch_bytes: int | None
    image_digest: str | None
    image_id: str | None
    input_tokens: int
    output_tokens: int
    # resolved is the official score; the runner's exit-code verdict and the trust in it beside it.
    exit_code_verdict: bool | None = None
    verdict_untrusted: bool = False

    @property
    def completed(self) -> bool:
        return self.state == "completed"


class RunLedger:
    def __init__(self, jobs_dir: Path, private_texts: list[str]) -> None:
        self.json_path = jobs_dir / LEDGER_JSON
        self.md_path = jobs_dir / LEDGER_MD
        self._private = private_texts
        self.rows: dict[str, LedgerRow] = self._load()

    def _load(self) -> dict[str, LedgerRow]:
        if not self.json_path.exists():
            return {}
        try:
            raw = json.loads(self.json_path.read_text(encoding="utf-8"))
            rows = [LedgerRow.model_validate(row) for row in raw["rows"]]
        except (OSError, json.JSONDecodeError, KeyError, TypeError) as e:
            raise CompactInputError(LEDGER_JSON, "rows", f"unreadable ({type(e).__name__}); move it aside") from e
        except ValidationError as e:
            raise compact_input_error(LEDGER_JSON, e) from e
        return {row.tag: row for row in rows}

    def upsert(self, row: LedgerRow) -> None:
        self.rows[row.tag] = row
        document = self.document()
        publish(self.json_path, document, private_texts=self._private)
        write_bytes_atomic(self.md_path, render_markdown(document).encode())

    def document(self) -> dict[str, Any]:
        return {"schema_version": SCHEMA, "rows": [self.rows[tag].model_dump() for tag in sorted(self.rows)]}


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
        sha = (row["patch_sha256"] or "-")[:12]
        lines.append(
            f"| {row['tag']} | {row['state']} | {resolved} | {row['first_failed_phase'] or '-'} | "
            f"{row['wall_seconds']:.1f} | {sha} | {row['patch_bytes'] if row['patch_bytes'] is not None else '-'} | "
            f"{row['image_digest'] or row['image_id'] or '-'} | "
            f"{ {True: 'yes', False: 'no', None: '-'}[row.get('exit_code_verdict')] } | "
            f"{'yes' if row.get('verdict_untrusted') else 'no'} |"
        )
    return "\n".join(lines) + "\n"
