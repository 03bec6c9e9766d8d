"""The Redis backend: the Store over a redis-py client, its scripts and its subscriber.

Every redis-py failure (connection refused, timeout, an error reply such as OOM or
READONLY) leaves this module as ``BackendUnavailable``, which the flow turns into policy.
"""

from __future__ import annotations

import asyncio
from contextlib import contextmanager
from typing import Any, Iterator

import redis
from redis.exceptions import RedisError

from . import _scripts
from ._breaker import CircuitBreaker
from ._errors import BackendUnavailable, ConfigError
from ._flow import AcquireReply, LockState
from ._keys import EntryKeys
from ._notify import Subscriber, Subscription

# What a failing command raises, blocking or asyncio (on Python 3.10 asyncio's timeout
# is not an OSError); of those, what says the server could not be reached.
FAILURES = (RedisError, OSError, asyncio.TimeoutError)
UNREACHABLE = (redis.ConnectionError, redis.TimeoutError, OSError, asyncio.TimeoutError)


@contextmanager
def translated(what: str, key: str, breaker: CircuitBreaker) -> Iterator[None]:
    """One command: refused at once while the circuit is open; its failure translated to
    BackendUnavailable and its outcome told to the breaker."""
    breaker.check(key)
    try:
        yield
    except FAILURES as error:
        raise failure(breaker, what, key, error) from error
    breaker.succeeded()


def failure(breaker: CircuitBreaker, what: str, key: str, error: BaseException) -> BackendUnavailable:
    """Tell the breaker about a failed command (an error reply means the server is
    there), and translate the error."""
    breaker.failed() if isinstance(error, UNREACHABLE) else breaker.succeeded()
    return BackendUnavailable(f"redis failed to {what} {key!r}: {error}", key=key)


def acquire_reply(reply: Any) -> AcquireReply:
    """The ACQUIRE script's reply as the flow's ``AcquireReply``."""
    state = reply[0]
    if state == 1:
        return AcquireReply(LockState.VALUE, reply[1])
    if state == 2:
        return AcquireReply(LockState.LOCKED, fence=int(reply[1]) if len(reply) > 1 else 0)
    return AcquireReply(LockState.HELD, lease_left=max(int(reply[1]), 0) / 1000)


class Scripts:
    """The backend's scripts registered on a client, blocking or asyncio (both clients
    call them by EVALSHA and load them again after NOSCRIPT)."""

    def __init__(self, client: Any) -> None:
        self.acquire = client.register_script(_scripts.ACQUIRE)
        self.write_release = client.register_script(_scripts.WRITE_AND_RELEASE)
        self.renew = client.register_script(_scripts.RENEW)
        self.release = client.register_script(_scripts.RELEASE)
        self.invalidate = client.register_script(_scripts.INVALIDATE)
        self.take_lock = client.register_script(_scripts.TAKE_LOCK)
        self.take_lock_fairly = client.register_script(_scripts.TAKE_LOCK_FAIRLY)
        self.leave_queue = client.register_script(_scripts.LEAVE_QUEUE)


def check_client(client: Any) -> None:
    if client.connection_pool.connection_kwargs.get("decode_responses"):
        raise ConfigError("the redis client must not use decode_responses=True: values are bytes")


class RedisStore:
    """A Store on one Redis server (or anything speaking its protocol)."""

    def __init__(self, client: redis.Redis, subscribe_timeout: float, breaker: CircuitBreaker) -> None:
        check_client(client)
        self.client = client
        self.breaker = breaker
        self._scripts = Scripts(client)
        self._subscriber = Subscriber(client, subscribe_timeout)

    def get(self, key: str) -> bytes | None:
        # The hit path: a plain try costs less than the context manager the others use.
        breaker = self.breaker
        breaker.check(key)
        try:
            raw: bytes | None = self.client.get(key)  # type: ignore[assignment]
        except FAILURES as error:
            raise failure(breaker, "read", key, error) from error
        breaker.succeeded()
        return raw

    def acquire(self, keys: EntryKeys, token: str, lease_ms: int, check_value: bool) -> AcquireReply:
        with translated("lock", keys.value, self.breaker):
            reply: Any = self._scripts.acquire(
                keys=[keys.value, keys.lock], args=[token, lease_ms, "1" if check_value else "0"]
            )
        return acquire_reply(reply)

    def renew(self, keys: EntryKeys, token: str, lease_ms: int) -> bool:
        with translated("renew the lease of", keys.value, self.breaker):
            return bool(self._scripts.renew(keys=[keys.lock], args=[token, lease_ms]))

    def write_release(self, keys: EntryKeys, token: str, envelope: bytes, ttl_ms: int, inline: bool) -> bool:
        with translated("write", keys.value, self.breaker):
            written = self._scripts.write_release(
                keys=[keys.value, keys.lock],
                args=[token, envelope, ttl_ms, keys.channel, "1" if inline else "0"],
            )
        return bool(written)

    def release(self, keys: EntryKeys, token: str) -> bool:
        with translated("release the lock of", keys.value, self.breaker):
            return bool(self._scripts.release(keys=[keys.lock], args=[token, keys.channel]))

    def holder(self, keys: EntryKeys) -> str | None:
        with translated("read the lock of", keys.lock, self.breaker):
            token: Any = self.client.get(keys.lock)
        return None if token is None else bytes(token).decode(errors="replace")

    def take_lock(self, keys: EntryKeys, token: str, lease_ms: int, queue_ms: int = 0) -> AcquireReply:
        with translated("lock", keys.lock, self.breaker):
            if queue_ms:
                reply: Any = self._scripts.take_lock_fairly(
                    keys=[keys.value, keys.lock, *keys.queue], args=[token, lease_ms, queue_ms]
                )
            else:
                reply = self._scripts.take_lock(keys=[keys.value, keys.lock], args=[token, lease_ms])
        return acquire_reply(reply)

    def leave_queue(self, keys: EntryKeys, token: str) -> None:
        with translated("leave the queue of", keys.lock, self.breaker):
            queue, waiters, _ = keys.queue
            self._scripts.leave_queue(keys=[queue, waiters], args=[token, keys.channel])

    def invalidate(self, keys: EntryKeys) -> None:
        with translated("invalidate", keys.value, self.breaker):
            self._scripts.invalidate(keys=[keys.value, keys.lock], args=[keys.channel])

    def subscribe(self, keys: EntryKeys) -> Subscription:
        return self._subscriber.subscribe(keys.channel)

    def close(self) -> None:
        self._subscriber.close()
