"""Item 1 of the fifth round of probing: a wake-up message published before a waiter
subscribed must never be handed to it as its value. A waiter's process may already
listen on the entry's channel (another waiter subscribed it), and a message published
before the new waiter began may still be unread there: the value an invalidation has
removed since. Each test holds the process's reader while such a message is on its way,
subscribes a new waiter, lets the reader go, and checks what the new waiter was given,
over the blocking and the asyncio subscriber of Redis and of PostgreSQL's listener, and a
whole call over the layer. Each fails without the fix (``_backends.channels``' rules,
``PostgresListener``'s fences)."""

from __future__ import annotations

import asyncio
import base64
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
import pytest
import redis

from stampede import Stampede
from stampede._backends.mailbox import LoopMailbox, ThreadMailbox
from stampede._core.keys import EntryKeys

from ..scenarios import until, wait_until

pytestmark = pytest.mark.timeout(60)


@contextmanager
def recorded_deliveries() -> Iterator[dict[int, list[bytes]]]:
    """Every message delivered to any mailbox while the block runs, by mailbox id."""
    seen: dict[int, list[bytes]] = {}
    originals = ThreadMailbox.deliver, LoopMailbox.deliver

    def recording(original: Callable[[Any, bytes], None]) -> Callable[[Any, bytes], None]:
        def deliver(mailbox: Any, message: bytes) -> None:
            seen.setdefault(id(mailbox), []).append(message)
            original(mailbox, message)

        return deliver

    ThreadMailbox.deliver = recording(originals[0])  # type: ignore[method-assign]
    LoopMailbox.deliver = recording(originals[1])  # type: ignore[method-assign]
    try:
        yield seen
    finally:
        ThreadMailbox.deliver, LoopMailbox.deliver = originals  # type: ignore[method-assign]


def gate_reader(connection: Any, gate: threading.Event) -> None:
    """Make the reader of a redis-py subscriber connection stop before its next read
    until ``gate`` is set."""
    read = connection.read_response

    def gated(*args: Any, **kwargs: Any) -> Any:
        assert gate.wait(20), "the test never let the reader go"
        return read(*args, **kwargs)

    connection.read_response = gated


def gate_async_reader(connection: Any, gate: threading.Event) -> None:
    read = connection.read_response

    async def gated(*args: Any, **kwargs: Any) -> Any:
        while not gate.is_set():
            await asyncio.sleep(0.002)
        return await read(*args, **kwargs)

    connection.read_response = gated


KEYS = EntryKeys.for_value("test:wakeup")


def test_redis_a_blocking_waiter_gets_no_message_published_before_it_subscribed(
    make_layer: Callable[..., Stampede], redis_client: redis.Redis
) -> None:
    store: Any = make_layer()._runner.store
    gate = threading.Event()
    with recorded_deliveries() as seen:
        first = store.subscribe(KEYS)  # an earlier waiter: the process listens on the channel
        gate_reader(store._subscriber._connection, gate)
        redis_client.publish(KEYS.channel, b"old")  # unread when the second waiter joins
        joined: list[Any] = []
        thread = threading.Thread(target=lambda: joined.append(store.subscribe(KEYS)))
        thread.start()
        wait_until(lambda: joined or len(store._subscriber._channels._members.get(KEYS.channel, ())) == 2)
        gate.set()
        thread.join(10)
        assert first.wait(5) == b"old"
        redis_client.publish(KEYS.channel, b"new")
        second = joined[0]
        assert second.wait(5) == b"new"
        assert seen[id(second)] == [b"new"], "a message published before the waiter subscribed reached it"
        first.close()
        second.close()


def test_redis_an_asyncio_waiter_gets_no_message_published_before_it_subscribed(
    make_layer: Callable[..., Stampede], redis_client: redis.Redis
) -> None:
    layer = make_layer()
    gate = threading.Event()

    async def main() -> None:
        store: Any = layer._async_runner.loop_store()  # type: ignore[union-attr]
        with recorded_deliveries() as seen:
            first = await store.subscribe(KEYS)
            gate_async_reader(store._subscriber._connection, gate)
            redis_client.publish(KEYS.channel, b"old")
            second_task = asyncio.create_task(store.subscribe(KEYS))
            await until(
                lambda: second_task.done() or len(store._subscriber._channels._members.get(KEYS.channel, ())) == 2
            )
            gate.set()
            second = await asyncio.wait_for(second_task, 10)
            assert await first.wait(5) == b"old"
            redis_client.publish(KEYS.channel, b"new")
            assert await second.wait(5) == b"new"
            assert seen[id(second)] == [b"new"], "a message published before the waiter subscribed reached it"
            first.close()
            second.close()
        await layer.aclose()

    asyncio.run(main())


def _notify(url: str, message: bytes) -> None:
    payload = "v" + base64.b64encode(message).decode() + "\n" + KEYS.channel
    with psycopg.connect(url, autocommit=True) as connection:
        connection.execute("SELECT pg_notify('stampede', %s)", (payload,))


