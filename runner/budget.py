"""A suite's budget (``--suite-budget-usd``): no task starts once the money is spent or would be.

One rule (``admit``) for the batch (``SuiteBudget``, in one process) and the fleet
(``runner.fleet.budget``, across hosts on Redis): only where the figures come from differs.

Spent is what the suite's finished tasks cost (their ledger rows: this run's and earlier
runs') plus what its running tasks have spent so far (each one's live usage file, written by
the codex phase's meter). A task starts only while

    spent (finished + live) < budget   and   finished + Σ max(live, estimate) + estimate <= budget

where ``estimate`` is the mean cost of the suite's priced tasks (0 before any): so a budget
"enough for three" starts three, not as many as there are workers. A task that does not fit
ends ``skipped_budget``; a rerun with a larger budget takes it.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import structlog

from reducers.costs import UNSPENT_STATES
from reducers.outcome import TaskFacts
from runner.codex_meter import LIVE_USAGE
from runner.errors import BadInputError

log = structlog.get_logger(__name__)
LIVE_USAGE_MAX_BYTES = 4096
MAX_BUDGET_USD = 1_000_000_000


def check_budget(limit_usd: float | None) -> float | None:
    """The one check of ``--suite-budget-usd`` (batch and ``submit``)."""
    if limit_usd is not None and not 0 < limit_usd <= MAX_BUDGET_USD:
        raise BadInputError("--suite-budget-usd must be a positive number of dollars")
    return limit_usd


def mean_cost(costs: list[float]) -> float:
    """The estimate of one more task: the mean of the priced finished ones (0 before any)."""
    return sum(costs) / len(costs) if costs else 0.0


def spent_costs(rows: Iterable[TaskFacts]) -> list[float]:
    """The costs a budget counts as finished: every priced row that ran and is not running or queued again."""
    return [row.cost_usd for row in rows if row.cost_usd is not None and row.state not in UNSPENT_STATES]


@dataclass(frozen=True)
class Admission:
    admitted: bool
    spent_usd: float
    estimate_usd: float


def admit(limit_usd: float, finished: list[float], live: Iterable[float]) -> Admission:
    """The suite budget's rule, the one the batch and the fleet apply (pure: no clock, no I/O).

    ``finished``: the costs of the suite's priced finished tasks; ``live``: what each running
    task has spent so far. A running task counts at least the estimate, so that a budget
    "enough for three" starts three however many workers ask at once.
    """
    live = list(live)
    estimate = mean_cost(finished)
    finished_usd = sum(finished)
    spent = finished_usd + sum(live)
    projected = finished_usd + sum(max(cost, estimate) for cost in live) + estimate
    return Admission(spent < limit_usd and projected <= limit_usd + 1e-9, spent, estimate)


def live_cost(job_logs: Path) -> float:
    """The running task's cost so far (0: none yet, or unreadable: a budget never crashes a batch)."""
    try:
        with (job_logs / LIVE_USAGE).open("rb") as handle:
            record = json.loads(handle.read(LIVE_USAGE_MAX_BYTES))
        cost = record.get("cost_usd")
        return float(cost) if isinstance(cost, (int, float)) and 0 <= cost < 1e9 else 0.0
    except (OSError, ValueError, AttributeError):
        return 0.0


@dataclass
class SuiteBudget:
    """A batch's budget: one process, its running tasks' live usage read from their files."""

    limit_usd: float
    _finished: list[float] = field(default_factory=list)  # the priced finished tasks' costs
    _running: dict[str, Path] = field(default_factory=dict)  # task name -> its logs dir
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def estimate_usd(self) -> float:
        return mean_cost(self._finished)

    def spent_usd(self) -> float:
        with self._lock:
            return sum(self._finished) + sum(live_cost(logs) for logs in self._running.values())

    def try_start(self, name: str, logs: Path) -> bool:
        """Admit the task (it counts as running from now) or refuse it: it would not fit."""
        with self._lock:
            verdict = admit(self.limit_usd, self._finished, (live_cost(path) for path in self._running.values()))
            if not verdict.admitted:
                log.info("task_skipped_budget", task=name, spent_usd=round(verdict.spent_usd, 6),
                         budget_usd=self.limit_usd, estimate_usd=round(verdict.estimate_usd, 6))
                return False
            self._running[name] = logs
            return True

    def finished(self, name: str, cost_usd: float | None) -> None:
        """A started task ended; a cost of None (a model the card lacks) counts as nothing."""
        with self._lock:
            self._running.pop(name, None)
            if cost_usd is not None:
                self._finished.append(cost_usd)

    def seed(self, costs: list[float]) -> None:
        """The suite's earlier runs (the ledger's rows)."""
        with self._lock:
            self._finished.extend(costs)
