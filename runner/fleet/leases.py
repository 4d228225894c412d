"""A lease per (suite, tag, attempt): who runs the task now.

Dramatiq delivers at least once (a redelivery after a heartbeat timeout, a retry, a
resubmission): the lease makes "at most one Codex run at a time" hold anyway.
Invariants: taken with SET NX and a TTL; renewed and released only by its holder
(compare-and-set in Lua), so a holder that died loses it after its TTL and a late
renewal can never steal it back from the next holder (it takes back only a lease that
nobody holds).
"""

from __future__ import annotations

import redis

_RENEW = """
local holder = redis.call('get', KEYS[1])
if holder == ARGV[1] then return redis.call('pexpire', KEYS[1], ARGV[2]) end
if not holder then
  redis.call('set', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return 2
end
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
        """False when the lease is someone else's now.

        A lease that is simply gone (it expired while the broker could not be reached, or the
        broker came back empty after a restart) is taken again: its task still runs here and
        nobody else holds it, so stopping it would throw its work away for nothing.
        """
        return bool(self._client.eval(_RENEW, 1, self.key, self.holder, self._ttl_ms))

    def release(self) -> None:
        self._client.eval(_RELEASE, 1, self.key, self.holder)

    def current_holder(self) -> str | None:
        value = self._client.get(self.key)
        return value.decode() if isinstance(value, bytes) else value
