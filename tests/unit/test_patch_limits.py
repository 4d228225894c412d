"""The patch phase with what agents leave: non-ASCII names git quotes, and very large files."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from runner.context import JobContext
from runner.errors import PhaseError
from runner.jobroot import JobRoot
from runner.phases.baseline import baseline
from runner.gitops import open_baseline
from runner.phases.patch import FILE_MAX_BYTES, PATCH_MAX_BYTES, export_patch
from runner.tasks.spec import load_settings
from tests.conftest import REPO


def _ctx(root: Path) -> JobContext:
    job = JobRoot.at(root / "job", "demo_1")
    (job.buggy_source / "pkg").mkdir(parents=True)
    (job.buggy_source / "pkg" / "mod.py").write_text("def f():\n    return 1\n")
    return JobContext(settings=load_settings(tag="demo_1"), job=job)


def test_sensitive_files_with_names_git_quotes_are_counted(tmp_path: Path) -> None:
    ctx = _ctx(tmp_path)
    commit = baseline(ctx).baseline_commit
    source = ctx.job.buggy_source
    (source / "tests" / "über").mkdir(parents=True)
    (source / "tests" / "über" / "helper.py").write_text("X = 1\n")  # under tests/: sensitive
    (source / "évil.pth").write_text("import os\n")  # an interpreter start-up hook
    (source / "pkg" / "naïve.py").write_text("Y = 2\n")  # quoted too, but not sensitive
    (source / "pkg" / "mod.py").write_text("def f():\n    return 2\n")
    result = export_patch(ctx, commit)
    assert b'"a/tests/\\303\\274ber/helper.py"' in ctx.job.patch.read_bytes()  # git did quote them
    assert result.changed_file_count == 4
    assert result.sensitive_file_count == 2


_MEASURE = """
import os, resource, sys
from pathlib import Path
sys.path.insert(0, sys.argv[2])
from tests.unit.test_patch_limits import _ctx
from runner.errors import PhaseError
from runner.phases.baseline import baseline
from runner.phases.patch import export_patch
ctx = _ctx(Path(sys.argv[1]))
commit = baseline(ctx).baseline_commit
mode, megabytes = sys.argv[3], int(sys.argv[4])
if mode == "sparse":  # one file of that size, no block written: the size alone must refuse it
    with open(ctx.job.buggy_source / "blob.bin", "wb") as out:
        out.truncate(megabytes << 20)
