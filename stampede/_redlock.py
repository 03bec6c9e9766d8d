"""Redlock: one lock over N independent Redis servers, held when a majority grant it.

The algorithm (as its author specified it):

1. take a random token and the time.
2. on every server, SET the lock key to the token, NX, PX ttl, each with a short socket
   timeout so a dead server costs little (asyncio callers ask all servers at once).
3. the lock is held if a majority (N // 2 + 1) granted it and time is left: the validity
   is ttl, minus the time the attempt took, minus an allowance for clock drift between
   the servers (``clock_drift_factor`` x ttl + 2 ms).
4. otherwise release it everywhere (compare-and-delete, by token) and retry after a
   random delay, so contending clients do not retry in step.

While held, the lease is renewed every ttl/3 on every server (compare-and-extend). Each
renewal a majority grants in time moves the validity on, and one that no majority grants
ends the renewals: the holder learns it at release (``LockLost``).

Its assumptions, stated honestly: it is safe only while processes pause for less than
the validity and server clocks run at about the same rate. A server that restarts
without persistence forgets the locks it granted (keep it down for a ttl after a crash,
or run it with fsync'd AOF). It has no fencing token: a majority drawn afresh each time
gives no number that always grows. For correctness-critical uses (a paused ex-holder
must not write) use a single-server ``layer.lock`` and its ``fence``, checked by the
resource. Use Redlock where a lock must survive the loss of a minority of servers and
an occasional overlap is tolerable (efficiency, not correctness).

Waiters retry after a random delay rather than listening for a release: N servers
publish N messages with no order between them.

The decisions are written once, as generators of effects (``_core.majority``, and the
retries below). ``_drivers.perform`` performs them with blocking calls, one server after
another, or with awaits, on all servers at once (``_backends.redis.lock_servers``).
"""

from __future__ import annotations

import asyncio
import random
import secrets
import time
import warnings
import weakref
from collections.abc import Sequence

import redis
import redis.asyncio

from ._backend import AsyncRedisLockServers, RedisLockServers
from ._core.backend import LeaseService
from ._core.effects import Decision, Pause, ServersRelease, milliseconds
from ._core.keys import EntryKeys, lock_keys
from ._core.majority import Quorum, RedlockLeases, renew_majority, take_majority
from ._core.store import Round
from ._drivers.aperform import AsyncPerformer, arun
from ._drivers.perform import Performer, run
from ._drivers.watchdog import Watchdog, WatchedLease, keep_renewed
from ._errors import ConfigError, LockLost, LockNotOwned, WaitTimeout
from ._lock import LockContextManager


