"""The Redis backend for asyncio callers: the same scripts and replies as ``_backends.redis.store``,
over a redis.asyncio client of one event loop.

When the layer made the client, it bounds the connections itself: at most ``slots``
commands are in flight (each store method sends one at a time), so the pool never runs
out, and a command that finds every slot taken waits at most ``slot_timeout``. That
costs far less per call than redis.asyncio's blocking pool, which makes a task and a
timer for every connection it hands out.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from contextlib import AbstractContextManager
from typing import Any, TypeVar

import redis

from ..._core.keys import EntryKeys, check_key, entry_value_keys, failing_key
from ..._core.near import NearChannel
from ..._core.store import AcquireCall, AcquireReply, AsyncSubscription, LockState, WriteCall, Written
from ..._core.tags import Tagged, TagKeys
from ..._errors import BackendUnavailable
from ..breaker import CircuitBreaker, NodeBreakers
from . import batches, tagging
from . import scripts as _scripts
from .anotify import AsyncSubscriber
from .ashards import AsyncShardedSubscriber
from .commands import (
    FAILURES,
    NOT_HEARD,
    TORN_DOWN,
    UNREAD,
    EvictionCheck,
    Scripts,
    ack_route,
    breaker_for,
    check_client,
    failure,
    follows_master,
    is_cluster,
    near_wait,
    new_nonce,
    node_of,
    refresh_route,
    torn_down_error,
    translated,
    warn_near,
    without_blmpop,
)
from .replies import acquire_reply, asks_failing, marked, queue_read_with_ttl, with_ttl
from .switches import NO_SWITCHES, Switches

T = TypeVar("T")

log = logging.getLogger("stampede.backend")


def cancel_requests(task: asyncio.Task[Any] | None) -> int:
    """How many cancellations of ``task`` are pending (``Task.cancelling``: Python 3.11
    and later; 0 where the loop cannot tell)."""
    cancelling = getattr(task, "cancelling", None)
    return int(cancelling()) if cancelling is not None else 0


class AsyncRedisStore:
    """An ``AsyncStore`` on one Redis server (or Sentinel's master, or a Redis Cluster),
    for the tasks of one event loop."""

    def __init__(
        self,
        client: Any,
        subscribe_timeout: float,
        breaker: CircuitBreaker,
        owns_client: bool = False,
        slots: int | None = None,
        slot_timeout: float = 2.0,
        eviction: EvictionCheck | None = None,
        node_breakers: NodeBreakers | None = None,
        near: NearChannel | None = None,
        switches: Switches = NO_SWITCHES,
    ) -> None:
        check_client(client)
        self.client = client
        self.breaker = breaker  # the whole server's. On a cluster, for commands on no one node
        self._node_breakers = node_breakers if is_cluster(client) or follows_master(client) else None
        self._torn_down = TORN_DOWN if self._node_breakers is not None else ()
        self.eviction = eviction or EvictionCheck()
        self._owns_client = owns_client
        self._slots = asyncio.Semaphore(slots) if slots else None
        self._slot_timeout = slot_timeout
        self._scripts = Scripts(client)
        self.near = near
        self._near_in_script = near if not is_cluster(client) else None  # see RedisStore
        self._blmpop = True  # until a server (before Redis 7) says it has no BLMPOP
        # A cluster client learns the slots before its first command, at once for every
        # task: redis.asyncio's cluster client, initialized lazily by many tasks at once,
        # can hand one of them a connection another is disconnecting.
        self._initialized = not is_cluster(client)
        # Through Sentinel: the switches of master the layer's watch saw, and those this
        # store's pool followed (it asks the sentinels at its next command after one).
        self._switches = switches
        self._followed = self._switches.generation
        self._following = asyncio.Lock()
        self._refreshes: set[asyncio.Task[None]] = set()
        self._initializing = asyncio.Lock()
        self._subscriber: AsyncSubscriber | AsyncShardedSubscriber = (
            AsyncShardedSubscriber(client, subscribe_timeout)
            if is_cluster(client)
            else AsyncSubscriber(client.connection_pool, subscribe_timeout)
        )

    async def get(self, key: str) -> bytes | None:
        breaker = self.breaker if self._node_breakers is None else self._breaker(key)
        breaker.check(key)
        try:
            raw: bytes | None = await self._send(key, self.client.get, key)
        except FAILURES as error:
            raise failure(breaker, "read", key, error) from error
        except self._torn_down as error:
            raise failure(breaker, "read", key, torn_down_error(error)) from error
        breaker.succeeded()
        return raw

    async def get_with_ttl(self, key: str, failing: bool = False) -> tuple[bytes | None, float, bool]:
        breaker = self.breaker if self._node_breakers is None else self._breaker(key)
        breaker.check(key)
        try:
            pipeline = queue_read_with_ttl(self.client.pipeline(transaction=False), key)
            read = with_ttl(*await self._send(key, pipeline.execute))
            if asks_failing(read, failing):
                read = marked(read, await self._send(key, self.client.exists, failing_key(key)))
        except FAILURES as error:
            raise failure(breaker, "read", key, error) from error
        except self._torn_down as error:
            raise failure(breaker, "read", key, torn_down_error(error)) from error
        breaker.succeeded()
        return read

    async def get_many(self, keys: Sequence[str]) -> list[bytes | None]:
        """``RedisStore.get_many``, awaited."""
        if is_cluster(self.client):
            return await self._read_cluster(keys, self._mget_nonatomic, None)
        with self._translated("read", keys[0]):
            return list(await self._send(keys[0], self.client.mget, keys))

    async def _mget_nonatomic(self, keys: Sequence[str]) -> list[bytes | None]:
        return list(await self._send(keys[0], self.client.mget_nonatomic, keys))

    async def get_many_with_ttl(
        self, keys: Sequence[str], failing: bool = False
    ) -> list[tuple[bytes | None, float, bool]]:
        if is_cluster(self.client):
            return await self._read_cluster(keys, functools.partial(self._reads_with_ttl, failing=failing), UNREAD)
        with self._translated("read", keys[0]):
            return await self._reads_with_ttl(keys, failing)

    async def _reads_with_ttl(self, keys: Sequence[str], failing: bool) -> list[tuple[bytes | None, float, bool]]:
        """``RedisStore._reads_with_ttl``, awaited."""
        pipeline = self.client.pipeline(transaction=False)
        batches.queue_reads_with_ttl(pipeline, keys)
        reads = batches.reads_with_ttl(await self._send(keys[0], pipeline.execute))
        stale = batches.asking_failing(reads, failing)
        if stale:
            pipeline = self.client.pipeline(transaction=False)
            batches.queue_failing(pipeline, [keys[index] for index in stale])
            batches.mark_failing(reads, stale, await self._send(keys[0], pipeline.execute))
        return reads

    async def _read_cluster(
        self, keys: Sequence[str], read: Callable[[Sequence[str]], Awaitable[list[T]]], unread: T
    ) -> list[T]:
        """``RedisStore._read_cluster``, awaited."""
        try:
            with self._translated("read", keys[0]):
                return await read(keys)
        except BackendUnavailable as error:
            parts = batches.keys_by_node(keys, lambda key: node_of(self.client, key))
            if len(parts) < 2:
                raise
            failed: BackendUnavailable = error
        reads: list[T] = [unread] * len(keys)
        answered = False
        for part in parts:
            part_keys = [keys[index] for index in part]
            try:
                with self._translated("read", part_keys[0]):
                    batches.put(reads, part, await read(part_keys))
                answered = True
            except BackendUnavailable as error:
                failed = error
        if not answered:
            raise failed
        return reads

    async def acquire_many(self, calls: Sequence[AcquireCall]) -> list[AcquireReply | BackendUnavailable]:
        replies = await self._run_scripts(
            self._scripts.acquires, batches.acquire_calls(calls), "lock", calls[0][0].value
        )
        acquired = batches.acquire_replies(replies, calls, batches.error_reply)
        if self.eviction.pending and any(getattr(reply, "state", None) is LockState.LOCKED for reply in acquired):
            self.eviction.pending = False
            self.eviction.found(await self.server_config())
        return acquired

    async def write_release_many(self, calls: Sequence[WriteCall]) -> list[Written | BackendUnavailable]:
        plain, tagged = batches.tagged_apart(calls)
        written: list[Written | BackendUnavailable] = [Written.REFUSED] * len(calls)
        if plain:
            together = [calls[index] for index in plain]
            calls_ = batches.write_calls(together)
            replies = await self._run_scripts(self._scripts.writes, calls_, "write", together[0][0].value)
            batches.put(written, plain, batches.write_replies(replies, together, batches.error_reply))
        if tagged:
            batches.put(written, tagged, await self._write_tagged_many([calls[index] for index in tagged]))
        return written

    async def _write_tagged_many(self, calls: Sequence[WriteCall]) -> list[Written | BackendUnavailable]:
        """A page's tagged writes in two pipelines: every admission (the order
        ``_core.tags`` shows for a cluster, here on one server too), then the writes
        admitted. A write a tag refused releases its lease."""
        owners, admit = tagging.admissions(calls, is_cluster(self.client))
        replies = await self._run_scripts(
            self._scripts.admissions, admit, "admit a tagged write of", calls[0][0].value, True
        )
        outcome = tagging.admitted(owners, replies, calls)
        written: list[Written | BackendUnavailable] = [Written.REFUSED] * len(calls)
        for index, ok in enumerate(outcome):
            if isinstance(ok, BackendUnavailable):
                written[index] = ok
            elif not ok:
                keys, token = calls[index][0], calls[index][1]
                try:
                    await self.release(keys, token)
                except BackendUnavailable:
                    pass  # the lease runs out by itself
        go = [index for index, ok in enumerate(outcome) if ok is True]
        if go:
            admitted = [calls[index] for index in go]
            calls_ = tagging.entry_writes(admitted)
            replies = await self._run_scripts(self._scripts.tagged_writes, calls_, "write", admitted[0][0].value)
            batches.put(written, go, batches.write_replies(replies, admitted, batches.error_reply))
        return written

    async def _run_scripts(
        self, pair: batches.Pair, calls: list[_scripts.Call], what: str, key: str, alone: bool = False
    ) -> list[Any]:
        """``RedisStore._run_scripts``, awaited."""
        groups = batches.slot_groups(calls, is_cluster(self.client), alone)
        with self._translated(what, key):
            pipeline = self.client.pipeline(transaction=False)
            batches.queue_groups(pipeline, pair, calls, groups)
            replies: list[Any] = await self._send(key, pipeline.execute, raise_on_error=False)
            unknown = batches.unknown_scripts(replies)
            if unknown:
                pipeline = self.client.pipeline(transaction=False)
                batches.queue_groups(pipeline, pair, calls, [groups[index] for index in unknown], by_text=True)
                again = await self._send(key, pipeline.execute, raise_on_error=False)
                for index, reply in zip(unknown, again, strict=True):
                    replies[index] = reply
        return batches.spread(groups, replies, len(calls))

    async def acquire(
        self, keys: EntryKeys, token: str, lease_ms: int, check_value: bool, stale: bytes = b""
    ) -> AcquireReply:
        with self._translated("lock", keys.value):
            call = _scripts.acquire_call(keys, token, lease_ms, check_value, stale)
            reply = await self._send(keys.value, self._scripts.acquire, *call)
        acquired = acquire_reply(reply)
        if self.eviction.pending and acquired.state is LockState.LOCKED:
            self.eviction.pending = False
            self.eviction.found(await self.server_config())
        return acquired

    async def server_config(self) -> dict[Any, Any] | None:
        """``RedisStore.server_config``, awaited."""
        try:
            config: dict[Any, Any] = await self._send("config", self.client.config_get, "maxmemory*")
        except FAILURES:
            return None
        return config

    async def check(self, namespace: str) -> None:
        """``RedisStore.check``, awaited."""
        key = check_key(namespace)
        with translated("check the server with", key, self.breaker):
            await self._send(key, self.client.ping)
            await self._send(key, self.client.set, key, b"1", px=1000)
            await self._send(key, self.client.delete, key)
        self.eviction.pending = False
        self.eviction.found(await self.server_config())

    async def scan(self, namespace: str, match: str = "*") -> set[str]:
        """``RedisStore.scan``, awaited."""
        with translated("scan", namespace, self.breaker):
            if not self._initialized:
                await self._initialize()
            keys = [key async for key in self.client.scan_iter(match=f"{namespace}:{{{match}}}*", count=1000)]
        return entry_value_keys(keys)

    async def renew(self, keys: EntryKeys, token: str, lease_ms: int) -> bool:
        with self._translated("renew the lease of", keys.value):
            call = _scripts.renew_call(keys, token, lease_ms)
            return bool(await self._send(keys.value, self._scripts.renew, *call))

    async def write_release(
        self, keys: EntryKeys, token: str, envelope: bytes, ttl_ms: int, inline: bool, tagged: Tagged | None = None
    ) -> Written:
        if tagged is not None:
            return await self._write_tagged(keys, token, envelope, ttl_ms, inline, tagged)
        with self._translated("write", keys.value):
            call = _scripts.write_release_call(keys, token, envelope, ttl_ms, inline)
            written = await self._send(keys.value, self._scripts.write_release, *call)
        return Written(int(written))

    async def _write_tagged(
        self, keys: EntryKeys, token: str, envelope: bytes, ttl_ms: int, inline: bool, tagged: Tagged
    ) -> Written:
        """``RedisStore._write_tagged``, awaited."""
        cluster = is_cluster(self.client)
        if cluster:
            for group in tagging.by_slot(tagged.tags.tags):
                with self._translated("admit a tagged write of", keys.value):
                    call = _scripts.admit_tags_call(group, keys.value, tagged.since, ttl_ms)
                    admitted = await self._send(keys.value, self._scripts.admit_tags, *call)
                if not admitted:
                    await self.release(keys, token)
                    return Written.REFUSED
        with self._translated("write", keys.value):
            call = _scripts.write_tagged_call(keys, token, envelope, ttl_ms, inline, tagged, not cluster)
            written = await self._send(keys.value, self._scripts.write_tagged, *call)
        return Written(int(written))

    async def touch(self, keys: EntryKeys, token: str, identity: bytes, ttl_ms: int) -> Written:
        with self._translated("keep", keys.value):
            call = _scripts.touch_call(keys, token, identity, ttl_ms)
            return Written(int(await self._send(keys.value, self._scripts.touch, *call)))

    async def tag_clock(self, key: str) -> int:
        with self._translated("read the tag clock", key):
            return int(await self._send(key, self._scripts.read_tag_clock, [key], []))

    async def invalidate_tag(self, clock: str, tag: TagKeys, soft: bool) -> list[str]:
        with self._translated("draw the tag clock", clock):
            drawn = int(await self._send(clock, self._scripts.draw_tag_clock, [clock], []))
        with self._translated("mark the tag", tag.members):
            call = _scripts.mark_tag_call(tag, drawn)
            members = tagging.members_of(await self._send(tag.members, self._scripts.mark_tag, *call))
        pair = self._scripts.expires if soft else self._scripts.invalidates
        what = "expire" if soft else "invalidate"
        done: list[str] = []
        members_keys: list[str] = []  # every member's near copies go, dropped here or not (see below)
        for chunk in tagging.chunks(members):
            value_keys = tagging.value_keys(chunk)
            members_keys += value_keys
            replies = await self._run_scripts(pair, tagging.entry_calls(value_keys), what, value_keys[0])
            done += tagging.dropped(replies, value_keys, what)
            if not soft:
                with self._translated("forget the members of", tag.members):
                    call = _scripts.forget_members_call(tag, chunk)
                    await self._send(tag.members, self._scripts.forget_members, *call)
        # A member another invalidation deleted first is not "dropped" here, but a near
        # cache may still hold its copy: that invalidation may not have asked the near
        # caches yet. So every member is asked for, as ``invalidate`` asks for its key.
        if members_keys and self.near is not None:
            nonce = new_nonce(self.near)
            with self._translated("ask near caches to drop", self.near.members):
                call = _scripts.request_near_call(self.near, nonce, *members_keys)
                reply = await self._send(self.near.members, self._scripts.request_near, *call)
            await self._await_near_caches(reply, nonce)
        return done

    async def entry_tags(self, keys: EntryKeys) -> list[str] | None:
        with self._translated("read the tags of", keys.value):
            return tagging.names_of(await self._send(keys.tags, self.client.get, keys.tags))

    async def release(self, keys: EntryKeys, token: str) -> bool:
        with self._translated("release the lock of", keys.value):
            call = _scripts.release_call(keys, token)
            return bool(await self._send(keys.value, self._scripts.release, *call))

    async def hold(self, keys: EntryKeys, token: str, hold_ms: int, failing_ms: int) -> bool:
        with self._translated("hold the lock of", keys.value):
            call = _scripts.hold_call(keys, token, hold_ms, failing_ms)
            return bool(await self._send(keys.value, self._scripts.hold, *call))

    async def expire(self, keys: EntryKeys) -> None:
        nonce = new_nonce(self.near)
        with self._translated("expire", keys.value):
            call = _scripts.expire_call(keys, self._near_in_script, nonce)
            reply = await self._send(keys.value, self._scripts.expire, *call)
        await self._await_near_caches(await self._ask_near_caches(reply, keys, nonce), nonce)

    async def holder(self, keys: EntryKeys) -> str | None:
        with self._translated("read the lock of", keys.lock):
            token = await self._send(keys.lock, self.client.get, keys.lock)
        return None if token is None else bytes(token).decode(errors="replace")

    async def take_lock(self, keys: EntryKeys, token: str, lease_ms: int, queue_ms: int = 0) -> AcquireReply:
        with self._translated("lock", keys.lock):
            if queue_ms:
                script, call = (
                    self._scripts.take_lock_fairly,
                    _scripts.take_lock_fairly_call(keys, token, lease_ms, queue_ms),
                )
            else:
                script, call = self._scripts.take_lock, _scripts.take_lock_call(keys, token, lease_ms)
            reply = await self._send(keys.lock, script, *call)
        return acquire_reply(reply)

    async def leave_queue(self, keys: EntryKeys, token: str) -> None:
        with self._translated("leave the queue of", keys.lock):
            await self._send(keys.lock, self._scripts.leave_queue, *_scripts.leave_queue_call(keys, token))

    async def invalidate(self, keys: EntryKeys) -> None:
        nonce = new_nonce(self.near)
        with self._translated("invalidate", keys.value):
            call = _scripts.invalidate_call(keys, self._near_in_script, nonce)
            reply = await self._send(keys.value, self._scripts.invalidate, *call)
        await self._await_near_caches(await self._ask_near_caches(reply, keys, nonce), nonce)

    async def seize(self, keys: EntryKeys, token: str, lease_ms: int) -> None:
        nonce = new_nonce(self.near)
        with self._translated("invalidate", keys.value):
            call = _scripts.seize_call(keys, token, lease_ms, self._near_in_script, nonce)
            reply = await self._send(keys.value, self._scripts.seize, *call)
        await self._await_near_caches(await self._ask_near_caches(reply, keys, nonce), nonce)

    async def _ask_near_caches(self, reply: Any, keys: EntryKeys, nonce: str) -> Any:
        """``RedisStore._ask_near_caches``, awaited."""
        if self.near is None or self._near_in_script is not None:
            return reply
        with self._translated("ask near caches to drop", self.near.members):
            call = _scripts.request_near_call(self.near, nonce, keys.value)
            return await self._send(self.near.members, self._scripts.request_near, *call)

    async def _await_near_caches(self, reply: Any, nonce: str) -> None:
        """``RedisStore._await_near_caches``, awaited."""
        wait = near_wait(reply, self.near)
        if wait is None or self.near is None:
            return
        ack_key = self.near.ack_key(nonce)
        while (command := wait.command(ack_key, time.monotonic(), self._blmpop)) is not None:
            try:
                route = ack_route(self.client, ack_key)
                wait.took(await self._send(ack_key, self.client.execute_command, *command, **route))
            except Exception as error:
                if without_blmpop(error, command):
                    self._blmpop = False
                    continue
                warn_near(NOT_HEARD, error)  # acknowledgements cannot be heard: the deadlines will do
                await asyncio.sleep(max(0.0, wait.last_deadline() - time.monotonic()))
                return

    def _translated(self, what: str, key: str) -> AbstractContextManager[None]:
        return translated(what, key, self._breaker(key), self._torn_down)

    def _breaker(self, key: str) -> CircuitBreaker:
        breaker = breaker_for(self.client, self._node_breakers, self.breaker, key)
        if breaker.open and self._node_breakers is not None and self._node_breakers.refresh_due():
            # The slot may have a new owner, or Sentinel a new master (see NodeBreakers):
            # ask in the background. The calls that follow go by the answer once it is in.
            task = asyncio.get_running_loop().create_task(self._refresh_slots())
            self._refreshes.add(task)
            task.add_done_callback(self._refreshes.discard)
        return breaker

    async def _refresh_slots(self) -> None:
        answered = False
        try:
            await refresh_route(self.client)
            answered = True
        except Exception as error:
            log.info("stampede: cannot ask where the server is now (%s)", error)
        finally:
            if self._node_breakers is not None:
                self._node_breakers.refreshed(answered)

    async def _initialize(self) -> None:
        async with self._initializing:
            if not self._initialized:
                try:
                    await self.client.initialize()
                except Exception as error:  # RedisClusterException is not a RedisError
                    raise redis.ConnectionError(f"cannot learn the cluster's slots: {error}") from error
                self._initialized = True

    async def _send(self, key: str, command: Callable[..., Awaitable[T]], *args: Any, **kwargs: Any) -> T:
        """Run one command, within a connection slot when the layer bounds them, and raise
        ``CancelledError`` if the task was cancelled while it ran: redis-py's asyncio
        client sometimes drops a cancellation that lands as a reply comes in, and the call
        would go on (an ``asyncio.timeout`` then never fires). The flow releases what the
        call holds, as after any interruption."""
        task = asyncio.current_task()
        cancelling = cancel_requests(task)
        result = await self._sent(key, command, *args, **kwargs)
        if cancel_requests(task) > cancelling:
            raise asyncio.CancelledError()
        return result

    async def _sent(self, key: str, command: Callable[..., Awaitable[T]], *args: Any, **kwargs: Any) -> T:
        if not self._initialized:
            await self._initialize()
        if self._switches.generation != self._followed:
            await self._follow_master()
        slots = self._slots
        if slots is None:
            return await command(*args, **kwargs)
        if slots.locked():
            try:
                await asyncio.wait_for(slots.acquire(), self._slot_timeout)
            except asyncio.TimeoutError:
                raise BackendUnavailable(
                    f"no free redis connection within {self._slot_timeout} s for {key!r}", key=key
                ) from None
        else:
            await slots.acquire()
        try:
            return await command(*args, **kwargs)
        finally:
            slots.release()

    async def _follow_master(self) -> None:
        """After a switch of master: ask the sentinels, which drops the pool's idle
        connections to the old one (see ``switches``). Every task that meets the switch
        waits for that, so that none sends on a connection about to be dropped."""
        async with self._following:
            generation = self._switches.generation
            if generation == self._followed:
                return  # another task followed it
            try:
                await refresh_route(self.client)
            except Exception as error:  # the sentinels cannot say now: the pool asks on its next connect
                log.info("stampede: cannot ask the sentinels for the new master (%s)", error)
            self._followed = generation

    async def subscribe(self, keys: EntryKeys) -> AsyncSubscription:
        return await self._subscriber.subscribe(keys.channel)

    async def subscribe_many(self, keys: Sequence[EntryKeys]) -> Sequence[AsyncSubscription | BackendUnavailable]:
        return list(await self._subscriber.subscribe_many([entry.channel for entry in keys]))

    async def aclose(self) -> None:
        for task in list(self._refreshes):
            task.cancel()
        await asyncio.gather(*self._refreshes, return_exceptions=True)
        await self._subscriber.aclose()
        if not self._owns_client:
            return
        if is_cluster(self.client):
            await self.client.aclose()
            return
        await self.client.aclose(close_connection_pool=True)
        manager = getattr(self.client.connection_pool, "sentinel_manager", None)
        for sentinel in getattr(manager, "sentinels", ()):  # a client through Sentinel: its sentinels too
            await sentinel.aclose()
