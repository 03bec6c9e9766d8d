"""The other lock services of the design, against real servers the suite starts: the
PostgreSQL store and ZooKeeper leases beside Redis. The behaviour, contract, lock and
asyncio suites run over both (conftest ``BACKENDS``); here is what is theirs alone:
stampedes across processes, a holder killed mid-load, the database lock's textbook
failures and their fixes, and the servers going away mid-stampede.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
import redis

from stampede import BackendUnavailable, ConfigError, LockLost, Stampede, WaitTimeout
from stampede.testing import PostgresServer, ZooKeeperServer

from ..conftest import empty_postgres, needs_postgres, needs_zookeeper
from ..promises.test_processes import Workers, run_stampede
from ..scenarios import wait_until

pytestmark = [pytest.mark.timeout(90), pytest.mark.extended]  # PostgreSQL and ZooKeeper: CI's extended step

SERVICES = ["postgres", "zookeeper"]


@pytest.fixture(params=SERVICES)
def service(request: pytest.FixtureRequest, redis_url: str, redis_client: redis.Redis) -> Iterator[list[str]]:
    """A worker's arguments for a layer on that service (loader calls counted in Redis)."""
    if request.param == "postgres":
        server: PostgresServer = request.getfixturevalue("postgres_server")
        empty_postgres(server.url)
        yield ["--url", server.url, "--count-url", redis_url]
    else:
        zookeeper: ZooKeeperServer = request.getfixturevalue("zookeeper_server")
        yield ["--url", redis_url, "--zookeeper", zookeeper.hosts]


def _stampede(service: list[str], *args: str) -> list[dict[str, Any]]:
    url = service[1]
    return run_stampede(url, 4, *service[2:], *args)


def test_four_processes_of_sixteen_threads_load_one_cold_key_once(
    service: list[str], redis_client: redis.Redis
) -> None:
    results = _stampede(service, "--threads", "16", "--keys", "1", "--delay", "0.2")
    assert int(redis_client.get("calls:0") or 0) == 1
    assert sum(r["calls"] for r in results) == 64
    assert all(r["wrong"] == [] for r in results)


def test_two_hundred_cold_keys_are_loaded_two_hundred_times(service: list[str], redis_client: redis.Redis) -> None:
    results = _stampede(service, "--threads", "16", "--keys", "200", "--delay", "0.01")
    assert [int(redis_client.get(f"calls:{key}") or 0) for key in range(200)] == [1] * 200
    assert all(r["wrong"] == [] for r in results)


def _listeners(url: str) -> int:
    import psycopg

    with psycopg.connect(url, autocommit=True) as connection:
        row = connection.execute("SELECT count(*) FROM pg_stat_activity WHERE query LIKE 'LISTEN %'").fetchone()
    return int(row[0]) if row else 0


@pytest.mark.parametrize("kind", SERVICES)
def test_a_killed_holder_is_taken_over(
    kind: str, request: pytest.FixtureRequest, redis_url: str, redis_client: redis.Redis
) -> None:
    """PostgreSQL: after the lease (1 s). ZooKeeper: as soon as the holder's session
    expires (2 s), although its lease on the cache server has 30 s left."""
    if kind == "postgres":
        server: PostgresServer = request.getfixturevalue("postgres_server")
        empty_postgres(server.url)
        args = ["--count-url", redis_url, "--lock-ttl", "1"]
        url, bound = server.url, 1.0
    else:
        zookeeper: ZooKeeperServer = request.getfixturevalue("zookeeper_server")
        args = ["--zookeeper", zookeeper.hosts, "--zk-session", "2", "--lock-ttl", "30"]
        url, bound = redis_url, 2.0
    workers = Workers()
    try:
        holder = workers.start(url, *args, "--threads", "1", "--hang")
        workers.expect(holder, "ready")
        workers.go([holder])
        workers.expect(holder, "loading")
        waiters = [workers.start(url, *args, "--threads", "4", "--wait-timeout", "20") for _ in range(2)]
        for waiter in waiters:
            workers.expect(waiter, "ready")
        workers.go(waiters)
        deadline = time.monotonic() + 10
        channel = "proc:{item:0}:notify"
        while (_listeners(url) if kind == "postgres" else redis_client.pubsub_numsub(channel)[0][1]) < 2:
            assert time.monotonic() < deadline, "waiters never subscribed"
            time.sleep(0.01)
        holder.kill()  # SIGKILL mid-load: no release, no write, its session left to expire
        killed_at = time.monotonic()
        results = [workers.result(waiter, timeout=30) for waiter in waiters]
        taken_over = time.monotonic() - killed_at
    finally:
        workers.stop_all()
    print(f"{kind}: taken over {taken_over:.2f} s after the kill (lease or session: {bound} s)")
    assert int(redis_client.get("calls:0") or 0) == 2  # the dead holder's and one takeover
    assert all(r["wrong"] == [] and r["calls"] == 4 for r in results)
    assert bound * 0.5 < taken_over < bound + 4  # by the lease or the session, not by wait_timeout (20 s)


