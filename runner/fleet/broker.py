"""The fleet's Redis: one connection helper, the Dramatiq broker, the keys, enqueueing a task.

Invariants:
- every key the fleet writes starts with ``<namespace>:`` (Dramatiq's own too), so a
  namespace can be listed and removed as a whole;
- a broker URL is never printed whole (it may hold a password): only host:port/db;
- Dramatiq's defaults that do not fit hour-long tasks are set here, deliberately.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import urlsplit

import redis
from dramatiq import Message
from dramatiq.brokers.redis import RedisBroker
from dramatiq.middleware import CurrentMessage, Retries, TimeLimit

from runner.errors import BadInputError, BrokerUnavailableError
from runner.fleet.messages import ACTOR_NAME, TaskMessage

DEFAULT_NAMESPACE = "runner-fleet"
# The runner's own deadlines (codex, evaluation) are the ones that count; Dramatiq's time
# limit (10 minutes by default) would kill hour-long runs, so it is only a last backstop.
TIME_LIMIT_MS = 48 * 3600 * 1000
# Dramatiq retries any exception 20 times by default; the fleet retries only infrastructure
# failures, a bounded number of times (``--max-infra-retries``), and never an agent's.
DEFAULT_INFRA_RETRIES = 2
# A dead worker's messages go back to the queue at the next maintenance after its heartbeat
# timeout; Dramatiq runs maintenance on 0.1% of broker calls by default, which would make
# "60 s" mean "some time in the next half hour". Every call does it here: it costs a sorted-set
# range per call on a handful of workers.
MAINTENANCE_CHANCE = 1_000_000


def where(url: str) -> str:
    """host:port/db of a Redis URL, without user or password."""
    parts = urlsplit(url)
    return f"{parts.hostname or '?'}:{parts.port or 6379}{parts.path or '/0'}"


def connect_redis(url: str, *, timeout: float = 5.0) -> redis.Redis:
    """A client whose server has answered a ping.

    Raises:
        BadInputError: not a redis:// URL.
        BrokerUnavailableError: nothing answers there.
    """
    if urlsplit(url).scheme not in ("redis", "rediss", "unix"):
        raise BadInputError("--broker must be a redis://HOST:PORT/DB URL")
    try:
        client = redis.Redis.from_url(url, socket_timeout=timeout, socket_connect_timeout=timeout)
        client.ping()
    except (redis.RedisError, ValueError, OSError) as e:
        raise BrokerUnavailableError(where(url), type(e).__name__) from e
    return client


@dataclass(frozen=True)
class Keys:
    """Every fleet key but Dramatiq's, in one place."""

    namespace: str

    @property
    def dramatiq(self) -> str:
        return f"{self.namespace}:dq"

    @property
    def suites(self) -> str:
        return f"{self.namespace}:suites"

    def ledger(self, suite: str) -> str:
        return f"{self.namespace}:ledger:{suite}"

    def lease(self, suite: str, key: str) -> str:
        return f"{self.namespace}:lease:{suite}:{key}"

    def cancelled(self, suite: str) -> str:
        return f"{self.namespace}:cancelled:{suite}"

    def queue(self, name: str) -> str:
        """Dramatiq's list of message ids of a queue (see dramatiq/brokers/redis/dispatch.lua)."""
        return f"{self.dramatiq}:{name}"


class GatedBroker(RedisBroker):
    """A Redis broker whose consumers take no message while ``gate()`` is false.

    The gate is the worker's "may I take work" (host healthy, not draining). Consumers
    still hold what they fetched; heartbeats are sent by the worker, not by fetching.
    """

    def __init__(self, *, gate: Callable[[], bool], **kwargs: object) -> None:
        super().__init__(**kwargs)
        self.gate = gate

    def consume(self, queue_name: str, prefetch: int = 1, timeout: int = 5000):  # noqa: ANN201 - a Consumer
        return _GatedConsumer(super().consume(queue_name, prefetch, timeout), self.gate, queue_name, timeout)


class _GatedConsumer:
    def __init__(self, inner, gate: Callable[[], bool], queue_name: str, timeout: int) -> None:  # noqa: ANN001
        self._inner = inner
        self._gate = gate
        self._delay_queue = queue_name.endswith(".DQ")  # delayed retries wait there: not work taken
        self._timeout = timeout

    def __iter__(self):  # noqa: ANN204
        return self

    def __next__(self):  # noqa: ANN204
        if not self._delay_queue and not self._gate():
            import time

            time.sleep(self._timeout / 1000)
            return None
        return next(self._inner)

    def __getattr__(self, name: str):  # noqa: ANN204 - ack, nack, requeue, close, ...
        return getattr(self._inner, name)


def make_broker(
    url: str,
    namespace: str,
    *,
    heartbeat_timeout: float = 60.0,
    gate: Callable[[], bool] = lambda: True,
    max_infra_retries: int = DEFAULT_INFRA_RETRIES,
    retry_backoff: float = 15.0,
    retry_when: Callable[[int, BaseException], bool] | None = None,
) -> GatedBroker:
    keys = Keys(namespace)
    return GatedBroker(
        gate=gate,
        url=url,
        namespace=keys.dramatiq,
        heartbeat_timeout=int(heartbeat_timeout * 1000),
        maintenance_chance=MAINTENANCE_CHANCE,
        middleware=[
            TimeLimit(time_limit=TIME_LIMIT_MS),
            Retries(
                max_retries=max_infra_retries,
                min_backoff=max(1, int(retry_backoff * 1000)),
                max_backoff=max(1, int(retry_backoff * 1000)) * 8,
                retry_when=retry_when or (lambda _retries, _error: False),
            ),
            CurrentMessage(),
        ],
    )


def task_message(task: TaskMessage, queue: str) -> Message:
    """The Dramatiq message of a task; its id is the task's identity (suite, tag, attempt)."""
    return Message(
        queue_name=queue, actor_name=ACTOR_NAME, args=(task.model_dump(mode="json"),), kwargs={}, options={},
        message_id=task.message_id,
    )
