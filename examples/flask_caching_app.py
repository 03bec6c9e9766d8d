"""A Flask app whose Flask-Caching decorators collapse misses across processes: four
worker processes of 16 threads ask for one cold page (``@cache.cached``) and one cold
report (``@cache.memoize``) at once, and each is rendered once.

    python examples/flask_caching_app.py                                  # a throwaway server
    python examples/flask_caching_app.py --redis redis://127.0.0.1:6379/0
    python examples/flask_caching_app.py --flask-caching                  # Flask-Caching's own Cache

The app is Flask-Caching's usual one, but for two lines: ``CACHE_TYPE`` names stampede's
type, and ``Cache`` is ``stampede.flask_caching.Cache``. With ``--flask-caching`` the
same app uses ``flask_caching.Cache`` over Flask-Caching's own ``RedisCache``: each
process's threads render the page themselves. Renders are counted on the server, so the
count is the same whichever process rendered. Exits non-zero unless stampede rendered
each once.
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
import uuid
from typing import Any

import redis
from bursts import run_workers
from flask import Flask

from stampede.testing import server_url

PROCESSES, THREADS, HOLD = 4, 16, 0.3  # a render takes HOLD seconds, as a page's queries would


def make_app(url: str, namespace: str, theirs: bool) -> tuple[Flask, Any]:
    app = Flask(__name__)
    if theirs:  # Flask-Caching as it comes: its Cache over its RedisCache
        import flask_caching

        app.config.update(CACHE_TYPE="RedisCache", CACHE_REDIS_URL=url, CACHE_KEY_PREFIX=f"{namespace}:")
        return app, flask_caching.Cache(app)
    from stampede.flask_caching import Cache

    app.config.update(
        CACHE_TYPE="stampede.flask_caching.StampedeCache",
        CACHE_STAMPEDE_URL=url,
        CACHE_STAMPEDE_OPTIONS={"namespace": namespace},
    )
    return app, Cache(app)


def worker(url: str, namespace: str, theirs: bool, start: Any) -> None:
    app, cache = make_app(url, namespace, theirs)
    server = redis.Redis.from_url(url, socket_timeout=5)

    def render(what: str) -> str:
        server.incr(f"{namespace}:renders:{what}")
        time.sleep(HOLD)
        return f"{what} rendered at {time.time():.3f}"

    @app.route("/categories")
    @cache.cached(timeout=60)
    def categories() -> str:
        return render("page")

    @cache.memoize(60)
    def sales(year: int) -> str:
        return render("report")

    def ask() -> None:
        start.wait()
        app.test_client().get("/categories")
        with app.app_context():
            sales(2026)

    with app.app_context():
        cache.has("warm-up")  # connected before the burst
    threads = [threading.Thread(target=ask) for _ in range(THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--redis", help="a Redis URL; default: a throwaway server on 127.0.0.1")
    parser.add_argument("--flask-caching", action="store_true", help="Flask-Caching's own Cache, for comparison")
    options = parser.parse_args()
    with server_url(options.redis) as url:
        namespace = f"flask-{uuid.uuid4().hex[:8]}"
        clean = run_workers(worker, PROCESSES, PROCESSES * THREADS, url, namespace, options.flask_caching)
        server = redis.Redis.from_url(url, socket_timeout=5)
        renders = {what: int(server.get(f"{namespace}:renders:{what}") or 0) for what in ("page", "report")}
        who = "flask_caching.Cache" if options.flask_caching else "stampede.flask_caching.Cache"
        print(f"{who}: {PROCESSES} processes x {THREADS} threads asked for one cold page and one cold report")
        print(f"  page renders: {renders['page']}, report renders: {renders['report']}")
        if not clean:
            sys.exit("a worker process failed")
        if not options.flask_caching:
            if renders != {"page": 1, "report": 1}:
                sys.exit("expected one render of each")
            print("OK")


if __name__ == "__main__":
    main()
