"""The ledger with attempts: rows per (tag, attempt), pass@k per tag, old ledgers unchanged."""

from __future__ import annotations

import json
from pathlib import Path

from runner.ledger import RunLedger, row_key
from tests.unit.test_batch_parts import _row_for


def test_a_ledger_without_attempts_keeps_its_shape(tmp_path: Path) -> None:
    ledger = RunLedger(tmp_path, private_texts=[])
    ledger.upsert(_row_for("a_1"))
    ledger.compact()
    document = json.loads((tmp_path / "run-ledger.json").read_text())
    # no pass@k summaries without attempts; the cost summary is every ledger's
    assert set(document) == {"schema_version", "rows", "cost"} and "attempt" not in document["rows"][0]
    assert "Per tag" not in (tmp_path / "run-ledger.md").read_text()


def test_attempts_are_rows_of_their_own_with_pass_at_k_per_tag(tmp_path: Path) -> None:
    ledger = RunLedger(tmp_path, private_texts=[])
    for attempt, resolved in ((1, True), (2, False), (3, False), (4, True)):
        ledger.upsert(_row_for("t_a", attempt=attempt, resolved=resolved))
    # An attempt the host broke is no evidence about the agent: it is not scored.
    ledger.upsert(_row_for("t_a", attempt=5, state="failed", exit_code=1, resolved=None,
                           first_failed_phase="extract", failure_label="failed_extract_docker_error"))
    ledger.upsert(_row_for("t_b", attempt=1, resolved=False))
    ledger.upsert(_row_for("t_a", attempt=2, resolved=True))  # a rerun of attempt 2 replaces its row
    ledger.compact()
    document = json.loads((tmp_path / "run-ledger.json").read_text())
    assert [(r["tag"], r["attempt"]) for r in document["rows"]] == [("t_a", i) for i in range(1, 6)] + [("t_b", 1)]
    tasks = {item["tag"]: item for item in document["tasks"]}
    assert tasks["t_a"]["attempts"] == 5 and (tasks["t_a"]["scored"], tasks["t_a"]["resolved"]) == (4, 3)
    assert tasks["t_a"]["pass_at"] == {"1": 0.75, "2": 1.0, "3": 1.0}
    assert tasks["t_b"]["pass_at"] == {"1": 0.0}
    assert document["suite"] == {"tags": 2, "attempts": 6, "mean_pass_at": {"1": 0.375, "2": 1.0, "3": 1.0}}
    reloaded = RunLedger(tmp_path, private_texts=[])
    assert reloaded.evaluated("t_a", 2) and not reloaded.evaluated("t_a", 9)
    assert reloaded.rows[row_key("t_a", 5)].state == "failed"
    markdown = (tmp_path / "run-ledger.md").read_text()
    assert "| t_a #5 | failed |" in markdown and "| t_a | 5 | 4 | 3 | 0.750 | 1.000 | 1.000 |" in markdown
