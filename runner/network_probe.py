"""The evaluation's network probe, and the host's memory of its answer.

Can a container in the evaluation's network mode reach what the tasks install from? That
answer is a fact about this host and its network, not about a task: a host whose bridge has
no route out used to pay the probe's timeout (3 s) for every evaluation. So the answer is
kept in the state dir for a minute per (network mode, endpoints), shared by every task of a
batch, an ``evaluate`` run and a worker on this host; tasks probing at once wait for the one
that probes. Only a definite answer (reached or not) is kept: a probe that could not tell is
asked again next time.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path

import docker
import structlog
from docker.errors import DockerException
from pydantic import BaseModel, ConfigDict, ValidationError
from requests.exceptions import RequestException

from runner.atomic import write_json_atomic
from runner.bounded_read import UnreadableFileError, read_bounded_json
from runner.docker_utils import NO_LOG_DRIVER, managed_container, run_main_process
from runner.settings import DEFAULT_PROBE_ENDPOINTS, split_endpoint

log = structlog.get_logger(__name__)

# The network probe: can a container of the image, in the evaluation's network mode, open a
# TCP connection to each endpoint the tasks install from (the package index, or the operator's
# own mirror: --eval-probe)? bash's /dev/tcp needs no tool the image may lack; exit 3 means the
# image cannot say (no bash or no timeout), exit 10+i that endpoint i was not reached.
NETWORK_PROBE_SECONDS = 3
NETWORK_PROBE_PHASE = "evaluate-network-probe"
_FIRST_UNREACHED_EXIT = 10
_NETWORK_PROBE_SCRIPT = (
    'command -v bash >/dev/null 2>&1 && command -v timeout >/dev/null 2>&1 || exit 3; '
    'seconds=$1; shift; i=0; while [ $# -ge 2 ]; do '
    'timeout "$seconds" bash -c \'exec 3<>"/dev/tcp/$0/$1"\' "$1" "$2" >/dev/null 2>&1 || exit $((' +
    str(_FIRST_UNREACHED_EXIT) + ' + i)); i=$((i + 1)); shift 2; done'
)


@dataclass(frozen=True)
class NetworkProbe:
    reachable: bool | None  # None: the probe could not tell
    detail: str  # reachable | unreachable | skipped_network_none | skipped_not_needed | probe_unavailable | probe_failed
    endpoints: tuple[str, ...] = ()  # what it tried to reach (HOST:PORT), in order; none under network none
    unreached: str | None = None  # the first endpoint it could not reach
    remembered: bool = False  # the host's answer of less than a minute ago (ProbeMemory), not a fresh probe


def probe_network(client: docker.DockerClient, *, image_id: str, network: str, labels: dict[str, str],
                  endpoints: tuple[str, ...] = DEFAULT_PROBE_ENDPOINTS) -> NetworkProbe:
    """Whether a container of ``image_id`` in ``network`` reaches every one of ``endpoints``; never raises for a probe failure."""
    if network == "none":
        return NetworkProbe(reachable=False, detail="skipped_network_none")
    pairs = [str(part) for endpoint in endpoints for part in split_endpoint(endpoint)]
    try:
        with managed_container(
            client,
            image=image_id,
            labels=labels,
            entrypoint=["/bin/sh", "-c", _NETWORK_PROBE_SCRIPT, "probe", str(NETWORK_PROBE_SECONDS), *pairs],
            command=[],
            network_mode=network,
            log_config=NO_LOG_DRIVER,
        ) as container:
            ended = run_main_process(container, timeout=NETWORK_PROBE_SECONDS * len(endpoints) + 20)
    except (DockerException, RequestException) as e:
        log.warning("network_probe_failed", error_type=type(e).__name__)
        return NetworkProbe(reachable=None, detail="probe_failed", endpoints=endpoints)
    if ended.exit_code == 0:
        return NetworkProbe(reachable=True, detail="reachable", endpoints=endpoints)
    if ended.exit_code == 3:
        return NetworkProbe(reachable=None, detail="probe_unavailable", endpoints=endpoints)
    index = (ended.exit_code or 0) - _FIRST_UNREACHED_EXIT
    unreached = endpoints[index] if 0 <= index < len(endpoints) else None
    return NetworkProbe(reachable=False, detail="unreachable", endpoints=endpoints, unreached=unreached)


# --- the host's memory of the answer ------------------------------------------------------

PROBE_MEMORY_SECONDS = 60.0
MEMORY_DIR = "network-probes"
_LOCK_WAIT_SECONDS = NETWORK_PROBE_SECONDS * 8 + 30  # past the longest probe another task can be running


class _Remembered(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    network: str
    endpoints: list[str]
    reachable: bool
    detail: str
    unreached: str | None
    probed_at: float  # time.time() of the probe


@dataclass(frozen=True)
class ProbeMemory:
    """Where this host keeps its probe answers (``<state dir>/network-probes/``), and for how long."""

    directory: Path
    max_age: float = PROBE_MEMORY_SECONDS

    @classmethod
    def in_state_dir(cls, state_dir: Path) -> ProbeMemory:
        return cls(state_dir / MEMORY_DIR)

    def _path(self, network: str, endpoints: tuple[str, ...], suffix: str) -> Path:
        key = hashlib.sha256(json.dumps([network, list(endpoints)]).encode()).hexdigest()[:32]
        return self.directory / f"{key}{suffix}"

    @contextmanager
    def turn(self, network: str, endpoints: tuple[str, ...]) -> Iterator[None]:
        """One probe at a time per key on this host; a waiter gives up after the longest probe and
        probes itself, and a state dir that cannot hold the lock only costs the waiting."""
        try:
            self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
            fd = os.open(self._path(network, endpoints, ".lock"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        except OSError as e:
            log.warning("network_probe_memory_unusable", error_type=type(e).__name__)
            yield
            return
        try:
            deadline = time.monotonic() + _LOCK_WAIT_SECONDS
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() > deadline:
                        break
                    time.sleep(0.05)
            yield
        finally:
            os.close(fd)  # releases the lock

    def recall(self, network: str, endpoints: tuple[str, ...]) -> NetworkProbe | None:
        path = self._path(network, endpoints, ".json")
        if not path.exists():
            return None
        try:
            record = _Remembered.model_validate(read_bounded_json(path, root=self.directory, max_bytes=4096, max_depth=3))
        except (UnreadableFileError, ValidationError):
            return None  # a damaged record is asked again, never believed
        age = time.time() - record.probed_at
        if not 0 <= age <= self.max_age or (record.network, tuple(record.endpoints)) != (network, endpoints):
            return None
        return NetworkProbe(reachable=record.reachable, detail=record.detail, endpoints=endpoints,
                            unreached=record.unreached, remembered=True)

    def remember(self, network: str, probe: NetworkProbe) -> None:
        if probe.reachable is None:
            return  # the probe could not tell: the next evaluation asks again
        record = _Remembered(network=network, endpoints=list(probe.endpoints), reachable=probe.reachable,
                             detail=probe.detail, unreached=probe.unreached, probed_at=time.time())
        try:
            write_json_atomic(self._path(network, probe.endpoints, ".json"), record.model_dump())
        except OSError as e:  # a full state disk: the answer stands, only the next one probes again
            log.warning("network_probe_memory_unusable", error_type=type(e).__name__)


def probe_once(client: docker.DockerClient, memory: ProbeMemory | None, *, needs_network: bool, image_id: str,
               network: str, labels: dict[str, str], endpoints: tuple[str, ...] = DEFAULT_PROBE_ENDPOINTS) -> NetworkProbe:
    """``probe_network`` for a tag that needs the network, unless this host answered the same
    question less than a minute ago; a tag that needs none is not probed (its verdict's trust
    does not depend on the answer). Never raises for the memory: a state dir that cannot hold
    it only costs a probe.
    """
    if network == "none":  # known without a container
        return probe_network(client, image_id=image_id, network=network, labels=labels, endpoints=endpoints)
    if not needs_network:
        return NetworkProbe(reachable=None, detail="skipped_not_needed")
    if memory is None:
        return probe_network(client, image_id=image_id, network=network, labels=labels, endpoints=endpoints)
    with memory.turn(network, endpoints):
        remembered = memory.recall(network, endpoints)
        if remembered is not None:
            return remembered
        probe = probe_network(client, image_id=image_id, network=network, labels=labels, endpoints=endpoints)
        memory.remember(network, probe)
        return probe