# --- the database lock's textbook failures, and the fixes ------------------------------


def _plain_lock_table(url: str) -> None:
    import psycopg

    with psycopg.connect(url, autocommit=True) as connection:
        connection.execute("CREATE TABLE IF NOT EXISTS textbook_locks (name text PRIMARY KEY, holder text)")
        connection.execute("TRUNCATE textbook_locks")


def _plain_acquire(url: str, name: str, holder: str) -> bool:
    """The textbook database lock: a unique row, inserted to take it."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as connection:
        cursor = connection.execute("INSERT INTO textbook_locks VALUES (%s, %s) ON CONFLICT DO NOTHING", (name, holder))
        return cursor.rowcount == 1


def test_a_crashed_holder_leaves_the_plain_row_lock_held_forever_and_the_fixed_one_expires(postgres_url: str) -> None:
    _plain_lock_table(postgres_url)
    assert _plain_acquire(postgres_url, "job", "crashed")  # and its process is gone: nobody deletes the row
    time.sleep(1.0)
    assert not _plain_acquire(postgres_url, "job", "next")  # still held, and would be for ever

    crashed = Stampede.from_url(postgres_url, namespace="textbook")
    survivor = Stampede.from_url(postgres_url, namespace="textbook")
    try:
        assert crashed.lock("job", ttl=0.5, renew=False).acquire()  # never released: it "crashes"
        started = time.monotonic()
        assert survivor.lock("job", timeout=5).acquire()  # the lease's deadline frees it
        assert 0.3 < time.monotonic() - started < 2.0
    finally:
        crashed.close()
        survivor.close()


@pytest.mark.timing
def test_a_plain_acquire_fails_at_once_where_the_fixed_one_waits_and_is_woken_by_notify(postgres_url: str) -> None:
    _plain_lock_table(postgres_url)
    assert _plain_acquire(postgres_url, "job", "first")
    assert not _plain_acquire(postgres_url, "job", "second")  # no wait: the caller must poll

    layer = Stampede.from_url(postgres_url, namespace="textbook", recheck_interval=5.0)
    try:
        holder = layer.lock("job")
        assert holder.acquire()
        acquired = threading.Event()
        woken_at: list[float] = []

        def waiter() -> None:
            lock = layer.lock("job")
            assert lock.acquire(timeout=10)
            woken_at.append(time.monotonic())
            acquired.set()
            lock.release()

        thread = threading.Thread(target=waiter)
        thread.start()
        listener = layer._runner.store.listener  # type: ignore[union-attr]
        wait_until(  # the waiter is asleep on LISTEN (no polling: recheck_interval is 5 s)
            lambda: listener._listening and listener._waiting.everyone(), "the waiter on LISTEN"
        )
        released_at = time.monotonic()
        holder.release()
        assert acquired.wait(5)
        thread.join(5)
        assert woken_at[0] - released_at < 0.5  # woken by the release's NOTIFY, not a recheck
    finally:
        layer.close()


def test_the_plain_lock_is_not_reentrant_and_the_fixed_one_is(postgres_url: str) -> None:
    _plain_lock_table(postgres_url)
    assert _plain_acquire(postgres_url, "job", "me")
    assert not _plain_acquire(postgres_url, "job", "me")  # its own holder is refused

    layer = Stampede.from_url(postgres_url, namespace="textbook")
    try:
        with layer.lock("job", reentrant=True) as outer, layer.lock("job", reentrant=True) as inner:
            assert outer.owned() and inner.owned()  # the same thread, again
        after = layer.lock("job", blocking=False)
        assert after.acquire()  # released as many times as taken
        after.release()
    finally:
        layer.close()


def _queued(url: str) -> int:
    """Waiters in the fair queues of the database (the table is emptied for each test)."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as connection:
        row = connection.execute("SELECT count(*) FROM stampede_queue WHERE expires_at > clock_timestamp()").fetchone()
    return int(row[0]) if row else 0


