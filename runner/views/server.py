"""The worker's HTTP views: ``/healthz``, ``/metrics`` and ``/`` (the status page).

Invariants: read-only (GET only, nothing a request can change); every response is
built from a ``StatusSource`` snapshot through the public guard; metric label values
come only from closed sets (task state, phase, token kind, outcome, slot state, check
name pattern); the metrics live in the server's own ``CollectorRegistry``, so two
servers in one process (tests) never share a counter. Binds loopback unless told otherwise.
"""

from __future__ import annotations

import json
import socket
import threading
from dataclasses import dataclass
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import structlog
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from runner.errors import BadInputError
from runner.views.document import health_view, outcome, suite_document
from runner.views.model import FINISHED_STATES, TIMED_PHASES, TOKEN_KINDS, HealthReport, StatusSource, TaskRow, TaskState
from runner.views.pages import render_status_page
from runner.views.public import public_document, view_private_texts

log = structlog.get_logger(__name__)

# From a tenth of a second (prepare) to two hours (a slow codex run).
PHASE_BUCKETS = (0.1, 0.5, 1, 2, 5, 10, 30, 60, 120, 300, 600, 1200, 1800, 3600, 7200)
OUTCOMES = ("resolved", "unresolved", "infra", "failed")
LOOPBACK = frozenset({"127.0.0.1", "::1", "localhost"})


class SuiteMetrics:
    """The Prometheus metrics of one server, in its own registry.

    Gauges are set from each snapshot; counters and the phase histogram count the
    finished tasks this process has seen (``sync`` records each finished row once,
    again only if its result changes, e.g. a retried infrastructure failure). So a
    worker needs no metrics hook: its rows are the one record, read at each scrape.
    ``counted_host``: when the source holds the whole suite (every host's rows), only
    this host's finished rows are counted, so summing the workers' counters counts
    each task once; ``runner_tasks`` still shows the suite.
    """

    def __init__(self, counted_host: str | None = None) -> None:
        self.counted_host = counted_host
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.tasks = Gauge("runner_tasks", "Tasks of the suite by state.", ["state"], registry=r)
        self.slots = Gauge("runner_slots", "This worker's task slots, busy or free.", ["state"], registry=r)
        self.taking_work = Gauge("runner_taking_work", "1 when this worker takes tasks.", registry=r)
        self.draining = Gauge("runner_draining", "1 while this worker drains.", registry=r)
        self.check_ok = Gauge("runner_host_check_ok", "1 when the host check passes.", ["check"], registry=r)
        self.phase_seconds = Histogram(
            "runner_phase_duration_seconds", "Duration of each phase of the finished tasks.", ["phase"],
            buckets=PHASE_BUCKETS, registry=r,
        )
        self.finished = Counter("runner_tasks_finished", "Finished tasks by outcome.", ["outcome"], registry=r)
        self.resolved = Counter("runner_tasks_resolved", "Finished tasks that resolved.", registry=r)
        self.infra = Counter("runner_tasks_infra_failed", "Tasks that failed for an infrastructure reason.", registry=r)
        self.tokens = Counter("runner_codex_tokens", "Codex tokens of the finished tasks, by kind.", ["kind"], registry=r)
        for state in TaskState:
            self.tasks.labels(state=state.value)
        for phase in TIMED_PHASES:
            self.phase_seconds.labels(phase=phase)
        for name in OUTCOMES:
            self.finished.labels(outcome=name)
        for kind in TOKEN_KINDS:
            self.tokens.labels(kind=kind)
        self._seen: dict[tuple[str, str, int], tuple[Any, ...]] = {}
        self._lock = threading.Lock()

    def record_finished(self, row: TaskRow) -> None:
        for phase, seconds in row.phase_seconds.items():
            self.phase_seconds.labels(phase=phase).observe(seconds)  # phases and values checked by TaskRow
        self.finished.labels(outcome=outcome(row)).inc()
        if row.resolved:
            self.resolved.inc()
        if row.infra_failure:
            self.infra.inc()
        for kind in TOKEN_KINDS:
            self.tokens.labels(kind=kind).inc(row.tokens.get(kind, 0))

    def sync(self, rows: list[TaskRow], health: HealthReport) -> None:
        with self._lock:
            for state in TaskState:
                self.tasks.labels(state=state.value).set(sum(1 for row in rows if row.state is state))
            self.slots.labels(state="busy").set(health.slots_busy)
            self.slots.labels(state="free").set(max(0, health.slots_total - health.slots_busy))
            self.taking_work.set(1 if health.taking_work else 0)
            self.draining.set(1 if health.draining else 0)
            for check in health.checks:
                self.check_ok.labels(check=check.name).set(1 if check.ok else 0)
            for row in rows:
                if row.state not in FINISHED_STATES:
                    continue
                if self.counted_host is not None and row.host != self.counted_host:
                    continue
                signature = (row.state, row.resolved, row.infra_failure, row.failure_label, row.wall_seconds)
                if self._seen.get(row.key) != signature:
                    self._seen[row.key] = signature
                    self.record_finished(row)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


