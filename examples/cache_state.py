"""What the cache held for an entry when a database query of it began: the note the load
test writes into the shop's query log (``ShopDatabase.note``), so that a query it did not
expect (a second one in an entry's expiry window) explains itself."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import redis

from stampede import Stampede
from stampede._core.keys import EntryKeys

NOTED = ("redis_errors", "wait_timeouts", "takeovers", "stale_writes_prevented", "evicted_leases")
"""The counters of the querying process that tell a leased load from another kind."""


def cache_state(layer: Stampede, url: str, value_keys: dict[str, Callable[[str], str]]) -> Callable[[str], str]:
    """A ``ShopDatabase.note`` for queries made through ``layer``'s loaders: the entry's
    TTL left, its lease's holder (the token's start) and TTL left, read with a client of
    its own, and this process's counters. ``value_keys`` maps a query's name ("product") to
    the value key of its argument."""
    client = redis.Redis.from_url(url, socket_timeout=1.0, socket_connect_timeout=1.0)

    def note(what: str) -> str:
        name, _, argument = what.partition(" ")
        keys = EntryKeys.for_value(value_keys[name](argument))
        try:
            pipeline = client.pipeline(transaction=False)
            pipeline.pttl(keys.value)
            pipeline.get(keys.lock)
            pipeline.pttl(keys.lock)
            value_ms, holder, lease_ms = pipeline.execute()
            state = f"value ttl {value_ms} ms, lease {_holder(holder)} ttl {lease_ms} ms"
        except redis.RedisError as error:
            state = f"cache unreadable ({type(error).__name__}: {error})"
        stats: dict[str, Any] = layer.stats()
        counters = ", ".join(f"{name} {stats[name]}" for name in NOTED if stats.get(name))
        return f"{state}; this process: {counters or 'no errors, waits timed out or leases lost'}"

    return note


def _holder(token: bytes | None) -> str:
    if token is None:
        return "free"
    return token[:8].decode(errors="replace")
