"""Cache-aside with no protection at all: GET, and on a miss run the query and SET.

This is what stampede replaces, kept here as the baseline that the demo and the load
test run with "protection off": every caller that misses runs the query, so a key that
expires under load sends every concurrent caller to the database at once.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import orjson
import redis
import redis.asyncio


def read_through(client: redis.Redis, key: str, ttl: float, query: Callable[[], Any]) -> Any:
    cached = client.get(key)
    if cached is not None:
        return orjson.loads(cached)  # type: ignore[arg-type]
    value = query()
    client.set(key, orjson.dumps(value), px=max(1, int(ttl * 1000)))
    return value


async def aread_through(client: redis.asyncio.Redis, key: str, ttl: float, query: Callable[[], Awaitable[Any]]) -> Any:
    cached = await client.get(key)
    if cached is not None:
        return orjson.loads(cached)
    value = await query()
    await client.set(key, orjson.dumps(value), px=max(1, int(ttl * 1000)))
    return value
