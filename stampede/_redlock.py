"""Redlock: one lock over N independent Redis servers, held when a majority grant it.

The algorithm (as its author specified it):

1. take a random token and the time;
2. on every server, SET the lock key to the token, NX, PX ttl, each with a short socket
   timeout so a dead server costs little;
3. the lock is held if a majority (N // 2 + 1) granted it and time is left: the validity
   is ttl, minus the time the attempt took, minus an allowance for clock drift between
   the servers (``clock_drift_factor`` x ttl + 2 ms);
4. otherwise release it everywhere (compare-and-delete, by token) and retry after a
   random delay, so contending clients do not retry in step.

Its assumptions, stated honestly: it is safe only while processes pause for less than
the validity and server clocks run at about the same rate; a server that restarts
without persistence forgets the locks it granted (keep it down for a ttl after a crash,
or run it with fsync'd AOF). It has no fencing token: a majority drawn afresh each time
gives no number that always grows. For correctness-critical uses (a paused ex-holder
must not write) use a single-server ``layer.lock`` and its ``fence``, checked by the
resource; use Redlock where a lock must survive the loss of a minority of servers and
an occasional overlap is tolerable (efficiency, not correctness).

Waiters retry after a random delay rather than listening for a release: N servers
publish N messages with no order between them.
"""

from __future__ import annotations

import random
import secrets
import time
from typing import Any, Sequence

import redis
from redis.exceptions import RedisError

from . import _scripts
from ._errors import ConfigError, LockLost, LockNotOwned, WaitTimeout
from ._flow import milliseconds
from ._keys import EntryKeys, lock_keys

FAILURES = (RedisError, OSError)


class Redlock:
    """A lock manager over several independent servers: ``Redlock(urls).lock(name)``."""

    def __init__(
        self,
        servers: Sequence[str | redis.Redis],
        *,
        namespace: str = "stampede",
        socket_timeout: float = 0.05,
        clock_drift_factor: float = 0.01,
        max_key_length: int = 200,
    ) -> None:
        if len(servers) < 1:
            raise ConfigError("Redlock needs at least one server (five is the usual number)")
        if not 0 <= clock_drift_factor < 1:
            raise ConfigError(f"clock_drift_factor must be in [0, 1), got {clock_drift_factor!r}")
        self._owned = [isinstance(server, str) for server in servers]
        self.clients: list[redis.Redis] = [
            redis.Redis.from_url(server, socket_timeout=socket_timeout, socket_connect_timeout=socket_timeout,
                                 retry_on_timeout=False, retry=None)  # fmt: skip
            if isinstance(server, str)
            else server
            for server in servers
        ]
        self.quorum = len(self.clients) // 2 + 1
        self.namespace = namespace
        self.clock_drift_factor = clock_drift_factor
        self._max_key_length = max_key_length
        self._release = [client.register_script(_scripts.RELEASE) for client in self.clients]
        self._renew = [client.register_script(_scripts.RENEW) for client in self.clients]

    def lock(
        self,
        name: str,
        *,
        ttl: float = 10.0,
        blocking: bool = True,
        timeout: float | None = None,
        retry_delay: float = 0.2,
        retries: int | None = None,
    ) -> RedlockLock:
        """A lock named ``name`` over all the servers; see ``RedlockLock``."""
        keys = lock_keys(self.namespace, name, self._max_key_length)
        return RedlockLock(self, name, keys, ttl, blocking, timeout, retry_delay, retries)

    def close(self) -> None:
        for client, owned in zip(self.clients, self._owned, strict=True):
            if owned:
                client.close()

    def __enter__(self) -> Redlock:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # --- one command on every server; each failure counts as a refusal ----------------

    def take_everywhere(self, keys: EntryKeys, token: str, ttl_ms: int) -> int:
        granted = 0
        for client in self.clients:
            try:
                granted += bool(client.set(keys.lock, token, nx=True, px=ttl_ms))
            except FAILURES:
                pass
        return granted

    def release_everywhere(self, keys: EntryKeys, token: str) -> int:
        released = 0
        for script in self._release:
            try:
                released += bool(script(keys=[keys.lock], args=[token, keys.channel]))
            except FAILURES:
                pass
        return released

    def renew_everywhere(self, keys: EntryKeys, token: str, ttl_ms: int) -> int:
        renewed = 0
        for script in self._renew:
            try:
                renewed += bool(script(keys=[keys.lock], args=[token, ttl_ms]))
            except FAILURES:
                pass
        return renewed

    def holders(self, keys: EntryKeys) -> list[bytes | None]:
        tokens: list[bytes | None] = []
        for client in self.clients:
            try:
                tokens.append(client.get(keys.lock))  # type: ignore[arg-type]
            except FAILURES:
                tokens.append(None)
        return tokens


