"""A lease per (suite, tag, attempt): who runs the task now.

Dramatiq delivers at least once (a redelivery after a heartbeat timeout, a retry, a
resubmission): the lease makes "at most one Codex run at a time" hold anyway.
Invariants: taken with SET NX and a TTL; renewed and released only by its holder
(compare-and-set in Lua), so a holder that died loses it after its TTL and a late
renewal can never steal it back from the next holder.
"""

from __future__ import annotations

import redis

_RENEW = """
if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('pexpire', KEYS[1], ARGV[2]) end
return 0
"""
_RELEASE = """
if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end
return 0
"""


class Lease:
    def __init__(self, client: redis.Redis, key: str, holder: str, ttl_seconds: float) -> None:
        self._client = client
        self.key = key
        self.holder = holder
        self._ttl_ms = max(100, int(ttl_seconds * 1000))

    def acquire(self) -> bool:
        return bool(self._client.set(self.key, self.holder, nx=True, px=self._ttl_ms))

    def renew(self) -> bool:
        """False when the lease is no longer ours (expired and maybe taken)."""
        return bool(self._client.eval(_RENEW, 1, self.key, self.holder, self._ttl_ms))

    def release(self) -> None:
        self._client.eval(_RELEASE, 1, self.key, self.holder)

    def current_holder(self) -> str | None:
        value = self._client.get(self.key)
        return value.decode() if isinstance(value, bytes) else value
