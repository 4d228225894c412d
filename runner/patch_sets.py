"""Patch sets as the official evaluation lays them out: ``DIR/<tag>/*.patch``, or one ``--patch FILE``.

A tag directory is named by a tag under any of its spellings (``evo.ninja_445`` is the
profile ``evoninja_445``): the profiles' spelling table maps it, and the mapping is
kept so the report can show it. A directory that is neither a safe tag nor a known
spelling is refused before any work, named escaped and cut short.

Each patch is classified before anything runs, from its size and its first bytes:
``empty_patch`` (scored FAILED without a container, as ``apply && test`` on an empty
file would fail the official rule), ``not_a_patch`` (no diff header at all),
``patch_too_large`` (over the patch phase's limit) and ``not_a_regular_file`` (a link,
a FIFO: never opened). The rest are run.
"""

from __future__ import annotations

import hashlib
import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path

from runner.errors import BadInputError
from runner.phases.patch import PATCH_MAX_BYTES
from runner.profiles import profile_table
from runner.settings import is_safe_tag

PATCH_SUFFIXES = (".patch", ".diff")
# A line that only a unified or git diff starts with.
_DIFF_HEADER = re.compile(rb"^(?:diff |--- |\+\+\+ |@@ |GIT binary patch)", re.MULTILINE)
# A patch name as the ledger shows it; any other name is shown as patch-<sha12>.
_SAFE_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.+-]{0,119}")
# "agent_attempt_3.patch", "run-2.patch": the patch is attempt N of one agent.
_ATTEMPT = re.compile(r"(?:attempt|run|sample)[-_ ]?(\d{1,3})(?!\d)", re.IGNORECASE)
_HASH_CHUNK = 1 << 20

REJECTIONS = ("empty_patch", "not_a_patch", "patch_too_large", "not_a_regular_file")


@dataclass(frozen=True)
class PatchUnit:
    """One patch to score: which tag, which file, what it holds."""

    tag: str  # the profile's spelling (or the directory's, for a tag without a profile)
    directory: str | None  # the tag directory's own name, when it differs from ``tag``
    name: str  # public: the file's name when it is plain, else patch-<sha12>
    path: Path
    sha256: str
    size: int
    attempt: int | None
    rejection: str | None  # one of REJECTIONS, or None: to be run

    @property
    def key(self) -> str:
        return f"{self.tag}/{self.name}"


def shown(name: str) -> str:
    """A name from the operator's disk, safe to print: escaped and cut short."""
    return repr(name[:60] + ("..." if len(name) > 60 else ""))


def tag_of_directory(name: str) -> str:
    """The tag a directory stands for. Raises: BadInputError when it is not one."""
    mapped = profile_table().by_alias.get(name)
    if mapped is not None:
        return mapped
    if is_safe_tag(name):
        return name
    raise BadInputError(f"--patches-dir: the directory {shown(name)} is not a tag (nor a spelling of one); "
                        "rename it to the tag or move it out")


def _classify(path: Path) -> tuple[str, int, str | None]:
    """(sha256, size, rejection) from the file itself; a non-regular file is never opened."""
    info = os.lstat(path)
    if not stat.S_ISREG(info.st_mode):
        return hashlib.sha256(b"").hexdigest(), 0, "not_a_regular_file"
    if info.st_size > PATCH_MAX_BYTES:
        return hashlib.sha256(b"").hexdigest(), info.st_size, "patch_too_large"
    digest = hashlib.sha256()
    head_has_header = False
    nonblank = False
    with path.open("rb") as handle:
        tail = b""
        for block in iter(lambda: handle.read(_HASH_CHUNK), b""):
            digest.update(block)
            nonblank = nonblank or bool(block.strip())
            if not head_has_header:
                head_has_header = bool(_DIFF_HEADER.search(tail + block))
                tail = block[-64:]
    size = info.st_size
    if not nonblank:
        return digest.hexdigest(), size, "empty_patch"
    return digest.hexdigest(), size, None if head_has_header else "not_a_patch"


def _public_name(file_name: str, sha256: str) -> str:
    return file_name if _SAFE_NAME.fullmatch(file_name) and ".." not in file_name else f"patch-{sha256[:12]}"


def _unit(tag: str, directory: str | None, path: Path, attempt: int | None) -> PatchUnit:
    try:
        sha256, size, rejection = _classify(path)
    except OSError as e:
        raise BadInputError(f"the patch {shown(path.name)} cannot be read ({e.strerror or type(e).__name__})") from e
    return PatchUnit(tag=tag, directory=directory, name=_public_name(path.name, sha256), path=path,
                     sha256=sha256, size=size, attempt=attempt, rejection=rejection)


def _attempts(names: list[str], as_patches: bool) -> list[int | None]:
    """Attempt numbers, when every name of the tag says one (or ``--attempts-as-patches``), else None each."""
    if as_patches:
        return list(range(1, len(names) + 1))
    found = [_ATTEMPT.search(Path(name).stem) for name in names]
    if names and all(found) and len({int(m.group(1)) for m in found if m}) == len(names):
        return [int(m.group(1)) for m in found if m]
    return [None] * len(names)


def discover(patches_dir: Path, *, tags: list[str] | None, attempts_as_patches: bool) -> list[PatchUnit]:
    """Every patch of ``DIR/<tag>/*.patch`` (only the tags named, when ``tags`` is given), in order.

    Raises:
        BadInputError: the directory is missing, a tag directory is not a tag, a named tag has
        no directory, two directories name one tag, or there is no patch at all.
    """
    if not patches_dir.is_dir():
        raise BadInputError("--patches-dir is not a directory (give the folder that holds <tag>/*.patch)")
    wanted = set(tags) if tags else None
    directories: dict[str, str] = {}
    for entry in sorted(os.scandir(patches_dir), key=lambda e: e.name):
        if not entry.is_dir(follow_symlinks=False):
            continue
        tag = tag_of_directory(entry.name)
        if wanted is not None and tag not in wanted and entry.name not in wanted:
            continue
        if tag in directories:
            raise BadInputError(f"--patches-dir: {shown(directories[tag])} and {shown(entry.name)} are one tag "
                                f"({tag}); merge them")
        directories[tag] = entry.name
    if wanted is not None:
        missing = sorted(t for t in wanted if t not in directories and t not in directories.values())
        if missing:
            raise BadInputError(f"--patches-dir has no directory for {', '.join(missing[:5])}")
    units: list[PatchUnit] = []
    for tag, directory in directories.items():
        folder = patches_dir / directory
        names = sorted(e.name for e in os.scandir(folder) if e.name.endswith(PATCH_SUFFIXES))
        for name, attempt in zip(names, _attempts(names, attempts_as_patches)):
            units.append(_unit(tag, directory if directory != tag else None, folder / name, attempt))
    if not units:
        raise BadInputError("--patches-dir holds no <tag>/*.patch file")
    return units


def single(patch: Path, tag: str) -> list[PatchUnit]:
    """``--patch FILE --tag T``. Raises: BadInputError when the file is missing."""
    if not os.path.lexists(patch):
        raise BadInputError("--patch: no such file")
    return [_unit(tag_of_directory(tag), None, patch, None)]