def gate_listener(listener: Any, gate: threading.Event) -> None:
    deliver = listener._deliver

    def gated(payload: str) -> None:
        assert gate.wait(20), "the test never let the listener go"
        deliver(payload)

    listener._deliver = gated


def test_postgres_a_blocking_waiter_gets_no_notify_committed_before_it_subscribed(
    make_postgres_layer: Callable[..., Stampede], postgres_url: str
) -> None:
    store: Any = make_postgres_layer()._runner.store
    gate = threading.Event()
    with recorded_deliveries() as seen:
        first = store.subscribe(KEYS)
        gate_listener(store.listener, gate)
        _notify(postgres_url, b"old")
        joined: list[Any] = []
        thread = threading.Thread(target=lambda: joined.append(store.subscribe(KEYS)))
        thread.start()
        wait_until(lambda: joined or getattr(store.listener, "_unconfirmed", None), "the second waiter's join")
        gate.set()
        thread.join(10)
        assert first.wait(5) == b"old"
        _notify(postgres_url, b"new")
        second = joined[0]
        assert second.wait(5) == b"new"
        assert seen[id(second)] == [b"new"], "a NOTIFY committed before the waiter subscribed reached it"
        first.close()
        second.close()


def test_postgres_an_asyncio_waiter_gets_no_notify_committed_before_it_subscribed(
    make_postgres_layer: Callable[..., Stampede], postgres_url: str
) -> None:
    layer = make_postgres_layer()

    async def main() -> None:
        store: Any = layer._async_runner.loop_store()  # type: ignore[union-attr]
        gate = threading.Event()
        with recorded_deliveries() as seen:
            first = await store.subscribe(KEYS)
            gate_listener(store.listener, gate)
            await asyncio.to_thread(_notify, postgres_url, b"old")
            second_task = asyncio.create_task(store.subscribe(KEYS))
            await until(lambda: second_task.done() or getattr(store.listener, "_unconfirmed", None))
            gate.set()
            second = await asyncio.wait_for(second_task, 10)
            assert await first.wait(5) == b"old"
            await asyncio.to_thread(_notify, postgres_url, b"new")
            assert await second.wait(5) == b"new"
            assert seen[id(second)] == [b"new"], "a NOTIFY committed before the waiter subscribed reached it"
            first.close()
            second.close()
        await layer.aclose()

    asyncio.run(main())


def test_a_call_begun_after_an_invalidation_never_returns_the_value_it_removed(
    make_layer: Callable[..., Stampede],
) -> None:
    """The whole promise over one Redis server: process A wrote version 1 (its message
    still unread in process B, whose reader is held), then invalidated; D took the lease
    to load. A call in B that begins now waits for a value written after it began: it
    takes over D's lease when it runs out and loads version 2, never version 1."""
    database = {"version": 1}
    process_a, process_b = make_layer(), make_layer()

    def read_row(key: int) -> dict[str, int]:
        return {"id": key, "version": database["version"]}

    load_a = process_a.cached_loader("row:{key}", ttl=60)(read_row)
    load_b = process_b.cached_loader("row:{key}", ttl=60)(read_row)
    keys = EntryKeys.for_value(load_a.key(1))  # type: ignore[attr-defined]
    store_b: Any = process_b._runner.store
    subscriber = store_b._subscriber
    earlier = store_b.subscribe(keys)  # another waiter in B: B listens on the channel
    reads = threading.Semaphore(0)
    gate = threading.Event()

    def one_read_at_a_time(*args: Any, **kwargs: Any) -> Any:
        if not gate.is_set():
            assert reads.acquire(timeout=20), "the test never let the reader go"
        return read(*args, **kwargs)

    read = subscriber._connection.read_response
    subscriber._connection.read_response = one_read_at_a_time
    try:
        assert load_a(1) == {"id": 1, "version": 1}  # written, and published inline
        database["version"] = 2
        load_a.invalidate(1)  # type: ignore[attr-defined]
        store_a: Any = process_a._runner.store
        assert store_a.acquire(keys, "d" * 32, 1500, False).state.value == "locked"  # D loads, slowly
        results: list[Any] = []
        caller = threading.Thread(target=lambda: results.append(load_b(1)))
        caller.start()
        wait_until(lambda: len(subscriber._channels._members.get(keys.channel, ())) == 2, "the caller's subscription")
        reads.release()  # B's reader reads version 1's message, and stops again
        assert earlier.wait(5), "the earlier waiter got version 1's message"
        # Either the caller waits for its own subscription's confirmation (behind the
        # invalidation's message), or it was handed version 1 and returned.
        wait_until(lambda: results or keys.channel in subscriber._channels._unconfirmed, "the caller's next step")
        gate.set()
        reads.release()
        caller.join(20)
        assert results == [{"id": 1, "version": 2}], "a call begun after the invalidation got the removed value"
    finally:
        gate.set()
        reads.release()
        earlier.close()
