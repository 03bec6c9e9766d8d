"""How a Redis store sends its commands: the one part of it the blocking and the asyncio
store do differently, written by hand side by side. The rest of the store is one text
(``astore.py``, and ``store.py`` generated from it), which sends every command through
``_send`` and asks ``_breaker`` which circuit guards a key.

The blocking store sends each command as it is (the generator writes
``self._send(key, command, args)`` as ``command(args)``): redis-py's blocking pool bounds its
connections, and a cluster client learns its slots when it is made. Its commands may be
cut short by ``close()`` from another thread (``closed``). A breaker that finds its
server's circuit open asks where the server is now (the slot's new owner, Sentinel's new
master) in line, at most once per ``NodeBreakers`` interval.

The asyncio store, one per event loop, bounds its own connections when the layer made
the client (at most ``slots`` commands in flight; one that finds every slot taken waits
at most ``slot_timeout``: far cheaper per call than redis.asyncio's blocking pool, which
makes a task and a timer for every connection it hands out), has a cluster client learn
its slots once for every task, follows Sentinel's switches of master the layer's watch
saw, and asks where a server is now in the background.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import redis

from ..._errors import BackendUnavailable
from ..breaker import CircuitBreaker, NodeBreakers
from .commands import breaker_for, is_cluster, refresh_route
from .switches import NO_SWITCHES, Switches

T = TypeVar("T")

log = logging.getLogger("stampede.backend")


def cancel_requests(task: asyncio.Task[Any] | None) -> int:
    """How many cancellations of ``task`` are pending (``Task.cancelling``: Python 3.11
    and later; 0 where the loop cannot tell)."""
    cancelling = getattr(task, "cancelling", None)
    return int(cancelling()) if cancelling is not None else 0


class Sending:
    """The blocking store's way of sending (see the module's docstring)."""

    client: Any
    breaker: CircuitBreaker
    _node_breakers: NodeBreakers | None
    _subscriber: Any

    def _start_sending(self, owns_client: bool, slots: int | None, slot_timeout: float, switches: Switches) -> None:
        """The layer closes a blocking client itself, and its pool bounds it."""
        self.closed = False  # set by close(), before the layer disconnects its pool

    def _ready(self) -> None:
        """Nothing to learn first: a blocking cluster client knows its slots when made."""

    def _breaker(self, key: str) -> CircuitBreaker:
        breaker = breaker_for(self.client, self._node_breakers, self.breaker, key)
        nodes = self._node_breakers
        if breaker.open and nodes is not None and nodes.refresh_due():
            answered = False
            try:  # the slot may have a new owner, or Sentinel a new master (see NodeBreakers)
                refresh_route(self.client)
                answered = True
            except Exception as error:
                log.info("stampede: cannot ask where the server is now (%s)", error)
            finally:
                nodes.refreshed(answered)
            breaker = breaker_for(self.client, nodes, self.breaker, key)
        return breaker

    def close(self) -> None:
        self.closed = True
        self._subscriber.close()


class AsyncSending:
    """The asyncio store's way of sending (see the module's docstring)."""

    client: Any
    breaker: CircuitBreaker
    _node_breakers: NodeBreakers | None
    _subscriber: Any

    def _start_sending(self, owns_client: bool, slots: int | None, slot_timeout: float, switches: Switches) -> None:
        self.closed = False  # set by aclose()
        self._owns_client = owns_client
        self._slots = asyncio.Semaphore(slots) if slots else None
        self._slot_timeout = slot_timeout
        # A cluster client learns the slots before its first command, at once for every
        # task: redis.asyncio's cluster client, initialized lazily by many tasks at once,
        # can hand one of them a connection another is disconnecting.
        self._initialized = not is_cluster(self.client)
        self._initializing = asyncio.Lock()
        # Through Sentinel: the switches of master the layer's watch saw, and those this
        # store's pool followed (it asks the sentinels at its next command after one).
        self._switches = switches
        self._followed = switches.generation
        self._following = asyncio.Lock()
        self._refreshes: set[asyncio.Task[None]] = set()

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
        if self.closed:
            # A task that outlived its loop's close (a write past the close's wait): sent,
            # it would open a connection of a closed pool that nothing closes after.
            raise _closed_before(key)
        if not self._initialized:
            await self._ready()
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
            if self.closed:  # closed while this waited for a slot
                raise _closed_before(key)
            return await command(*args, **kwargs)
        finally:
            slots.release()

    async def _ready(self) -> None:
        """A cluster client's slots, learnt once for every task of the loop."""
        if self._initialized:
            return
        async with self._initializing:
            if not self._initialized:
                try:
                    await self.client.initialize()
                except Exception as error:  # RedisClusterException is not a RedisError
                    raise redis.ConnectionError(f"cannot learn the cluster's slots: {error}") from error
                self._initialized = True

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

    async def aclose(self) -> None:
        self.closed = True
        for task in list(self._refreshes):
            task.cancel()
        await asyncio.gather(*self._refreshes, return_exceptions=True)
        try:
            await self._subscriber.aclose()
        finally:
            await self._close_client()

    async def _close_client(self) -> None:
        if not self._owns_client:
            return
        if is_cluster(self.client):
            await self.client.aclose()
            return
        await self.client.aclose(close_connection_pool=True)
        manager = getattr(self.client.connection_pool, "sentinel_manager", None)
        for sentinel in getattr(manager, "sentinels", ()):  # a client through Sentinel: its sentinels too
            await sentinel.aclose()


def _closed_before(key: str) -> BackendUnavailable:
    return BackendUnavailable(f"the layer's store for this event loop was closed before {key!r}", key=key)


__all__ = ["NO_SWITCHES", "AsyncSending", "Sending", "Switches", "cancel_requests"]
