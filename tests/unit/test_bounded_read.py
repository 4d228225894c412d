"""The bounded reader on real planted files (FIFOs, links, huge and deep files), and the batch ledger through it."""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from runner.bounded_read import (
    Unreadable, UnreadableFileError, iter_bounded_lines, parse_json_bounded, read_bounded, read_bounded_json,
)
from runner.errors import CompactInputError
from runner.ledger import LEDGER_JOURNAL, RunLedger
from tests.unit.test_batch_parts import _row_for


def within(seconds: float, call: Callable[[], Any]) -> Any:
    """``call()``, failing the test (not hanging it) if it does not return in time."""
    outcome: list[Any] = []

    def run() -> None:
        try:
            outcome.append(("value", call()))
        except BaseException as e:  # noqa: BLE001 - handed back to the test
            outcome.append(("error", e))

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    if not outcome:
        pytest.fail(f"still blocked after {seconds} s")
    kind, value = outcome[0]
    if kind == "error":
        raise value
    return value


def refused(call: Callable[[], Any]) -> Unreadable:
    with pytest.raises(UnreadableFileError) as caught:
        within(10, call)
    return caught.value.unreadable


def test_special_files_and_links_out_are_refused_without_blocking_or_reading(tmp_path: Path) -> None:
    root = tmp_path / "jobs"
    (root / "t").mkdir(parents=True)
    os.mkfifo(root / "t" / "fifo.json")
    (root / "t" / "zero.json").symlink_to("/dev/zero")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "run.json").write_text("{}")
    (root / "out").symlink_to(elsewhere)  # a directory on the way that leads out
    (root / "loop.json").symlink_to("loop.json")
    read = lambda name: lambda: read_bounded(root / name, root=root, max_bytes=1 << 20)  # noqa: E731
    assert refused(read("t/fifo.json")) is Unreadable.NOT_REGULAR
    assert refused(read("t/zero.json")) is Unreadable.OUTSIDE
    assert refused(read("out/run.json")) is Unreadable.OUTSIDE
    assert refused(read("t")) is Unreadable.NOT_REGULAR
    assert refused(read("loop.json")) is Unreadable.NOT_REGULAR
    assert refused(read("absent.json")) is Unreadable.MISSING
    # a link that stays inside is followed
    (root / "t" / "real.json").write_text('{"ok": 1}')
    (root / "inside.json").symlink_to(root / "t" / "real.json")
    assert read_bounded_json(root / "inside.json", root=root, max_bytes=100, max_depth=2) == {"ok": 1}


def test_the_message_names_the_file_relative_to_the_root_and_never_quotes_it(tmp_path: Path) -> None:
    (tmp_path / "t").mkdir()
    (tmp_path / "t" / "run.json").write_bytes(b'{"x": "SECRET-\xff"}')
    with pytest.raises(UnreadableFileError) as caught:
        read_bounded_json(tmp_path / "t" / "run.json", root=tmp_path, max_bytes=100, max_depth=4)
    assert str(caught.value).startswith("t/run.json is unreadable (not_utf8)")
    assert str(tmp_path) not in str(caught.value) and "SECRET" not in str(caught.value)
    assert caught.value.exit_code == 2


