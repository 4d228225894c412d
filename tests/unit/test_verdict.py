"""The official string verdict: FAILED anywhere fails, else any success string passes."""

from __future__ import annotations

from pathlib import Path

import pytest

from runner.verdict import SUCCESS_STRINGS, string_verdict


@pytest.mark.parametrize(
    ("texts", "expected"),
    [
        (["applied\n", "FIX CONFIRMED: add works\n"], True),
        (["applied\n", "FIX CONFIRMED\n❌ TEST FAILED\n"], False),
        (["PATCH FAILED\n", "FIX CONFIRMED\n"], False),
        (["applied\n", "all good\n"], False),
        (["", ""], False),
        *[(["", f"... {s} ...\n"], True) for s in SUCCESS_STRINGS],
    ],
)
def test_string_verdict(tmp_path: Path, texts: list[str], expected: bool) -> None:
    paths = []
    for index, text in enumerate(texts):
        path = tmp_path / f"log{index}"
        path.write_text(text)
        paths.append(path)
    assert string_verdict(paths) is expected


def test_a_string_across_a_read_boundary_is_found(tmp_path: Path) -> None:
    log = tmp_path / "big.log"
    padding = (1 << 20) - 4
    log.write_bytes(b"x" * padding + b"FIX CONFIRMED\n")
    assert string_verdict([log]) is True
    log.write_bytes(b"x" * padding + b"FAILED\n" + b"FIX CONFIRMED\n")
    assert string_verdict([log]) is False