def test_the_fixed_lock_is_fair_and_fenced(postgres_url: str) -> None:
    layer = Stampede.from_url(postgres_url, namespace="textbook")
    try:
        first = layer.lock("job", fair=True)
        assert first.acquire()
        order: list[int] = []
        fences: list[int] = [first.fence]
        queued: list[threading.Event] = [threading.Event() for _ in range(3)]

        def waiter(index: int) -> None:
            lock = layer.lock("job", fair=True)
            queued[index].set()
            assert lock.acquire(timeout=20)
            order.append(index)
            fences.append(lock.fence)
            lock.release()

        threads = []
        for index in range(3):  # arrive one after another
            thread = threading.Thread(target=waiter, args=(index,))
            thread.start()
            threads.append(thread)
            assert queued[index].wait(5)
            wait_until(lambda n=index + 1: _queued(postgres_url) == n, f"waiter {index} in the queue")
        first.release()
        for thread in threads:
            thread.join(20)
        assert order == [0, 1, 2]
        assert fences == sorted(fences) and len(set(fences)) == 4  # every holder a greater token
    finally:
        layer.close()


# --- servers going away mid-stampede ---------------------------------------------------


def _callers(load: Any, keys: int, until: threading.Event) -> tuple[list[Any], list[BaseException]]:
    values: list[Any] = []
    errors: list[BaseException] = []

    def call(index: int) -> None:
        while not until.is_set():
            key = index % keys
            try:
                value = load(key)
                if value != {"key": key}:
                    errors.append(AssertionError(f"wrong value {value!r} for {key}"))
                values.append(value)
            except BackendUnavailable as error:
                errors.append(error)

    pool = ThreadPoolExecutor(8)
    futures = [pool.submit(call, index) for index in range(8)]
    until.wait()
    for future in futures:
        future.result(timeout=20)  # no caller hangs
    pool.shutdown()
    return values, errors


def test_the_database_restarted_mid_stampede(redis_client: redis.Redis) -> None:
    needs_postgres()
    with PostgresServer() as server:
        layer = Stampede.from_url(server.url, namespace="restart", wait_timeout=3, socket_timeout=1)
        loads: list[int] = []

        @layer.cached_loader("item:{key}", ttl=0.2)
        def load(key: int) -> dict[str, int]:
            loads.append(key)
            time.sleep(0.01)
            return {"key": key}

        stop = threading.Event()
        outcome: list[Any] = []
        runner = threading.Thread(target=lambda: outcome.append(_callers(load, 4, stop)))
        runner.start()
        time.sleep(0.5)
        server.stop("fast")  # every connection cut mid-stampede
        time.sleep(0.5)
        server.start()
        time.sleep(1.5)
        stop.set()
        runner.join(30)
        assert not runner.is_alive()
        values, errors = outcome[0]
        layer.close()
    assert [error for error in errors if not isinstance(error, BackendUnavailable)] == []
    assert values  # served before, during (policy "load") and after
    assert len(loads) <= len(values) + len(errors)  # never more loads than calls


def test_zookeeper_stopped_and_restarted_mid_stampede(redis_url: str, redis_client: redis.Redis) -> None:
    needs_zookeeper()
    with ZooKeeperServer() as zookeeper:
        raising = Stampede.from_url(redis_url, namespace="zk-down", zookeeper=zookeeper.hosts, on_backend_error="raise")
        loading = Stampede.from_url(redis_url, namespace="zk-down2", zookeeper=zookeeper.hosts)
        try:

            def loader(key: int) -> dict[str, int]:
                return {"key": key}

            strict = raising.cached_loader("item:{key}")(loader)
            lenient = loading.cached_loader("item:{key}")(loader)
            assert strict(1) == {"key": 1}
            zookeeper.stop()
            started = time.monotonic()
            with pytest.raises(BackendUnavailable):
                strict(2)  # a cold key needs a lease, and ZooKeeper is gone: the policy raises
            assert lenient(2) == {"key": 2}  # the default policy loads without a lease
            assert strict(1) == {"key": 1}  # hits need no lease
            assert time.monotonic() - started < 15  # bounded by the request timeout, not hung
            zookeeper.start()
            deadline = time.monotonic() + 20
            while True:
                try:
                    assert strict(3) == {"key": 3}
                    break
                except BackendUnavailable:
                    assert time.monotonic() < deadline, "the layer never got ZooKeeper back"
                    time.sleep(0.1)
        finally:
            raising.close()
            loading.close()


def test_an_invalidation_refuses_the_write_of_a_load_in_flight_on_zookeeper(
    make_zookeeper_layer: Callable[..., Stampede],
) -> None:
    layer = make_zookeeper_layer()
    started, finish = threading.Event(), threading.Event()
    version = [1]

    @layer.cached_loader("row:{key}")
    def load(key: int) -> dict[str, int]:
        seen = version[0]
        started.set()
        assert finish.wait(10)
        return {"v": seen}

    thread = threading.Thread(target=load, args=(1,))
    thread.start()
    assert started.wait(5)
    version[0] = 2
    load.invalidate(1)  # the load in flight read version 1: its write must be refused
    finish.set()
    thread.join(10)
    started.clear()
    finish.set()
    assert load(1) == {"v": 2}


