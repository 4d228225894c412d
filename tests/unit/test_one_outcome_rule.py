"""One rule for a finished task: for every failure the runner can write, the batch's ledger, the fleet's
ledger and the report agree on its state and on whether the host (not the agent) ended it."""

from __future__ import annotations

from pathlib import Path

import pytest

from reducers.compact import BenchmarkRun
from reducers.models import Phase, Reason
from reducers.outcome import TaskState
from reducers.passk import infra_label
from runner.batch import Unit, _row
from runner.fleet.ledger import LedgerRow as FleetRow
from runner.fleet.outcome import Action, decide
from runner.fleet.views import task_row as fleet_view_row
from runner.tasks.protocol import TaskOutcome
from runner.tasks.supervisor import TaskEnd
from runner.views.sources import _task_row as batch_view_row
from runner.views.stats import scored

GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "failed" / "benchmark_run.compact.json"
FAILABLE = [phase for phase in Phase if phase is not Phase.REDUCE]
# Every reason a failed marker can carry (ok, and eval_timeout, are the reasons of an ok marker).
FAILURES = [(phase, reason) for phase in FAILABLE for reason in Reason if reason not in (Reason.OK, Reason.EVAL_TIMEOUT)]


def _run(phase: Phase, reason: Reason) -> BenchmarkRun:
    base = BenchmarkRun.model_validate_json(GOLDEN.read_bytes())
    label = f"failed_{phase.value}_{reason.value}"
    return base.model_copy(update={
        "first_failed_phase": phase.value, "first_failure_reason": reason.value,
        "score_failure_attribution": label, "failure_attribution_labels": [label],
        "infra_failure": reason is Reason.CODEX_MODEL_ERROR,  # as the compact reducer marks it
    })


@pytest.mark.parametrize("exit_code", [1, 3])
@pytest.mark.parametrize(("phase", "reason"), FAILURES, ids=[f"{p.value}-{r.value}" for p, r in FAILURES])
def test_every_failure_is_judged_the_same_by_every_ledger_and_view(phase: Phase, reason: Reason, exit_code: int) -> None:
    run = _run(phase, reason)
    expected_infra = exit_code == 3 or infra_label(run.failure_attribution_labels[0])

    batch = _row(Unit("t_1", 1, Path("/jobs/t_1/attempt-1")), TaskEnd(exit_code, TaskOutcome(exit_code=exit_code, run=run)), 2.0)
    decision = decide(run, exit_code, 2.0, stop_reason=None, retries=0, max_retries=0)
    fleet = FleetRow(tag="t_1", attempt=1, queue="q", submitted_at=0.0, **decision.facts.model_dump())
    views = [batch_view_row(batch, "local", "ledger-row-1"), fleet_view_row("s", fleet)]

    assert batch.infra_failure is expected_infra
    assert fleet.infra_failure is expected_infra and decision.action is Action.DONE
    assert batch.state is fleet.state is (TaskState.FAILED if expected_infra else TaskState.DONE)
    assert batch.failure_label == fleet.failure_label == run.failure_attribution_labels[0]
    for view in views:
        assert view.infra_failure is expected_infra and scored(view) is (not expected_infra)
        assert view.state is batch.state and view.failure_label == batch.failure_label


def test_an_agents_failure_is_scored_and_a_model_error_is_the_providers() -> None:
    assert not infra_label("failed_codex_codex_timeout") and infra_label("failed_codex_codex_model_error")
    assert infra_label("failed_extract_unsafe_archive_entry") and infra_label("failed_patch_missing_input")
    refused = decide(None, 2, 0.1, stop_reason=None, retries=0, max_retries=2)
    assert (refused.action, refused.facts.state, refused.facts.infra_failure) == (Action.DONE, TaskState.FAILED, False)
    broken = decide(None, 3, 0.1, stop_reason=None, retries=0, max_retries=2)
    assert (broken.action, broken.facts.state, broken.retries) == (Action.RETRY, TaskState.QUEUED, 1)
