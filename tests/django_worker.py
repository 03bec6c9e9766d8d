"""A worker process for the Django backend's tests: Django configured with one cache,
``StampedeCache`` at ``--location``, whose callers all ``get_or_set`` one cold key.

Prints "ready" once connected and waits for "go". Then ``--callers`` threads (or tasks of
one event loop, with ``--asyncio``), released together by a barrier, each call
``cache.get_or_set`` (``aget_or_set``) of ``--key``. The default counts itself on the
server (``INCR <key>:calls``) and takes ``--hold`` seconds, as a query would. Prints one
JSON line: what each caller got.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import threading
import time
from typing import Any

import django
import redis
from django.conf import settings


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--location", required=True)
    parser.add_argument("--namespace", required=True)
    parser.add_argument("--key", default="page")
    parser.add_argument("--callers", type=int, default=16)
    parser.add_argument("--hold", type=float, default=0.3)
    parser.add_argument("--asyncio", action="store_true")
    options = parser.parse_args()
    settings.configure(
        CACHES={
            "default": {
                "BACKEND": "stampede.django.StampedeCache",
                "LOCATION": options.location,
                "OPTIONS": {"namespace": options.namespace},
            }
        }
    )
    django.setup()
    from django.core.cache import cache

    counter = redis.Redis.from_url(options.location, socket_timeout=5)
    calls = f"{options.namespace}:{options.key}:calls"

    def default() -> dict[str, Any]:
        number = counter.incr(calls)
        time.sleep(options.hold)
        return {"rendered_by_call": number}

    cache.has_key("warm-up")  # connect before "go"
    print("ready", flush=True)
    if sys.stdin.readline().strip() != "go":
        return
    if options.asyncio:
        got = asyncio.run(_tasks(cache, options.key, options.callers, default))
    else:
        got = _threads(cache, options.key, options.callers, default)
    print(json.dumps({"got": got, "stats": cache.layer.stats()}), flush=True)


def _threads(cache: Any, key: str, callers: int, default: Any) -> list[Any]:
    barrier = threading.Barrier(callers)
    got: list[Any] = [None] * callers

    def call(index: int) -> None:
        barrier.wait()
        got[index] = cache.get_or_set(key, default, timeout=60)

    threads = [threading.Thread(target=call, args=(index,)) for index in range(callers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return got


async def _tasks(cache: Any, key: str, callers: int, default: Any) -> list[Any]:
    async def call() -> Any:
        return await cache.aget_or_set(key, default, timeout=60)

    return list(await asyncio.gather(*(call() for _ in range(callers))))


if __name__ == "__main__":
    main()
