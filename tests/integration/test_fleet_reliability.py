"""The fleet when things go wrong around a task: a broker that restarts empty, a host whose Docker dies,
two workers on one jobs dir, a worker killed during evaluate, a cancel during patch, two submits at once.

Real processes on a real Redis (a server of the test's own where it is killed and restarted) and a
real Docker Engine; the fake codex. Each test leaves no container and no worker behind.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from runner.fleet.broker import Keys
from runner.fleet.ledger import SuiteLedger
from tests.conftest import RunningCli, log_events, read_json, run_cli, runner_containers
from tests.docker_proxy import CuttableDockerProxy
from tests.fleet_support import Fleet
from tests.ports import free_port

pytestmark = [pytest.mark.docker, pytest.mark.redis, pytest.mark.usefixtures("no_leaked_containers")]

SECRET_PROMPT = "Fix calc.add. prompt-sentinel-7f3a9c\n"


class OwnRedis:
    """A redis-server of the test's own, with nothing on disk: killed, it comes back empty."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        binary = shutil.which("redis-server")
        assert binary, ".ci/run installs Debian's redis-server"
        self.process = subprocess.Popen([binary, "--bind", "127.0.0.1", "--port", str(self.port), "--save", "",
                                         "--appendonly", "no"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                redis.Redis.from_url(self.url, socket_timeout=1).ping()
                return
            except redis.RedisError:
                time.sleep(0.05)
        raise AssertionError("the test's redis-server did not answer")

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=10)


@pytest.fixture
def own_redis(tmp_path: Path, stub_image: str) -> Iterator[Fleet]:
    server = OwnRedis(free_port())
    server.start()
    fleet = Fleet(server.url, "runner-test-restart", tmp_path, stub_image)
    fleet.server = server  # type: ignore[attr-defined]
    yield fleet
    for worker in fleet.workers:
        if worker.process.poll() is None:
            worker.process.kill()
            worker.process.wait(timeout=30)
    time.sleep(1)
    server.kill()


def test_a_broker_that_restarts_empty_costs_time_never_a_verdict(own_redis: Fleet) -> None:
    fleet, server = own_redis, own_redis.server  # type: ignore[attr-defined]
    fleet.prompt("t_slow", SECRET_PROMPT + "fake-codex-sleep: 6\nfake-codex-mode: fix\n")
    jobs = fleet.jobs("host-a")
    worker = fleet.worker("host-a", jobs)
    assert fleet.submit("s", "--tag", "t_slow").returncode == 0
    fleet.wait_state("s", "t_slow/1", "running", phase="codex")
    server.kill()  # Redis dies while the task's codex runs
    compact = jobs / "s" / "t_slow" / "attempt-1" / "benchmark_run.compact.json"
    deadline = time.monotonic() + 120
    while not compact.exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert read_json(compact)["official_task_score"]["resolved"] is True  # the task ended, resolved, on disk
    time.sleep(2)  # the worker has tried (and failed) to write its row
    kept = list((jobs / "s" / ".worker-outbox").glob("*.json"))
    assert len(kept) == 1, "the verdict is kept on the host while the broker is gone"
    server.start()  # back, and empty
    fleet.client = redis.Redis.from_url(server.url)
    row = fleet.wait_state("s", "t_slow/1", "done", timeout=60)
    assert row["resolved"] is True and row["host"] == "host-a"
    assert not list((jobs / "s" / ".worker-outbox").glob("*.json")), "delivered, then no longer kept"
    again = fleet.submit("s", "--tag", "t_slow")  # the resubmission finds the verdict: nothing to redo
    assert json.loads(again.stdout)["queued"] == 0 and json.loads(again.stdout)["skipped_existing"] == 1
    assert worker.process.poll() is None, "the worker outlived its broker"
    code, _stdout, stderr = fleet.stop(worker)
    assert code == 0, stderr[-2000:]
    assert "prompt-sentinel-7f3a9c" not in stderr + "".join(worker.lines), "the prompt reached a log"
    assert log_events(list(worker.lines), "broker_unreachable") and log_events(list(worker.lines), "outbox_delivered")


def test_a_rerun_task_keeps_its_first_runs_log_lines(fleet: Fleet) -> None:
    fleet.prompt("t_twice", "Fix calc.add.\nfake-codex-mode: fail\n")
    jobs = fleet.jobs("host-a")
    worker = fleet.worker("host-a", jobs)
    assert fleet.submit("s", "--tag", "t_twice").returncode == 0
    fleet.wait_state("s", "t_twice/1", "done")
    cancel = run_cli("cancel", "--broker", fleet.url, "--namespace", fleet.namespace, "--suite", "s")
    assert cancel.returncode == 0
    fleet.client.hdel(Keys(fleet.namespace).ledger("s"), "t_twice/1")  # as an operator starting it over
    assert fleet.submit("s", "--tag", "t_twice").returncode == 0
    fleet.wait("the second run", lambda: len(log_events(list(worker.lines), "task_finished")) == 2)
    lines = (jobs / "s" / ".worker-logs" / "t_twice.attempt-1.log").read_text().splitlines()
    assert len(log_events(lines, "task_process_started")) == 2, "one separator per run"
    assert len(log_events(lines, "codex_started")) == 2, "the first run's lines are still there"
    code, _stdout, stderr = fleet.stop(worker)
    assert code == 0, stderr[-2000:]


def test_a_host_whose_docker_dies_mid_task_fails_it_as_infrastructure_and_another_host_finishes_it(
    fleet: Fleet, docker_client
) -> None:
    fleet.prompt("t_move", "Fix calc.add.\nfake-codex-mode: fix\n")
    proxy = CuttableDockerProxy(b"/attach")  # the evaluation's attach: the daemon 'stops' mid-task
    try:
        broken = fleet.worker("host-a", fleet.jobs("host-a"), "--retry-backoff", "0.5",
                              env={"DOCKER_HOST": proxy.docker_host})
        assert fleet.submit("s", "--tag", "t_move").returncode == 0
        fleet.wait("host-a's infrastructure failure",
                   lambda: bool(log_events(list(broken.lines), "task_infra_failure")), timeout=120)
        fleet.wait("host-a unhealthy", lambda: any("docker_daemon" in e.get("failing", [])
                                                   for e in log_events(list(broken.lines), "host_unhealthy")))
        # host-b's start sweeps the evaluation container host-a's task could no longer remove
        healthy = fleet.worker("host-b", fleet.jobs("host-b"))
        row = fleet.wait_state("s", "t_move/1", "done", timeout=120)
        assert row["host"] == "host-b" and row["resolved"] is True and row["retries"] >= 1
        first = log_events(list(broken.lines), "task_infra_failure")[0]
        assert "docker" in first["failure_label"]
        for worker in (broken, healthy):
            code, _stdout, stderr = fleet.stop(worker)
            assert code == 0, stderr[-2000:]
    finally:
        proxy.close()


def test_two_workers_on_one_jobs_dir_run_each_task_once(fleet: Fleet) -> None:
    tags = [f"t_{i}" for i in range(4)]
    for tag in tags:
        fleet.prompt(tag, "Fix calc.add.\nfake-codex-sleep: 1\nfake-codex-mode: fix\n")
    shared = fleet.jobs("shared")
    workers = [fleet.worker(name, shared, "--slots", "2") for name in ("host-a", "host-b")]
    assert fleet.submit("s", *[arg for tag in tags for arg in ("--tag", tag)]).returncode == 0
    fleet.wait("every task done", lambda: [r["state"] for r in fleet.rows("s").values()] == ["done"] * 4)
    started = [event["task"] for worker in workers for event in log_events(list(worker.lines), "task_started")]
    assert sorted(started) == sorted(f"{tag}/1" for tag in tags), "each task started once, on one host"
    for tag in tags:
        assert read_json(shared / "s" / tag / "attempt-1" / "benchmark_run.compact.json")["official_task_score"]["resolved"]
    for worker in workers:
        code, _stdout, stderr = fleet.stop(worker)
        assert code == 0, stderr[-2000:]


def test_a_worker_killed_during_evaluate_hands_the_task_over_and_leaves_no_container(fleet: Fleet, docker_client) -> None:
    fleet.prompt("t_eval", "Fix calc.add.\nfake-codex-mode: fix\n")
    slow_test = "sleep 8; /usr/local/bin/run_test_entrypoint.sh test_patched"
    host_a = fleet.worker("host-a", fleet.jobs("host-a"))
    assert fleet.submit("s", "--tag", "t_eval", "--test-cmd", slow_test).returncode == 0
    fleet.wait_state("s", "t_eval/1", "running", phase="evaluate")
    time.sleep(1)  # the evaluation container runs
    host_a.process.kill()
    host_b = fleet.worker("host-b", fleet.jobs("host-b"))
    row = fleet.wait_state("s", "t_eval/1", "done", timeout=180)
    assert row["host"] == "host-b" and row["resolved"] is True
    code, _stdout, stderr = fleet.stop(host_b)
    assert code == 0, stderr[-2000:]
    deadline = time.monotonic() + 30  # the killed worker's task ends through its cleanup (parent-death signal)
    while runner_containers(docker_client) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert runner_containers(docker_client) == []


def test_cancel_during_patch_ends_the_task_cancelled(fleet: Fleet) -> None:
    fleet.prompt("t_patch", "Fix calc.add.\nfake-codex-mode: fix\nfake-codex-files: 30000\n")
    worker = fleet.worker("host-a", fleet.jobs("host-a"))
    assert fleet.submit("s", "--tag", "t_patch").returncode == 0
    fleet.wait_state("s", "t_patch/1", "running", phase="patch", timeout=180)
    done = run_cli("cancel", "--broker", fleet.url, "--namespace", fleet.namespace, "--suite", "s")
    assert done.returncode == 0 and json.loads(done.stdout)["interrupting_running"] == 1
    row = fleet.wait_state("s", "t_patch/1", "cancelled", timeout=120)
    assert row["resolved"] is None
    job = fleet.tmp / "host-a" / "s" / "t_patch" / "attempt-1"
    assert read_json(job / "result-markers" / "patch.json")["reason"] == "interrupted"
    code, _stdout, stderr = fleet.stop(worker)
    assert code == 0, stderr[-2000:]


def test_the_same_suite_submitted_twice_at_once_queues_each_task_once(fleet: Fleet) -> None:
    tags = [f"t_{i}" for i in range(20)]
    for tag in tags:
        fleet.prompt(tag, "Fix calc.add.\n")
    args = ["submit", "--broker", fleet.url, "--namespace", fleet.namespace, "--suite", "twice",
            "--prompts-dir", str(fleet.prompts), "--image", fleet.image, "--attempts", "2",
            *[arg for tag in tags for arg in ("--tag", tag)]]
    both = [RunningCli(*args) for _ in range(2)]
    results = [cli.finish(timeout=120) for cli in both]
    assert all(code == 0 for code, _out, _err in results), [err[-500:] for _c, _o, err in results]
    queued = sum(json.loads(out)["queued"] for _code, out, _err in results)
    assert queued == 40, "each of the 40 tasks queued by exactly one of the two submits"
    keys = Keys(fleet.namespace)
    assert fleet.client.llen(keys.queue("runner")) == 40
    assert len(SuiteLedger(fleet.client, keys, "twice").rows()) == 40
