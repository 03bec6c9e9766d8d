"""The backend seam: what a layer needs of the store it runs over.

A backend family builds one ``Backend`` for a layer. The families are Redis (one server,
Sentinel, Cluster), PostgreSQL and the embedded store, with Redlock or ZooKeeper leases
beside Redis. The layer composes the backend with the drivers and asks nothing else of
it: the layer never names a family.

What a backend says about itself:

* its stores: the blocking one, and a maker of one event loop's store.
* where a load's lease is held (``lease_policy``), and the lock servers the policy needs
  beside the stores (Redlock's, ZooKeeper's).
* where named locks live (``named_lock_store``), and their own line if they have one.
* whether it can keep a near cache exact (``make_tracker``), and if not, why not.
* capabilities only some families have (``advisory_lock``: PostgreSQL's session lock,
  ``inspector``: what the command line reads of a shared store).
* what to close, in two steps: lease services before the stores, connections after.

Rules of the imports: this module is part of the core. It names no family.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from .._errors import ConfigError
from .config import Settings
from .keys import EntryKeys
from .leases import ONE_SERVER, LeasePolicy
from .store import AsyncLockServers, AsyncStore, LockServers, Store
from .tags import TagKeys

DEFAULT_SOCKET_TIMEOUT = 2.0  # seconds: from_url's, and what a client without one is taken to have
DEFAULT_CONNECT_TIMEOUT = 1.0


class Tracking(Protocol):
    """A near cache's invalidation stream and lease (``_backends.redis.tracking``)."""

    def start(self) -> None: ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class EntryState:
    """What a shared store holds for one entry, as the command line shows it."""

    raw: bytes | None  # the envelope, or None
    ttl_ms: int  # what is left of the value's life (-1: no expiry, meaningless without a value)
    holder: str | None  # the lease's token, or "!failed" during a failed load's hold
    lock_ttl_ms: int
    failing: bool  # the loader failed and a stale value stands in
    waiting: int | None  # processes subscribed to the entry's wake-ups (None: the store cannot tell)
    tags: list[str] | None = None  # the tags the value was written with (None: none, or no value)


@dataclass(frozen=True)
class LeaseState:
    """One lease in flight: a load's, or a named lock's."""

    lock_key: str
    holder: str
    ttl_ms: int
    fence: int | None  # a named lock's last fencing token (None: the store keeps none per lock)
    queued: int | None  # a named lock's waiters in line


class Inspector(Protocol):
    """Reads a shared store's entries and leases without taking part (``stampede`` CLI)."""

    def describe(self, keys: EntryKeys) -> EntryState: ...

    def leases(self, namespace: str) -> list[LeaseState]: ...

    def tagged(self, tag: TagKeys) -> int:
        """How many live entries carry ``tag`` (what ``invalidate_tag`` would invalidate)."""
        ...


@dataclass(frozen=True)
class BackendOptions:
    """What every family is built with, from the layer's own settings."""

    namespace: str
    settings: Settings
    max_entries: int  # the embedded store's bound
    on_breaker_change: Callable[[bool], None]  # the layer's report when a circuit opens or closes


def _same(store: Any) -> Any:
    return store


@dataclass(frozen=True)
class LeaseService:
    """Lock servers that hold every load's lease beside a backend's own store, under a lease
    policy of the core: Redlock's majority (``_core.majority``), ZooKeeper's sessions
    (``_core.sessions``). ``Backend.with_leases`` composes one into a new backend; nothing
    rewrites a backend once built."""

    name: str  # what the backend's name gains: "redlock", "zookeeper"
    policy: LeasePolicy
    servers: LockServers  # for blocking callers
    make_async_servers: Callable[[], AsyncLockServers] | None = None  # one event loop's
    named_lock_store: Callable[[Any], Any] | None = None  # named locks' store, where the service keeps their line
    async_named_lock_store: Callable[[Any], Any] | None = None
    lock_queue: Any = None  # that line (ZooKeeper's): named locks are then all fair
    close: Callable[[], None] | None = None  # stops the service, before the stores close


