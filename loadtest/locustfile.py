"""Locust: hundreds of users over several processes read through the cache, and the
database's query log says how many queries each key cost per expiry.

    locust -f loadtest/locustfile.py --headless -u 60 -r 60 -t 20s --processes 2

On its own like this, it starts what it was not given, on 127.0.0.1, and stops it when
Locust exits: a throwaway server (no ``--redis-url``), a fresh shop database (no
``--db``) and the web app over both (no ``--host``); see ``standalone.py``. Or against
what you run, the web app (examples/web_app.py) serving the same database:

    locust -f loadtest/locustfile.py --headless --processes 4 -u 200 -r 100 -t 60s \\
        --host http://127.0.0.1:8000 --redis-url redis://127.0.0.1:6379/0 \\
        --db shop.sqlite --ttl 3 --protection on

``python loadtest/run_locust.py`` runs it twice, protection off then on, and prints the
two side by side.

Two kinds of readers, as many of each, and a writer:

* ``DirectUser`` calls cached loaders in its own process. Locust runs users as gevent
  greenlets, so stampede runs monkey-patched: its lease watchdog and its pub/sub
  subscriber are greenlets too.
* ``WebUser`` calls the web app over HTTP on 127.0.0.1.

* ``WriterUser`` (two of them, idle unless ``--writer``) updates products, then
  invalidates them (``correct``) or forgets to (``broken``): with ``--history DIR`` every
  process records its product calls, loads and writes there, and ``--verify-sample``
  verifies product hits (loadtest/locust_consistency.py reads both).

Both read the same entries (namespace "shop", the same templates), so "one query per
key per expiry" must hold across the web app and every Locust process together. Keys
are picked with a long-tailed popularity (a few hot shops and products, many cold ones,
and a shop that does not exist), and TTLs are a few seconds, so entries expire all the
time under load. ``--protection off`` runs the same users over plain cache-aside.

When the run ends, the master reads the query log and prints queries per key per
expiry window (see expiry_windows.py); with protection on it exits non-zero if any key
was queried twice in one window.
"""

from __future__ import annotations

import json
import os
import random
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from locust import FastHttpUser, User, between, events, task
from locust.runners import WorkerRunner

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))

import redis
from cache_aside import read_through
from cache_state import cache_state
from category_map import make_category_map
from expiry_windows import expiry_windows, explain, summarize
from shop import CATEGORY_MAP_ENTRY, PRODUCT_ENTRY, ShopDatabase
from standalone import Standalone

from stampede import Settings, Stampede, verifying
from stampede.testing import Recorder

SHOPS = [f"shop-{index}" for index in range(20)] + ["no-such-shop"]
SHOP_WEIGHTS = [1 / (rank + 1) for rank in range(20)] + [0.2]
PRODUCTS = [*list(range(1, 41)), 999999]
PRODUCT_WEIGHTS = [1 / (rank + 1) for rank in range(40)] + [0.1]


# What this process starts when the command line does not name it. Locust parses the
# command line once, in the process that then forks its workers, and argparse converts a
# string default through the option's type only when the option is absent: so each
# "auto" below starts its part there, once, and the workers inherit the parsed values.
STANDALONE = Standalone()
AUTO = "auto"


STOP_TIMEOUT = 10.0
"""Seconds a user is given to finish the call it is in when the run ends (Locust's
``--stop-timeout``, unless the command line sets one). Locust kills users at once by
default: a user killed mid-load releases the lease unwritten (as any interrupted caller
does), and the next caller queries again, a second query in what looked like one
expiry window though its first value was never cached."""


def _redis_url(value: str) -> str:
    STANDALONE.redis_url = STANDALONE.server() if value == AUTO else value
    return STANDALONE.redis_url


def _database(value: str) -> str:
    STANDALONE.db = STANDALONE.database() if value == AUTO else value
    return STANDALONE.db


def _ttl(value: str) -> float:
    STANDALONE.ttl = float(value)
    return STANDALONE.ttl


