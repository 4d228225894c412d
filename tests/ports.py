"""A free TCP port on loopback, for the servers a test (or a bench) starts of its own: a registry, a
redis-server. A plain module (no pytest), so ``bench/`` imports it as the tests do."""

from __future__ import annotations

import socket


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]
