"""A declared mirror (``--eval-probe HOST:PORT``): the evaluation's network probe tries what the
operator names instead of the package index, every endpoint must answer, and the public results
say which endpoints were tried.

The mirror is a real TCP listener in a container of this engine (the stub image's python), reached
from the evaluation's bridge network by its address; a port nobody listens on is the dead mirror.
``autogen_1174``'s profile says its test needs the network, so an unreached mirror makes the verdict
untrusted, exactly as an unreached package index does.
"""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path

import pytest

from tests.conftest import REPO, SESSION, TEST_SESSION, make_job_root, read_json, run_cli, stub_args

pytestmark = pytest.mark.docker

NEEDS_NETWORK_TAG = "autogen_1174"  # needs_network = true, scorable, the default entrypoint
MIRROR_PORT = 3141
DEAD_PORT = 9  # nothing listens there
_LISTEN = (
    "import socket\n"
    "s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
    f"s.bind(('0.0.0.0', {MIRROR_PORT})); s.listen(64)\n"
    "while True:\n"
    "    c, _ = s.accept(); c.close()\n"
)


@pytest.fixture
def mirror(docker_client, stub_image: str):
    """The address of a listener on this engine's default bridge: the operator's own package mirror."""
    container = docker_client.containers.run(
        stub_image, entrypoint=["python3", "-c", _LISTEN], detach=True, network_mode="bridge",
        name=f"mirror-{SESSION}", labels={"io.agentissue-runner.test": "mirror"},
    )
    try:
        deadline = time.monotonic() + 30
        address = ""
        while time.monotonic() < deadline:
            container.reload()
            address = container.attrs["NetworkSettings"].get("IPAddress") or ""
            if address:
                try:
                    socket.create_connection((address, MIRROR_PORT), timeout=1).close()
                    break
                except OSError:
                    pass
            time.sleep(0.2)
        else:
            pytest.fail(f"the mirror never listened: {container.logs()[-500:]!r}")
        yield address
    finally:
        container.remove(force=True)


def test_execute_probes_the_declared_mirror_and_records_it(
    tmp_path: Path, stub_image: str, mirror: str, no_leaked_containers: None
) -> None:
    reached = make_job_root(tmp_path / "reached")
    args = stub_args(reached, stub_image)
    args[args.index("stub_calc")] = NEEDS_NETWORK_TAG
    done = run_cli("--execute", *args, "--eval-network", "bridge", "--eval-probe", f"{mirror}:{MIRROR_PORT}")
    assert done.returncode == 0, done.stderr[-3000:]
    run = read_json(reached / "benchmark_run.compact.json")
    evaluation = run["evaluation"]
    assert evaluation["network_probed"] == [f"{mirror}:{MIRROR_PORT}"]  # the index was not asked
    assert (evaluation["network_probe"], evaluation["network_reachable"]) == ("reachable", True)
    assert evaluation["needs_network"] is True and run["verdict_untrusted"] is False
    assert run["official_task_score"]["resolved"] is True

    # A second endpoint that does not answer: every declared endpoint must be reached.
    dead = make_job_root(tmp_path / "dead")
    args = stub_args(dead, stub_image)
    args[args.index("stub_calc")] = NEEDS_NETWORK_TAG
    done = run_cli("--execute", *args, "--eval-network", "bridge", "--eval-probe", f"{mirror}:{MIRROR_PORT}",
                   "--eval-probe", f"{mirror}:{DEAD_PORT}")
    assert done.returncode == 0, done.stderr[-3000:]
    run = read_json(dead / "benchmark_run.compact.json")
    assert run["evaluation"]["network_probed"] == [f"{mirror}:{MIRROR_PORT}", f"{mirror}:{DEAD_PORT}"]
    assert (run["evaluation"]["network_probe"], run["evaluation"]["network_reachable"]) == ("unreachable", False)
    assert run["verdict_untrusted"] is True
    (probed,) = [json.loads(line) for line in done.stderr.splitlines() if '"event": "network_probed"' in line]
    assert probed["unreached"] == f"{mirror}:{DEAD_PORT}"


