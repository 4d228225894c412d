"""The views server under idle, slow and too many clients (issue 21, item 9): real sockets on loopback.

The server runs with its defaults (a request must arrive within 5 s of the connection or of
the previous response; 32 connections at once), as a worker's ``--http`` runs it.
"""

from __future__ import annotations

import socket
import threading
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from runner.views.model import HealthReport, SnapshotSource, TaskRow
from runner.views.server import BackgroundServer

REQUEST_TIMEOUT = 5.0  # runner.views.server.REQUEST_TIMEOUT_SECONDS, the default
MAX_CONNECTIONS = 32  # runner.views.server.MAX_CONNECTIONS, the default
SLACK = 3.0
HEALTHY = HealthReport(checks=[], taking_work=True, slots_busy=0, slots_total=1)


def address(views: BackgroundServer) -> tuple[str, int]:
    host, port = views.server.server_address[:2]
    return host, port


def connect(views: BackgroundServer) -> socket.socket:
    return socket.create_connection(address(views), timeout=10)


def closed_by_server_at(sock: socket.socket, deadline: float) -> float | None:
    """When the server closed ``sock`` (EOF or reset, whatever it sent first), or None if still open at ``deadline``."""
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return None
        sock.settimeout(left)
        try:
            if not sock.recv(65536):
                return time.monotonic()
        except (ConnectionResetError, BrokenPipeError):
            return time.monotonic()
        except TimeoutError:
            return None


def healthz(views: BackgroundServer) -> tuple[int, float]:
    started = time.monotonic()
    with urllib.request.urlopen(views.url + "/healthz", timeout=10) as response:
        response.read()
        return response.status, time.monotonic() - started


def views_threads() -> int:
    return sum(1 for thread in threading.enumerate() if thread.name.startswith("Thread-"))


@contextmanager
def serving(source: SnapshotSource | None = None) -> Iterator[BackgroundServer]:
    with BackgroundServer(source or SnapshotSource(HEALTHY), "127.0.0.1", 0) as views:
        yield views


def test_idle_connections_cannot_starve_healthz_and_are_closed_within_the_timeout() -> None:
    before = views_threads()
    with serving() as views:
        started = time.monotonic()
        idle = [connect(views) for _ in range(3 * MAX_CONNECTIONS)]
        opened = time.monotonic()
        try:
            assert opened - started < 5, "a burst of connections waited on SYN retries (a short listen backlog)"
            time.sleep(0.5)
            assert views_threads() - before <= MAX_CONNECTIONS + 1  # one thread per admitted connection, no more
            status, seconds = healthz(views)
            assert status == 200 and seconds < 1.5, seconds
            closed = [closed_by_server_at(sock, opened + REQUEST_TIMEOUT + SLACK) for sock in idle]
            assert None not in closed, f"{closed.count(None)} idle connections still open"
            assert max(closed) - opened <= REQUEST_TIMEOUT + SLACK
            assert healthz(views)[0] == 200  # and the server is as it was
        finally:
            for sock in idle:
                sock.close()


@pytest.mark.parametrize("trickle", [False, True], ids=["half-a-request-line", "a-byte-a-second"])
def test_a_slow_loris_is_dropped_after_the_request_timeout(trickle: bool) -> None:
    with serving() as views:
        sock = connect(views)
        try:
            started = time.monotonic()
            sock.sendall(b"GET /heal")
            closed = None
            if trickle:  # each byte in time for any per-read timeout, the request never whole
                for byte in b"thz HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 60:
                    if time.monotonic() - started > REQUEST_TIMEOUT + SLACK:
                        break
                    try:
                        sock.sendall(bytes([byte]))
                    except (BrokenPipeError, ConnectionResetError):
                        closed = time.monotonic()
                        break
                    sock.settimeout(1.0)
                    try:
                        if not sock.recv(65536):
                            closed = time.monotonic()
                            break
                    except TimeoutError:
                        pass
                    except ConnectionResetError:
                        closed = time.monotonic()
                        break
            if closed is None:
                closed = closed_by_server_at(sock, started + REQUEST_TIMEOUT + SLACK)
            assert closed is not None, "the slow client is still connected"
            assert REQUEST_TIMEOUT - 1.0 <= closed - started <= REQUEST_TIMEOUT + SLACK, closed - started
            assert healthz(views)[0] == 200
        finally:
            sock.close()


class BlockingSource(SnapshotSource):
    """Rows that take as long as the test wants: every slot busy serving, for real."""

    def __init__(self) -> None:
        super().__init__(HEALTHY)
        self.release = threading.Event()
        self.entered = threading.Semaphore(0)

    def rows(self) -> list[TaskRow]:
        self.entered.release()
        self.release.wait(30)
        return super().rows()


def test_with_every_connection_busy_a_new_one_gets_503_at_once() -> None:
    source = BlockingSource()
    with serving(source) as views:
        busy = [connect(views) for _ in range(MAX_CONNECTIONS)]
        try:
            for sock in busy:
                sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            for _ in busy:
                assert source.entered.acquire(timeout=10), "a request did not reach the source"
            extra = connect(views)
            extra.settimeout(3)
            started = time.monotonic()
            answer = extra.recv(4096)
            assert answer.startswith(b"HTTP/1.1 503 "), answer[:80]
            assert b"Retry-After" in answer and time.monotonic() - started < 1.5
            assert closed_by_server_at(extra, time.monotonic() + 3) is not None
            extra.close()
            source.release.set()
            for sock in busy:
                sock.settimeout(10)
                assert sock.recv(64).startswith(b"HTTP/1.1 200 ")
        finally:
            source.release.set()
            for sock in busy:
                sock.close()


def test_closing_the_views_closes_their_connections() -> None:
    with serving() as views:
        kept = [connect(views) for _ in range(3)]
        for sock in kept:  # a whole request, answered; the connection stays open for the next
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            sock.settimeout(10)
            assert sock.recv(65536).startswith(b"HTTP/1.1 200 ")
    closed_at = time.monotonic()
    try:
        for sock in kept:
            when = closed_by_server_at(sock, closed_at + 1.5)
            assert when is not None, "a connection outlived the server"
    finally:
        for sock in kept:
            sock.close()