def _expire_session(client: Any, hosts: str) -> None:
    """End ``client``'s session as the ensemble would after a long silence: another
    client joins the same session and closes it. ``client`` sees it LOST."""
    from kazoo.client import KazooClient
    from kazoo.protocol.states import KazooState

    lost = threading.Event()
    client.add_listener(lambda state: lost.set() if state == KazooState.LOST else None)
    twin = KazooClient(hosts=hosts, client_id=client.client_id)
    twin.start(timeout=10)
    twin.stop()
    twin.close()
    assert lost.wait(10), "the session never expired"


def test_a_session_that_expires_mid_load_writes_nothing(
    zookeeper_server: ZooKeeperServer, redis_url: str, redis_client: redis.Redis
) -> None:
    from kazoo.client import KazooClient

    client = KazooClient(hosts=zookeeper_server.hosts, timeout=2)
    client.start(timeout=10)
    layer = Stampede.from_url(redis_url, namespace="zk-expiry", zookeeper=client)
    started, finish = threading.Event(), threading.Event()
    calls: list[int] = []

    @layer.cached_loader("row:{key}")
    def load(key: int) -> dict[str, int]:
        calls.append(key)
        started.set()
        assert finish.wait(10)
        return {"v": len(calls)}

    try:
        results: list[Any] = []
        thread = threading.Thread(target=lambda: results.append(load(1)))
        thread.start()
        assert started.wait(5)
        _expire_session(client, zookeeper_server.hosts)  # its lease node is gone with it
        finish.set()
        thread.join(10)
        assert results == [{"v": 1}]  # the caller still gets what it loaded
        assert not redis_client.exists("zk-expiry:{row:1}")  # but nothing is written
        assert not redis_client.exists("zk-expiry:{row:1}:lock")  # and the cache key is given back
        started.clear()
        wait_until_connected(client)
        assert load(1) == {"v": 2}  # the next caller loads afresh, under a new session
    finally:
        finish.set()
        layer.close()
        client.stop()
        client.close()


def wait_until_connected(client: Any) -> None:
    from kazoo.protocol.states import KazooState

    deadline = time.monotonic() + 10
    while client.state != KazooState.CONNECTED:
        assert time.monotonic() < deadline, "kazoo never reconnected"
        time.sleep(0.01)


def test_a_named_lock_whose_session_expires_is_lost_and_taken_over_at_once(
    zookeeper_server: ZooKeeperServer, redis_url: str, redis_client: redis.Redis
) -> None:
    from kazoo.client import KazooClient

    from stampede._backends.zookeeper.servers import entry_path

    client = KazooClient(hosts=zookeeper_server.hosts, timeout=2)
    client.start(timeout=10)
    holder_layer = Stampede.from_url(redis_url, namespace="zk-lock", zookeeper=client)
    other = Stampede.from_url(redis_url, namespace="zk-lock", zookeeper=zookeeper_server.hosts)
    try:
        holder = holder_layer.lock("job", ttl=30)
        assert holder.acquire()
        first_fence = holder.fence
        got: list[float] = []
        waiter = other.lock("job", timeout=20)
        thread = threading.Thread(target=lambda: waiter.acquire() and got.append(time.monotonic()))
        thread.start()
        line = entry_path(holder.keys)
        deadline = time.monotonic() + 10
        while len(client.get_children(line)) < 2:  # the waiter is in line, asleep
            assert time.monotonic() < deadline, "the waiter never queued"
            time.sleep(0.01)
        assert not got
        expired_at = time.monotonic()
        _expire_session(client, zookeeper_server.hosts)
        thread.join(20)
        assert got and got[0] - expired_at < 2.0  # the watch woke it; the 30 s key did not hold it
        assert waiter.fence is not None and first_fence is not None and waiter.fence > first_fence
        assert not holder.owned()  # the ex-holder learns it lost the lock
        waiter.release()
    finally:
        holder_layer.close()
        other.close()
        client.stop()
        client.close()


# --- PostgreSQL's advisory lock, where it fits -----------------------------------------


