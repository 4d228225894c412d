"""The fleet's Redis: one connection helper, the Dramatiq broker, the keys, enqueueing a task.

Invariants:
- every key the fleet writes starts with ``<namespace>:`` (Dramatiq's own too), so a
  namespace can be listed and removed as a whole;
- a broker URL is never printed whole (it may hold a password): only host:port/db;
- Dramatiq's defaults that do not fit hour-long tasks are set here, deliberately.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import urlsplit

import redis
from dramatiq import Message
from dramatiq.brokers.redis import RedisBroker
from dramatiq.middleware import CurrentMessage, Retries, TimeLimit

from runner.errors import BadInputError, BrokerUnavailableError, MessageError
from runner.tasks.protocol import EvalMessage, TaskMessage

DEFAULT_NAMESPACE = "runner-fleet"
ACTOR_NAME = "run_task"
DEFAULT_QUEUE = "runner"
SAFE_QUEUE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_-]{0,63}")
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


def check_queue(queue: str) -> str:
    if not SAFE_QUEUE.fullmatch(queue):
        raise MessageError("queue name must be 1-64 letters, digits, '_' or '-'")
    return queue


class _MessagesByIdOnly(logging.Filter):
    """Dramatiq's own log lines name a message by its repr, which holds its arguments: the prompt.

    Each such argument is replaced by the message's id, so no log line carries a task's text.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.args, tuple):
            record.args = tuple(_by_id(arg) for arg in record.args)
        elif isinstance(record.args, dict):
            record.args = {key: _by_id(value) for key, value in record.args.items()}
        if isinstance(record.msg, Message):
            record.msg = _by_id(record.msg)
        return True


def _by_id(value: object) -> object:
    if isinstance(value, Message) or (hasattr(value, "message_id") and hasattr(value, "args")):
        return f"message {getattr(value, 'message_id', '?')}"
    return value


def quiet_dramatiq_messages() -> None:
    """Keep task text out of Dramatiq's own logging (its warnings on retries, failures, timeouts).

    On the root's handlers, where every logger's records end (Dramatiq makes a logger per
    class and instance, so a filter on a logger would miss its children's records).
    """
    for handler in logging.root.handlers:
        if not any(isinstance(f, _MessagesByIdOnly) for f in handler.filters):
            handler.addFilter(_MessagesByIdOnly())


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

    def budget(self, suite: str) -> str:
        return f"{self.namespace}:budget:{suite}"

    def spending(self, suite: str) -> str:
        return f"{self.namespace}:spending:{suite}"

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


def task_message(task: TaskMessage | EvalMessage, queue: str) -> Message:
    """The Dramatiq message of a task or an evaluation unit; its id is the unit's identity
    ((suite, tag, attempt), or (suite, tag, patch name, sha256))."""
    return Message(
        queue_name=queue, actor_name=ACTOR_NAME, args=(task.model_dump(mode="json"),), kwargs={}, options={},
        message_id=task.message_id,
    )
