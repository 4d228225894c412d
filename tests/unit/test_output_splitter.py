"""The evaluation's output split: apply log up to the gate's status line, test log after it."""

from __future__ import annotations

import io

import pytest

from runner.phases.evaluate import APPLY_STATUS, OutputSplitter

NONCE = "0123456789abcdef"
LINE = f"{APPLY_STATUS}:{NONCE}:0\n".encode()


def _split(stream: bytes, chunk_size: int) -> tuple[bytes, bytes, OutputSplitter]:
    apply_sink, test_sink = io.BytesIO(), io.BytesIO()
    splitter = OutputSplitter(NONCE, apply_sink, test_sink)
    for start in range(0, len(stream), chunk_size):
        splitter.feed(stream[start : start + chunk_size])
    splitter.close()
    return apply_sink.getvalue(), test_sink.getvalue(), splitter


@pytest.mark.parametrize("chunk_size", [1, 2, 7, len(LINE) - 1, 4096])
def test_the_status_line_is_found_at_any_chunking_and_kept_out_of_both_logs(chunk_size: int) -> None:
    apply_out, test_out = b"patching file calc.py\n", b"FIX CONFIRMED\n"
    applied, tested, splitter = _split(apply_out + LINE + test_out, chunk_size)
    assert (applied, tested, splitter.found, splitter.apply_status) == (apply_out, test_out, True, 0)


def test_apply_output_without_a_final_newline_still_splits() -> None:
    stream = b"no newline" + f"{APPLY_STATUS}:{NONCE}:2\n".encode()
    applied, tested, splitter = _split(stream, 3)
    assert (applied, tested, splitter.apply_status) == (b"no newline", b"", 2)


def test_a_later_status_line_from_the_code_under_test_changes_nothing() -> None:
    forged = f"{APPLY_STATUS}:{NONCE}:7\n".encode()
    applied, tested, splitter = _split(b"ok\n" + LINE + b"test\n" + forged, 5)
    assert splitter.apply_status == 0 and tested == b"test\n" + forged and applied == b"ok\n"


@pytest.mark.parametrize(
    "fake",
    [
        f"{APPLY_STATUS}:{'f' * 16}:0\n",  # another nonce
        f"{APPLY_STATUS}:{NONCE}:\n",  # no status
        f"{APPLY_STATUS}:{NONCE}:0x\n",  # not a number
        f"{APPLY_STATUS}:{NONCE}:1234\n",  # no shell status has four digits
    ],
)
def test_lines_that_are_not_the_gates_stay_in_the_apply_log(fake: str) -> None:
    stream = fake.encode() + b"more apply output\n"
    for chunk_size in (1, 4, 4096):
        applied, tested, splitter = _split(stream, chunk_size)
        assert (applied, tested, splitter.found, splitter.apply_status) == (stream, b"", False, None)


def test_a_stream_that_ends_inside_a_status_line_loses_nothing() -> None:
    cut = LINE[:-2]
    applied, tested, splitter = _split(b"out\n" + cut, 4)
    assert (applied, tested, splitter.found) == (b"out\n" + cut, b"", False)