@pytest.mark.timing
def test_an_advisory_lock_excludes_waits_in_the_database_and_is_freed_with_its_session(postgres_url: str) -> None:
    import psycopg

    layer = Stampede.from_url(postgres_url, namespace="advisory")
    other = Stampede.from_url(postgres_url, namespace="advisory")
    try:
        holder = layer.advisory_lock("job")
        assert holder.acquire()
        assert other.advisory_lock("job", blocking=False).acquire() is False
        with pytest.raises(WaitTimeout):
            other.advisory_lock("job", timeout=0.2).acquire()
        got: list[float] = []
        waiter = other.advisory_lock("job", timeout=10)
        thread = threading.Thread(target=lambda: waiter.acquire() and got.append(time.monotonic()))
        thread.start()
        deadline = time.monotonic() + 10
        with psycopg.connect(postgres_url, autocommit=True) as admin:
            query = "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
            while admin.execute(query).fetchone() != (1,):  # the waiter is queued in the database
                assert time.monotonic() < deadline, "the waiter never queued"
                time.sleep(0.01)
        released_at = time.monotonic()
        holder.release()
        thread.join(10)
        assert got and got[0] - released_at < 0.2  # woken by the database at once
        waiter.release()

        # The session ends (a crashed holder's connection closes): the database frees it.
        crashed = Stampede.from_url(postgres_url, namespace="advisory")
        lock = crashed.advisory_lock("other-job")
        assert lock.acquire()
        with psycopg.connect(postgres_url, autocommit=True) as admin:
            admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_locks WHERE locktype = 'advisory' AND objid = %s",
                (lock.key & 0xFFFFFFFF,),
            )
        with layer.advisory_lock("other-job", timeout=5):
            pass
        with pytest.raises(LockLost):
            lock.release()  # its session is gone
        crashed.close()
    finally:
        layer.close()
        other.close()


def test_an_advisory_lock_is_taken_by_tasks_one_at_a_time(postgres_url: str) -> None:
    import asyncio

    layer = Stampede.from_url(postgres_url, namespace="advisory")

    async def main() -> int:
        counter = {"value": 0}

        async def work() -> None:
            for _ in range(5):
                async with layer.advisory_lock("counter", timeout=10):
                    seen = counter["value"]
                    await asyncio.sleep(0.001)
                    counter["value"] = seen + 1

        await asyncio.gather(*(work() for _ in range(8)))
        await layer.aclose()
        return counter["value"]

    try:
        assert asyncio.run(main()) == 40
    finally:
        layer.close()


def test_an_advisory_lock_needs_a_postgresql_layer() -> None:
    layer = Stampede()
    with pytest.raises(ConfigError, match="PostgreSQL"):
        layer.advisory_lock("job")
    layer.close()


def test_the_schema_is_created_once_and_again_if_the_database_lost_it(redis_client: redis.Redis) -> None:
    import psycopg

    needs_postgres()
    with PostgresServer() as server:
        layer = Stampede.from_url(server.url, namespace="schema")
        loads: list[int] = []

        @layer.cached_loader("item:{key}")
        def load(key: int) -> dict[str, int]:
            loads.append(key)
            return {"key": key}

        try:
            assert load(1) == {"key": 1} and load(1) == {"key": 1} and loads == [1]
            with psycopg.connect(server.url, autocommit=True) as admin:
                admin.execute("DROP SCHEMA public CASCADE; CREATE SCHEMA public")  # a database recreated
            assert load(2) == {"key": 2}  # on_backend_error="load": served while the schema is gone
            assert load(3) == {"key": 3} and load(3) == {"key": 3}  # created again, then cached
            assert loads == [1, 2, 3]
            with psycopg.connect(server.url, autocommit=True) as admin:
                created = admin.execute("SELECT count(*) FROM pg_proc WHERE proname LIKE 'stampede_%'").fetchone()
            assert created is not None and created[0] >= 9
        finally:
            layer.close()


def test_a_pool_of_ones_own_serves_blocking_and_async_callers(postgres_url: str) -> None:
    import asyncio

    from psycopg_pool import ConnectionPool

    pool = ConnectionPool(postgres_url, min_size=1, max_size=8, kwargs={"autocommit": True}, timeout=5, open=True)
    layer = Stampede(postgres=pool, namespace="own-pool")
    loads: list[int] = []

    @layer.cached_loader("item:{key}")
    def load(key: int) -> dict[str, int]:
        loads.append(key)
        time.sleep(0.05)
        return {"key": key}

    @layer.cached_loader("async-item:{key}")
    async def aload(key: int) -> dict[str, int]:
        loads.append(-key)
        await asyncio.sleep(0.05)
        return {"key": key}

    async def tasks() -> list[dict[str, int]]:
        try:
            return await asyncio.gather(*(aload(1) for _ in range(20)))
        finally:
            await layer.aclose()

    try:
        with ThreadPoolExecutor(8) as threads:
            assert list(threads.map(load, [1] * 16)) == [{"key": 1}] * 16
        assert asyncio.run(tasks()) == [{"key": 1}] * 20
        assert loads == [1, -1]
    finally:
        layer.close()
        assert not pool.closed  # the caller's pool stays the caller's
        pool.close()