@dataclass(eq=False)
class Backend:
    """One layer's backend. Built by one family (``stampede._backend`` chooses which)."""

    name: str  # what the layer's repr shows: "redis", "postgresql", "memory", "redis+redlock", ...
    store: Store | None  # None: no blocking client was given
    make_async_store: Callable[[], AsyncStore] | None  # None: no asyncio client was given
    in_process: bool = False  # the store lives in this process: a near cache adds nothing
    near_refusal: str | None = None  # why near_cache cannot be kept exact here (None: it can)
    make_tracker: Callable[[Any, float], Tracking] | None = None  # (the near cache's copies, its lease)
    lease_policy: LeasePolicy = ONE_SERVER  # where a load's lease is held (``_core.leases``)
    lock_servers: LockServers | None = None  # the policy's servers, for blocking callers
    make_async_lock_servers: Callable[[], AsyncLockServers] | None = None  # one event loop's
    named_lock_store: Callable[[Any], Any] = _same  # the store named locks use, given a loader's
    async_named_lock_store: Callable[[Any], Any] = _same  # the same, given one event loop's
    lock_queue: Any = None  # named locks' own line beside the store (ZooKeeper's): all are fair
    advisory_lock: Callable[..., Any] | None = None  # a database session lock, where there is one
    inspector: Inspector | None = None  # None: the store is not shared (the embedded store's)
    close_first: list[Callable[[], None]] = field(default_factory=list)  # lease services
    close_last: list[Callable[[], None]] = field(default_factory=list)  # connections it opened
    tracker: Tracking | None = None  # made by track()
    takes_lease_services: bool = False  # Redlock's or ZooKeeper's leases may sit beside it (Redis's)

    def with_leases(self, service: LeaseService) -> Backend:
        """A new backend: this one's stores, with every load's lease held under ``service``'s
        policy on its servers as well (``redlock=``, ``zookeeper=``). Refused for a backend
        whose leases are already held elsewhere, or whose family takes no lease service."""
        self.check_takes_leases(service.name)
        return replace(
            self,
            name=f"{self.name}+{service.name}",
            lease_policy=service.policy,
            lock_servers=service.servers,
            make_async_lock_servers=service.make_async_servers if self.make_async_store is not None else None,
            named_lock_store=service.named_lock_store or self.named_lock_store,
            async_named_lock_store=service.async_named_lock_store or self.async_named_lock_store,
            lock_queue=service.lock_queue if service.lock_queue is not None else self.lock_queue,
            close_first=[*self.close_first, *([service.close] if service.close is not None else [])],
            close_last=list(self.close_last),
        )

    def check_takes_leases(self, service: str) -> None:
        """``ConfigError`` unless the lease service named ``service`` may be composed onto
        this backend (``with_leases``): asked before the service connects anywhere."""
        if not self.takes_lease_services:
            raise ConfigError(f"{service} leases sit beside a Redis cache server; the {self.name} backend takes none")
        if self.lease_policy is not ONE_SERVER:
            raise ConfigError(f"the {self.name} backend holds its leases elsewhere already: one lease service at most")

    def track(self, copies: Any, lease: float) -> None:
        """Make (not start) the stream that keeps ``copies`` exact."""
        assert self.make_tracker is not None, "track() on a backend without near-cache tracking"
        self.tracker = self.make_tracker(copies, lease)

    def start_tracking(self) -> None:
        if self.tracker is not None:
            self.tracker.start()

    def close_services(self) -> None:
        """Stop lease services and the tracking stream, before the stores close."""
        for close in self.close_first:
            close()
        self.close_first.clear()
        if self.tracker is not None:
            self.tracker.close()

    def close_connections(self) -> None:
        """Close what the backend opened for itself, after the stores closed."""
        for close in self.close_last:
            close()
        self.close_last.clear()
