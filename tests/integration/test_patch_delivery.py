"""How the patch reaches the evaluation container, on a real engine: on the container's stdin
(the attach that reads its output, as ``docker run -i``), whole and byte for byte, or, where the
image's user cannot make its path, by ``put_archive`` in a fresh container. The engine's own
events say which way was taken: ``put_archive`` is an ``extract-to-dir`` event."""

from __future__ import annotations

import hashlib
import io
import json
import os
import time
from pathlib import Path

import pytest

from runner.docker_utils import LABEL_RUN, LABEL_SESSION, runner_labels, stdin_attach_supported
from runner.phases.evaluate import EvalSinks, run_apply_and_test
from tests.conftest import REPO, TEST_SESSION, make_job_root, read_json, run_cli, stub_args

pytestmark = [pytest.mark.docker, pytest.mark.usefixtures("no_leaked_containers")]

GOLDEN = (REPO / "containers" / "stub" / "golden.patch").read_bytes()
STUB_APPLY = "/usr/local/bin/run_test_entrypoint.sh apply_patch /patches/attempt.patch"
STUB_TEST = "/usr/local/bin/run_test_entrypoint.sh test_patched"


def _events(docker_client, action: str, since: float, run_id: str) -> int:
    """How many ``action`` events the engine saw for the containers of ``run_id``."""
    filters = {"event": action, "label": [f"{LABEL_SESSION}={TEST_SESSION}", f"{LABEL_RUN}={run_id}"]}
    return sum(1 for _ in docker_client.events(since=since, until=time.time() + 1, filters=filters, decode=True))


def _run(docker_client, image: str, patch: Path | bytes, apply_cmd: str, test_cmd: str, run_id: str):
    labels = runner_labels(job_id="delivery-test", run_id=run_id, phase="evaluate")
    sinks = {name: io.BytesIO() for name in ("apply", "test", "apply_err", "test_err")}
    image_id = docker_client.images.get(image).id
    run = run_apply_and_test(docker_client, image_id=image_id, labels=labels, patch=patch, apply_cmd=apply_cmd,
                             test_cmd=test_cmd, network="none", timeout=60,
                             sinks=EvalSinks(sinks["apply"], sinks["test"], sinks["apply_err"], sinks["test_err"]))
    return run, {name: sink.getvalue().decode(errors="replace") for name, sink in sinks.items()}


@pytest.mark.parametrize("as_file", [True, False], ids=["a patch file", "a patch in memory"])
def test_the_patch_arrives_whole_on_stdin_and_apply_and_test_read_no_stdin(
    docker_client, stub_image: str, tmp_path: Path, as_file: bool
) -> None:
    """Over 64 KiB (more than a pipe holds), with NULs and Docker's detach keys (ctrl-p, ctrl-q),
    which a TTY attach would act on: the bytes in the container are the runner's, and apply and
    the test see /dev/null on their stdin, as when nothing was attached."""
    assert stdin_attach_supported(docker_client)
    data = os.urandom(300 * 1024) + b"\x10\x11\x00\x03\x04" + os.urandom(999)
    patch: Path | bytes = data
    if as_file:
        patch = tmp_path / "attempt.patch"
        patch.write_bytes(data)
    since = time.time() - 1
    run, logs = _run(docker_client, stub_image, patch,
                     "sha256sum /patches/attempt.patch; wc -c < /patches/attempt.patch; readlink /proc/self/fd/0",
                     "readlink /proc/self/fd/0; echo FIX CONFIRMED", "stdin-" + tmp_path.name)
    assert (run.container_exit_code, run.apply_exit_code, run.test_exit_code) == (0, 0, 0), logs
    digest, size, apply_stdin = logs["apply"].split()[0], logs["apply"].split()[2], logs["apply"].split()[3]
    assert (digest, int(size)) == (hashlib.sha256(data).hexdigest(), len(data))
    assert apply_stdin == "/dev/null"
    assert logs["test"].split()[0] == "/dev/null" and "FIX CONFIRMED" in logs["test"]
    assert logs["apply_err"] == logs["test_err"] == ""  # the gate's own steps print nothing
    assert _events(docker_client, "extract-to-dir", since, "stdin-" + tmp_path.name) == 0  # no put_archive
    assert _events(docker_client, "create", since, "stdin-" + tmp_path.name) == 1


def test_the_stub_fix_resolves_through_stdin_as_it_did_through_put_archive(docker_client, stub_image: str) -> None:
    run, logs = _run(docker_client, stub_image, GOLDEN, STUB_APPLY, STUB_TEST, "stub-fix")
    assert (run.container_exit_code, run.apply_exit_code, run.test_exit_code) == (0, 0, 0), logs
    assert "Patch applied successfully" in logs["apply"] and "FIX CONFIRMED" in logs["test"]


def test_an_image_whose_user_cannot_make_the_patch_path_gets_it_by_put_archive(
    docker_client, stub_image: str, variant_image, tmp_path: Path
) -> None:
    """The gate, as nobody, cannot create /patches: it gives up before apply, silently, and the
    runner evaluates again in a fresh container with the patch put in by ``put_archive``. The
    verdict is the fix's, and nothing of the first try is in the records."""
    image = variant_image("non_root")
    since = time.time() - 1
    run, logs = _run(docker_client, image, GOLDEN, STUB_APPLY, STUB_TEST, "non-root")
    assert (run.container_exit_code, run.apply_exit_code, run.test_exit_code) == (0, 0, 0), logs
    assert logs["apply"].startswith("Applying patch") and "FIX CONFIRMED" in logs["test"]
    assert "mkdir" not in logs["apply_err"] + logs["test_err"]
    assert _events(docker_client, "create", since, "non-root") == 2
    assert _events(docker_client, "extract-to-dir", since, "non-root") == 1


def test_execute_on_a_non_root_image_resolves(tmp_path: Path, variant_image) -> None:
    """The whole run: the fallback is the evaluate phase's, and the run says it once, as a warning."""
    job = make_job_root(tmp_path)
    done = run_cli("--execute", *stub_args(job, variant_image("non_root")))
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout)["resolved"] is True
    assert read_json(job / "benchmark_run.compact.json")["apply_exit_code"] == 0
    warnings = [json.loads(line)["event"] for line in done.stderr.splitlines()
                if line.startswith("{") and json.loads(line).get("level") == "warning"]
    assert warnings == ["patch_not_taken_on_stdin"]