def test_what_a_lock_service_cannot_do_is_refused_when_the_layer_is_made(redis_url: str) -> None:
    with pytest.raises(ConfigError, match="whole store"):
        Stampede(redis.Redis.from_url(redis_url), postgres="postgresql://127.0.0.1/x")
    with pytest.raises(ConfigError, match="cache server"):
        Stampede(zookeeper="127.0.0.1:1")  # leases beside nothing
    with pytest.raises(ConfigError, match="whole store"):
        Stampede.from_url("postgresql://127.0.0.1/x", cluster=True)
    with pytest.raises(ConfigError, match="postgresql://"):
        Stampede(postgres="redis://127.0.0.1/0")


def test_a_near_cache_is_refused_over_postgresql(postgres_url: str) -> None:
    layer = Stampede.from_url(postgres_url, namespace="near")
    try:
        with pytest.raises(ConfigError, match="PostgreSQL"):
            layer.cached_loader("item:{key}", near_cache=True)
    finally:
        layer.close()


def test_a_version_3_schema_is_brought_to_version_4_and_still_answers_version_3_stores() -> None:
    """Version 4 adds ``holder`` to ``stampede_acquire``'s reply (traces read it), which a
    function cannot change in place: a store that finds version 3 drops and creates the
    function. A version 3 store reads the reply's columns by name, and finds its own
    marker, so it goes on working beside it."""
    import psycopg

    needs_postgres()
    with PostgresServer() as server:
        first = Stampede.from_url(server.url, namespace="schema")
        first.cached_loader("item:{key}")(lambda key: key)(1)  # the schema, now version 8
        first.close()
        with psycopg.connect(server.url, autocommit=True) as admin:  # back to what version 3 had
            admin.execute("DROP FUNCTION stampede_schema_v4()")
            admin.execute("DROP FUNCTION stampede_schema_v5()")
            admin.execute("DROP FUNCTION stampede_schema_v6()")
            admin.execute("DROP FUNCTION stampede_schema_v7()")
            admin.execute("DROP FUNCTION stampede_schema_v8()")
            admin.execute("DROP FUNCTION stampede_seize(text, text, text, text, text, text, bigint)")
            admin.execute("DROP FUNCTION stampede_acquire(text, text, text, bigint, boolean, bytea)")
            admin.execute(
                "CREATE FUNCTION stampede_acquire(p_value text, p_lock text, p_token text, p_lease_ms bigint, "
                "p_check boolean, p_stale bytea, OUT state int, OUT raw bytea, OUT left_ms bigint, OUT failed boolean) "
                "LANGUAGE plpgsql AS $$ BEGIN state := 0; END $$"
            )
        layer = Stampede.from_url(server.url, namespace="schema")
        loads: list[int] = []

        @layer.cached_loader("item:{key}")
        def load(key: int) -> int:
            loads.append(key)
            return key

        try:
            assert load(2) == load(2) == 2 and loads == [2]  # version 8 created again, and used
            with psycopg.connect(server.url, autocommit=True) as admin:
                v3_reads = (
                    "SELECT state, raw, left_ms, failed FROM stampede_acquire('v', 'l', 't', 1000, true, ''::bytea)"
                )
                assert admin.execute(v3_reads).fetchone() == (2, None, 0, False)
                markers = (
                    "SELECT count(*) FROM pg_proc WHERE proname IN "
                    "('stampede_schema_v3', 'stampede_schema_v4', 'stampede_schema_v5', 'stampede_schema_v6', "
                    "'stampede_schema_v7', 'stampede_schema_v8')"
                )
                assert admin.execute(markers).fetchone() == (6,)
        finally:
            layer.close()


@pytest.fixture
def kazoo_client(zookeeper_server: ZooKeeperServer) -> Iterator[Any]:
    """A started kazoo client of the session's ZooKeeper server (a 2 s session), stopped
    after the test: for tests that drive the lock servers' store-level classes."""
    from kazoo.client import KazooClient

    client = KazooClient(hosts=zookeeper_server.hosts, timeout=2)
    client.start(timeout=10)
    try:
        yield client
    finally:
        client.stop()
        client.close()


