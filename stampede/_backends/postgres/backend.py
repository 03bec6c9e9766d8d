"""The PostgreSQL family's backend: values, leases, queues and wake-ups all in the
database, over a psycopg_pool ``ConnectionPool`` (extra ``postgres``)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from ..._core.backend import Backend, BackendOptions
from ..._errors import ConfigError
from ..breaker import CircuitBreaker
from .astore import AsyncPostgresStore
from .inspect import PostgresInspector
from .listener import PostgresListener
from .pools import AsyncConnections, Connections, make_pool
from .schema import MAX_KEY_LENGTH
from .store import PostgresStore

NEAR_REFUSAL = "near_cache needs Redis's client-side caching to keep copies exact: the PostgreSQL store has none"


def postgres_backend(pool: Any, options: BackendOptions, *, owns_pool: bool) -> Backend:
    """A backend over ``pool``. It closes the pool on close if ``owns_pool``."""
    from psycopg_pool import ConnectionPool

    if not isinstance(pool, ConnectionPool):
        raise ConfigError(f"postgres= takes a postgresql:// URL or a psycopg_pool.ConnectionPool, got {pool!r}")
    settings = options.settings
    if settings.max_key_length > MAX_KEY_LENGTH:
        raise ConfigError(
            f"max_key_length={settings.max_key_length} is more than PostgreSQL's keys can hold: "
            f"at most {MAX_KEY_LENGTH} (a btree entry holds 2704 bytes); longer entries are "
            "shortened to a prefix and a hash"
        )
    breaker = CircuitBreaker(settings.breaker_threshold, settings.breaker_cooldown, on_change=options.on_breaker_change)
    store, make_async_store = postgres_stores(pool, breaker, owns_pool=owns_pool)
    return Backend(
        name="postgresql",
        store=store,
        make_async_store=make_async_store,
        near_refusal=NEAR_REFUSAL,
        advisory_lock=functools.partial(_advisory_lock, store.pool),
        inspector=PostgresInspector(store),
    )


def postgres_stores(
    pool: Connections, breaker: CircuitBreaker, *, owns_pool: bool
) -> tuple[PostgresStore, Callable[[], AsyncPostgresStore]]:
    """A layer's blocking store over ``pool`` and its maker of each event loop's store,
    whose connections copy this pool's conninfo, connection settings, size and timeout."""
    settings = dict(pool.kwargs) if isinstance(pool.kwargs, dict) else {}
    conninfo = pool.conninfo if isinstance(pool.conninfo, str) else ""
    listener = PostgresListener(conninfo, settings, pool.timeout)
    store = PostgresStore(pool, breaker, listener, pool.timeout, owns_pool=owns_pool)
    max_connections = pool.max_size

    def make() -> AsyncPostgresStore:
        connections = AsyncConnections(conninfo, settings, max_connections, pool.timeout)
        return AsyncPostgresStore(connections, breaker, listener, pool.timeout, owns_pool=True)

    return store, make


def _advisory_lock(
    pool: Any,
    namespace: str,
    name: str,
    *,
    blocking: bool,
    timeout: float | None,
    loop_store: Callable[[], Any] | None,
) -> Any:
    """PostgreSQL's session lock on a connection of the layer's pool, or of the event
    loop's (``loop_store().pool``) for a task."""
    from .advisory import AdvisoryLock

    loop_pool = None if loop_store is None else (lambda: loop_store().pool)
    return AdvisoryLock(namespace, name, pool, loop_pool, blocking=blocking, timeout=timeout)


__all__ = ["make_pool", "postgres_backend"]