def _protection(value: str) -> str:
    STANDALONE.protection = value
    return value


def _web_app(value: str) -> str:
    """Start the web app for WebUser unless --host names one (it is parsed last)."""
    named = os.environ.get("LOCUST_HOST") or any(arg.startswith(("--host", "-H")) for arg in sys.argv)
    if value == AUTO and not named:
        WebUser.host = STANDALONE.web_app()
    return value


@events.init_command_line_parser.add_listener
def _options(parser: Any) -> None:
    parser.set_defaults(stop_timeout=STOP_TIMEOUT)  # an explicit --stop-timeout (even 0) wins
    group = parser.add_argument_group("stampede")
    group.add_argument(
        "--redis-url",
        type=_redis_url,
        default=os.environ.get("STAMPEDE_REDIS_URL", AUTO),
        help="the cache's Redis (default: STAMPEDE_REDIS_URL, else a throwaway server)",
    )
    group.add_argument(
        "--db", type=_database, default=AUTO, help="the shop database (examples/shop.py) the web app also reads"
    )
    group.add_argument("--ttl", type=_ttl, default="3.0", help="seconds an entry stays cached")
    group.add_argument("--protection", type=_protection, choices=("on", "off"), default="on")
    group.add_argument("--summary", help="write the query-log figures to this JSON file")
    group.add_argument(
        "--web-app", type=_web_app, default=AUTO, help="'auto': start the web app unless --host is given"
    )
    group.add_argument(
        "--writer", choices=("none", "correct", "broken"), default="none",
        help="WriterUser updates products, then invalidates them (correct) or not (broken)",
    )  # fmt: skip
    group.add_argument("--verify-sample", type=float, default=0.0, help="the products' verify_sample")
    group.add_argument("--history", default="", help="a directory: every process records its product calls there")


def pick_shop() -> str:
    return random.choices(SHOPS, SHOP_WEIGHTS)[0]


def pick_product() -> int:
    return random.choices(PRODUCTS, PRODUCT_WEIGHTS)[0]


class Loaders:
    """This process's way to the data: cached loaders (protection on) or cache-aside. With
    ``--history``, every product call, load and write of the process is recorded
    (``stampede.testing.Recorder``, streamed to a file there), and the products' layer
    (a layer of its own, of the same namespace, so that its ``stats()`` are theirs)
    verifies ``--verify-sample`` of its hits."""

    def __init__(self, options: Any) -> None:
        database = ShopDatabase(options.db)
        self.database = database
        ttl = options.ttl
        self.recorder: Recorder | None = None
        self.web_recorder: Recorder | None = None
        if options.history:
            pid = os.getpid()
            self.recorder = Recorder(f"direct-{pid}", stream=Path(options.history) / f"direct-{pid}.jsonl")
            self.web_recorder = Recorder(f"web-{pid}", stream=Path(options.history) / f"web-{pid}.jsonl")
        self.products_layer: Stampede | None = None
        if options.protection == "on":
            layer = Stampede.from_url(options.redis_url, namespace="shop")
            products = layer
            if options.history:  # verify_grace: the writer invalidates within milliseconds
                products = Stampede.from_url(
                    options.redis_url, namespace="shop", verify_sample=options.verify_sample, verify_grace=0.05
                )
                self.products_layer = products
            category_map = make_category_map(layer, database, ttl)
            product = products.cached_loader(PRODUCT_ENTRY, ttl=ttl, null_ttl=ttl)(self._recorded(database.product))
            self.category_map: Callable[[str], Any] = category_map
            self.product: Callable[[int], Any] = product
            self.invalidate: Callable[[int], Any] = product.invalidate
            database.note = cache_state(layer, options.redis_url, {
                "category_map": category_map.key,
                "product": lambda argument: product.key(int(argument)),
            })  # fmt: skip
        else:
            client = redis.Redis.from_url(options.redis_url, socket_timeout=5)
            self.category_map = lambda shop: read_through(
                client, "off:" + CATEGORY_MAP_ENTRY.format(shop=shop), ttl, lambda: database.category_map(shop)
            )
            self.product = lambda product_id: read_through(
                client, "off:" + PRODUCT_ENTRY.format(product_id=product_id), ttl, lambda: database.product(product_id)
            )
            self.invalidate = lambda product_id: client.delete("off:" + PRODUCT_ENTRY.format(product_id=product_id))

    def _recorded(self, load: Callable[[int], Any]) -> Callable[[int], Any]:
        """``load``, each run recorded as a load (a verification's as "verify")."""
        recorder = self.recorder
        if recorder is None:
            return load

        def product(product_id: int) -> Any:
            with recorder.op("verify" if verifying() else "load", product_id) as op:
                value = load(product_id)
                if value is not None:
                    op.saw(value["version"], source=value["id"])
                return value

        product.__name__ = load.__name__
        return product


