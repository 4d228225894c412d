"""The worker's HTTP views: ``/healthz``, ``/metrics`` and ``/`` (the status page).

Invariants: read-only (GET only, nothing a request can change); every response is
built from a ``StatusSource`` snapshot through the public guard; metric label values
come only from closed sets (task state, phase, token kind, outcome, slot state, check
name pattern); the metrics live in the server's own ``CollectorRegistry``, so two
servers in one process (tests) never share a counter. Binds loopback unless told otherwise.

Bounded, so that idle or slow clients cannot hold the worker's threads: at most
``MAX_CONNECTIONS`` connections have a thread at once (a new one takes the place of the one
that has waited longest for its request; with every connection busy it gets 503); a request
line and headers must arrive within ``REQUEST_TIMEOUT_SECONDS`` of the connection or of the
previous response, however slowly they trickle in; a response may take ``WRITE_TIMEOUT_SECONDS``
to a client that does not read; closing the server closes its connections.
"""

from __future__ import annotations

import io
import json
import socket
import sys
import threading
import time
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
REQUEST_TIMEOUT_SECONDS = 5.0
WRITE_TIMEOUT_SECONDS = 30.0
MAX_CONNECTIONS = 32
_BUSY = (b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain\r\nContent-Length: 33\r\n"
         b"Retry-After: 1\r\nConnection: close\r\n\r\nbusy: every connection is in use\n")


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


@dataclass
class _Connection:
    sock: socket.socket
    waiting_since: float | None  # waiting for its (next) request since then; None while a response is made
    evicted: bool = False


def _shut(sock: socket.socket) -> None:
    """End a connection from any thread: its handler's read returns at once (EOF) and the thread ends."""
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass  # already gone


