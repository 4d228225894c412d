"""The ledger at the size of a long suite: an update costs the same with 10 rows or 10,000."""

from __future__ import annotations

import json
import time
from pathlib import Path

from runner.ledger import LEDGER_JOURNAL, RunLedger
from tests.unit.test_batch_parts import _row_for


def _big_ledger(jobs: Path, rows: int) -> None:
    ledger = RunLedger(jobs, private_texts=[str(jobs)])
    for i in range(rows):
        ledger.rows[f"t_{i:05d}"] = _row_for(f"t_{i:05d}")
    ledger.compact()


def test_an_update_costs_the_same_with_ten_thousand_rows(tmp_path: Path) -> None:
    _big_ledger(tmp_path, 10_000)
    snapshot = (tmp_path / "run-ledger.json").read_bytes()
    ledger = RunLedger(tmp_path, private_texts=[str(tmp_path)])
    timings = []
    for i in range(50):
        started = time.perf_counter()
        ledger.upsert(_row_for(f"n_{i:03d}", wall_seconds=float(i)))
        timings.append(time.perf_counter() - started)
    timings.sort()
    assert timings[len(timings) // 2] < 0.02, f"median update {timings[len(timings) // 2]:.3f} s"
    assert max(timings) < 0.3, f"slowest update {max(timings):.3f} s"  # no whole rewrite among them
    assert (tmp_path / "run-ledger.json").read_bytes() == snapshot  # not rewritten per task
    # Every row is there for the next batch, through the journal, and in the snapshot once compacted.
    reloaded = RunLedger(tmp_path, private_texts=[])
    assert len(reloaded.rows) == 10_050 and reloaded.rows["n_049"].wall_seconds == 49.0
    reloaded.compact()
    document = json.loads((tmp_path / "run-ledger.json").read_text())
    assert set(document) == {"schema_version", "rows", "cost"} and len(document["rows"]) == 10_050
    assert [row["tag"] for row in document["rows"]] == sorted(row["tag"] for row in document["rows"])
    assert not (tmp_path / LEDGER_JOURNAL).exists()


def test_a_torn_journal_line_from_a_crash_is_skipped(tmp_path: Path) -> None:
    _big_ledger(tmp_path, 100)
    ledger = RunLedger(tmp_path, private_texts=[str(tmp_path)])
    ledger.upsert(_row_for("late_1", state="failed", exit_code=1, resolved=False))
    with (tmp_path / LEDGER_JOURNAL).open("ab") as journal:
        journal.write(b'{"tag": "torn_2", "state": "comp')  # killed mid-append
    reloaded = RunLedger(tmp_path, private_texts=[])
    assert reloaded.rows["late_1"].state == "failed" and "torn_2" not in reloaded.rows