_loaders: dict[int, Loaders] = {}


def loaders(options: Any) -> Loaders:
    """Built on first use in each process: Locust forks its worker processes after
    importing this file, and connections must not cross a fork."""
    pid = os.getpid()
    if pid not in _loaders:
        _loaders[pid] = Loaders(options)
    return _loaders[pid]


class DirectUser(User):
    """Calls the loaders in this process, as application code does."""

    wait_time = between(0.05, 0.25)

    def _call(self, name: str, load: Callable[[], Any]) -> None:
        started = time.perf_counter()
        error: Exception | None = None
        try:
            load()
        except Exception as raised:  # reported to Locust as a failure
            error = raised
        self.environment.events.request.fire(
            request_type="call", name=name, response_time=(time.perf_counter() - started) * 1000,
            response_length=0, exception=error, context={},
        )  # fmt: skip

    @task(3)
    def category_map(self) -> None:
        shop = pick_shop()
        self._call("category_map(shop)", lambda: loaders(self.environment.parsed_options).category_map(shop))

    @task(1)
    def product(self) -> None:
        product_id = pick_product()
        found = loaders(self.environment.parsed_options)
        if found.recorder is None:
            self._call("product(id)", lambda: found.product(product_id))
            return

        def read() -> None:
            with found.recorder.op("read", product_id) as op:  # type: ignore[union-attr]
                value = found.product(product_id)
                if value is not None:
                    op.saw(value["version"], source=value["id"])

        self._call("product(id)", read)


class WebUser(FastHttpUser):
    """Calls the web app, whose endpoints are async cached loaders (or cache-aside)."""

    wait_time = between(0.05, 0.25)

    def _get(self, path: str, name: str, missing: bool) -> Any:
        """The answer's JSON (None if it failed)."""
        with self.client.get(path, name=name, catch_response=True) as response:
            if response.status_code == 404 and missing:
                response.success()  # the unknown shop or product: a 404 is the right answer
            return response.json() if response.status_code == 200 else None

    @task(3)
    def categories(self) -> None:
        shop = pick_shop()
        self._get(f"/categories/{shop}", "/categories/[shop]", shop == "no-such-shop")

    @task(1)
    def product(self) -> None:
        product_id = pick_product()
        recorder = loaders(self.environment.parsed_options).web_recorder
        if recorder is None:
            self._get(f"/products/{product_id}", "/products/[id]", product_id == 999_999)
            return
        with recorder.op("read", product_id) as op:
            value = self._get(f"/products/{product_id}", "/products/[id]", product_id == 999_999)
            if isinstance(value, dict) and "version" in value:
                op.saw(value["version"], source=value["id"])


