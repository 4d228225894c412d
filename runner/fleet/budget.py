"""The suite budget on the fleet: the batch's rule (``runner.budget.admit``) over the suite's keys in Redis.

Keys: ``budget:<suite>`` (the limit, set by ``submit --suite-budget-usd``) and ``spending:<suite>``
(a hash: each admitted running task's live cost, published by its worker, with a deadline on the
Redis clock, so that a dead host's task stops counting once its deadline passes). Finished costs
are the suite ledger's rows.

Invariant: admission reads the limit, the spending and the ledger and admits in one WATCH/MULTI
transaction: two hosts asking at once never both take the last room.
"""

from __future__ import annotations

import json

import redis
import structlog

from runner.budget import admit, spent_costs
from runner.fleet.broker import Keys
from runner.fleet.ledger import LedgerRow

log = structlog.get_logger(__name__)


def _redis_now(client: redis.Redis | redis.client.Pipeline) -> float:
    seconds, micros = client.time()
    return seconds + micros / 1e6


def _live(raw: dict[bytes, bytes], now: float) -> tuple[dict[str, float], list[bytes]]:
    """The running tasks' live costs, and the entries whose deadline passed (their host is gone)."""
    live: dict[str, float] = {}
    stale: list[bytes] = []
    for key, value in raw.items():
        try:
            entry = json.loads(value)
            cost, until = float(entry["cost"]), float(entry["until"])
        except (ValueError, KeyError, TypeError):
            stale.append(key)
            continue
        if until < now:
            stale.append(key)
        else:
            live[key.decode()] = max(cost, 0.0)
    return live, stale


class FleetBudget:
    """One worker's (or a command's) handle on the suites' budgets; ``ttl``: how long a published cost holds."""

    def __init__(self, client: redis.Redis, keys: Keys, ttl: float) -> None:
        self._client, self._keys, self._ttl = client, keys, ttl

    def set_limit(self, suite: str, limit_usd: float) -> None:
        self._client.set(self._keys.budget(suite), repr(float(limit_usd)))

    def limit(self, suite: str) -> float | None:
        raw = self._client.get(self._keys.budget(suite))
        return float(raw) if raw is not None else None

    def running_usd(self, suite: str) -> float:
        """What the suite's running tasks have spent so far (status: spent = finished + this)."""
        live, _ = _live(self._client.hgetall(self._keys.spending(suite)), _redis_now(self._client))
        return sum(live.values())

    def try_start(self, suite: str, key: str) -> bool:
        """Admit the task (it counts as running from now) or refuse it; True when the suite has no budget."""
        budget_key, spending_key, ledger_key = self._keys.budget(suite), self._keys.spending(suite), self._keys.ledger(suite)
        with self._client.pipeline() as pipe:
            while True:
                try:
                    pipe.watch(budget_key, spending_key, ledger_key)
                    raw = pipe.get(budget_key)
                    if raw is None:
                        pipe.unwatch()
                        return True
                    limit = float(raw)
                    rows = []
                    for field, value in pipe.hgetall(ledger_key).items():
                        if field.decode() != key:
                            try:
                                rows.append(LedgerRow.model_validate_json(value))
                            except ValueError:
                                continue  # a row of another version counts nothing, as status shows nothing
                    now = _redis_now(pipe)
                    live, stale = _live(pipe.hgetall(spending_key), now)
                    live.pop(key, None)
                    verdict = admit(limit, spent_costs(rows), live.values())
                    pipe.multi()
                    if stale:
                        pipe.hdel(spending_key, *stale)
                    if verdict.admitted:
                        pipe.hset(spending_key, key, json.dumps({"cost": 0.0, "until": now + self._ttl}))
                    pipe.execute()
                except redis.WatchError:
                    continue
                log.info("task_admitted" if verdict.admitted else "task_skipped_budget", budget_usd=limit,
                         spent_usd=round(verdict.spent_usd, 6), estimate_usd=round(verdict.estimate_usd, 6),
                         running=len(live))
                return verdict.admitted

    def publish(self, suite: str, key: str, cost_usd: float) -> None:
        """A running task's cost so far, held for ``ttl`` (the worker publishes it every tick)."""
        until = _redis_now(self._client) + self._ttl
        self._client.hset(self._keys.spending(suite), key, json.dumps({"cost": cost_usd, "until": until}))

    def release(self, suite: str, key: str) -> None:
        """The task ended: its cost is its ledger row's from now (written before this: never counted as nothing)."""
        self._client.hdel(self._keys.spending(suite), key)
