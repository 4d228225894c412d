"""Patch export: new files in, ignored files out, binary changes counted, and GNU patch -p1 applies it."""

from __future__ import annotations

import io
import subprocess
import tarfile
from pathlib import Path

import pytest

from runner.context import JobContext
from runner.errors import PhaseError
from runner.jobroot import JobRoot
from runner.phases.baseline import baseline
from runner.phases.patch import export_patch
from runner.tasks.spec import load_settings
from runner.gitops import init_baseline, open_baseline


@pytest.fixture
def ctx(tmp_path: Path) -> JobContext:
    job = JobRoot.at(tmp_path / "job", "demo_1")
    source = job.buggy_source
    (source / "pkg").mkdir(parents=True)
    (source / "pkg" / "mod.py").write_text("def f():\n    return 1\n")
    (source / "notes.txt").write_text("no final newline")
    (source / "data.bin").write_bytes(b"\x00\x01\x02" * 10)
    (source / ".gitignore").write_text("*.log\n")
    return JobContext(settings=load_settings(tag="demo_1"), job=job)


def _pristine_copy(ctx: JobContext, commit: str, dest: Path) -> Path:
    archive = subprocess.run(
        ["git", "--git-dir", str(ctx.job.baseline_git_dir), "archive", commit], capture_output=True, check=True
    ).stdout
    dest.mkdir()
    with tarfile.open(fileobj=io.BytesIO(archive)) as tree:
        tree.extractall(dest, filter="data")
    return dest


def _git(tree: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(tree), *args], capture_output=True, text=True, check=True).stdout


def test_text_changes_and_new_files_apply_with_gnu_patch(ctx: JobContext, tmp_path: Path) -> None:
    commit = baseline(ctx).baseline_commit
    source = ctx.job.buggy_source
    (source / "pkg" / "mod.py").write_text("def f():\n    return 2\n")
    (source / "pkg" / "new.py").write_text("VALUE = 3\n")
    (source / "notes.txt").write_text("still no final newline, changed")
    (source / "debug.log").write_text("ignored\n")
    result = export_patch(ctx, commit)
    patch = ctx.job.patch.read_bytes()
    assert b"--- /dev/null\n+++ b/pkg/new.py" in patch
    assert b"debug.log" not in patch
    assert (result.changed_file_count, result.added_file_count, result.binary_change_count) == (3, 1, 0)
    assert result.hunk_count == 3 and result.patch_bytes == len(patch)

    plain = _pristine_copy(ctx, commit, tmp_path / "plain")
    applied = subprocess.run(["patch", "-p1", "--batch", "--forward"], cwd=plain, input=patch, capture_output=True)
    assert applied.returncode == 0, applied.stdout
    for name in ("pkg/mod.py", "pkg/new.py", "notes.txt"):
        assert (plain / name).read_bytes() == (source / name).read_bytes(), name


def test_binary_changes_are_kept_and_counted(ctx: JobContext) -> None:
    commit = baseline(ctx).baseline_commit
    (ctx.job.buggy_source / "data.bin").write_bytes(b"\xff\x00" * 40)
    result = export_patch(ctx, commit)
    assert result.binary_change_count == 1
    assert b"GIT binary patch" in ctx.job.patch.read_bytes()


def test_the_agent_has_its_own_repository_and_its_commits_still_count(ctx: JobContext) -> None:
    commit = baseline(ctx).baseline_commit
    source = ctx.job.buggy_source
    assert _git(source, "rev-parse", "HEAD").strip() == commit
    assert _git(source, "status", "--porcelain") == ""
    (source / "pkg" / "mod.py").write_text("def f():\n    return 9\n")
    assert "pkg/mod.py" in _git(source, "diff", "--name-only")
    _git(source, "commit", "-qam", "agent commit")
    result = export_patch(ctx, commit)
    assert result.changed_file_count == 1
    assert b".git/" not in ctx.job.patch.read_bytes()


def test_the_agents_git_config_never_runs_in_the_runner(ctx: JobContext, tmp_path: Path) -> None:
    commit = baseline(ctx).baseline_commit
    source = ctx.job.buggy_source
    proof = tmp_path / "fsmonitor-ran"
    hook = tmp_path / "monitor.sh"
    hook.write_text(f"#!/bin/sh\ntouch {proof}\n")
    hook.chmod(0o755)
    with (source / ".git" / "config").open("a") as config:
        config.write(f"[core]\n\tfsmonitor = {hook}\n\thooksPath = {tmp_path}\n")
    (source / ".gitattributes").write_text("* filter=evil\n")
    (source / "pkg" / "mod.py").write_text("def f():\n    return 5\n")
    result = export_patch(ctx, commit)
    assert result.changed_file_count == 2  # the edit and the new .gitattributes
    assert not proof.exists(), "the agent's git config ran code in the runner's git"