class WriterUser(User):
    """With ``--writer``, updates a product now and then (a new price and version), then
    invalidates it (``correct``) or forgets to (``broken``); recorded with ``--history``.
    Without, it idles."""

    fixed_count = 2
    wait_time = between(0.1, 0.3)

    @task
    def update(self) -> None:
        options = self.environment.parsed_options
        if options.writer == "none":
            return
        product_id = random.choices(PRODUCTS[:-1], PRODUCT_WEIGHTS[:-1])[0]
        found = loaders(options)
        started = time.perf_counter()
        error: Exception | None = None
        try:
            if found.recorder is None:
                found.database.update_product(product_id)
                if options.writer == "correct":
                    found.invalidate(product_id)
            else:
                with found.recorder.op("invalidate", product_id) as update:  # the application's write path
                    with found.recorder.op("write", product_id) as write:
                        version = found.database.update_product(product_id)
                        write.saw(version)
                    if options.writer == "correct":
                        found.invalidate(product_id)
                    update.saw(version)
        except Exception as raised:
            error = raised
        self.environment.events.request.fire(
            request_type="write", name="update_product(id)", response_time=(time.perf_counter() - started) * 1000,
            response_length=0, exception=error, context={},
        )  # fmt: skip


_started: list[float] = []
_stopping: list[float] = []


@events.test_stopping.add_listener
def _note_stopping(environment: Any, **kwargs: Any) -> None:
    if not isinstance(environment.runner, WorkerRunner):
        _stopping.append(time.time())


@events.test_start.add_listener
def _note_start(environment: Any, **kwargs: Any) -> None:
    if not isinstance(environment.runner, WorkerRunner):
        _started.append(time.time())
        for started in STANDALONE.started:
            print(f"started {started}", flush=True)
        print(f"users get {environment.stop_timeout:g} s to finish their call when the run ends", flush=True)


@events.quitting.add_listener
def _save_checks(environment: Any, **kwargs: Any) -> None:
    """With ``--history``: this process's verifications of product hits, for the script
    that reads the history (loadtest/locust_consistency.py)."""
    options = environment.parsed_options
    found = _loaders.get(os.getpid())
    if not options.history or found is None or found.products_layer is None:
        return
    stats = found.products_layer.stats()
    checks = {name: value for name, value in stats.items() if name.startswith("consistency_")}
    checks["hits"] = stats["hits"] + stats["near_hits"]  # what a verification samples
    (Path(options.history) / f"checks-{os.getpid()}.json").write_text(json.dumps(checks))


@events.quitting.add_listener
def _report(environment: Any, **kwargs: Any) -> None:
    """On the master (or a single process): the single-hit check over the query log."""
    options = environment.parsed_options
    if isinstance(environment.runner, WorkerRunner) or not options.db:
        return
    since = _started[0] if _started else 0.0
    queries = [query for query in ShopDatabase(options.db).queries() if query.started >= since]
    min_ttl = options.ttl * (1 - Settings().jitter)  # the layer's default jitter; cache-aside has none
    windows = expiry_windows(queries, min_ttl)
    figures = summarize(windows)
    figures.update(protection=options.protection, ttl=options.ttl, min_ttl=min_ttl, since=since,
                   processes=getattr(options, "processes", None), users=options.num_users)  # fmt: skip
    print(f"\nprotection {options.protection}: {figures['queries']} database queries, {figures['keys']} keys, "
          f"{figures['windows']} expiry windows; queries per window: max {figures['max_queries_per_window']}, "
          f"mean {figures['mean_queries_per_window']}; windows with more than one query: "
          f"{figures['windows_with_more_than_one_query']}", flush=True)  # fmt: skip
    if options.summary:
        Path(options.summary).write_text(json.dumps(figures, indent=2))
    if options.writer != "none":  # a writer's invalidations make second queries in a window, rightly
        print("(a writer ran: the history checker, not the query log, judges this run)")
    elif options.protection == "on" and figures["max_queries_per_window"] > 1:
        print(f"FAILED: a key was queried more than once in one expiry window: {figures['worst_windows']}")
        for line in explain(windows, since):
            print(line)
        if _stopping:
            print(f"(the run began stopping its users at {_stopping[0] - since:.3f} s)")
        environment.process_exit_code = 1
    elif not queries:
        print("FAILED: no database query was logged; is the web app reading the same --db?")
        environment.process_exit_code = 1
    STANDALONE.stop()
