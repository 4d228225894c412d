"""/healthz, /metrics and / against a running views server fed from a real batch's files."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from reducers.models import Phase
from runner.views.model import TIMED_PHASES, TOKEN_KINDS, HealthReport, HostCheck, SnapshotSource, TaskRow, TaskState
from runner.views.public import WITHHELD
from runner.views.server import OUTCOMES, BackgroundServer
from runner.views.sources import rows_from_jobs_dir
from tests.views_support import KINDS, SECRET_NAME, SECRET_VALUE, assert_nothing_private, make_batch

HEALTHY = HealthReport(
    checks=[HostCheck(name="docker", ok=True, detail="engine answers"), HostCheck(name="disk", ok=True),
            HostCheck(name="codex_login", ok=True), HostCheck(name="broker", ok=True)],
    taking_work=True, slots_busy=1, slots_total=2,
)


def get(url: str) -> tuple[int, str, str]:
    try:
        with urllib.request.urlopen(url, timeout=30) as response:
            return response.status, response.headers["Content-Type"], response.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.headers["Content-Type"], e.read().decode()


@pytest.fixture
def served(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[BackgroundServer, SnapshotSource, Path]]:
    monkeypatch.setenv(SECRET_NAME, SECRET_VALUE)
    batch = make_batch(tmp_path / "jobs", {f"t{i}_{kind}": kind for i, kind in enumerate(KINDS)})
    rows = rows_from_jobs_dir(batch.jobs_dir) + [
        TaskRow(suite="local", tag="t5_running", attempt=1, state=TaskState.RUNNING, host="host-b", phase=Phase.CODEX,
                phase_seconds={"prepare": 0.1, "extract": 4.0}),
        TaskRow(suite="local", tag="t6_queued", attempt=1, state=TaskState.QUEUED),
    ]
    source = SnapshotSource(HEALTHY, rows)
    with BackgroundServer(source, "127.0.0.1", 0, private_texts=[str(batch.jobs_dir)], title="suite local") as views:
        yield views, source, batch.jobs_dir


def test_healthz_is_200_when_taking_work_and_503_with_the_failing_checks_otherwise(served, tmp_path: Path) -> None:
    views, source, _ = served
    status, content_type, body = get(views.url + "/healthz")
    assert (status, content_type) == (200, "application/json")
    health = json.loads(body)
    assert health["status"] == "ok" and health["failing"] == [] and health["slots_free"] == 1

    source.set_health(HEALTHY.model_copy(update={"draining": True}))
    status, _, body = get(views.url + "/healthz")
    assert status == 503 and json.loads(body)["status"] == "draining"

    broken = HEALTHY.model_copy(update={"taking_work": False, "checks": [
        HostCheck(name="docker", ok=True), HostCheck(name="disk", ok=False, detail=f"1 GB free under {tmp_path}"),
        HostCheck(name="codex_login", ok=False, detail="codex login status: not logged in"),
    ]})
    source.set_health(broken)
    status, _, body = get(views.url + "/healthz")
    health = json.loads(body)
    assert status == 503 and health["status"] == "not_taking_work"
    assert health["failing"] == ["disk", "codex_login"]
    assert [check["detail"] for check in health["checks"]][1:] == [WITHHELD, "codex login status: not logged in"]
    assert str(tmp_path) not in body


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def test_metrics_parse_and_count_the_suite(served) -> None:
    views, _, _ = served
    status, content_type, text = get(views.url + "/metrics")
    assert status == 200 and content_type.startswith("text/plain")
    samples = _samples(text)
    state = {s.value: samples[("runner_tasks", (("state", s.value),))] for s in TaskState}
    assert state == {"queued": 1, "running": 1, "done": 3, "failed": 2, "cancelled": 0, "skipped_budget": 0, "unreadable": 0}
    assert samples[("runner_slots", (("state", "busy"),))] == 1 and samples[("runner_slots", (("state", "free"),))] == 1
    assert samples[("runner_taking_work", ())] == 1 and samples[("runner_draining", ())] == 0
    assert samples[("runner_tasks_resolved_total", ())] == 1
    assert samples[("runner_tasks_infra_failed_total", ())] == 2
    # the unresolved task and the agent's timed-out one: both scored, both unresolved
    assert samples[("runner_tasks_finished_total", (("outcome", "unresolved"),))] == 2
    assert samples[("runner_codex_tokens_total", (("kind", "input"),))] == 123000
    assert samples[("runner_codex_tokens_total", (("kind", "cached_input"),))] == 90000
    # codex ran (and was timed) in the resolved, the unresolved and the timed-out task: not in the running one
    assert samples[("runner_phase_duration_seconds_count", (("phase", "codex"),))] == 3
    assert samples[("runner_phase_duration_seconds_sum", (("phase", "codex"),))] == pytest.approx(95 + 95 + 600)
    assert samples[("runner_phase_duration_seconds_bucket", (("le", "120.0"), ("phase", "codex")))] == 2

    # a second scrape counts nothing twice
    again = _samples(get(views.url + "/metrics")[2])
    assert again[("runner_tasks_resolved_total", ())] == 1
    assert again[("runner_phase_duration_seconds_count", (("phase", "codex"),))] == 3


def test_metric_labels_come_only_from_closed_sets(served) -> None:
    views, _, _ = served
    allowed = {
        "state": {s.value for s in TaskState} | {"busy", "free"},
        "phase": set(TIMED_PHASES),
        "kind": set(TOKEN_KINDS),
        "outcome": set(OUTCOMES),
        "check": {"docker", "disk", "codex_login", "broker"},
    }
    families = list(text_string_to_metric_families(get(views.url + "/metrics")[2]))
    assert {f.name for f in families if not f.name.endswith("_created")} == {
        "runner_tasks", "runner_slots", "runner_taking_work", "runner_draining", "runner_host_check_ok",
        "runner_phase_duration_seconds", "runner_tasks_finished", "runner_tasks_resolved",
        "runner_tasks_infra_failed", "runner_codex_tokens",
    }
    for family in families:
        for sample in family.samples:
            for name, value in sample.labels.items():
                if name != "le":
                    assert value in allowed[name], (sample.name, name, value)


def test_status_page_lists_every_task_and_nothing_private(served) -> None:
    views, _, jobs_dir = served
    status, content_type, html = get(views.url + "/")
    assert status == 200 and content_type == "text/html; charset=utf-8"
    for tag in [f"t{i}_{kind}" for i, kind in enumerate(KINDS)] + ["t5_running", "t6_queued"]:
        assert f"<td>{tag}</td>" in html
    assert '<meta http-equiv="refresh"' in html and "host-b" in html
    assert_nothing_private(html, str(jobs_dir))
    assert_nothing_private(get(views.url + "/metrics")[2], str(jobs_dir))
    assert get(views.url + "/nothing-here")[0] == 404


def test_a_broken_source_answers_500_and_the_server_stays_up(served) -> None:
    views, source, _ = served

    def explode() -> list[TaskRow]:
        raise RuntimeError("/home/op/private path in a message")

    source.rows = explode  # type: ignore[method-assign]
    status, _, body = get(views.url + "/")
    assert status == 500 and "/home/op" not in body and "RuntimeError" in body
    assert get(views.url + "/healthz")[0] == 200