else:  # incompressible files each under the per-file bound, together past the patch's
    for i in range(megabytes // 7):
        (ctx.job.buggy_source / f"part{i}.bin").write_bytes(os.urandom(7 << 20))
try:
    result = export_patch(ctx, commit)
    print("exported", end=" ")
except PhaseError as e:
    print(e.reason, e.details.get("files_over_limit", 0), end=" ")
# The phase's peak: this process's own, and its git children's (a child's maximum starts at
# this process's size when it forks, so it never reads below the truth).
hwm = next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmHWM"))
print(max(hwm, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss))
"""


def _measure(tmp_path: Path, mode: str, megabytes: int) -> tuple[str, int, int]:
    done = subprocess.run(
        [sys.executable, "-c", _MEASURE, str(tmp_path), str(REPO), mode, str(megabytes)],
        capture_output=True, text=True, timeout=600, cwd=REPO,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    outcome, over, peak_kib = done.stdout.split()
    return outcome, int(over), int(peak_kib)


def _nothing_written(tmp_path: Path) -> None:
    patches = tmp_path / "job" / "Patches"
    assert not (patches / "demo_1" / "attempt.patch").exists()
    assert not (patches.exists() and list(patches.rglob("*.tmp")))


def test_an_agents_1gb_file_is_refused_by_its_size_before_git_reads_it(tmp_path: Path) -> None:
    """Issue 21, item 6: a 1 GB file took about 3 GB before ``patch_too_large``; now its size
    refuses it, and the phase's peak (the runner and every git it ran) stays under 100 MB."""
    assert 1024 << 20 > FILE_MAX_BYTES
    outcome, over, peak_kib = _measure(tmp_path, "sparse", 1024)
    assert (outcome, over) == ("patch_too_large", 1)
    assert peak_kib < 100 * 1024, f"the patch phase peaked at {peak_kib // 1024} MiB"
    _nothing_written(tmp_path)


def test_files_each_under_the_bound_but_a_patch_past_it_stop_git_as_it_streams(tmp_path: Path) -> None:
    outcome, over, peak_kib = _measure(tmp_path, "many", 70)  # 10 files of 7 MiB, random
    assert 70 << 20 > PATCH_MAX_BYTES and 7 << 20 < FILE_MAX_BYTES
    assert (outcome, over) == ("patch_too_large", 0)
    assert peak_kib < 100 * 1024, f"the patch phase peaked at {peak_kib // 1024} MiB"
    _nothing_written(tmp_path)


def test_a_rerun_starts_from_the_baseline_s_index_whatever_an_earlier_attempt_staged(tmp_path: Path) -> None:
    """The phase stages into its own copy of the baseline's index: an attempt refused for a large
    file, or one that exported, leaves the baseline's index as the baseline wrote it, so a rerun
    sees exactly the tree's changes (the large file once it is gone: no trace of it)."""
    ctx = _ctx(tmp_path)
    commit = baseline(ctx).baseline_commit
    index = ctx.job.baseline_git_dir / "index"
    pristine = (index.read_bytes(), index.stat().st_mtime_ns)
    big = ctx.job.buggy_source / "staged.bin"
    with open(big, "wb") as out:
        out.truncate(FILE_MAX_BYTES + 1)
    (ctx.job.buggy_source / "pkg" / "extra.py").write_text("X = 1\n")
    with pytest.raises(PhaseError) as caught:
        export_patch(ctx, commit)
    assert caught.value.reason == "patch_too_large" and caught.value.details["files_over_limit"] == 1
    assert (index.read_bytes(), index.stat().st_mtime_ns) == pristine
    big.unlink()  # once it is gone, the rerun exports the rest and holds no trace of it
    (ctx.job.buggy_source / "pkg" / "mod.py").write_text("def f():\n    return 2\n")
    result = export_patch(ctx, commit)
    assert result.changed_file_count == 2 and b"staged.bin" not in ctx.job.patch.read_bytes()
    (ctx.job.buggy_source / "pkg" / "extra.py").unlink()  # an earlier export staged it: this one must not
    again = export_patch(ctx, commit)
    assert again.changed_file_count == 1 and b"extra.py" not in ctx.job.patch.read_bytes()
    assert (index.read_bytes(), index.stat().st_mtime_ns) == pristine
    assert sorted(p.name for p in ctx.job.baseline_git_dir.iterdir() if p.name.startswith("runner-")) == []


def test_gnu_patch_leftovers_are_kept_out_of_the_patch_and_counted(tmp_path: Path) -> None:
    """Issue 21, item 8: an agent that applies a diff with GNU ``patch`` leaves ``*.orig`` backups
    and ``*.rej`` rejected hunks; the fix goes into the patch, they do not."""
    ctx = _ctx(tmp_path)
    commit = baseline(ctx).baseline_commit
    source = ctx.job.buggy_source
    (source / "pkg" / "other.py").write_text("A = 1\n")
    hand_made = (
        "--- a/pkg/mod.py\n+++ b/pkg/mod.py\n@@ -1,2 +1,2 @@\n def f():\n-    return 1\n+    return 2\n"
        "--- a/pkg/other.py\n+++ b/pkg/other.py\n@@ -1 +1 @@\n-A = 9\n+A = 10\n"  # does not apply
    )
    done = subprocess.run(["patch", "-p1", "--backup"], input=hand_made, text=True, cwd=source, capture_output=True)
    assert done.returncode == 1, done.stdout  # one hunk rejected, as GNU patch says it
    assert {p.name for p in source.rglob("*.rej")} == {"other.py.rej"}
    assert {p.name for p in source.rglob("*.orig")} >= {"mod.py.orig"}
    result = export_patch(ctx, commit)
    text = ctx.job.patch.read_bytes()
    assert b"+    return 2" in text and b".rej" not in text and b".orig" not in text
    leftovers = len(list(source.rglob("*.rej"))) + len(list(source.rglob("*.orig")))
    assert result.artifact_files_left_out == leftovers


def test_a_patch_within_the_limit_is_hashed_as_written(tmp_path: Path) -> None:
    import hashlib

    ctx = _ctx(tmp_path)
    commit = baseline(ctx).baseline_commit
    (ctx.job.buggy_source / "data.bin").write_bytes(bytes(range(256)) * 4096)  # 1 MiB binary
    result = export_patch(ctx, commit)
    written = ctx.job.patch.read_bytes()
    assert result.patch_sha256 == hashlib.sha256(written).hexdigest() and result.patch_bytes == len(written)
    assert result.binary_change_count == 1


def test_an_empty_diff_is_still_empty_patch(tmp_path: Path) -> None:
    ctx = _ctx(tmp_path)
    commit = baseline(ctx).baseline_commit
    with pytest.raises(PhaseError) as caught:
        export_patch(ctx, commit)
    assert caught.value.reason == "empty_patch" and not ctx.job.patch.exists()
