"""The views' models, numbers and guard, on rows read back from a real batch's files."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from reducers.guard import check_public
from runner.views.document import suite_document
from runner.views.model import HealthReport, HostCheck, SnapshotSource, TaskRow, TaskState
from runner.views.public import WITHHELD, view_private_texts
from runner.errors import BadInputError
from runner.views.server import SuiteMetrics, http_address
from runner.views.sources import rows_from_jobs_dir
from runner.views.stats import summarize
from tests.views_support import KINDS, SECRET_NAME, SECRET_VALUE, make_batch


@pytest.fixture
def batch_rows(tmp_path: Path) -> list[TaskRow]:
    batch = make_batch(tmp_path / "jobs", {f"t{i}_{kind}": kind for i, kind in enumerate(KINDS)})
    return rows_from_jobs_dir(batch.jobs_dir)


def test_rows_from_a_batch_carry_state_verdict_label_durations_and_tokens(batch_rows: list[TaskRow]) -> None:
    by_tag = {row.tag: row for row in batch_rows}
    ok = by_tag["t0_resolved"]
    assert (ok.state, ok.resolved, ok.infra_failure, ok.failure_label) == (TaskState.DONE, True, False, None)
    assert ok.phase_seconds["codex"] == 95.0 and ok.tokens == {"input": 41000, "cached_input": 30000, "output": 2300}
    assert by_tag["t1_unresolved"].failure_label == "unresolved_single_tag_eval_compact_result"
    agent = by_tag["t2_agent_failure"]
    # the agent's failure is scored, as every ledger scores it (reducers.outcome): done, unresolved
    assert (agent.state, agent.phase.value, agent.infra_failure, agent.resolved) == (TaskState.DONE, "codex", False, False)
    infra = by_tag["t3_infra_failure"]
    assert (infra.failure_label, infra.infra_failure) == ("failed_extract_docker_error", True)
    assert by_tag["t4_bad_environment"].failure_label == "bad_environment"


def test_rates_with_and_without_infrastructure_failures(batch_rows: list[TaskRow]) -> None:
    extra = [
        TaskRow(suite="local", tag="t9_queued", attempt=1, state=TaskState.QUEUED),
        TaskRow(suite="local", tag="t9_running", attempt=1, state=TaskState.RUNNING, host="h1", phase="codex"),
        TaskRow(suite="local", tag="t9_cancelled", attempt=1, state=TaskState.CANCELLED),
    ]
    summary = summarize(batch_rows + extra)
    assert summary.tasks == 8 and summary.finished == 5 and summary.resolved == 1 and summary.infra_failures == 2
    assert summary.resolved_rate == pytest.approx(1 / 5)
    assert summary.resolved_rate_excluding_infra == pytest.approx(1 / 3)
    assert summary.by_state == {"queued": 1, "running": 1, "done": 3, "failed": 2, "cancelled": 1,
                                "skipped_budget": 0, "unreadable": 0}
    assert summary.pass_at == {1: pytest.approx(1 / 3)}  # three tags scored, one resolved
    assert summary.tokens == {"input": 123000, "cached_input": 90000, "output": 6900}
    assert dict(summary.failure_labels)["failed_extract_docker_error"] == 1


def test_pass_at_k_per_tag_over_attempts() -> None:
    rows = [
        TaskRow(suite="s", tag="a", attempt=i, state=TaskState.DONE, resolved=i == 1, infra_failure=False)
        for i in range(1, 5)
    ] + [TaskRow(suite="s", tag="a", attempt=5, state=TaskState.FAILED, resolved=False, infra_failure=True)]
    summary = summarize(rows)
    assert summary.pass_at[1] == pytest.approx(0.25) and summary.pass_at[2] == pytest.approx(0.5)
    assert 5 not in summary.pass_at  # the infra failure is no attempt of the agent's
    assert summary.rate_by_attempt == {1: 1.0, 2: 0.0, 3: 0.0, 4: 0.0}


@pytest.mark.parametrize(
    "bad",
    [
        {"tag": "a; rm -rf /"},
        {"suite": "$(reboot)"},
        {"phase_seconds": {"thinking": 1.0}},
        {"tokens": {"reasoning": 3}},
        {"tokens": {"input": -1}},
        {"failure_label": "Failed at /home/op"},
        {"host": "host name with spaces"},
        {"state": "exploded"},
        {"secret": "x"},
        {"state": "unreadable"},  # an unreadable row says why
        {"unreadable": "too_large"},  # and only an unreadable row does
        {"state": "unreadable", "unreadable": "/etc/passwd is a link"},  # from the closed set only
        {"agent": "Codex CLI"},  # the agents' own spelling only
        {"image": "registry.example:5000/repo:latest"},  # a digest or an id, never a name
        {"image": "sha256:" + "0" * 63},
    ],
)
def test_task_rows_refuse_what_could_leak_into_a_label_or_the_page(bad: dict) -> None:
    fields = {"suite": "s", "tag": "t", "attempt": 1, "state": "done", **bad}
    with pytest.raises(ValidationError):
        TaskRow(**fields)


def test_free_text_is_withheld_and_the_document_passes_the_guard(
    batch_rows: list[TaskRow], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(SECRET_NAME, SECRET_VALUE)
    health = HealthReport(
        checks=[
            HostCheck(name="disk", ok=False, detail=f"only 1 GB free under {tmp_path}"),
            HostCheck(name="codex_login", ok=False, detail=f"login token {SECRET_VALUE} expired"),
            HostCheck(name="docker", ok=True, detail="engine 20.10 answers"),
        ],
        taking_work=False, slots_busy=0, slots_total=2,
    )
    private = view_private_texts([str(tmp_path)])
    doc = suite_document("suite s", batch_rows, private, health=health)
    details = [check["detail"] for check in doc["health"]["checks"]]
    assert details == [WITHHELD, WITHHELD, "engine 20.10 answers"]
    check_public("doc", doc, private_texts=private)  # does not raise
    assert str(tmp_path) not in repr(doc) and SECRET_VALUE not in repr(doc)


def test_snapshot_source_keeps_one_row_per_task_and_attempt() -> None:
    health = HealthReport(checks=[], taking_work=True, slots_busy=0, slots_total=1)
    source = SnapshotSource(health)
    source.upsert(TaskRow(suite="s", tag="t", attempt=1, state=TaskState.RUNNING, phase="extract"))
    source.upsert(TaskRow(suite="s", tag="t", attempt=1, state=TaskState.DONE, resolved=True))
    source.upsert(TaskRow(suite="s", tag="t", attempt=2, state=TaskState.QUEUED))
    assert [(row.attempt, row.state) for row in source.rows()] == [(1, TaskState.DONE), (2, TaskState.QUEUED)]
    source.upsert(TaskRow(suite="s", tag="t", attempt=1, state=TaskState.QUEUED, agent="claude-code"))
    assert len(source.rows()) == 3  # another agent's attempt 1 is another task


def test_metrics_count_a_finished_task_once_and_again_only_when_its_result_changes() -> None:
    health = HealthReport(checks=[], taking_work=True, slots_busy=1, slots_total=2)
    metrics = SuiteMetrics()
    failed = TaskRow(suite="s", tag="t", attempt=1, state=TaskState.FAILED, resolved=False, infra_failure=True,
                     failure_label="failed_extract_docker_error", phase_seconds={"extract": 2.0}, wall_seconds=3.0)
    metrics.sync([failed], health)
    metrics.sync([failed], health)
    assert metrics.registry.get_sample_value("runner_tasks_infra_failed_total") == 1
    retried = TaskRow(suite="s", tag="t", attempt=1, state=TaskState.DONE, resolved=True, infra_failure=False,
                      phase_seconds={"extract": 2.5, "codex": 40.0}, wall_seconds=50.0, tokens={"input": 7})
    metrics.sync([retried], health)
    assert metrics.registry.get_sample_value("runner_tasks_resolved_total") == 1
    assert metrics.registry.get_sample_value("runner_tasks_infra_failed_total") == 1
    assert metrics.registry.get_sample_value("runner_phase_duration_seconds_count", {"phase": "extract"}) == 2
    assert metrics.registry.get_sample_value("runner_codex_tokens_total", {"kind": "input"}) == 7


def test_a_label_that_is_a_forbidden_key_name_is_still_shown_as_a_value(tmp_path: Path) -> None:
    """Labels are values in the document, never keys, so no task result can break the page."""
    row = TaskRow(suite="s", tag="t", attempt=1, state=TaskState.FAILED, resolved=False, infra_failure=False,
                  failure_label="solution")
    doc = suite_document("suite s", [row], view_private_texts())
    assert doc["summary"]["failure_labels"] == [["solution", 1]]


def test_http_address_for_the_worker_flag() -> None:
    assert http_address("127.0.0.1:9464") == ("127.0.0.1", 9464)
    assert http_address("[::1]:8080") == ("::1", 8080)
    for bad in ("9464", "127.0.0.1:", ":80", "127.0.0.1:99999", "host:port"):
        with pytest.raises(BadInputError, match="HOST:PORT"):
            http_address(bad)


def test_a_worker_counts_only_its_own_hosts_tasks_from_a_suite_wide_source() -> None:
    health = HealthReport(checks=[], taking_work=True, slots_busy=0, slots_total=2)
    rows = [TaskRow(suite="s", tag="t", attempt=i, state=TaskState.DONE, resolved=True, infra_failure=False,
                    host=f"host-{i % 2}") for i in range(5)]
    metrics = SuiteMetrics(counted_host="host-1")
    metrics.sync(rows, health)
    assert metrics.registry.get_sample_value("runner_tasks_resolved_total") == 2
    assert metrics.registry.get_sample_value("runner_tasks", {"state": "done"}) == 5


DIGEST = "sha256:" + "ab" * 32


def test_a_row_shows_its_image_by_digest_alone_and_the_tasks_table_shortens_it() -> None:
    from runner.views.report import render_html, render_markdown

    row = TaskRow(suite="s", tag="t", attempt=1, state=TaskState.DONE, resolved=True, agent="codex",
                  image=f"127.0.0.1:5000/agentissue-bench@{DIGEST}")
    assert row.image == DIGEST
    document = suite_document("s", [row], [])
    assert document["rows"][0]["image"] == DIGEST and document["agents"] is None  # one agent: nothing to compare
    html = render_html(document)
    assert f'data-image="{DIGEST}">{DIGEST[:19]}</span>' in html and "Agents side by side" not in html
    assert f"| t #1 | codex | {DIGEST} |" in render_markdown(document)


def test_a_suite_of_two_agents_keeps_their_rows_apart_and_compares_them_per_tag() -> None:
    from runner.views.report import render_markdown

    def row(tag: str, attempt: int, agent: str, resolved: bool, cost: float) -> TaskRow:
        return TaskRow(suite="s", tag=tag, attempt=attempt, state=TaskState.DONE, resolved=resolved, agent=agent,
                       cost_usd=cost, tokens={"input": 100, "output": 10})

    rows = [row("t_a", 1, "codex", True, 0.5), row("t_a", 2, "codex", False, 0.5),
            row("t_a", 1, "claude-code", True, 1.0), row("t_b", 1, "codex", False, 0.25),
            row("t_b", 1, "claude-code", True, 1.0),
            TaskRow(suite="s", tag="t_b", attempt=2, state=TaskState.FAILED, infra_failure=True, agent="claude-code")]
    source = SnapshotSource(HealthReport(checks=[], taking_work=True, slots_busy=0, slots_total=1), rows)
    assert len(source.rows()) == 6  # (tag, attempt) alone would fold t_a #1 of both agents into one
    document = suite_document("s", source.rows(), [])
    sides = document["agents"]["agents"]
    assert list(sides) == ["claude-code", "codex"]
    codex, claude = sides["codex"], sides["claude-code"]
    assert (codex["scored"], codex["resolved"], codex["resolved_rate"]) == (3, 1, round(1 / 3, 4))
    assert (claude["tasks"], claude["scored"], claude["resolved"], claude["resolved_rate"]) == (3, 2, 2, 1.0)
    assert codex["per_tag"]["t_a"]["pass_at"] == {"1": 0.5, "2": 1.0} and codex["per_tag"]["t_a"]["cost_usd"] == 1.0
    assert claude["per_tag"]["t_b"]["scored"] == 1  # the infrastructure failure says nothing of the agent
    assert {r["label"] for r in document["rows"]} >= {"t_a #1 codex", "t_a #1 claude-code"}
    markdown = render_markdown(document)
    assert "| claude-code | 3 | 2 | 2 | 100.0% |" in markdown
    assert ("| t_a | 1/1 resolved, pass@1 100.0%, tokens 100 in / 10 out, $1.0000 "
            "| 1/2 resolved, pass@1 50.0%, tokens 200 in / 20 out, $1.0000 |" in markdown), markdown


def test_the_document_and_the_report_carry_the_ledgers_cost_summary() -> None:
    from runner.views.report import render_html, render_markdown

    rows = [TaskRow(suite="s", tag="t_a", attempt=1, state=TaskState.DONE, resolved=True, cost_usd=0.5,
                    tokens={"input": 10}),
            TaskRow(suite="s", tag="t_b", attempt=1, state=TaskState.DONE, resolved=False, cost_usd=0.25,
                    tokens={"input": 10}),
            TaskRow(suite="s", tag="t_c", attempt=1, state=TaskState.DONE, resolved=False, tokens={"input": 10}),
            TaskRow(suite="s", tag="t_d", attempt=1, state=TaskState.SKIPPED_BUDGET)]
    cost = summarize(rows).cost
    assert cost["total_usd"] == 0.75 and cost["tasks_priced"] == 2 and cost["tasks_cost_unknown"] == 1
    assert cost["per_resolved_usd"] == 0.75 and cost["per_tag_usd"] == {"t_a": 0.5, "t_b": 0.25}
    document = suite_document("s", rows, [])
    assert [row["cost_usd"] for row in document["rows"]] == [0.5, 0.25, None, None]
    markdown = render_markdown(document)
    assert "| $0.7500 | $0.3750 | $0.7500 | 2 | 1 |" in markdown and "| t_a | $0.5000 |" in markdown
    html = render_html(document)
    assert "<td>$0.7500</td><td>$0.3750</td><td>$0.7500</td>" in html and 'data-card="cost"' in html


@pytest.mark.parametrize("written, shown", [
    (2.5, 2.5), (3, 3.0), ("2.5", None), (True, None), (-1, None), (1e12, None), (None, None),
])
def test_a_batch_s_budget_is_read_from_its_ledger_only_when_it_is_a_budget(
    tmp_path: Path, written: object, shown: float | None
) -> None:
    """The report shows the last batch's budget as its ledger wrote it; anything else shows none, and
    the rows still stand (a damaged cost block never hides the suite)."""
    import json

    from runner.views.sources import read_jobs_dir

    batch = make_batch(tmp_path / "jobs", {"t0_resolved": "resolved"})
    ledger = batch.jobs_dir / "run-ledger.json"
    document = json.loads(ledger.read_text())
    document["cost"] = {"budget_usd": written}
    ledger.write_text(json.dumps(document))
    local = read_jobs_dir(batch.jobs_dir)
    assert [row.tag for row in local.rows] == ["t0_resolved"]
    assert (local.budget.limit_usd if local.budget else None) == shown
    cost = summarize(local.rows, budget=local.budget).cost
    assert ("budget_usd" in cost) is (shown is not None)
    if shown is not None:
        assert cost["left_usd"] == pytest.approx(shown - cost["total_usd"])