def test_a_half_made_baseline_is_made_again(ctx: JobContext) -> None:
    init_baseline(ctx.job.baseline_git_dir, ctx.job.buggy_source)  # a crash right after init
    result = baseline(ctx)
    assert result.tracked_file_count == 4
    assert len(list(open_baseline(ctx.job.baseline_git_dir, ctx.job.buggy_source).iter_commits())) == 1


def test_baseline_refuses_an_empty_tree(tmp_path: Path) -> None:
    job = JobRoot.at(tmp_path / "job", "demo_1")
    job.buggy_source.mkdir(parents=True)
    with pytest.raises(PhaseError) as caught:
        baseline(JobContext(settings=load_settings(tag="demo_1"), job=job))
    assert caught.value.reason == "empty_source"


def test_an_unchanged_tree_is_the_empty_patch_failure(ctx: JobContext) -> None:
    commit = baseline(ctx).baseline_commit
    with pytest.raises(PhaseError) as caught:
        export_patch(ctx, commit)
    assert caught.value.reason == "empty_patch"
    assert not ctx.job.patch.exists()


def test_baseline_is_one_commit_of_everything_not_ignored(ctx: JobContext) -> None:
    (ctx.job.buggy_source / "build.log").write_text("x")
    result = baseline(ctx)
    assert result.tracked_file_count == 4
    repo = open_baseline(ctx.job.baseline_git_dir, ctx.job.buggy_source)
    assert len(list(repo.iter_commits("--all"))) == 1
    assert baseline(ctx).baseline_commit == result.baseline_commit  # a rerun reuses it


def test_deletions_and_mode_changes_are_counted_from_the_patch(ctx: JobContext) -> None:
    commit = baseline(ctx).baseline_commit
    source = ctx.job.buggy_source
    (source / "notes.txt").unlink()
    (source / "pkg" / "mod.py").chmod(0o755)
    result = export_patch(ctx, commit)
    assert (result.changed_file_count, result.deleted_file_count, result.added_file_count) == (2, 1, 0)
    assert result.hunk_count == 1  # the deletion; a mode change has no hunk


def test_even_a_changed_baseline_config_runs_nothing(ctx: JobContext, tmp_path: Path) -> None:
    commit = baseline(ctx).baseline_commit
    proof = tmp_path / "ran"
    hook = tmp_path / "monitor.sh"
    hook.write_text(f"#!/bin/sh\ntouch {proof}\n")
    hook.chmod(0o755)
    with (ctx.job.baseline_git_dir / "config").open("a") as config:
        config.write(f"[core]\n\tfsmonitor = {hook}\n")
    (ctx.job.buggy_source / "pkg" / "mod.py").write_text("def f():\n    return 7\n")
    assert export_patch(ctx, commit).changed_file_count == 1
    assert not proof.exists()


def test_patches_to_tests_and_startup_hooks_are_counted(ctx: JobContext) -> None:
    commit = baseline(ctx).baseline_commit
    source = ctx.job.buggy_source
    (source / "tests").mkdir()
    (source / "tests" / "helper.py").write_text("X = 1\n")
    (source / "sitecustomize.py").write_text("print('FIX CONFIRMED')\n")
    (source / "pkg" / "mod.py").write_text("def f():\n    return 3\n")
    result = export_patch(ctx, commit)
    assert (result.changed_file_count, result.sensitive_file_count) == (3, 2)


def _embedded_repository(path: Path) -> None:
    """A repository of its own inside the tree, with one commit."""
    path.mkdir()
    subprocess.run(["git", "init", "-q", str(path)], check=True)
    (path / "f").write_text("f\n")
    subprocess.run(["git", "-C", str(path), "add", "f"], check=True)
    subprocess.run(["git", "-C", str(path), "-c", "user.name=a", "-c", "user.email=a@b", "commit", "-qm", "m"],
                   check=True)


def _stage_the_plain_way(ctx: JobContext, commit: str, extra: tuple[str, ...]) -> tuple[bytes, int]:
    """What ``git add --all`` with the hygiene pathspecs stages, and the artefacts it leaves out: the
    export as it was before it staged only the changed paths (the reference the fast one must equal)."""
    from runner import hygiene
    from runner.phases.patch import DIFF_OPTIONS

    repo = open_baseline(ctx.job.baseline_git_dir, ctx.job.buggy_source)
    repo.git.read_tree("-m", commit)
    repo.git.add("--all", "--", *hygiene.excluding(extra))
    only = hygiene.matching(extra)
    left_out = {name for output in (repo.git.diff_files("--name-only", "-z", "--", *only),
                                    repo.git.ls_files("--others", "--exclude-standard", "-z", "--", *only))
                for name in output.split("\0") if name}
    patch = repo.git.diff("--cached", *DIFF_OPTIONS, commit, stdout_as_string=False)
    repo.git.read_tree("-m", commit)
    return patch + (b"\n" if patch else b""), len(left_out)