def test_a_late_release_after_an_invalidation_leaves_the_next_holders_node(kazoo_client: Any) -> None:
    """An invalidation deletes every lease node and then the entry's empty parent, so the
    next taker recreates the parent and ZooKeeper numbers its node from 0 again: the very
    path the invalidated holder had. That holder's late release must not delete it (it
    did: the next holder's write was refused, as if it had been invalidated too)."""
    from stampede._backends.zookeeper.servers import ZooKeeperLockServers, ZooKeeperQueue
    from stampede._core.keys import EntryKeys

    client = kazoo_client
    servers = ZooKeeperLockServers(client)
    keys = EntryKeys("zk-reuse:{row:1}", "zk-reuse:{row:1}:lock", "zk-reuse:{row:1}:notify")
    assert servers.take(keys, "a" * 32, 30_000).agreed
    assert servers.drop(keys).agreed  # an invalidation
    assert servers.take(keys, "b" * 32, 30_000).agreed
    servers.release(keys, "a" * 32)  # the invalidated holder, late
    assert servers.renew(keys, "b" * 32, 30_000).agreed  # the new holder's node stands
    assert servers.holders(keys) == [b"b" * 32]
    servers.release(keys, "b" * 32)

    queue = ZooKeeperQueue(servers)
    lock = EntryKeys("zk-reuse:{job}:fence", "zk-reuse:{job}:lock", "zk-reuse:{job}:notify")
    queue.enqueue(lock, "c" * 32)
    for child in client.get_children(entry_path_of(lock)):  # its node goes (a session ended)
        client.delete(f"{entry_path_of(lock)}/{child}")
    client.delete(entry_path_of(lock))
    queue.enqueue(lock, "d" * 32)  # first in a new line: the same node name as c's
    assert not queue.holds(lock, "c" * 32)  # c's node is gone, whatever d's is called
    queue.leave(lock, "c" * 32)
    assert queue.holds(lock, "d" * 32)  # and c leaving did not take d's place
    queue.leave(lock, "d" * 32)


class _Counted:
    """A kazoo client that counts the requests sent through it, by method."""

    def __init__(self, client: Any) -> None:
        self._client = client
        self.sent: list[str] = []

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._client, name)
        if not name.endswith("_async"):
            return method

        def send(*args: Any, **kwargs: Any) -> Any:
            self.sent.append(name.removesuffix("_async"))
            return method(*args, **kwargs)

        return send


def test_a_cold_keys_lease_is_four_requests_and_a_refused_takers_four(kazoo_client: Any) -> None:
    """A cold key's take makes the entry's parent and its node, and a node numbered 0 is
    the lowest without asking (the number counts the parent's child changes); its release
    deletes both. A cold storm of 200 keys queued nine requests a key on one session (a
    parent made by kazoo's makepath after a failed create, its ancestors asked after, the
    children listed), past the 2 s request timeout on a loaded machine. A second taker's
    node is numbered 1: it lists the children, finds it is not the lowest, and deletes it."""
    from stampede._backends.zookeeper.servers import ZooKeeperLockServers
    from stampede._core.keys import EntryKeys

    client = kazoo_client
    counted = _Counted(client)
    servers = ZooKeeperLockServers(counted)  # type: ignore[arg-type]
    keys = EntryKeys("zk-count:{row:1}", "zk-count:{row:1}:lock", "zk-count:{row:1}:notify")
    first = EntryKeys("zk-count:{row:0}", "zk-count:{row:0}:lock", "zk-count:{row:0}:notify")
    assert servers.take(first, "z" * 32, 30_000).agreed and servers.release(first, "z" * 32).agreed
    counted.sent.clear()  # the root made once, by the first take of a new ensemble

    assert servers.take(keys, "a" * 32, 30_000).agreed
    assert counted.sent == ["create", "create"]
    counted.sent.clear()
    assert not servers.take(keys, "b" * 32, 30_000).agreed  # held by a
    assert counted.sent == ["create", "create", "get_children", "delete"]
    assert servers.holders(keys) == [b"a" * 32]
    counted.sent.clear()
    assert servers.release(keys, "a" * 32).agreed
    assert counted.sent == ["delete", "delete"] and not client.exists(entry_path_of(keys))


class _AnswersLost:
    """A kazoo client whose next create of a holder's node (a sequential one, not its
    parent) is applied by the server but whose answer does not come back in time (the
    request times out client-side): a fault at the client's edge, against a real server."""

    def __init__(self, client: Any) -> None:
        self._client = client
        self.lose_next = True
        self.lost: list[str] = []

    def create_async(self, *args: Any, **kwargs: Any) -> Any:
        created = self._client.create_async(*args, **kwargs)
        if not (self.lose_next and kwargs.get("sequence")):
            return created
        self.lost.append(args[0])
        self.lose_next = False
        return _LostAnswer(created)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)