def http_address(value: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[::1]:PORT`` for IPv6) as given to ``worker --http``.

    Raises:
        BadInputError: not HOST:PORT, or the port is not 1..65535.
    """
    host, sep, port = value.rpartition(":")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise BadInputError(f"--http wants HOST:PORT, e.g. 127.0.0.1:9464 (got {value[:60]!r})")
    return host, int(port)


@dataclass
class ViewConfig:
    source: StatusSource
    title: str
    private_texts: list[str]
    refresh_seconds: int
    metrics: SuiteMetrics


class _Handler(BaseHTTPRequestHandler):
    server: _ViewServer
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the stdlib's name
        """Access lines go to structlog at debug level, not to stderr as text."""

    def _send(self, status: int, body: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.send_header("X-Content-Type-Options", "nosniff")
        self.send_header("Content-Security-Policy", "default-src 'none'; style-src 'unsafe-inline'; img-src data:")
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
        config = self.server.config
        path = self.path.split("?", 1)[0]
        try:
            if path == "/healthz":
                health = config.source.health()
                body = public_document("healthz", health_view(health), config.private_texts)
                status = HTTPStatus.OK if health.healthy else HTTPStatus.SERVICE_UNAVAILABLE
                self._send(status, json.dumps(body, indent=2).encode(), "application/json")
            elif path == "/metrics":
                config.metrics.sync(config.source.rows(), config.source.health())
                self._send(HTTPStatus.OK, config.metrics.exposition(), CONTENT_TYPE_LATEST)
            elif path in ("/", "/index.html"):
                doc = suite_document(config.title, config.source.rows(), config.private_texts,
                                     health=config.source.health())
                html = render_status_page(doc, refresh_seconds=config.refresh_seconds)
                self._send(HTTPStatus.OK, html.encode(), "text/html; charset=utf-8")
            else:
                self._send(HTTPStatus.NOT_FOUND, b"not found: try / , /healthz or /metrics\n", "text/plain")
        except Exception as e:  # a bad snapshot must not kill the server; its text may be private
            log.error("view_failed", path=path if path in ("/", "/healthz", "/metrics") else "other",
                      error_type=type(e).__name__)
            self._send(HTTPStatus.INTERNAL_SERVER_ERROR, f"view failed ({type(e).__name__})\n".encode(), "text/plain")


class _ViewServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: tuple[str, int], config: ViewConfig) -> None:
        self.config = config
        if ":" in address[0]:
            self.address_family = socket.AF_INET6
        super().__init__(address, _Handler)


def make_server(
    source: StatusSource,
    host: str = "127.0.0.1",
    port: int = 0,
    *,
    title: str = "runner suite status",
    private_texts: list[str] | None = None,
    refresh_seconds: int = 5,
    counted_host: str | None = None,
) -> _ViewServer:
    """A bound, not yet serving, server (``port=0`` picks a free port: ``server.server_address``).

    ``private_texts``: this host's own (its jobs dir, the broker URL), added to the home
    directory and the secret values; ``counted_host``: see ``SuiteMetrics``.
    """
    if host not in LOOPBACK:
        log.warning("views_not_loopback", host=host, hint="the status page is readable by anyone who reaches it")
    config = ViewConfig(source=source, title=title, private_texts=view_private_texts(private_texts or []),
                        refresh_seconds=refresh_seconds, metrics=SuiteMetrics(counted_host))
    return _ViewServer((host, port), config)


def serve(source: StatusSource, host: str = "127.0.0.1", port: int = 0, **options: Any) -> None:
    """Serve the views until interrupted (blocks). ``options`` as for ``make_server``."""
    server = make_server(source, host, port, **options)
    log.info("views_serving", host=host, port=server.server_address[1])
    try:
        server.serve_forever()
    finally:
        server.server_close()


class BackgroundServer:
    """The views on a daemon thread, for a worker (``with BackgroundServer(...) as views:``)."""

    def __init__(self, source: StatusSource, host: str = "127.0.0.1", port: int = 0, **options: Any) -> None:
        self.server = make_server(source, host, port, **options)
        self._thread = threading.Thread(target=self.server.serve_forever, name="views", daemon=True)

    @property
    def url(self) -> str:
        host, port = self.server.server_address[:2]
        return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"

    @property
    def metrics(self) -> SuiteMetrics:
        return self.server.config.metrics

    def __enter__(self) -> BackgroundServer:
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
        self._thread.join(timeout=10)