@pytest.mark.parametrize("extra", [(), ("/build/", "docs/*.tmp", "[!a]*.log2", "a**b.dat")])
def test_the_patch_is_what_git_add_all_with_the_hygiene_pathspecs_would_stage(tmp_path: Path, extra) -> None:
    """Only the changed paths are staged (one listing, git's pathspecs on those alone), and the
    patch and the artefact count are byte for byte what staging the whole tree gives."""
    job = JobRoot.at(tmp_path / "job", "demo_1")
    source = job.buggy_source
    for name, text in {"pkg/mod.py": "x = 1\n", "pkg/gone.py": "y\n", "becomes_dir": "file\n",
                       "dir_goes/inner.py": "z\n", "old.pyc": "tracked bytecode\n", "link_target.py": "t\n",
                       "docs/keep.tmp": "tracked tmp\n", "tests/test_x.py": "def test(): pass\n",
                       "spaced name.py": "s\n", "ünï/côde.py": "u\n", "build/out.txt": "tracked build\n",
                       "symdir/inner.py": "s\n", "nest/sub/one.py": "1\n", "nest/sub/two.py": "2\n",
                       "elsewhere/sub/one.py": "1\n", "elsewhere/sub/two.py": "2\n"}.items():
        (source / name).parent.mkdir(parents=True, exist_ok=True)
        (source / name).write_text(text)
    (source / "link").symlink_to("link_target.py")
    (source / ".gitignore").write_text("*.log\nignored_dir/\n")
    ctx = JobContext(settings=load_settings(tag="demo_1", patch_exclude=list(extra)), job=job)
    commit = baseline(ctx).baseline_commit

    (source / "pkg" / "mod.py").write_text("x = 2\n")
    (source / "pkg" / "gone.py").unlink()
    (source / "becomes_dir").unlink()
    (source / "becomes_dir").mkdir()
    (source / "becomes_dir" / "now.py").write_text("inside\n")
    import shutil
    shutil.rmtree(source / "dir_goes")
    (source / "dir_goes").write_text("a file now\n")
    (source / "old.pyc").write_text("rewritten bytecode\n")  # a tracked artefact: left out
    (source / "link").unlink()
    (source / "link").symlink_to("pkg/mod.py")
    (source / "spaced name.py").chmod(0o755)
    (source / "ünï" / "côde.py").write_text("u2\n")
    (source / "tests" / "test_x.py").write_text("def test(): assert True\n")
    (source / "docs" / "keep.tmp").write_text("changed tmp\n")
    (source / "build" / "out.txt").write_text("changed build\n")
    for name in ("pkg/__pycache__/mod.cpython-311.pyc", "node_modules/a/index.js", ".pytest_cache/v/x",
                 "run.log", "ignored_dir/x.py", "pkg/fix.py.orig", "bx.log2", "ax.log2", "aXYb.dat", "a/b.dat",
                 "deep/er/.coverage", "new dir/new file.py", "assets/blob.bin"):
        (source / name).parent.mkdir(parents=True, exist_ok=True)
        (source / name).write_bytes(b"\x00\xff binary" if name.endswith(".bin") else b"new\n")

    shutil.rmtree(source / "symdir")
    (source / "symdir").symlink_to("pkg")  # a tracked directory become a symlink to one
    shutil.rmtree(source / "nest")  # and one deeper: nest/sub/ still looks like a directory, through the link
    (source / "nest").symlink_to("elsewhere")
    _embedded_repository(source / "vendored")  # a gitlink, as git add --all makes it
    expected_patch, expected_left_out = _stage_the_plain_way(ctx, commit, extra)
    result = export_patch(ctx, commit)
    got = ctx.job.patch.read_bytes()
    heads = lambda text: [line.decode() for line in text.split(b"\n") if line.startswith(b"diff")]  # noqa: E731
    assert heads(got) == heads(expected_patch), (sorted(set(heads(got)) ^ set(heads(expected_patch))))
    assert got == expected_patch
    assert result.artifact_files_left_out == expected_left_out and expected_left_out >= 6
    again = export_patch(ctx, commit)  # a rerun finds the index staged, puts it back, and gives the same
    assert again == result and ctx.job.patch.read_bytes() == expected_patch
    pristine = _pristine_copy(ctx, commit, tmp_path / "pristine")
    applied = subprocess.run(["git", "apply", "--binary", str(ctx.job.patch)], cwd=pristine, capture_output=True)
    assert applied.returncode == 0, applied.stderr
    assert (pristine / "becomes_dir" / "now.py").read_text() == "inside\n"
    assert (pristine / "dir_goes").read_text() == "a file now\n"


