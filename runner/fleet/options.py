"""A worker's options: its broker and queues, its slots and pacing, and its host's settings.

Validated whole before the worker connects, so a bad flag is refused with exit 2; the
host's settings are read as a single run reads them (flags, then the environment).
"""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Any

from pydantic import Field, field_validator

from reducers.models import Frozen
from runner.entry import RunnerArgumentParser, add_disk_flags, add_host_flags, host_flags
from runner.fleet.broker import DEFAULT_INFRA_RETRIES, DEFAULT_NAMESPACE, DEFAULT_QUEUE, check_queue
from runner.settings import SAFE_HOST_PATH, SAFE_TAG
from runner.tasks.spec import HostSettings, build_model, read_operator
from runner.views.server import http_address


class WorkerOptions(Frozen):
    """How one worker runs: its broker and queues, its slots and pacing, and its host's settings.

    Validated whole before the worker connects, so a bad flag is refused with exit 2.
    """

    broker: str
    jobs_dir: Path
    host: HostSettings = Field(default_factory=HostSettings)
    slots: int = Field(1, ge=1, le=64)
    queues: list[str] = Field(default_factory=lambda: [DEFAULT_QUEUE])
    namespace: str = DEFAULT_NAMESPACE
    name: str = Field(default_factory=socket.gethostname)
    heartbeat_timeout: float = Field(60.0, ge=1)
    grace: float | None = None
    min_free_gb: float = 5.0
    check_interval: float = Field(30.0, gt=0)
    max_infra_retries: int = Field(DEFAULT_INFRA_RETRIES, ge=0, le=20)
    retry_backoff: float = Field(15.0, gt=0)
    http: str | None = None  # HOST:PORT of the views (/healthz, /metrics, /); off by default
    keep_trees: str = "all"  # runner.disk_policy.KeepTrees
    prefetch: int = Field(2, ge=0, le=16)  # images of the next messages pulled ahead (with --allow-pull)
    image_budget_gb: float | None = Field(None, gt=0, le=100_000)

    def disk(self) -> Any:  # runner.disk_policy.DiskPolicy
        from runner.disk_policy import DiskPolicy, KeepTrees

        return DiskPolicy(keep_trees=KeepTrees(self.keep_trees), image_budget_gb=self.image_budget_gb)

    @field_validator("keep_trees")
    @classmethod
    def _keep_trees(cls, value: str) -> str:
        if value not in ("all", "failed", "none"):
            raise ValueError("must be all, failed or none")
        return value

    @field_validator("queues")
    @classmethod
    def _queues(cls, value: list[str]) -> list[str]:
        for queue in value:
            check_queue(queue)
        return value

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not SAFE_TAG.fullmatch(value):
            raise ValueError("must be letters, digits, '_', '.' or '-' (it is shown as the task's host)")
        return value

    @field_validator("jobs_dir")
    @classmethod
    def _jobs_dir(cls, value: Path) -> Path:
        value = value.expanduser().resolve()
        if not SAFE_HOST_PATH.fullmatch(str(value)):
            raise ValueError("must be a path of letters, digits and '_ . @ + / ~ -', without spaces")
        value.mkdir(parents=True, exist_ok=True)  # as every command that takes --jobs-dir
        return value

    @field_validator("http")
    @classmethod
    def _http(cls, value: str | None) -> str | None:
        if value is not None:
            http_address(value)  # refuses a malformed address before anything starts
        return value


def build_parser() -> RunnerArgumentParser:
    parser = RunnerArgumentParser(prog="python -m runner worker",
                                  description="The runner daemon: take tasks from the fleet's queue and run them.")
    parser.add_argument("--broker", required=True, help="redis://HOST:PORT/DB")
    parser.add_argument("--jobs-dir", type=Path, required=True,
                        help="job roots go to DIR/<suite>/<tag>/attempt-<i> (created when missing)")
    parser.add_argument("--slots", type=int, default=1, help="tasks run at once (default 1)")
    parser.add_argument("--queue", action="append", dest="queues", help=f"queue to take from (repeatable; default {DEFAULT_QUEUE})")
    parser.add_argument("--heartbeat-timeout", type=float, default=60.0, metavar="SECONDS",
                        help="a worker silent this long is dead: its tasks go back to the queue (default 60)")
    parser.add_argument("--grace", type=float, metavar="SECONDS",
                        help="after the first SIGTERM, interrupt running tasks after this long (default: wait)")
    parser.add_argument("--min-free-gb", type=float, default=5.0, help="free disk wanted on the jobs dir and Docker's data root")
    parser.add_argument("--check-interval", type=float, default=30.0, metavar="SECONDS", help="host checks (default 30)")
    parser.add_argument("--max-infra-retries", type=int, default=DEFAULT_INFRA_RETRIES,
                        help=f"requeues of a task failed by infrastructure (default {DEFAULT_INFRA_RETRIES}); agent failures never")
    parser.add_argument("--retry-backoff", type=float, default=15.0, metavar="SECONDS", help="first retry delay (default 15)")
    parser.add_argument("--name", default=socket.gethostname(), help="this host's name in the ledger (default: hostname)")
    parser.add_argument("--http", metavar="HOST:PORT",
                        help="serve /healthz, /metrics and a status page there (off by default; keep it on loopback)")
    parser.add_argument("--namespace", default=None, help="prefix of every Redis key (env RUNNER_FLEET_NAMESPACE)")
    disk = parser.add_argument_group("what the host's disks keep, and pull ahead")
    add_disk_flags(disk)
    disk.add_argument("--prefetch", type=int, default=2, metavar="N",
                      help="with --allow-pull: pull the images of the next N messages of the queues while tasks "
                      "run, so a task does not wait for its pull (default 2; 0 turns it off); they count as "
                      "needed for --image-budget-gb")
    add_host_flags(parser)
    return parser


def options_from(args: Any) -> WorkerOptions:
    """The worker's options from its flags; its host settings as a single run reads them (flags, then env).

    Raises:
        BadInputError: naming the flag that is wrong.
    """
    host = read_operator(host_flags(args)).host
    values = {
        "broker": args.broker, "jobs_dir": args.jobs_dir, "host": host, "slots": args.slots,
        "queues": args.queues or [DEFAULT_QUEUE], "name": args.name,
        "namespace": args.namespace or os.environ.get("RUNNER_FLEET_NAMESPACE") or DEFAULT_NAMESPACE,
        "heartbeat_timeout": args.heartbeat_timeout, "grace": args.grace, "min_free_gb": args.min_free_gb,
        "check_interval": args.check_interval, "max_infra_retries": args.max_infra_retries,
        "retry_backoff": args.retry_backoff, "http": args.http, "keep_trees": args.keep_trees or "all",
        "image_budget_gb": args.image_budget_gb, "prefetch": args.prefetch,
    }
    return build_model(WorkerOptions, values)
