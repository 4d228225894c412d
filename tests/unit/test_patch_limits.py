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
from runner.phases.patch import PATCH_MAX_BYTES, export_patch
from runner.settings import load_settings
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
import resource, sys
from pathlib import Path
sys.path.insert(0, sys.argv[2])
from tests.unit.test_patch_limits import _ctx
from runner.errors import PhaseError
from runner.phases.baseline import baseline
from runner.phases.patch import export_patch
ctx = _ctx(Path(sys.argv[1]))
commit = baseline(ctx).baseline_commit
with open(ctx.job.buggy_source / "blob.bin", "wb") as out:
    for _ in range(int(sys.argv[3])):
        out.write(__import__("os").urandom(1 << 20))
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, end=" ")
try:
    export_patch(ctx, commit)
    print("exported", end=" ")
except PhaseError as e:
    print(e.reason, end=" ")
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
"""


def test_an_agents_huge_file_is_refused_without_holding_it_in_memory(tmp_path: Path) -> None:
    """A 200 MB file: the patch phase fails ``patch_too_large``, the runner's peak RSS stays small."""
    megabytes = 200
    assert megabytes * 1024 * 1024 > PATCH_MAX_BYTES
    done = subprocess.run(
        [sys.executable, "-c", _MEASURE, str(tmp_path), str(REPO), str(megabytes)],
        capture_output=True, text=True, timeout=600, cwd=REPO,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    before_kib, outcome, peak_kib = done.stdout.split()
    assert outcome == "patch_too_large"
    # Measured against the process's own peak before the export (imports, baseline): the export
    # may add far less than the 200 MB file (the old code added several times its size).
    grown = int(peak_kib) - int(before_kib)
    assert grown < 100 * 1024, f"the export added {grown // 1024} MiB to the runner's peak"
    job = tmp_path / "job"
    assert not (job / "Patches" / "demo_1" / "attempt.patch").exists()
    assert not list((job / "Patches").rglob("*.tmp")) if (job / "Patches").exists() else True


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
