"""The Redis backend: the Store over a redis-py client, its scripts and its subscriber.

Every redis-py failure (connection refused, timeout, an error reply such as OOM or
READONLY) leaves this module as ``BackendUnavailable``, which the flow turns into policy.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Iterator

import redis
from redis.exceptions import RedisError

from . import _scripts
from ._errors import BackendUnavailable, ConfigError
from ._flow import AcquireReply, LockState
from ._keys import EntryKeys
from ._notify import Subscriber, Subscription


@contextmanager
def _translated(what: str, key: str) -> Iterator[None]:
    try:
        yield
    except (RedisError, OSError) as error:
        raise BackendUnavailable(f"redis failed to {what} {key!r}: {error}", key=key) from error


class RedisStore:
    """A Store on one Redis server (or anything speaking its protocol)."""

    def __init__(self, client: redis.Redis, subscribe_timeout: float) -> None:
        if client.connection_pool.connection_kwargs.get("decode_responses"):
            raise ConfigError("the redis client must not use decode_responses=True: values are bytes")
        self.client = client
        self._acquire = client.register_script(_scripts.ACQUIRE)
        self._write_release = client.register_script(_scripts.WRITE_AND_RELEASE)
        self._renew = client.register_script(_scripts.RENEW)
        self._release = client.register_script(_scripts.RELEASE)
        self._invalidate = client.register_script(_scripts.INVALIDATE)
        self._subscriber = Subscriber(client, subscribe_timeout)

    def get(self, key: str) -> bytes | None:
        # The hit path: a plain try costs less than the context manager the others use.
        try:
            raw: bytes | None = self.client.get(key)  # type: ignore[assignment]
        except (RedisError, OSError) as error:
            raise BackendUnavailable(f"redis failed to read {key!r}: {error}", key=key) from error
        return raw

    def acquire(self, keys: EntryKeys, token: str, lease_ms: int, check_value: bool) -> AcquireReply:
        with _translated("lock", keys.value):
            reply: Any = self._acquire(
                keys=[keys.value, keys.lock], args=[token, lease_ms, "1" if check_value else "0"]
            )
        state = reply[0]
        if state == 1:
            return AcquireReply(LockState.VALUE, reply[1])
        if state == 2:
            return AcquireReply(LockState.LOCKED)
        return AcquireReply(LockState.HELD, lease_left=max(int(reply[1]), 0) / 1000)

    def renew(self, keys: EntryKeys, token: str, lease_ms: int) -> bool:
        with _translated("renew the lease of", keys.value):
            return bool(self._renew(keys=[keys.lock], args=[token, lease_ms]))

    def write_release(self, keys: EntryKeys, token: str, envelope: bytes, ttl_ms: int, inline: bool) -> bool:
        with _translated("write", keys.value):
            written = self._write_release(
                keys=[keys.value, keys.lock],
                args=[token, envelope, ttl_ms, keys.channel, "1" if inline else "0"],
            )
        return bool(written)

    def release(self, keys: EntryKeys, token: str) -> None:
        with _translated("release the lock of", keys.value):
            self._release(keys=[keys.lock], args=[token, keys.channel])

    def invalidate(self, keys: EntryKeys) -> None:
        with _translated("invalidate", keys.value):
            self._invalidate(keys=[keys.value, keys.lock], args=[keys.channel])

    def subscribe(self, keys: EntryKeys) -> Subscription:
        return self._subscriber.subscribe(keys.channel)

    def close(self) -> None:
        self._subscriber.close()