class _Connections:
    """The server's live connections, at most ``limit`` of them admitted at once.

    Why the eviction: refusing a new connection while idle ones hold every place would let
    a few idle clients (or one slow-loris) take /healthz away; so the one that has waited
    longest for its request makes way. Evicted ones still count until their thread ends
    (at once, their socket shut), and never more than ``limit`` of them.
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._lock = threading.Lock()
        self._live: dict[int, _Connection] = {}

    def admit(self, sock: socket.socket) -> bool:
        with self._lock:
            active = [c for c in self._live.values() if not c.evicted]
            if len(active) >= self.limit:
                waiting = [c for c in active if c.waiting_since is not None]
                if not waiting or len(self._live) >= 2 * self.limit:
                    return False
                oldest = min(waiting, key=lambda c: c.waiting_since or 0.0)
                oldest.evicted = True
                _shut(oldest.sock)
            self._live[id(sock)] = _Connection(sock, time.monotonic())
            return True

    def mark(self, sock: socket.socket, *, waiting: bool) -> None:
        with self._lock:
            connection = self._live.get(id(sock))
            if connection is not None:
                connection.waiting_since = time.monotonic() if waiting else None

    def release(self, sock: socket.socket) -> None:
        with self._lock:
            self._live.pop(id(sock), None)

    def shut_all(self) -> None:
        with self._lock:
            for connection in self._live.values():
                connection.evicted = True
                _shut(connection.sock)

    def __len__(self) -> int:
        with self._lock:
            return len(self._live)


class _DeadlineReader(io.RawIOBase):
    """The request's socket as a stream whose every read stops at the request's deadline.

    Why: a socket timeout alone bounds each read, so a client sending a byte every few seconds
    would hold its thread for ever; here the request line and headers share one deadline.
    """

    def __init__(self, handler: _Handler) -> None:
        super().__init__()
        self._handler = handler

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        deadline = self._handler.read_deadline
        sock = self._handler.connection
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("the request did not arrive in time")
            sock.settimeout(left)
        return sock.recv_into(buffer)


class _Handler(BaseHTTPRequestHandler):
    server: _ViewServer
    protocol_version = "HTTP/1.1"
    timeout = WRITE_TIMEOUT_SECONDS  # the socket's, until a request's deadline takes over
    read_deadline: float | None = None

    def setup(self) -> None:
        super().setup()
        self.rfile.close()  # the stdlib's reader, closed so that the socket really closes at the end
        self.rfile = io.BufferedReader(_DeadlineReader(self))

    def handle_one_request(self) -> None:
        """One request, whose line and headers must all arrive before its deadline."""
        self.read_deadline = time.monotonic() + self.server.request_timeout
        self.server.connections.mark(self.connection, waiting=True)
        super().handle_one_request()

    def _begin_response(self) -> None:
        self.read_deadline = None
        self.server.connections.mark(self.connection, waiting=False)
        self.connection.settimeout(self.server.write_timeout)

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
        self._begin_response()
        path = self.path.split("?", 1)[0]
        try:
            status, body, content_type = self._response(path)
        except Exception as e:  # a bad snapshot must not kill the server; its text may be private
            log.error("view_failed", path=path if path in ("/", "/healthz", "/metrics") else "other",
                      error_type=type(e).__name__)
            status, body, content_type = (HTTPStatus.INTERNAL_SERVER_ERROR,
                                          f"view failed ({type(e).__name__})\n".encode(), "text/plain")
        self._send(status, body, content_type)  # a client gone meanwhile: handle_error, not a second answer

    def _response(self, path: str) -> tuple[HTTPStatus, bytes, str]:
        config = self.server.config
        if path == "/healthz":
            health = config.source.health()
            body = public_document("healthz", health_view(health), config.private_texts)
            status = HTTPStatus.OK if health.healthy else HTTPStatus.SERVICE_UNAVAILABLE
            return status, json.dumps(body, indent=2).encode(), "application/json"
        if path == "/metrics":
            config.metrics.sync(config.source.rows(), config.source.health())
            return HTTPStatus.OK, config.metrics.exposition(), CONTENT_TYPE_LATEST
        if path in ("/", "/index.html"):
            doc = suite_document(config.title, config.source.rows(), config.private_texts,
                                 health=config.source.health())
            html = render_status_page(doc, refresh_seconds=config.refresh_seconds)
            return HTTPStatus.OK, html.encode(), "text/html; charset=utf-8"
        return HTTPStatus.NOT_FOUND, b"not found: try / , /healthz or /metrics\n", "text/plain"


class _ViewServer(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128  # the listen backlog: a burst of clients waits in the kernel, not in SYN retries

    def __init__(self, address: tuple[str, int], config: ViewConfig, *, max_connections: int = MAX_CONNECTIONS,
                 request_timeout: float = REQUEST_TIMEOUT_SECONDS,
                 write_timeout: float = WRITE_TIMEOUT_SECONDS) -> None:
        self.config = config
        self.connections = _Connections(max_connections)
        self.request_timeout = request_timeout
        self.write_timeout = write_timeout
        if ":" in address[0]:
            self.address_family = socket.AF_INET6
        super().__init__(address, _Handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self.connections.admit(request):
            self._refuse(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:  # no thread for it: its place is free again
            self.connections.release(request)
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.connections.release(request)

    def _refuse(self, request: socket.socket) -> None:
        """503 and close, from the accepting thread: a few bytes to a new socket do not block."""
        try:
            request.settimeout(1.0)
            request.sendall(_BUSY)
        except OSError:
            pass
        log.debug("views_busy", connections=len(self.connections))
        self.shutdown_request(request)

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that went away mid-request: a debug line, not a traceback on stderr."""
        log.debug("views_connection_failed", error_type=type(sys.exc_info()[1]).__name__)

    def server_close(self) -> None:
        super().server_close()
        self.connections.shut_all()


def make_server(
    source: StatusSource,
    host: str = "127.0.0.1",
    port: int = 0,
    *,
    title: str = "runner suite status",
    private_texts: list[str] | None = None,
    refresh_seconds: int = 5,
    counted_host: str | None = None,
    max_connections: int = MAX_CONNECTIONS,
    request_timeout: float = REQUEST_TIMEOUT_SECONDS,
) -> _ViewServer:
    """A bound, not yet serving, server (``port=0`` picks a free port: ``server.server_address``).

    ``private_texts``: this host's own (its jobs dir, the broker URL), added to the home
    directory and the secret values; ``counted_host``: see ``SuiteMetrics``;
    ``max_connections``, ``request_timeout``: see the module's docstring.
    """
    if host not in LOOPBACK:
        log.warning("views_not_loopback", host=host, hint="the status page is readable by anyone who reaches it")
    config = ViewConfig(source=source, title=title, private_texts=view_private_texts(private_texts or []),
                        refresh_seconds=refresh_seconds, metrics=SuiteMetrics(counted_host))
    return _ViewServer((host, port), config, max_connections=max_connections, request_timeout=request_timeout)


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
