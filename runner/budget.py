"""A suite's budget (``--suite-budget-usd``): no task starts once the money is spent or would be.

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
from dataclasses import dataclass, field
from pathlib import Path

import structlog

from runner.codex_meter import LIVE_USAGE

log = structlog.get_logger(__name__)
LIVE_USAGE_MAX_BYTES = 4096


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
    limit_usd: float
    finished_usd: float = 0.0
    priced_tasks: int = 0
    _running: dict[str, Path] = field(default_factory=dict)  # task name -> its logs dir
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def estimate_usd(self) -> float:
        return self.finished_usd / self.priced_tasks if self.priced_tasks else 0.0

    def spent_usd(self) -> float:
        with self._lock:
            return self.finished_usd + sum(live_cost(logs) for logs in self._running.values())

    def try_start(self, name: str, logs: Path) -> bool:
        """Admit the task (it counts as running from now) or refuse it: it would not fit."""
        with self._lock:
            live = [live_cost(path) for path in self._running.values()]
            estimate = self.estimate_usd
            spent = self.finished_usd + sum(live)
            projected = self.finished_usd + sum(max(cost, estimate) for cost in live) + estimate
            if spent >= self.limit_usd or projected > self.limit_usd + 1e-9:
                log.info("task_skipped_budget", task=name, spent_usd=round(spent, 6), budget_usd=self.limit_usd,
                         estimate_usd=round(estimate, 6))
                return False
            self._running[name] = logs
            return True

    def finished(self, name: str, cost_usd: float | None) -> None:
        """A started task ended; a cost of None (a model the card lacks) counts as nothing."""
        with self._lock:
            self._running.pop(name, None)
            if cost_usd is not None:
                self.finished_usd += cost_usd
                self.priced_tasks += 1

    def seed(self, costs: list[float]) -> None:
        """The suite's earlier runs (the ledger's rows)."""
        self.finished_usd += sum(costs)
        self.priced_tasks += len(costs)