class _LostAnswer:
    def __init__(self, created: Any) -> None:
        self._created = created

    def get(self, timeout: float) -> Any:
        from kazoo.handlers.threading import KazooTimeoutError

        self._created.get(timeout=timeout)  # applied on the server
        raise KazooTimeoutError("the answer was lost")

    def rawlink(self, callback: Any) -> None:
        self._created.rawlink(callback)


def test_a_take_whose_answer_is_lost_leaves_no_node_holding_the_lease(kazoo_client: Any) -> None:
    """A take gave up on an unanswered create (a timeout, a lost connection), but the
    server had applied it: its node, the lowest, held the lease for as long as the
    session lived, with no load behind it, so every caller of the entry waited out
    ``wait_timeout`` and loaded uncached (seen once in CI: a burst of 200 cold keys, one
    loaded twice after a 30 s wait). The token is in the node's name: the take deletes
    it, and the next taker gets the lease."""
    from stampede._backends.zookeeper.servers import ZooKeeperLockServers
    from stampede._core.keys import EntryKeys

    client = kazoo_client
    lossy = _AnswersLost(client)
    servers = ZooKeeperLockServers(lossy)  # type: ignore[arg-type]
    keys = EntryKeys("zk-lost:{row:1}", "zk-lost:{row:1}:lock", "zk-lost:{row:1}:notify")
    taken = servers.take(keys, "a" * 32, 30_000)
    assert not taken.agreed and taken.failed == 1  # unanswered: the caller goes on without the cache
    assert [path.rsplit("/", 1)[1][:6] for path in lossy.lost] == ["lease-"]  # the node's answer was lost
    assert servers.holders(keys) == [None]  # and its node is gone
    assert servers.take(keys, "b" * 32, 30_000).agreed
    assert servers.holders(keys) == [b"b" * 32]
    servers.release(keys, "b" * 32)

    lossy.lose_next = True  # and a waiter that tries again with its token keeps the lease it gets
    assert not servers.take(keys, "c" * 32, 30_000).agreed
    assert servers.take(keys, "c" * 32, 30_000).agreed
    servers._strays.add(entry_path_of(keys), "c" * 32)  # as a create answered late marks it
    assert servers.take(EntryKeys("zk-lost:{row:2}", "zk-lost:{row:2}:lock", "zk-lost:{row:2}:notify"),
                        "d" * 32, 30_000).agreed  # fmt: skip
    assert servers.holders(keys) == [b"c" * 32]
    assert servers.renew(keys, "c" * 32, 30_000).agreed


def test_a_place_in_line_whose_answer_is_lost_leaves_no_node_holding_the_named_lock(
    kazoo_client: Any,
) -> None:
    """Named locks: an enqueue gave up on an unanswered create the server had applied. Its
    node, first in line, held the lock for as long as the session lived while its caller
    had been told the service failed: every other caller waited out its timeout. The
    token is in the node's name: the enqueue deletes it, and the next caller is first."""
    from stampede._backends.zookeeper.servers import ZooKeeperLockServers, ZooKeeperQueue
    from stampede._core.keys import EntryKeys
    from stampede._errors import BackendUnavailable

    client = kazoo_client
    lossy = _AnswersLost(client)
    queue = ZooKeeperQueue(ZooKeeperLockServers(lossy))  # type: ignore[arg-type]
    lock = EntryKeys("zk-lost:{job}:fence", "zk-lost:{job}:lock", "zk-lost:{job}:notify")
    with pytest.raises(BackendUnavailable):
        queue.enqueue(lock, "a" * 32)
    assert [path.rsplit("/", 1)[1][:5] for path in lossy.lost] == ["lock-"]  # the node's answer was lost
    assert client.get_children(entry_path_of(lock)) == []  # its node is gone
    _, before = queue.enqueue(lock, "b" * 32)
    assert before is None and queue.holds(lock, "b" * 32)  # the next caller is first
    queue.leave(lock, "b" * 32)

    lossy.lose_next = True  # a caller that tries again with its token keeps its place
    with pytest.raises(BackendUnavailable):
        queue.enqueue(lock, "c" * 32)
    assert queue.enqueue(lock, "c" * 32)[1] is None
    queue._strays.add(entry_path_of(lock), "c" * 32)  # as a create answered late marks it
    queue.enqueue(lock, "d" * 32)  # sweeps: c's place stays
    assert queue.holds(lock, "c" * 32) and queue.enqueue(lock, "c" * 32)[1] is None
    queue.leave(lock, "c" * 32)
    queue.leave(lock, "d" * 32)


def entry_path_of(keys: Any) -> str:
    from stampede._backends.zookeeper.servers import entry_path

    return entry_path(keys)
