"""A worker process for the Flask-Caching tests: a Flask app whose cache is
``stampede.flask_caching.Cache`` of type ``StampedeCache`` at ``--url``, with a view under
``@cache.cached`` and a function under ``@cache.memoize``, both cold.

Prints "ready" once connected and waits for "go". Then ``--callers`` threads, released
together by a barrier, each ask for the page (through the app's test client) or, with
``--memoize``, call the function. Each counts itself on the server (``INCR
<namespace>:calls``) and takes ``--hold`` seconds, as a query would. Prints one JSON line:
what each caller got.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from typing import Any

import redis
from flask import Flask

from stampede.flask_caching import Cache


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", required=True)
    parser.add_argument("--namespace", required=True)
    parser.add_argument("--callers", type=int, default=16)
    parser.add_argument("--hold", type=float, default=0.3)
    parser.add_argument("--memoize", action="store_true")
    options = parser.parse_args()
    app = Flask(__name__)
    app.config.update(
        CACHE_TYPE="stampede.flask_caching.StampedeCache",
        CACHE_STAMPEDE_URL=options.url,
        CACHE_STAMPEDE_OPTIONS={"namespace": options.namespace},
    )
    cache = Cache(app)
    counter = redis.Redis.from_url(options.url, socket_timeout=5)

    def render() -> str:
        number = counter.incr(f"{options.namespace}:calls")
        time.sleep(options.hold)
        return f"rendered by call {number}"

    @app.route("/page")
    @cache.cached(timeout=60)
    def page() -> str:
        return render()

    @cache.memoize(60)
    def report(year: int) -> str:
        return f"{render()} for {year}"

    with app.app_context():
        cache.has("warm-up")  # connect before "go"
    print("ready", flush=True)
    if sys.stdin.readline().strip() != "go":
        return
    barrier = threading.Barrier(options.callers)
    got: list[Any] = [None] * options.callers

    def call(index: int) -> None:
        barrier.wait()
        if options.memoize:
            with app.app_context():
                got[index] = report(2026)
        else:
            got[index] = app.test_client().get("/page").get_data(as_text=True)

    threads = [threading.Thread(target=call, args=(index,)) for index in range(options.callers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    with app.app_context():
        stats = cache.cache.layer.stats()
    print(json.dumps({"got": got, "stats": stats}), flush=True)


if __name__ == "__main__":
    main()
