"""The fleet's admission (``runner.fleet.budget``) on a real Redis: many hosts asking at once get
exactly the room there is, and a dead host's live cost stops counting."""

from __future__ import annotations

import threading
import time

import pytest
import redis

from reducers.outcome import TaskState
from runner.fleet.broker import Keys
from runner.fleet.budget import FleetBudget
from runner.fleet.ledger import LedgerRow, SuiteLedger, now

pytestmark = [pytest.mark.redis]
P = 0.000628


def _done(ledger: SuiteLedger, tag: str, cost: float) -> None:
    row = LedgerRow(tag=tag, attempt=1, state=TaskState.DONE, queue="runner", submitted_at=now(), cost_usd=cost)
    ledger.update(row.key, lambda _cur: row)


def test_hosts_racing_for_the_last_room_get_it_once(redis_namespace: tuple[str, str]) -> None:
    url, namespace = redis_namespace
    keys = Keys(namespace)
    clients = [redis.Redis.from_url(url) for _ in range(8)]
    try:
        FleetBudget(clients[0], keys, ttl=30).set_limit("s", 3.5 * P)
        _done(SuiteLedger(clients[0], keys, "s"), "t_done", P)  # one done: the mean is P; room for two more
        barrier = threading.Barrier(len(clients))
        admitted: list[str] = []

        def ask(index: int) -> None:
            barrier.wait()
            if FleetBudget(clients[index], keys, ttl=30).try_start("s", f"t_{index}/1"):
                admitted.append(f"t_{index}/1")

        threads = [threading.Thread(target=ask, args=(i,)) for i in range(len(clients))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=30)
        assert len(admitted) == 2, admitted  # 1 done + 2 running at the mean = 3 <= 3.5; a third would be 4
        budget = FleetBudget(clients[0], keys, ttl=30)
        budget.publish("s", admitted[0], 0.5 * P)
        assert budget.running_usd("s") == pytest.approx(0.5 * P)
        budget.release("s", admitted[0])
        budget.release("s", admitted[1])
        assert budget.running_usd("s") == 0 and budget.limit("s") == pytest.approx(3.5 * P)
        assert FleetBudget(clients[0], keys, ttl=30).try_start("s", "t_other/1")
        assert FleetBudget(clients[0], keys, ttl=30).try_start("no-budget", "t_x/1"), "a suite without one: always"
    finally:
        for client in clients:
            client.close()


def test_a_live_cost_whose_host_stopped_publishing_expires(redis_namespace: tuple[str, str]) -> None:
    url, namespace = redis_namespace
    client = redis.Redis.from_url(url)
    try:
        keys = Keys(namespace)
        budget = FleetBudget(client, keys, ttl=1)
        budget.set_limit("s", P)
        assert budget.try_start("s", "t_dead/1")
        budget.publish("s", "t_dead/1", P)  # all of it: nothing else fits
        assert not budget.try_start("s", "t_next/1")
        time.sleep(1.5)  # the dead host publishes no more
        assert budget.running_usd("s") == 0 and budget.try_start("s", "t_next/1")
        assert client.hkeys(keys.spending("s")) == [b"t_next/1"], "the stale entry is removed"
    finally:
        client.close()
