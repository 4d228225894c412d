"""The environment failing under a running task: the daemon stops, the disk fills, the layout lies.

The daemon's stop is provoked through a pass-through proxy to the real engine that stops
answering at a chosen request (``tests/docker_proxy.py``); the rerun, against the engine
itself, removes what the stopped daemon left and resumes.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.conftest import FAKE_CODEX, make_job_root, read_json, run_cli, stub_args
from tests.docker_proxy import CuttableDockerProxy

pytestmark = [pytest.mark.docker, pytest.mark.usefixtures("no_leaked_containers")]


@pytest.mark.parametrize(
    ("cut_on", "phase"),
    [(b"/images/", "precheck"), (b"/archive", "extract"), (b"/attach", "evaluate")],
)
def test_a_docker_daemon_stopping_mid_phase_is_a_bad_environment(
    tmp_path: Path, stub_image: str, cut_on: bytes, phase: str
) -> None:
    job = make_job_root(tmp_path)
    proxy = CuttableDockerProxy(cut_on)
    try:
        done = run_cli("--execute", *stub_args(job, stub_image), env={"DOCKER_HOST": proxy.docker_host})
    finally:
        proxy.close()
    assert proxy.cut.is_set(), "the daemon was never stopped"
    assert done.returncode == 3, done.stderr[-2000:]
    assert "Docker daemon does not answer" in done.stderr and "a file operation failed" not in done.stderr
    marker = read_json(job / "result-markers" / f"{phase}.json")
    assert marker["status"] == "failed"
    assert marker["reason"] == ("precheck_docker_daemon" if phase == "precheck" else "docker_unavailable")
    assert read_json(job / "benchmark_run.compact.json")["first_failed_phase"] == phase
    # The daemon is back: the rerun removes what the stopped one left and completes.
    again = run_cli("--execute", *stub_args(job, stub_image))
    assert again.returncode == 0, again.stderr[-2000:]
    assert read_json(job / "benchmark_run.compact.json")["official_task_score"]["resolved"] is True


def test_a_full_disk_during_extract_is_job_root_unwritable(tmp_path: Path, hostile_image: str) -> None:
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(disk)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({mounted.stderr.decode().strip()}); needs root")
    try:
        job = make_job_root(disk)
        done = run_cli("--execute", "--job-root", str(job), "--tag", "big", "--image", hostile_image,
                       "--codex-bin", str(FAKE_CODEX), "--source-dir", "/app/big")
        assert done.returncode == 3, done.stderr[-2000:]
        assert "cannot be written" in done.stderr and "No space left on device" in done.stderr
        assert "unsafe" not in done.stderr
        assert read_json(job / "result-markers" / "extract.json")["reason"] == "job_root_unwritable"
        assert not (job / "buggy-source").exists() and not list(job.glob(".buggy-source.partial*"))
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)


def test_a_source_dir_that_is_a_symlink_in_the_image_is_named(job_root: Path, stub_image: str) -> None:
    # Debian's merged /usr: /bin is a link to usr/bin in the image.
    done = run_cli("--execute", *stub_args(job_root, stub_image, "--source-dir", "/bin"))
    assert done.returncode == 1, done.stderr
    assert "--source-dir /bin is a symbolic link in the image" in done.stderr
    assert "holds no files" not in done.stderr
    assert read_json(job_root / "result-markers" / "extract.json")["reason"] == "source_dir_is_symlink"