def test_size_utf8_json_and_depth_bounds(tmp_path: Path) -> None:
    path = tmp_path / "f.json"

    def reason(data: bytes, *, max_bytes: int = 1 << 20, max_depth: int = 4) -> Unreadable | None:
        path.write_bytes(data)
        try:
            read_bounded_json(path, root=tmp_path, max_bytes=max_bytes, max_depth=max_depth)
        except UnreadableFileError as e:
            return e.unreadable
        return None

    assert reason(b'{"a": [1]}', max_bytes=10) is None  # exactly the bound
    assert reason(b'{"a": [12]}', max_bytes=10) is Unreadable.TOO_LARGE
    assert reason(b"\xef\xbb\xbf{}") is Unreadable.NOT_JSON  # a BOM is no JSON
    assert reason(b'["\xc3\x28"]') is Unreadable.NOT_UTF8
    assert reason(b"[NaN]") is Unreadable.NOT_JSON and reason(b"[Infinity]") is Unreadable.NOT_JSON
    assert reason(b"1" + b"0" * 100_000) is Unreadable.NOT_JSON  # no 100,000-digit integer
    assert reason(b'{"a": {"b": {"c": [1]}}}') is None  # four deep
    assert reason(b'{"a": {"b": {"c": [[1]]}}}') is Unreadable.TOO_DEEP
    assert reason(b'{"a": "[[[[[[[[[["}') is None  # brackets in a string are no nesting
    assert reason(b"[" * 100_000 + b"]" * 100_000, max_depth=64) is Unreadable.TOO_DEEP
    assert parse_json_bounded(b'{"k": ["v"]}', name="x", max_depth=2) == {"k": ["v"]}


def test_lines_are_streamed_with_a_bound_per_line_and_in_all(tmp_path: Path) -> None:
    path = tmp_path / "journal.jsonl"
    with path.open("wb") as handle:
        handle.write(b"first\n")
        handle.write(b"x" * (10 << 20) + b"\n")  # 10 MB, never held
        handle.write(b"\nthird\nto")
    lines = list(iter_bounded_lines(path, root=tmp_path, max_line_bytes=1024, max_total_bytes=1 << 30))
    assert [(line.number, line.data, line.unreadable, line.terminated) for line in lines] == [
        (1, b"first", None, True), (2, None, Unreadable.TOO_LARGE, True), (3, b"", None, True),
        (4, b"third", None, True), (5, b"to", None, False),
    ]
    path.write_bytes(b"ok\n" + b"y" * 5000)  # an overlong last line without its newline
    assert [line.unreadable for line in iter_bounded_lines(path, root=tmp_path, max_line_bytes=100,
                                                           max_total_bytes=1 << 20)] == [None, Unreadable.TOO_LARGE]
    seen = []
    with pytest.raises(UnreadableFileError) as caught:
        for line in iter_bounded_lines(path, root=tmp_path, max_line_bytes=100, max_total_bytes=1000):
            seen.append(line.data)
    assert caught.value.unreadable is Unreadable.TOO_LARGE


def test_the_batch_ledger_names_a_bad_snapshot_and_never_blocks_on_it(tmp_path: Path) -> None:
    (tmp_path / "run-ledger.json").write_bytes(b'{"rows": [{"tag": "\xff"}]}')
    with pytest.raises(CompactInputError, match=r"run-ledger.json: <root>: unreadable \(not_utf8\)"):
        within(10, lambda: RunLedger(tmp_path, private_texts=[]))
    (tmp_path / "run-ledger.json").write_text('{"rows": ' + "[" * 100_000 + "]" * 100_000 + "}")
    with pytest.raises(CompactInputError, match=r"unreadable \(too_deep\)"):
        within(10, lambda: RunLedger(tmp_path, private_texts=[]))
    (tmp_path / "run-ledger.json").unlink()
    os.mkfifo(tmp_path / "run-ledger.json")
    with pytest.raises(CompactInputError, match=r"unreadable \(not_a_regular_file\)"):
        within(10, lambda: RunLedger(tmp_path, private_texts=[]))


def test_the_batch_ledger_skips_an_overlong_journal_line_and_keeps_the_rows_after_it(tmp_path: Path) -> None:
    ledger = RunLedger(tmp_path, private_texts=[str(tmp_path)])
    ledger.upsert(_row_for("a_1"))
    with (tmp_path / LEDGER_JOURNAL).open("ab") as journal:
        journal.write(b'{"tag": "' + b"z" * (8 << 20) + b'"}\n')
        journal.write(json.dumps(_row_for("b_2").public()).encode() + b"\n")
    reloaded = within(30, lambda: RunLedger(tmp_path, private_texts=[]))
    assert set(reloaded.rows) == {"a_1", "b_2"} and reloaded.journal_entries == 1