class RedlockLock:
    """One holder of a Redlock lock (make one per use). ``validity`` is how long the lock
    is safely held from the moment ``acquire`` returned True: finish within it, or
    ``extend``. There is no automatic renewal and no fencing token (see the module)."""

    def __init__(
        self,
        manager: Redlock,
        name: str,
        keys: EntryKeys,
        ttl: float,
        blocking: bool,
        timeout: float | None,
        retry_delay: float,
        retries: int | None,
    ) -> None:
        if ttl <= 0 or retry_delay < 0 or (timeout is not None and timeout < 0) or (retries or 0) < 0:
            raise ConfigError(f"Redlock lock {name!r}: ttl must be > 0; timeout, retry_delay and retries >= 0")
        self._manager = manager
        self.name = name
        self.keys = keys
        self.ttl = ttl
        self.blocking = blocking
        self.timeout = timeout
        self.retry_delay = retry_delay
        self.retries = retries
        self.token: str | None = None
        self.valid_until: float | None = None  # time.monotonic() deadline of the validity
        self.last_granted = 0  # how many servers granted the last attempt

    @property
    def validity(self) -> float:
        """Seconds of validity left (0 when not held)."""
        return 0.0 if self.valid_until is None else max(self.valid_until - time.monotonic(), 0.0)

    def acquire(self, blocking: bool | None = None, timeout: float | None = None) -> bool:
        """Take the lock on a majority within its validity; True once held."""
        if self.token is not None:
            raise LockNotOwned(f"Redlock lock {self.name!r} is already held by this object", key=self.keys.lock)
        blocking = self.blocking if blocking is None else blocking
        timeout = self.timeout if timeout is None else timeout
        deadline = None if timeout is None else time.monotonic() + timeout
        tries_left = self.retries
        manager, ttl_ms = self._manager, milliseconds(self.ttl)
        while True:
            token = secrets.token_hex(16)
            started = time.monotonic()
            self.last_granted = manager.take_everywhere(self.keys, token, ttl_ms)
            drift = self.ttl * manager.clock_drift_factor + 0.002
            valid_until = started + self.ttl - drift
            if self.last_granted >= manager.quorum and time.monotonic() < valid_until:
                self.token, self.valid_until = token, valid_until
                return True
            manager.release_everywhere(self.keys, token)  # undo a minority (or a late majority)
            if not blocking or (tries_left is not None and tries_left <= 0):
                return False
            pause = random.uniform(0, self.retry_delay)
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                pause = min(pause, left)
            if tries_left is not None:
                tries_left -= 1
            time.sleep(pause)

    def release(self) -> None:
        """Release on every server. LockNotOwned if not held; LockLost if a majority no
        longer held it (its validity ran out: the work may have overlapped another's)."""
        token = self._held()
        self.token = self.valid_until = None
        if self._manager.release_everywhere(self.keys, token) < self._manager.quorum:
            raise self._lost("released")

    def extend(self, ttl: float | None = None) -> None:
        """Reset the lease to ``ttl`` on every server that still holds it; LockLost unless
        a majority did within the new validity."""
        token = self._held()
        ttl = ttl or self.ttl
        started = time.monotonic()
        renewed = self._manager.renew_everywhere(self.keys, token, milliseconds(ttl))
        valid_until = started + ttl - (ttl * self._manager.clock_drift_factor + 0.002)
        if renewed < self._manager.quorum or time.monotonic() >= valid_until:
            self.token = self.valid_until = None
            self._manager.release_everywhere(self.keys, token)
            raise self._lost("extended")
        self.valid_until = valid_until

    def locked(self) -> bool:
        """Whether a majority of servers hold one same token now."""
        tokens = [token for token in self._manager.holders(self.keys) if token is not None]
        return any(tokens.count(token) >= self._manager.quorum for token in set(tokens))

    def owned(self) -> bool:
        if self.token is None or self.validity <= 0:
            return False
        mine = self.token.encode()
        return sum(token == mine for token in self._manager.holders(self.keys)) >= self._manager.quorum

    def __enter__(self) -> RedlockLock:
        if not self.acquire():
            raise WaitTimeout(
                f"could not acquire Redlock lock {self.name!r}: {self.last_granted} of "
                f"{len(self._manager.clients)} servers granted the last attempt, {self._manager.quorum} needed",
                key=self.keys.lock,
            )
        return self

    def __exit__(self, exc_type: Any, exc: Any, traceback: Any) -> None:
        try:
            self.release()
        except LockLost:
            if exc_type is None:
                raise

    def _held(self) -> str:
        if self.token is None:
            raise LockNotOwned(f"Redlock lock {self.name!r} is not held by this object", key=self.keys.lock)
        return self.token

    def _lost(self, what: str) -> LockLost:
        return LockLost(
            f"Redlock lock {self.name!r} could not be {what} on a majority: its validity had run out, "
            "so the work done under it may have overlapped another holder's",
            key=self.keys.lock,
        )
