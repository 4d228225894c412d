"""The streaming extractor: plain trees come out whole; hostile entries are refused, .git left out."""

from __future__ import annotations

import io
import os
import subprocess
import tarfile
from pathlib import Path

import pytest

from runner.errors import UnsafeArchiveError
from runner.safe_extract import extract_tree


def _tar(*entries: tuple) -> io.BytesIO:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        for name, kind, *rest in entries:
            info = tarfile.TarInfo(name)
            if kind == "file":
                data = rest[0]
                info.size, info.mode = len(data), (rest[1] if len(rest) > 1 else 0o644)
                archive.addfile(info, io.BytesIO(data))
                continue
            info.type = {"dir": tarfile.DIRTYPE, "sym": tarfile.SYMTYPE, "hard": tarfile.LNKTYPE,
                         "chr": tarfile.CHRTYPE, "fifo": tarfile.FIFOTYPE}[kind]
            info.mode = 0o755
            if kind in ("sym", "hard"):
                info.linkname = rest[0]
            archive.addfile(info)
    buffer.seek(0)
    return buffer


def test_a_plain_tree_comes_out_whole_without_its_history(tmp_path: Path) -> None:
    binary = bytes(range(256)) * 3
    stats = extract_tree(
        _tar(
            ("src", "dir"), ("src/pkg", "dir"), ("src/pkg/a.py", "file", b"x = 1\n"),
            ("src/logo.bin", "file", binary), ("src/link", "sym", "pkg/a.py"),
            ("src/.git", "dir"), ("src/.git/HEAD", "file", b"ref: refs/heads/main\n"),
            ("src/vendor/.git", "file", b"gitdir: ../x\n"),
        ),
        tmp_path / "out",
    )
    out = tmp_path / "out"
    assert (out / "pkg" / "a.py").read_text() == "x = 1\n"
    assert (out / "logo.bin").read_bytes() == binary
    assert os.readlink(out / "link") == "pkg/a.py"
    assert not (out / ".git").exists() and not (out / "vendor" / ".git").exists()
    assert (stats.files, stats.symlinks, stats.oracle_entries_skipped) == (2, 1, 3)
    assert stats.bytes == len(binary) + 6


def test_setuid_bits_are_dropped(tmp_path: Path) -> None:
    extract_tree(_tar(("src", "dir"), ("src/tool", "file", b"#!/bin/sh\n", 0o6755)), tmp_path / "out")
    mode = (tmp_path / "out" / "tool").stat().st_mode
    assert not mode & 0o6000 and mode & 0o100


@pytest.mark.parametrize(
    ("entries", "why"),
    [
        ((("src/../escape", "file", b"x"),), "'..'"),
        ((("/etc/evil", "file", b"x"),), "absolute name"),
        ((("src/abs", "sym", "/etc/passwd"),), "AbsoluteLinkError"),
        ((("src/up", "sym", "../../outside"),), "LinkOutsideDestinationError"),
        ((("src/h", "hard", "/etc/passwd"),), "absolute name"),
        ((("src/h", "hard", "other/../../x"),), "'..'"),
        ((("src/dev", "chr"),), "special file"),
        ((("src/pipe", "fifo"),), "special file"),
    ],
)
def test_hostile_entries_are_refused_and_nothing_lands_outside(tmp_path: Path, entries: tuple, why: str) -> None:
    outside_before = sorted(p.name for p in tmp_path.iterdir())
    with pytest.raises(UnsafeArchiveError, match=why):
        extract_tree(_tar(("src", "dir"), *entries), tmp_path / "out")
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([*outside_before, "out"])
    assert not (tmp_path / "escape").exists() and not Path("/etc/evil").exists()


def test_the_archive_is_read_as_a_stream(tmp_path: Path) -> None:
    class ForwardOnly(io.RawIOBase):
        def __init__(self, data: bytes) -> None:
            self._inner = io.BytesIO(data)

        def readable(self) -> bool:
            return True

        def readinto(self, target) -> int:
            chunk = self._inner.read(min(len(target), 4096))
            target[: len(chunk)] = chunk
            return len(chunk)

        def seekable(self) -> bool:
            return False

    data = _tar(("src", "dir"), *[(f"src/f{i}", "file", b"y" * 5000) for i in range(20)]).getvalue()
    stats = extract_tree(ForwardOnly(data), tmp_path / "out")  # type: ignore[arg-type]
    assert stats.files == 20


def test_an_in_tree_hard_link_comes_out_and_one_into_the_history_is_refused(tmp_path: Path) -> None:
    stats = extract_tree(
        _tar(("src", "dir"), ("src/a.txt", "file", b"shared\n"), ("src/b.txt", "hard", "src/a.txt")),
        tmp_path / "ok",
    )
    assert (tmp_path / "ok" / "b.txt").read_text() == "shared\n" and stats.files == 2
    with pytest.raises(UnsafeArchiveError, match="hard link"):
        extract_tree(
            _tar(("src", "dir"), ("src/.git", "dir"), ("src/.git/config", "file", b"x"),
                 ("src/c", "hard", "src/.git/config")),
            tmp_path / "bad",
        )


@pytest.mark.parametrize(
    ("entries", "why"),
    [
        # A link that looks inside by its text but climbs out through another link.
        ((("src/c", "sym", "."), ("src/d", "dir"), ("src/d/l", "sym", "../c/..")), "LinkOutsideDestinationError"),
        # A link made harmless-looking first, then the link it goes through.
        ((("src/l1", "sym", "y/.."), ("src/y", "sym", ".")), "LinkOutsideDestinationError"),
        # An entry under a link: it would be written wherever the link points.
        ((("src/sub", "dir"), ("src/l", "sym", "sub"), ("src/l/evil", "file", b"x")), "a directory where"),
        # The same name twice: the second could replace the first with a link.
        ((("src/a", "file", b"1"), ("src/a", "sym", "b")), "occurs twice"),
    ],
)
def test_link_tricks_are_refused(tmp_path: Path, entries: tuple, why: str) -> None:
    with pytest.raises(UnsafeArchiveError, match=why):
        extract_tree(_tar(("src", "dir"), *entries), tmp_path / "out")


@pytest.mark.parametrize(
    ("entries", "why"),
    [
        ((("src/" + "n" * 300, "file", b"x"),), "cannot be created"),
        ((("src/empty", "sym", ""),), "AbsoluteLinkError"),
        ((("src/a", "file", b"x"), ("other/b", "file", b"y")), "single root"),
    ],
)
def test_odd_entries_are_refused_naming_the_entry(tmp_path: Path, entries: tuple, why: str) -> None:
    with pytest.raises(UnsafeArchiveError, match=why):
        extract_tree(_tar(("src", "dir"), *entries), tmp_path / "out")


def test_a_deep_tree_and_a_broken_stream(tmp_path: Path) -> None:
    deep = "src/" + "/".join(["d"] * 1100) + "/leaf.txt"  # deeper than Python's recursion limit
    try:
        assert extract_tree(_tar(("src", "dir"), (deep, "file", b"deep\n")), tmp_path / "deep").files == 1
    finally:
        subprocess.run(["rm", "-rf", str(tmp_path / "deep")], check=True)  # shutil.rmtree would recurse too deep
    whole = _tar(("src", "dir"), ("src/a", "file", b"x" * 5000)).getvalue()
    with pytest.raises(UnsafeArchiveError, match="not a readable tar stream|truncated"):
        extract_tree(io.BytesIO(whole[:1500]), tmp_path / "cut")
