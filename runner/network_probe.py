"""The evaluation's network probe, and the host's memory of its answer.

Can a container in the evaluation's network mode reach what the tasks install from? That
answer is a fact about this host and its network, not about a task: a host whose bridge has
no route out used to pay the probe's timeout (3 s) for every evaluation. So the answer is
kept in the state dir for a minute per (network mode, endpoints) (``runner.host_memory``),
shared by every task of a batch, an ``evaluate`` run and a worker on this host; tasks probing
at once wait for the one that probes. Only a definite answer (reached or not) is kept: a probe
that could not tell is asked again next time.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import docker
import structlog
from docker.errors import DockerException
from pydantic import BaseModel, ConfigDict
from requests.exceptions import RequestException

from runner.docker_utils import NO_LOG_DRIVER, managed_container, run_main_process
from runner.host_memory import HostMemory
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
    remembered: bool = False  # the host's answer of less than a minute ago (runner.host_memory), not a fresh probe


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
MEMORY_KIND = "network-probes"
_WAIT_SECONDS = NETWORK_PROBE_SECONDS * 8 + 30  # past the longest probe another task can be running


class _Answer(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    reachable: bool
    detail: str
    unreached: str | None


def probe_memory(state_dir: Path) -> HostMemory:
    """Where this host keeps its probe answers (``<state dir>/network-probes/``), for a minute."""
    return HostMemory.in_state_dir(state_dir, MEMORY_KIND, max_age=PROBE_MEMORY_SECONDS, wait_seconds=_WAIT_SECONDS)


def _question(network: str, endpoints: tuple[str, ...]) -> str:
    return HostMemory.question("network-probe", network, list(endpoints))


def recall_probe(memory: HostMemory, network: str, endpoints: tuple[str, ...]) -> NetworkProbe | None:
    answer = memory.recall(_question(network, endpoints), _Answer)
    if answer is None:
        return None
    return NetworkProbe(reachable=answer.reachable, detail=answer.detail, endpoints=endpoints,
                        unreached=answer.unreached, remembered=True)


def remember_probe(memory: HostMemory, network: str, probe: NetworkProbe) -> None:
    """Only a definite answer (reached or not): a probe that could not tell is asked again next time."""
    if probe.reachable is not None:
        memory.remember(_question(network, probe.endpoints),
                        _Answer(reachable=probe.reachable, detail=probe.detail, unreached=probe.unreached))


def probe_once(client: docker.DockerClient, memory: HostMemory | None, *, needs_network: bool, image_id: str,
               network: str, labels: dict[str, str], endpoints: tuple[str, ...] = DEFAULT_PROBE_ENDPOINTS) -> NetworkProbe:
    """``probe_network`` for a tag that needs the network, unless this host answered the same
    question less than a minute ago; a tag that needs none is not probed (its verdict's trust
    does not depend on the answer). Never raises for the memory.
    """
    if network == "none":  # known without a container
        return probe_network(client, image_id=image_id, network=network, labels=labels, endpoints=endpoints)
    if not needs_network:
        return NetworkProbe(reachable=None, detail="skipped_not_needed")
    if memory is None:
        return probe_network(client, image_id=image_id, network=network, labels=labels, endpoints=endpoints)
    with memory.turn(_question(network, endpoints)):
        remembered = recall_probe(memory, network, endpoints)
        if remembered is not None:
            return remembered
        probe = probe_network(client, image_id=image_id, network=network, labels=labels, endpoints=endpoints)
        remember_probe(memory, network, probe)
        return probe