class Redlock:
    """A lock manager over several independent servers: ``Redlock(urls).lock(name)``, or
    the lock behind a layer's loads: ``Stampede(client, redlock=Redlock(urls))``.

    Servers given as URLs serve blocking and asyncio callers (asyncio clients are made
    per event loop). Servers given as ``redis.Redis`` clients serve blocking callers only.
    """

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
        if socket_timeout <= 0:
            raise ConfigError(f"socket_timeout must be > 0, got {socket_timeout!r}")
        self._timeouts = dict(socket_timeout=socket_timeout, socket_connect_timeout=socket_timeout)
        self._urls = [server for server in servers if isinstance(server, str)]
        self._owned = [isinstance(server, str) for server in servers]
        self.clients: list[redis.Redis] = [
            redis.Redis.from_url(server, retry_on_timeout=False, retry=None, **self._timeouts)
            if isinstance(server, str)
            else server
            for server in servers
        ]
        self.quorum = Quorum(len(self.clients), clock_drift_factor)
        self.namespace = namespace
        self.servers = RedisLockServers(self.clients)
        self.watchdog = Watchdog()  # renews the leases of blocking holders (a thread, started on first use)
        self._max_key_length = max_key_length
        self._loop_servers: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, AsyncRedisLockServers] = (
            weakref.WeakKeyDictionary()
        )

    def lock(
        self,
        name: str,
        *,
        ttl: float = 10.0,
        blocking: bool = True,
        timeout: float | None = None,
        retry_interval: float = 0.2,
        retries: int | None = None,
        renew: bool = True,
        retry_delay: float | None = None,
    ) -> RedlockLock:
        """A lock named ``name`` over all the servers. See ``RedlockLock``. ``retry_delay``
        is the old name of ``retry_interval`` (a DeprecationWarning)."""
        if retry_delay is not None:
            warnings.warn("retry_delay is deprecated: use retry_interval", DeprecationWarning, stacklevel=2)
            retry_interval = retry_delay
        keys = lock_keys(self.namespace, name, self._max_key_length)
        return RedlockLock(self, name, keys, ttl, blocking, timeout, retry_interval, retries, renew)

    def lease_service(self) -> LeaseService:
        """Every load's lease of a layer held on a majority of these servers as well as on
        its cache server (``redlock=``: ``_core.majority.RedlockLeases``). Named locks stay on
        the cache server: a fencing token and a fair line need one server. The servers'
        clients are this manager's: it closes them, not the layer."""
        return LeaseService("redlock", RedlockLeases(self.quorum), self.servers, self.async_servers)

    def async_servers(self) -> AsyncRedisLockServers:
        """New asyncio clients of every server, for the running event loop."""
        if len(self._urls) != self.quorum.size:
            raise ConfigError("asyncio callers of a Redlock need its servers given as URLs, not clients")
        return AsyncRedisLockServers(
            [
                redis.asyncio.Redis.from_url(url, retry_on_timeout=False, retry=None, **self._timeouts)  # type: ignore[arg-type]
                for url in self._urls
            ]
        )

    def loop_servers(self) -> AsyncRedisLockServers:
        """The running event loop's servers for this manager's own locks."""
        loop = asyncio.get_running_loop()
        servers = self._loop_servers.get(loop)
        if servers is None:
            servers = self._loop_servers[loop] = self.async_servers()
        return servers

    def __repr__(self) -> str:
        return f"<stampede.Redlock {self.quorum.size} servers, {self.quorum.needed} needed>"

    def close(self) -> None:
        """Stop renewing, and close the blocking clients this manager made (``aclose``
        closes asyncio ones)."""
        self.watchdog.close()
        for client, owned in zip(self.clients, self._owned, strict=True):
            if owned:
                client.close()

    async def aclose(self) -> None:
        """Close the running event loop's clients, then the blocking ones."""
        servers = self._loop_servers.pop(asyncio.get_running_loop(), None)
        if servers is not None:
            await servers.aclose()
        self.close()

    def __enter__(self) -> Redlock:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    async def __aenter__(self) -> Redlock:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()


class Renewal:
    """Renews one held ``RedlockLock`` for the watchdog thread."""

    def __init__(self, lock: RedlockLock, servers: RedisLockServers) -> None:
        self._lock, self._servers = lock, servers

    def renew(self, keys: EntryKeys, token: str, lease_ms: int) -> bool:
        return run(self._lock._renewing(token, lease_ms), Performer(servers=self._servers))


class AsyncRenewal:
    """Renews one held ``RedlockLock`` for its renewal task."""

    def __init__(self, lock: RedlockLock, servers: AsyncRedisLockServers) -> None:
        self._lock, self._servers = lock, servers

    async def renew(self, keys: EntryKeys, token: str, lease_ms: int) -> bool:
        return await arun(self._lock._renewing(token, lease_ms), AsyncPerformer(servers=self._servers))