def test_evaluate_and_the_audit_take_the_declared_mirror(
    tmp_path: Path, stub_image: str, mirror: str, no_leaked_containers: None
) -> None:
    patches = tmp_path / "patches" / NEEDS_NETWORK_TAG
    patches.mkdir(parents=True)
    (patches / "golden.patch").write_bytes((REPO / "containers" / "stub" / "golden.patch").read_bytes())
    out = tmp_path / "out"
    done = run_cli("evaluate", "--patches-dir", str(tmp_path / "patches"), "--jobs-dir", str(out),
                   "--image", stub_image, "--eval-network", "bridge", "--eval-probe", f"{mirror}:{MIRROR_PORT}")
    assert done.returncode == 0, done.stderr[-3000:]
    (row,) = read_json(out / "eval-ledger.json")["rows"]
    assert row["network_probed"] == [f"{mirror}:{MIRROR_PORT}"] and row["network_reachable"] is True
    assert row["resolved"] is True and row["verdict_untrusted"] is False

    # The variable, as the flag: a dead mirror there makes the audit's verdict untrusted.
    audit = run_cli("audit", "--tag", NEEDS_NETWORK_TAG, "--image", stub_image, "--jobs-dir", str(tmp_path / "audit"),
                    "--eval-network", "bridge", env={"RUNNER_EVAL_PROBE": f"{mirror}:{DEAD_PORT}"})
    assert audit.returncode == 0, audit.stderr[-3000:]
    (audited,) = json.loads(audit.stdout)["rows"]
    assert audited["network_probed"] == [f"{mirror}:{DEAD_PORT}"] and audited["network_reachable"] is False
    assert audited["verdict_untrusted"] is True and audited["audit"] == "valid"


@pytest.mark.parametrize("bad", ["pypi.org", "user@mirror:3141", "mirror:0", "mirror:70000", "http://mirror:80",
                                 "mirror:80/simple"])
def test_a_bad_endpoint_is_refused_before_any_work(tmp_path: Path, stub_image: str, bad: str) -> None:
    job = make_job_root(tmp_path)
    done = run_cli("--execute", *stub_args(job, stub_image), "--eval-probe", bad)
    assert done.returncode == 2
    assert "--eval-probe: must be HOST:PORT" in done.stderr and bad not in done.stderr
    assert sorted(p.name for p in job.iterdir()) == ["context"]  # nothing made, nothing lost


# --- the probe once, not per task (issue 25) -----------------------------------------------

# Nine tags whose profiles need the network and keep the default commands (so the stub runs them).
PROBE_TAGS = ["autogen_1174", "autogen_1844", "autogen_4197", "autogen_4733", "camel_1145", "camel_1614",
              "chatdev_318", "crewai_1532", "haystack_9313"]


def _containers_created(docker_client, phase: str, since: float, until: float) -> int:
    filters = {"event": "create", "label": [f"io.agentissue-runner.session={TEST_SESSION}",
                                              f"io.agentissue-runner.phase={phase}"]}
    return sum(1 for _ in docker_client.events(since=since, until=until, filters=filters, decode=True))


def test_a_batch_on_one_image_probes_the_network_the_layout_and_codex_once(
    tmp_path: Path, stub_image: str, docker_client, no_leaked_containers: None
) -> None:
    """A batch of ten tasks on one image, two at a time: nine need the network, one needs none. One
    network probe container in all (the first answer is the host's for the others: remembered; the
    tag that needs none is not probed), one layout probe container, and codex asked its version and
    login once. The endpoint is the container's own port 9, refused at once: a definite answer."""
    jobs = tmp_path / "jobs"
    tags = [*PROBE_TAGS, "stub_calc"]
    for tag in tags:
        (jobs / tag / "context").mkdir(parents=True)
        (jobs / tag / "context" / "prompt.md").write_text("Fix calc.add.\nfake-codex-mode: fix\n")
    calls = tmp_path / "codex-calls"
    codex = tmp_path / "codex"  # the fake codex, counting how it is called
    codex.write_text(f'#!/bin/sh\necho "$*" >> {calls}\nexec {stub_args(jobs, stub_image)[-1]} "$@"\n')
    codex.chmod(0o755)
    args = ["--execute", "--jobs-dir", str(jobs), "--image", stub_image, "--codex-bin", str(codex),
            "--workers", "2", "--eval-network", "bridge", "--eval-probe", "127.0.0.1:9"]
    for tag in tags:
        args += ["--tag", tag]
    since = time.time() - 1
    done = run_cli(*args, env={"RUNNER_STATE_DIR": str(tmp_path / "state")})  # a host that has found out nothing yet
    until = time.time() + 1
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout)["resolved"] == len(tags)
    evaluations = {tag: read_json(jobs / tag / "benchmark_run.compact.json")["evaluation"] for tag in tags}
    assert evaluations["stub_calc"]["network_probe"] == "skipped_not_needed"
    assert evaluations["stub_calc"]["network_probed"] == []
    probed = [evaluations[tag] for tag in PROBE_TAGS]
    assert all((e["network_probe"], e["network_reachable"]) == ("unreachable", False) for e in probed)
    assert all(e["network_probed"] == ["127.0.0.1:9"] for e in probed)
    assert sorted(e["network_probe_remembered"] for e in probed) == [False] + [True] * (len(PROBE_TAGS) - 1)
    assert _containers_created(docker_client, "evaluate-network-probe", since, until) == 1
    assert _containers_created(docker_client, "precheck", since, until) == 1
    lines = calls.read_text().splitlines()
    assert sum(line == "--version" for line in lines) == 1
    assert sum(line.endswith("login status") for line in lines) == 1
    assert sum(line.startswith("exec") for line in lines) == len(tags)
