"""A pass-through to the real Docker Engine's socket that the test can cut, as a daemon that stops.

Not a fake Docker: every byte goes to and from the real engine. When a client sends a
request whose line contains ``cut_on`` (``/archive``, ``/attach``, ...), the proxy stops
answering at that instant: the request is never forwarded, every open connection is
closed and the socket file removed, so new connections fail as with a stopped daemon.
With ``hold_on``, a request whose line contains it is held that long before it is forwarded
(``held`` is set meanwhile): a daemon slow to take a request, while the client waits for it.
With ``stall_on``, the answer to such a request is forwarded up to ``stall_after`` bytes and then
no more, its connection left open (``stalled`` is set): a daemon stopped mid-stream (SIGSTOP, a
hung disk), with the engine's real bytes before it; with ``drip_on`` the answer keeps coming, its
real bytes ``drip_bytes`` at a time every ``drip_seconds``: a stream that takes for ever.
The connection of a stalled or dripping answer ends when its client closes it, as the daemon's would.
"""

from __future__ import annotations

import os
import socket
import tempfile
import threading
import time
from pathlib import Path


def engine_socket() -> str:
    host = os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")
    assert host.startswith("unix://"), f"the proxy needs a unix socket DOCKER_HOST, not {host}"
    return host[len("unix://"):]


class _Answer:
    """What the proxy does with one connection's answers (set by the request that asks for it)."""

    def __init__(self) -> None:
        self.mode: str | None = None  # None: forwarded as it comes; "stall" or "drip"
        self.sent = 0
        self.closed = threading.Event()  # the client's side ended


class CuttableDockerProxy:
    def __init__(
        self, cut_on: bytes | None = None, *, hold_on: bytes | None = None, hold_seconds: float = 0.0,
        stall_on: bytes | None = None, stall_after: int = 1 << 20,
        drip_on: bytes | None = None, drip_bytes: int = 16384, drip_seconds: float = 0.05,
    ) -> None:
        self.cut_on = cut_on
        self.hold_on, self.hold_seconds = hold_on, hold_seconds
        self.stall_on, self.stall_after = stall_on, stall_after
        self.drip_on, self.drip_bytes, self.drip_seconds = drip_on, drip_bytes, drip_seconds
        self.stalled = threading.Event()
        self.dripping = threading.Event()
        self.held = threading.Event()
        self.cut = threading.Event()
        self._dir = tempfile.mkdtemp(prefix="dproxy-", dir="/tmp")  # short: unix socket paths are limited
        self.path = Path(self._dir) / "docker.sock"
        self._target = engine_socket()
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._listener.bind(str(self.path))
        self._listener.listen(64)
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def docker_host(self) -> str:
        return f"unix://{self.path}"

    def _track(self, sock: socket.socket) -> None:
        with self._lock:
            self._sockets.append(sock)

    def _accept(self) -> None:
        while not self.cut.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            upstream.connect(self._target)
            self._track(client)
            self._track(upstream)
            answer = _Answer()
            threading.Thread(target=self._pump, args=(client, upstream, True, answer), daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, client, False, answer), daemon=True).start()

    def _slowed(self, answer: _Answer, data: bytes, sink: socket.socket) -> bool:
        """Forward an answer the test slows; False once it stalls (nothing more is sent)."""
        if answer.mode == "stall":
            room = self.stall_after - answer.sent
            if room > 0:
                sink.sendall(data[:room])
                answer.sent += min(room, len(data))
            if answer.sent >= self.stall_after:
                self.stalled.set()
                return False
            return True
        self.dripping.set()
        for start in range(0, len(data), self.drip_bytes):
            sink.sendall(data[start:start + self.drip_bytes])
            time.sleep(self.drip_seconds)
        return True

    def _pump(self, source: socket.socket, sink: socket.socket, from_client: bool, answer: _Answer) -> None:
        half_closed = False
        try:
            while True:
                data = source.recv(65536)
                if not data and from_client and not self.cut.is_set():
                    # The client half-closed (an attach's stdin ended, as `docker run -i` does): the
                    # engine hears the same, and its answer still comes back (the other pump ends it).
                    half_closed = True
                    sink.shutdown(socket.SHUT_WR)
                    return
                if not data or self.cut.is_set():
                    break
                if not from_client and answer.mode is not None:
                    if not self._slowed(answer, data, sink):
                        answer.closed.wait()  # stopped mid-stream: read no more, send nothing, until the client goes
                        break
                    continue
                line = data.split(b"\r\n", 1)[0] if from_client else b""
                if from_client and self.stall_on is not None and self.stall_on in line:
                    answer.mode = "stall"
                elif from_client and self.drip_on is not None and self.drip_on in line:
                    answer.mode = "drip"
                if self.cut_on is not None and self.cut_on in line:
                    self.stop()
                    break
                if self.hold_on is not None and self.hold_on in line and not self.held.is_set():
                    self.held.set()  # the first such request only
                    time.sleep(self.hold_seconds)
                sink.sendall(data)
        except OSError:
            pass
        finally:
            if from_client:
                answer.closed.set()
            for sock in () if half_closed else (source, sink):
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def stop(self) -> None:
        """The daemon 'stops': no more answers, no new connections."""
        self.cut.set()
        try:
            self.path.unlink()
        except FileNotFoundError:
            pass
        with self._lock:
            sockets = [self._listener, *self._sockets]
        for sock in sockets:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sock.close()

    def close(self) -> None:
        self.stop()
        try:
            os.rmdir(self._dir)
        except OSError:
            pass
