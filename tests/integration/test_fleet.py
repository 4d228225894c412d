"""The fleet against a real Redis and a real Docker Engine: workers as processes, the stub image, fake codex.

Two workers with separate jobs directories stand for two hosts. Every worker is
stopped (or killed) by the end of its test; every key of the test's namespace is
removed (``redis_namespace``) and no runner container may be left (``no_leaked_containers``).
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from runner.fleet.broker import make_broker, task_message
from runner.tasks.protocol import TaskMessage
from runner.tasks.spec import TaskSpec
from tests.conftest import RunningCli, log_events, read_json, run_cli, runner_containers
from tests.fleet_support import Fleet

pytestmark = [pytest.mark.docker, pytest.mark.redis, pytest.mark.usefixtures("no_leaked_containers")]

SLOW_TEST = "sleep 6; /usr/local/bin/run_test_entrypoint.sh test_patched"


def _events(worker: RunningCli, event: str) -> list[dict[str, Any]]:
    return log_events(list(worker.lines), event)


def test_two_hosts_route_by_queue_run_attempts_and_a_resubmission_adds_nothing(fleet: Fleet) -> None:
    fleet.prompt("t_fix", "Fix calc.add.\nfake-codex-mode: fix\n")
    fleet.prompt("t_wrong", "Fix calc.add.\nfake-codex-mode: wrong-fix\n")
    jobs_a, jobs_b = fleet.jobs("host-a"), fleet.jobs("host-b")
    host_a = fleet.worker("host-a", jobs_a, "--queue", "pool-a", "--slots", "2")
    host_b = fleet.worker("host-b", jobs_b, "--queue", "pool-b", "--slots", "2")
    started = time.monotonic()
    done = fleet.submit("suite1", "--tag", "t_fix", "--tag", "t_wrong", "--attempts", "2", "--queue", "pool-b")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["queued"] == 4
    other = fleet.submit("suite2", "--tag", "t_fix", "--queue", "pool-a")
    assert other.returncode == 0, other.stderr
    fleet.wait("every task done", lambda: [r["state"] for r in fleet.rows("suite1").values()] == ["done"] * 4
               and [r["state"] for r in fleet.rows("suite2").values()] == ["done"])
    wall = time.monotonic() - started

    rows = fleet.rows("suite1")
    assert set(rows) == {"t_fix/1", "t_fix/2", "t_wrong/1", "t_wrong/2"}
    assert {row["host"] for row in rows.values()} == {"host-b"}, "pool-b's tasks ran only on pool-b"
    assert fleet.rows("suite2")["t_fix/1"]["host"] == "host-a"
    for attempt in (1, 2):
        assert read_json(jobs_b / "suite1" / "t_fix" / f"attempt-{attempt}" / "benchmark_run.compact.json")[
            "official_task_score"]["resolved"] is True
    assert not (jobs_a / "suite1").exists() and not (jobs_b / "suite2").exists()

    status = fleet.status("--suite", "suite1")
    assert status.returncode == 0, status.stderr
    document = json.loads(status.stdout)["suites"][0]
    assert document["summary"]["resolved"] == 2 and document["summary"]["resolved_rate"] == 0.5
    assert document["summary"]["states"] == {"done": 4}
    for row in document["rows"]:
        assert {"tag", "attempt", "state", "host", "resolved"} <= set(row)
        assert row["resolved"] is (row["tag"] == "t_fix")
        assert row["input_tokens"] > 0 and row["phase_durations_seconds"]["codex"] >= 0
    assert str(fleet.tmp) not in status.stdout and "Fix calc.add" not in status.stdout
    assert document["tasks"] == [
        {"tag": "t_fix", "attempts": 2, "scored": 2, "resolved": 2, "pass_at": {"1": 1.0, "2": 1.0}},
        {"tag": "t_wrong", "attempts": 2, "scored": 2, "resolved": 0, "pass_at": {"1": 0.0, "2": 0.0}},
    ]
    assert document["suite_pass_at"]["mean_pass_at"] == {"1": 0.5, "2": 0.5}
    markdown = fleet.status("--suite", "suite1", "--format", "markdown").stdout
    assert "| task | t_fix | 1 | - | done | host-b | - | yes |" in markdown
    assert "| t_wrong | 2 | 2 | 0 | 0.000 | 0.000 |" in markdown

    again = fleet.submit("suite1", "--tag", "t_fix", "--tag", "t_wrong", "--attempts", "2", "--queue", "pool-b")
    assert json.loads(again.stdout)["queued"] == 0 and json.loads(again.stdout)["skipped_existing"] == 4
    time.sleep(2)
    assert len(_events(host_b, "task_started")) == 4, "nothing done is run again"
    for worker in (host_a, host_b):
        code, stdout, stderr = fleet.stop(worker)
        assert code == 0, stderr[-2000:]
    assert json.loads(stdout)["finished"] == {"done": 4}
    print(f"\nfleet figures: 5 stub tasks on two hosts (2 slots each) in {wall:.1f} s")


def test_a_worker_killed_mid_task_hands_it_to_another_and_the_ledger_has_it_once(fleet: Fleet) -> None:
    fleet.prompt("t_slow", "Fix calc.add.\nfake-codex-sleep: 8\nfake-codex-mode: fix\n")
    jobs_a, jobs_b = fleet.jobs("host-a"), fleet.jobs("host-b")
    host_a = fleet.worker("host-a", jobs_a)
    assert fleet.submit("s", "--tag", "t_slow").returncode == 0
    fleet.wait_state("s", "t_slow/1", "running", phase="codex")
    host_b = fleet.worker("host-b", jobs_b)
    killed_at = time.monotonic()
    host_a.process.kill()  # SIGKILL: no cleanup, no goodbye; its heartbeat stops
    row = fleet.wait_state("s", "t_slow/1", "done")
    took = time.monotonic() - killed_at
    assert row["host"] == "host-b" and row["resolved"] is True
    assert list(fleet.rows("s")) == ["t_slow/1"], "one row, one verdict"
    # The killed worker's run did not go on in the background: its child got SIGTERM and stopped
    # through its cleanup (in whichever phase it was by then), so it never reached a verdict.
    compact = jobs_a / "s" / "t_slow" / "attempt-1" / "benchmark_run.compact.json"
    deadline = time.monotonic() + 30
    while not compact.exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert read_json(compact)["first_failure_reason"] == "interrupted"
    assert len(_events(host_b, "task_started")) == 1
    code, _stdout, stderr = fleet.stop(host_b)
    assert code == 0, stderr[-2000:]
    print(f"\nfleet figures: SIGKILL to done on the other host in {took:.1f} s (heartbeat timeout 3 s, codex 8 s)")


def test_a_duplicate_delivery_while_running_does_not_start_a_second_run(fleet: Fleet) -> None:
    prompt = "Fix calc.add.\nfake-codex-sleep: 4\nfake-codex-mode: fix\n"
    fleet.prompt("t_dup", prompt)
    worker = fleet.worker("host-a", fleet.jobs("host-a"), "--slots", "2")
    assert fleet.submit("s", "--tag", "t_dup").returncode == 0
    fleet.wait_state("s", "t_dup/1", "running", phase="codex")
    # Dramatiq delivers at least once: the same task's message, delivered again while it runs.
    spec = TaskSpec(tag="t_dup", image=fleet.image)
    broker = make_broker(fleet.url, fleet.namespace)
    try:
        broker.enqueue(task_message(TaskMessage(suite="s", attempt=1, prompt=prompt, spec=spec), "runner"))
    finally:
        broker.close()
    fleet.wait("the duplicate deferred", lambda: bool(_events(worker, "duplicate_deferred")))
    fleet.wait_state("s", "t_dup/1", "done")
    fleet.wait("the duplicate dropped", lambda: bool(_events(worker, "duplicate_dropped")), timeout=30)
    assert len(_events(worker, "task_started")) == 1, "one Codex run only"
    assert fleet.rows("s")["t_dup/1"]["resolved"] is True
    code, _stdout, stderr = fleet.stop(worker)
    assert code == 0, stderr[-2000:]


def test_drain_finishes_running_tasks_a_second_sigterm_or_grace_interrupts_and_a_restart_resumes(
    fleet: Fleet, docker_client
) -> None:
    fleet.prompt("t_a", "Fix calc.add.\nfake-codex-mode: fix\n")
    fleet.prompt("t_b", "Fix calc.add.\nfake-codex-mode: fix\n")
    jobs = fleet.jobs("host-a")
    worker = fleet.worker("host-a", jobs)
    assert fleet.submit("s", "--tag", "t_a", "--tag", "t_b", "--test-cmd", SLOW_TEST).returncode == 0
    fleet.wait_state("s", "t_a/1", "running", phase="evaluate")
    code, stdout, stderr = fleet.stop(worker)  # first SIGTERM: drain
    assert code == 0, stderr[-2000:]
    rows = fleet.rows("s")
    assert rows["t_a/1"]["state"] == "done" and rows["t_a/1"]["resolved"] is True, "the running task finished"
    assert rows["t_b/1"]["state"] == "queued" and not (jobs / "s" / "t_b").exists(), "no task taken while draining"
    assert json.loads(stdout) == {"mode": "worker", "name": "host-a", "finished": {"done": 1}, "interrupted": False}

    # A second SIGTERM interrupts the running task through its cleanup; its message goes back.
    worker = fleet.worker("host-a", jobs)
    fleet.wait_state("s", "t_b/1", "running", phase="evaluate")
    job = jobs / "s" / "t_b" / "attempt-1"
    codex_marker = (job / "result-markers" / "codex.json").read_bytes()
    code, stdout, stderr = fleet.stop(worker, signals=2)
    assert code == 0 and json.loads(stdout)["interrupted"] is True, stderr[-2000:]
    row = fleet.rows("s")["t_b/1"]
    assert row["state"] == "queued" and row["host"] is None
    assert read_json(job / "result-markers" / "evaluate.json")["reason"] == "interrupted"
    assert runner_containers(docker_client) == []

    # --grace: one SIGTERM, and the task is interrupted after that many seconds.
    worker = fleet.worker("host-a", jobs, "--grace", "1")
    fleet.wait_state("s", "t_b/1", "running", phase="evaluate")
    code, stdout, stderr = fleet.stop(worker)
    assert code == 0 and json.loads(stdout)["interrupted"] is True, stderr[-2000:]
    assert fleet.rows("s")["t_b/1"]["state"] == "queued"

    # A restarted worker resumes from the markers: the finished codex phase is not run again.
    worker = fleet.worker("host-a", jobs)
    row = fleet.wait_state("s", "t_b/1", "done")
    assert row["resolved"] is True
    assert (job / "result-markers" / "codex.json").read_bytes() == codex_marker, "codex ran once: tokens spent once"
    code, _stdout, stderr = fleet.stop(worker)
    assert code == 0, stderr[-2000:]


def test_a_broken_host_takes_nothing_and_says_why(fleet: Fleet, tmp_path: Path) -> None:
    fleet.prompt("t_fix", "Fix calc.add.\nfake-codex-mode: fix\n")
    no_login = tmp_path / "no-login"
    no_login.mkdir()
    # A codex that is not logged in (`codex login status` fails) and no key variable: the worker's
    # check is the precheck's, so it refuses exactly what --execute's precheck would.
    logged_out = tmp_path / "logged-out-codex"
    logged_out.write_text("#!/bin/sh\n[ \"$1\" = --version ] && echo 'codex-cli 9.9.9' && exit 0\nexit 1\n")
    logged_out.chmod(0o755)
    broken = {
        "docker_daemon": fleet.worker("no-docker", fleet.jobs("no-docker"), env={"DOCKER_HOST": "unix:///nonexistent/docker.sock"}),
        "jobs_disk": fleet.worker("full-disk", fleet.jobs("full-disk"), "--min-free-gb", "1000000"),
        "codex_login": fleet.worker("no-login", fleet.jobs("no-login"), "--codex-bin", str(logged_out),
                                    env={"CODEX_HOME": str(no_login), "HOME": str(no_login)}),
    }
    for check, worker in broken.items():
        unhealthy = _events(worker, "host_unhealthy")
        assert unhealthy and check in unhealthy[0]["failing"], (check, "".join(worker.lines)[-1500:])
        assert _events(worker, "worker_started")[0]["taking_work"] is False
    assert fleet.submit("s", "--tag", "t_fix").returncode == 0
    time.sleep(4)
    assert fleet.rows("s")["t_fix/1"]["state"] == "queued", "no broken host took the task"
    healthy = fleet.worker("healthy", fleet.jobs("healthy"))
    row = fleet.wait_state("s", "t_fix/1", "done")
    assert row["host"] == "healthy" and row["resolved"] is True
    for worker in [*broken.values(), healthy]:
        assert not _events(worker, "task_started") or worker is healthy
        code, _stdout, stderr = fleet.stop(worker)
        assert code == 0, stderr[-2000:]


def test_an_infrastructure_failure_is_retried_a_bounded_number_of_times_an_agent_failure_never(fleet: Fleet) -> None:
    fleet.prompt("t_infra", "Fix calc.add.\nfake-codex-mode: fix\n")
    fleet.prompt("t_agent", "Fix calc.add.\nfake-codex-mode: fail\n")
    fleet.prompt("t_fix", "Fix calc.add.\nfake-codex-mode: fix\n")
    worker = fleet.worker("host-a", fleet.jobs("host-a"), "--slots", "2", "--max-infra-retries", "2",
                          "--retry-backoff", "0.2")
    # This host lacks the task's image: the run fails in precheck, an environment failure.
    assert fleet.submit("s", "--tag", "t_infra", image="agentissue-runner-absent:none").returncode == 0
    assert fleet.submit("s", "--tag", "t_agent", "--tag", "t_fix").returncode == 0
    fleet.wait("every task final", lambda: all(r["state"] in ("done", "failed") for r in fleet.rows("s").values())
               and len(fleet.rows("s")) == 3)
    rows = fleet.rows("s")
    assert rows["t_infra/1"]["state"] == "failed" and rows["t_infra/1"]["infra_failure"] is True
    assert rows["t_infra/1"]["retries"] == 2 and "precheck" in rows["t_infra/1"]["failure_label"]
    assert rows["t_agent/1"]["state"] == "done" and rows["t_agent/1"]["retries"] == 0
    assert rows["t_agent/1"]["failure_label"] == "failed_codex_codex_exit_nonzero"
    assert rows["t_agent/1"]["infra_failure"] is False and rows["t_agent/1"]["resolved"] is False
    starts = [event["task"] for event in _events(worker, "task_started")]
    assert starts.count("t_infra/1") == 3 and starts.count("t_agent/1") == 1
    summary = json.loads(fleet.status("--suite", "s").stdout)["suites"][0]["summary"]
    assert summary["resolved_rate"] == 0.3333 and summary["resolved_rate_without_infra"] == 0.5
    assert summary["infra_failures"] == 1
    code, _stdout, stderr = fleet.stop(worker)
    assert code == 0, stderr[-2000:]


def test_a_host_that_crashed_mid_task_sweeps_its_strays_on_restart_and_resumes(fleet: Fleet, docker_client) -> None:
    from runner.containment.descendants import descendants

    fleet.prompt("t_crash", "Fix calc.add.\nfake-codex-mode: fix\n")
    jobs = fleet.jobs("host-a")
    worker = fleet.worker("host-a", jobs)
    assert fleet.submit("s", "--tag", "t_crash", "--test-cmd", SLOW_TEST).returncode == 0
    fleet.wait_state("s", "t_crash/1", "running", phase="evaluate")
    time.sleep(1)
    assert len(runner_containers(docker_client)) == 1, "the evaluation container runs"
    job = jobs / "s" / "t_crash" / "attempt-1"
    codex_marker = (job / "result-markers" / "codex.json").read_bytes()
    # The host crashes: the task process and the worker die at once, with no cleanup at all.
    for pid in descendants(worker.process.pid):
        os.kill(pid, signal.SIGKILL)
    worker.process.kill()
    worker.process.wait(timeout=30)
    assert len(runner_containers(docker_client)) == 1, "the crash left its container behind"

    worker = fleet.worker("host-a", jobs)
    swept = _events(worker, "stray_containers_swept")
    assert swept and swept[0]["removed"] == 1
    row = fleet.wait_state("s", "t_crash/1", "done")
    assert row["resolved"] is True and row["host"] == "host-a"
    assert (job / "result-markers" / "codex.json").read_bytes() == codex_marker
    code, _stdout, stderr = fleet.stop(worker)
    assert code == 0, stderr[-2000:]


def test_bad_input_gives_a_clear_error_and_a_failed_row_never_a_crashed_worker(fleet: Fleet) -> None:
    unreachable = "redis://127.0.0.1:1/0"
    for command in (["status"], ["cancel", "--suite", "s"],
                    ["submit", "--suite", "s", "--tag", "t", "--prompts-dir", str(fleet.prompts)],
                    ["worker", "--jobs-dir", str(fleet.jobs("x"))]):
        done = run_cli(*command, "--broker", unreachable, timeout=60)
        assert done.returncode == 3, (command, done.stderr)
        assert "the broker at 127.0.0.1:1/0 does not answer" in done.stderr and "Traceback" not in done.stderr
    shell = fleet.submit("s;rm -rf x", "--tag", "t_fix")
    assert shell.returncode == 2 and "suite name must be" in shell.stderr
    assert not list(fleet.client.scan_iter(match=f"{fleet.namespace}:*")), "a refused submission writes nothing"

    fleet.prompt("t_fix", "Fix calc.add.\nfake-codex-mode: fix\n")
    missing = fleet.submit("s", "--tag", "t_noprompt", "--tag", "t_fix")
    assert missing.returncode == 2 and json.loads(missing.stdout)["refused"] == 1
    assert fleet.rows("s")["t_noprompt/1"]["state"] == "failed"
    assert fleet.rows("s")["t_noprompt/1"]["failure_label"] == "bad_input_prompt"

    # Malformed messages put on the queue by something other than submit.
    spec = {"tag": "t_x", "codex_timeout": 10, "eval_timeout": 10, "eval_network": "bridge", "source_dir": "/app",
            "apply_cmd": "true", "test_cmd": "true"}
    good = {"suite": "s", "attempt": 1, "prompt": "p", "spec": spec}
    from dramatiq import Message

    broker = make_broker(fleet.url, fleet.namespace)
    try:
        for number, payload in enumerate([
            {**good, "spec": {**spec, "tag": "t;rm -rf /"}},
            {**good, "spec": {**spec, "tag": "t_empty"}, "prompt": "   "},
            {**good, "suite": "x$(id)"},
            "not a task at all",
            {**good, "spec": {**spec, "tag": "t_badcmd", "source_dir": "relative/../path"}},
        ]):
            broker.enqueue(Message(queue_name="runner", actor_name="run_task", args=(payload,), kwargs={}, options={},
                                   message_id=f"00000000-0000-0000-0000-00000000000{number}"))
    finally:
        broker.close()
    worker = fleet.worker("host-a", fleet.jobs("host-a"))
    fleet.wait_state("s", "t_fix/1", "done")
    fleet.wait("the rejected rows", lambda: len(fleet.rows("_rejected")) == 2)
    # the messages are read in any order: wait for each one's row, not for the last one seen
    fleet.wait("the rows of the malformed messages",
               lambda: {"t_empty/1", "t_badcmd/1"} <= set(fleet.rows("s"))
               and any(key.startswith("invalid-") for key in fleet.rows("s")))
    rows = fleet.rows("s")
    assert rows["t_empty/1"]["state"] == "failed" and rows["t_empty/1"]["failure_label"] == "bad_message"
    assert "prompt" in rows["t_empty/1"]["error"]
    # a spec is checked whole when the message is read: the same rules as a single run's flags
    assert rows["t_badcmd/1"]["state"] == "failed" and rows["t_badcmd/1"]["failure_label"] == "bad_message"
    assert "spec.source_dir" in rows["t_badcmd/1"]["error"] and "relative" not in rows["t_badcmd/1"]["error"]
    invalid = [row for key, row in rows.items() if key.startswith("invalid-")]
    assert len(invalid) == 1 and "tag" in invalid[0]["error"] and "rm -rf" not in invalid[0]["error"]
    assert all(row["state"] == "failed" for row in fleet.rows("_rejected").values())
    assert worker.process.poll() is None, "the worker is still up"
    status = fleet.status()
    assert status.returncode == 0 and "$(id)" not in status.stdout
    unknown = fleet.status("--suite", "never-submitted")
    assert unknown.returncode == 2 and "no suite 'never-submitted'" in unknown.stderr  # not exit 0 with "0 tasks"
    code, _stdout, stderr = fleet.stop(worker)
    assert code == 0, stderr[-2000:]


def test_cancel_drops_queued_tasks_and_interrupts_running_ones(fleet: Fleet, docker_client) -> None:
    fleet.prompt("t_run", "Fix calc.add.\nfake-codex-sleep: 30\nfake-codex-mode: fix\n")
    fleet.prompt("t_wait", "Fix calc.add.\nfake-codex-mode: fix\n")
    worker = fleet.worker("host-a", fleet.jobs("host-a"))
    assert fleet.submit("s", "--tag", "t_run", "--tag", "t_wait").returncode == 0
    fleet.wait_state("s", "t_run/1", "running", phase="codex")
    done = run_cli("cancel", "--broker", fleet.url, "--namespace", fleet.namespace, "--suite", "s")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["cancelled_queued"] == 1 and report["dropped_messages"] == 1 and report["interrupting_running"] == 1
    fleet.wait_state("s", "t_run/1", "cancelled", timeout=30)
    assert fleet.rows("s")["t_wait/1"]["state"] == "cancelled"
    job = fleet.tmp / "host-a" / "s" / "t_run" / "attempt-1"
    assert read_json(job / "result-markers" / "codex.json")["reason"] == "interrupted"
    time.sleep(1.5)
    assert len(_events(worker, "task_started")) == 1, "the dropped task never started"
    assert runner_containers(docker_client) == []
    code, _stdout, stderr = fleet.stop(worker)
    assert code == 0, stderr[-2000:]


def test_worker_http_serves_health_metrics_and_the_status_page_and_report_reads_the_suite(
    fleet: Fleet, tmp_path: Path
) -> None:
    """Issue 13 wired to the daemon: ``worker --http`` and ``report --suite --broker``."""
    import socket
    import urllib.error
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    fleet.prompt("t_fix", "Fix calc.add. planted-prompt-text\nfake-codex-mode: fix\n")
    worker = fleet.worker("host-a", fleet.jobs("host-a"), "--http", f"127.0.0.1:{port}")
    assert fleet.submit("views", "--tag", "t_fix").returncode == 0
    fleet.wait_state("views", "t_fix/1", "done")
    base = f"http://127.0.0.1:{port}"

    with urllib.request.urlopen(f"{base}/healthz", timeout=10) as answer:
        health = json.loads(answer.read())
        assert answer.status == 200
    assert {check["name"] for check in health["checks"]} >= {"docker_daemon", "codex_login", "broker"}
    metrics = urllib.request.urlopen(f"{base}/metrics", timeout=10).read().decode()
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for family in text_string_to_metric_families(metrics) for s in family.samples}
    assert samples[("runner_tasks", (("state", "done"),))] >= 1
    assert samples[("runner_tasks_resolved_total", ())] >= 1
    page = urllib.request.urlopen(f"{base}/", timeout=10).read().decode()
    assert "t_fix" in page and "host-a" in page
    for private in ("planted-prompt-text", str(fleet.jobs("host-a")), fleet.url):
        assert private not in page and private not in metrics

    out = tmp_path / "report.md"
    report = run_cli("report", "--suite", "views", "--broker", fleet.url, "--out", str(out), "--format", "markdown",
                     env={"RUNNER_FLEET_NAMESPACE": fleet.namespace})
    assert report.returncode == 0, report.stderr
    text = out.read_text()
    assert "t_fix" in text and "planted-prompt-text" not in text

    code, _out, _err = fleet.stop(worker)
    assert code == 0
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(f"{base}/healthz", timeout=5)