def test_an_embedded_repository_in_a_tree_without_artefacts_is_staged_as_git_add_all_stages_it(
    ctx: JobContext, tmp_path: Path
) -> None:
    """No path may be an artefact, so git is not asked to sort them: the listing's ``dir/`` is
    still staged as the gitlink ``git add --all`` makes."""
    commit = baseline(ctx).baseline_commit
    source = ctx.job.buggy_source
    (source / "pkg" / "mod.py").write_text("def f():\n    return 2\n")
    _embedded_repository(source / "vendored")
    expected, left_out = _stage_the_plain_way(ctx, commit, ())
    result = export_patch(ctx, commit)
    assert ctx.job.patch.read_bytes() == expected and b"Subproject commit" in expected
    assert (result.changed_file_count, result.artifact_files_left_out) == (2, left_out) == (2, 0)


def _count_line_by_line(text: bytes) -> dict[str, int]:
    """The counts as the patch format defines them: each line's first 8 KiB against the headers."""
    from runner.phases.patch import _diff_path, _sensitive

    headers = ((b"diff --git ", "changed_file_count"), (b"new file mode ", "added_file_count"),
               (b"deleted file mode ", "deleted_file_count"), (b"@@ ", "hunk_count"),
               (b"GIT binary patch", "binary_change_count"))
    counts = dict.fromkeys([key for _, key in headers] + ["sensitive_file_count"], 0)
    for line in text.split(b"\n"):
        line = line[:8192]
        key = next((key for prefix, key in headers if line.startswith(prefix)), None)
        if key is not None:
            counts[key] += 1
            counts["sensitive_file_count"] += key == "changed_file_count" and _sensitive(_diff_path(line))
    return counts


def test_the_patch_counter_counts_the_same_however_the_stream_is_cut() -> None:
    """The counter reads git's output in chunks of any size: header lines cut between chunks,
    content lines that look like headers (`+@@`, ` diff --git`), lines longer than what it keeps,
    binary patches, and a last line without its newline all count as the whole patch read line by line."""
    import random

    from runner.phases.patch import PatchCounter

    pieces = [b"diff --git a/x.py b/x.py\n", b"diff --git a/tests/test_a.py b/tests/test_a.py\n",
              b'diff --git "a/t\\303\\274/conftest.py" "b/t\\303\\274/conftest.py"\n', b"new file mode 100644\n",
              b"deleted file mode 100644\n", b"@@ -1 +1 @@\n", b"+@@ not a hunk\n", b" diff --git no\n",
              b"GIT binary patch\n", b"literal 12\n", b"-x" * 5000 + b"\n", b"+" + b"y" * 20000 + b"\n",
              b"diff --git a/" + b"z" * 9000 + b" b/z\n"]
    rng = random.Random(7)
    for _ in range(300):
        text = b"".join(rng.choice(pieces) for _ in range(rng.randint(0, 60)))
        if rng.random() < 0.5:
            text = text.rstrip(b"\n")
        counter, at = PatchCounter(), 0
        while at < len(text):
            size = rng.randint(1, 5000)
            counter.feed(text[at:at + size])
            at += size
        assert counter.close() == _count_line_by_line(text)


@pytest.mark.parametrize("size", [1, 2, 3, 7, 1000])
def test_a_listing_read_in_chunks_finds_an_artefact_name_cut_between_them(size: int) -> None:
    """Whatever the size of the chunks git's listing arrives in, every name is copied and counted
    once, and a needle cut between two chunks is still found (and one across two names is not)."""
    import io

    from runner.phases.patch import _copy_listing

    def chunks(data: bytes):
        return (data[i:i + size] for i in range(0, len(data), size))

    with_artefact = b"src/a.py\0pkg/__pycache__/m.pyc\0docs/x.md\0"
    across_names = b"src/__pyc\0ache__.txt\0"  # the needle's text only across the NUL between two names
    for data, suspect in ((with_artefact, True), (across_names, False), (b"", False)):
        listing = io.BytesIO()
        assert _copy_listing(chunks(data), listing, [b"__pycache__", b".pyc"]) == (data.count(b"\0"), suspect)
        assert listing.getvalue() == data
    listing = io.BytesIO()
    assert _copy_listing(chunks(b"one\0two"), listing, None) == (2, True)  # no needles: anything may be one
    assert listing.getvalue() == b"one\0two\0"