class RedlockLock(LockContextManager):
    """One holder of a Redlock lock (make one per use), for threads (``with``,
    ``acquire``) and tasks (``async with``, ``aacquire``).

    ``validity`` is how long the lock is safely held from now: ttl from the last
    acquisition or renewal, less the time it took and the clock-drift allowance. While
    ``renew`` is on (the default) a majority renews the lease every ttl/3, moving the
    validity on. A renewal that no majority grants in time stops the renewals, and the
    release then raises ``LockLost``. There is no fencing token (see the module)."""

    def __init__(
        self,
        manager: Redlock,
        name: str,
        keys: EntryKeys,
        ttl: float,
        blocking: bool,
        timeout: float | None,
        retry_interval: float,
        retries: int | None,
        renew: bool,
    ) -> None:
        if ttl <= 0 or retry_interval < 0 or (timeout is not None and timeout < 0) or (retries or 0) < 0:
            raise ConfigError(f"Redlock lock {name!r}: ttl must be > 0; timeout, retry_interval and retries >= 0")
        self._manager = manager
        self.name = name
        self.keys = keys
        self.ttl = ttl
        self.blocking = blocking
        self.timeout = timeout
        self.retry_interval = retry_interval
        self.retries = retries
        self.renew = renew
        self.token: str | None = None
        self.valid_until: float | None = None  # time.monotonic() deadline of the validity
        self.last_granted = 0  # how many servers granted the last attempt
        self._lease_ms = milliseconds(ttl)  # what a renewal asks for (extend changes it)
        self._renewal: WatchedLease | asyncio.Future[None] | None = None  # while held and renewed

    @property
    def validity(self) -> float:
        """Seconds of validity left (0 when not held)."""
        if self.token is None or self.valid_until is None:
            return 0.0
        return max(self.valid_until - time.monotonic(), 0.0)

    # --- blocking ---------------------------------------------------------------------

    def acquire(self, blocking: bool | None = None, timeout: float | None = None) -> bool:
        """Take the lock on a majority within its validity. True once held (and renewed
        from then on by the manager's watchdog thread, unless ``renew`` is False)."""
        servers = self._manager.servers
        if not run(self._acquiring(blocking, timeout), Performer(servers=servers)):
            return False
        if self.renew:
            renewal = Renewal(self, servers)
            self._renewal = self._manager.watchdog.watch(renewal, self.keys, self._held(), self._lease_ms)
        return True

    def release(self) -> None:
        """Release on every server. LockNotOwned if not held. LockLost if a majority no
        longer held it (its validity ran out: the work may have overlapped another's)."""
        run(self._releasing(), Performer(servers=self._manager.servers))

    def extend(self, ttl: float | None = None) -> None:
        """Reset the lease to ``ttl`` on every server that still holds it. LockLost unless
        a majority did within the new validity."""
        run(self._extending(ttl), Performer(servers=self._manager.servers))
        if isinstance(self._renewal, WatchedLease):
            self._renewal.lease_ms = self._lease_ms

    def __repr__(self) -> str:
        return f"<stampede.RedlockLock {self.name!r} {'held' if self.token is not None else 'not held'}>"

    def locked(self) -> bool:
        """Whether a majority of servers hold one same token now."""
        return self._majority_holds(self._manager.servers.holders(self.keys), None)

    def owned(self) -> bool:
        if self.token is None or self.validity <= 0:
            return False
        return self._majority_holds(self._manager.servers.holders(self.keys), self.token)

    # --- asyncio ----------------------------------------------------------------------

    async def aacquire(self, blocking: bool | None = None, timeout: float | None = None) -> bool:
        """``acquire`` for a task (renewed by a task of its own, unless ``renew`` is False)."""
        servers = self._manager.loop_servers()
        if not await arun(self._acquiring(blocking, timeout), AsyncPerformer(servers=servers)):
            return False
        if self.renew:
            self._renew_in_task(servers)
        return True

    async def arelease(self) -> None:
        """``release`` for a task."""
        await arun(self._releasing(), AsyncPerformer(servers=self._manager.loop_servers()))

    async def aextend(self, ttl: float | None = None) -> None:
        """``extend`` for a task."""
        servers = self._manager.loop_servers()
        await arun(self._extending(ttl), AsyncPerformer(servers=servers))
        if isinstance(self._renewal, asyncio.Future):
            self._renewal.cancel()
            self._renew_in_task(servers)

    async def alocked(self) -> bool:
        return self._majority_holds(await self._manager.loop_servers().holders(self.keys), None)

    async def aowned(self) -> bool:
        if self.token is None or self.validity <= 0:
            return False
        return self._majority_holds(await self._manager.loop_servers().holders(self.keys), self.token)

    # --- the decisions, once ----------------------------------------------------------

    def _acquiring(self, blocking: bool | None, timeout: float | None) -> Decision[bool]:
        if self.token is not None:
            raise LockNotOwned(f"Redlock lock {self.name!r} is already held by this object", key=self.keys.lock)
        blocking = self.blocking if blocking is None else blocking
        timeout = self.timeout if timeout is None else timeout
        deadline = None if timeout is None else time.monotonic() + timeout
        tries_left = self.retries
        quorum, ttl_ms = self._manager.quorum, milliseconds(self.ttl)
        while True:
            token = secrets.token_hex(16)
            taken, valid_until = yield from take_majority(quorum, self.keys, token, ttl_ms)
            self.last_granted = taken.agreed
            if valid_until is not None:
                self.token, self.valid_until = token, valid_until
                return True
            if not blocking or (tries_left is not None and tries_left <= 0):
                return False
            pause = random.uniform(0, self.retry_interval)
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                pause = min(pause, left)
            if tries_left is not None:
                tries_left -= 1
            yield Pause(pause)

    def _releasing(self) -> Decision[None]:
        token = self._held()
        self._forget()
        released: Round = yield ServersRelease(self.keys, token)
        if released.agreed < self._manager.quorum.needed:
            raise self._lost("released", released)

    def _extending(self, ttl: float | None) -> Decision[None]:
        token = self._held()
        lease_ms = milliseconds(ttl or self.ttl)
        renewed, valid_until = yield from renew_majority(self._manager.quorum, self.keys, token, lease_ms)
        if valid_until is None:
            self._forget()
            yield ServersRelease(self.keys, token)
            raise self._lost("extended", renewed)
        if self.token == token:  # not released meanwhile
            self.valid_until = valid_until
        self._lease_ms = lease_ms  # what the renewals keep from now on

    def _renewing(self, token: str, lease_ms: int) -> Decision[bool]:
        """Reset the lease to ``lease_ms`` on every server. True, and the validity moved on,
        if a majority did so in time."""
        _, valid_until = yield from renew_majority(self._manager.quorum, self.keys, token, lease_ms)
        if valid_until is None:
            return False
        if self.token == token:  # not released meanwhile
            self.valid_until = valid_until
        return True

    def _renew_in_task(self, servers: AsyncRedisLockServers) -> None:
        renewal = AsyncRenewal(self, servers)
        self._renewal = asyncio.ensure_future(keep_renewed(renewal, self.keys, self._held(), self._lease_ms))

    def _forget(self) -> None:
        """No longer held by this object: stop renewing."""
        self.token = self.valid_until = None
        if isinstance(self._renewal, WatchedLease):
            self._renewal.active = False
        elif self._renewal is not None:
            self._renewal.cancel()
        self._renewal = None

    def _majority_holds(self, tokens: list[bytes | None], token: str | None) -> bool:
        held = [held for held in tokens if held is not None]
        candidates = set(held) if token is None else {token.encode()}
        return any(held.count(candidate) >= self._manager.quorum.needed for candidate in candidates)

    def _held(self) -> str:
        if self.token is None:
            raise LockNotOwned(f"Redlock lock {self.name!r} is not held by this object", key=self.keys.lock)
        return self.token

    def _timed_out(self) -> WaitTimeout:
        return WaitTimeout(
            f"could not acquire Redlock lock {self.name!r}: {self.last_granted} of {self._manager.quorum.size} "
            f"servers granted the last attempt, {self._manager.quorum.needed} needed",
            key=self.keys.lock,
        )

    def _lost(self, what: str, answers: Round) -> LockLost:
        """Why a majority did not confirm: servers that answered no (the lease had ended
        there), or that did not answer in ``socket_timeout`` (down or slow: whether they
        still held it is unknown). Either way the work may have overlapped another's."""
        unanswered = f", {answers.failed} did not answer in time" if answers.failed else ""
        return LockLost(
            f"Redlock lock {self.name!r} could not be {what} on a majority ({answers.agreed} of "
            f"{self._manager.quorum.size} confirmed{unanswered}): its validity may have run out, "
            "so the work done under it may have overlapped another holder's",
            key=self.keys.lock,
        )
