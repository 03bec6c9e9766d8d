"""Wake-ups for asyncio waiters: one subscriber connection per event loop.

The rules are ``_backends.channels``'s, as for the blocking subscriber. This module only performs
them with redis.asyncio. Everything here belongs to one event loop: a redis.asyncio
connection cannot be used from another, so each loop that waits gets its own subscriber.

Ordering: SUBSCRIBE and UNSUBSCRIBE go through one outbox, sent in order by one task, so
an UNSUBSCRIBE of a channel can never overtake the SUBSCRIBE that follows it. Only the
reader task reads from the connection.

As for blocking waiters, a cluster has one such subscriber per primary per loop, speaking
sharded pub/sub and handing lost mailboxes to ``on_lost`` (``_backends.redis.shards``). Through
Sentinel the subscriber follows the master (see ``_backends.redis.notify``).
"""

from __future__ import annotations

import asyncio
import collections
import logging
import math
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

from redis.exceptions import ResponseError

from ..._errors import BackendUnavailable
from ..channels import Channels
from ..mailbox import LoopMailbox
from .commands import FAILURES, TORN_DOWN
from .notify import FOLLOW_INTERVAL, connect_pubsub

log = logging.getLogger("stampede.wakeups")
T = TypeVar("T")

RECONNECT_INTERVAL = 0.5

AsyncHandoff = Callable[[list[LoopMailbox]], Awaitable[None]]


class AsyncSubscriber:
    """One pub/sub connection for the asyncio waiters of one event loop (per layer), or of
    one cluster node. ``pool`` is the redis.asyncio pool (or cluster node) whose settings,
    and through Sentinel whose master, the connection takes."""

    def __init__(
        self, pool: Any, timeout: float, *, sharded: bool = False, on_lost: AsyncHandoff | None = None
    ) -> None:
        self._pool = pool
        self._timeout = timeout  # for connecting and for the server's confirmation
        self._subscribe_command = "SSUBSCRIBE" if sharded else "SUBSCRIBE"
        self._unsubscribe_command = "SUNSUBSCRIBE" if sharded else "UNSUBSCRIBE"
        self._on_lost = on_lost
        self._follows_master = callable(getattr(pool, "get_master_address", None))
        self._followed_at = 0.0  # monotonic: when the sentinels were last asked (see Subscriber)
        self._channels = Channels()
        self._connection: Any = None
        self._connecting = asyncio.Lock()
        self._outbox: collections.deque[tuple[str, ...]] = collections.deque()
        self._sender: asyncio.Task[None] | None = None
        self._reader: asyncio.Task[None] | None = None
        self._closed = False

    async def subscribe(self, channel: str) -> LoopMailbox:
        """A mailbox on ``channel``, once the server has confirmed the subscription."""
        return await self.join(LoopMailbox(channel, asyncio.get_running_loop(), self.leave))

    async def subscribe_many(self, channels: Sequence[str]) -> list[LoopMailbox]:
        """``Subscriber.subscribe_many``, awaited."""
        loop = asyncio.get_running_loop()
        mailboxes: list[LoopMailbox] = []
        try:
            for channel in channels:
                mailboxes.append(await self.join(LoopMailbox(channel, loop, self.leave), confirmed=False))
        except BaseException:
            for mailbox in mailboxes:
                mailbox.close()
            raise
        return await confirm_all(mailboxes, self._timeout)

    async def join(self, subscription: LoopMailbox, confirmed: bool = True) -> LoopMailbox:
        """``Subscriber.join``, awaited."""
        channel = subscription.channel
        if self._closed:
            raise BackendUnavailable("the layer is closed")
        try:
            await self._follow_master()
            await self._ensure_connected()
        except FAILURES as error:
            raise BackendUnavailable(f"cannot subscribe to {channel!r}: {error}") from error
        if self._channels.add(subscription):
            self._send(self._subscribe_command, channel)
        if not confirmed:
            return subscription
        try:
            confirmed = await subscription.wait_confirmed(self._timeout)
        except BaseException:
            subscription.close()
            raise
        if not confirmed:
            subscription.close()
            raise BackendUnavailable(f"the server did not confirm the subscription to {channel!r}")
        return subscription

    async def aclose(self) -> None:
        self._closed = True
        for task in (self._reader, self._sender):
            if task is not None:
                task.cancel()
        await self._drop(self._connection)

    def leave(self, subscription: LoopMailbox) -> None:
        """Unsubscribe ``subscription``: its waiter is done (its mailbox's ``close``)."""
        if self._channels.remove(subscription):
            self._send(self._unsubscribe_command, subscription.channel)

    def _send(self, *command: str) -> None:
        if self._connection is None:
            return  # the next connection subscribes to whatever is awaited then
        self._outbox.append(command)
        if self._sender is None or self._sender.done():
            self._sender = asyncio.get_running_loop().create_task(self._flush())

    async def _flush(self) -> None:
        while self._outbox:
            connection = self._connection
            if connection is None:
                self._outbox.clear()
                return
            command = self._outbox.popleft()
            try:
                await connection.send_command(*command, check_health=False)
            except (*FAILURES, *TORN_DOWN) as error:
                # TORN_DOWN: the reader dropped the connection while this send was on
                # its way (redis-py then finds its writer gone). Either way it is lost.
                log.info("stampede: subscriber connection lost (%s: %s)", type(error).__name__, error)
                await self._drop(connection)

    async def _ensure_connected(self) -> None:
        if self._connection is not None:
            return
        async with self._connecting:
            if self._connection is not None or self._closed:
                return
            connection = connect_pubsub(self._pool, self._timeout)
            try:
                await connection.connect()
            except BaseException:  # a failed or cancelled connect leaves no socket open
                await _disconnected(connection)
                raise
            if self._closed:  # closed while it connected: nobody would close it after
                await _disconnected(connection)
                return
            self._connection = connection
            if self._channels:  # after a reconnect: subscribe again to what is awaited
                self._send(self._subscribe_command, *self._channels.resubscribe())
            self._reader = asyncio.get_running_loop().create_task(self._read(connection))

    async def _drop(self, connection: Any) -> None:
        """Disconnect and wake everyone: waiters re-check, unconfirmed subscribers fail."""
        if connection is None or connection is not self._connection:
            return
        self._connection = None
        self._outbox.clear()
        self._channels.on_connection_lost()
        await _disconnected(connection)
        if self._on_lost is not None and not self._closed:
            await self._hand_over(None)

    async def _hand_over(self, channels: list[str] | None) -> None:
        """Give the mailboxes of ``channels`` (None: all) to ``on_lost``."""
        orphans = self._channels.take(channels)
        if orphans and self._on_lost is not None:
            await self._on_lost(orphans)  # type: ignore[arg-type]

    async def _follow_master(self) -> None:
        """``Subscriber._follow_master``, awaited."""
        connection = self._connection
        if not self._follows_master or connection is None or time.monotonic() - self._followed_at < FOLLOW_INTERVAL:
            return
        if await self._master_moved(connection):
            log.info("stampede: the master moved while nobody waited; subscribing there")
            await self._drop(connection)

    async def _master_moved(self, connection: Any) -> bool:
        """Through Sentinel: whether the master is now elsewhere than ``connection``."""
        self._followed_at = time.monotonic()
        try:
            address = await keeping_cancellation(self._pool.get_master_address())
        except Exception:  # the sentinels cannot say now. Ask again next time
            return False
        return tuple(address) != (connection.host, connection.port)

    async def _read(self, connection: Any) -> None:
        timeout = FOLLOW_INTERVAL if self._follows_master else math.inf
        moved = False
        try:
            while True:
                try:
                    reply = await connection.read_response(timeout=timeout, disconnect_on_error=False)
                except ResponseError as error:  # refused (MOVED, NOPERM). The connection works
                    log.info("stampede: the server refused a subscription (%s)", error)
                    refused = self._channels.fail_unconfirmed()
                    if refused and self._on_lost is not None:
                        await self._hand_over(refused)  # to the slot's owner, as the cluster says now
                    continue
                if reply is None:  # FOLLOW_INTERVAL passed in silence
                    if self._channels and await self._master_moved(connection):
                        log.info("stampede: the master moved; subscribing there")
                        moved = True
                        break
                    continue
                dropped = self._channels.on_reply(reply)
                if dropped is not None and self._on_lost is not None:
                    await self._hand_over([dropped])
        except asyncio.CancelledError:
            await self._drop(connection)
            raise
        except Exception as error:  # the reader must not die while waiters depend on it
            log.info("stampede: subscriber connection lost (%s)", error)
        await self._drop(connection)
        # Waiters are still there: try to reconnect now and then (at once where the master
        # moved: it is up).
        while self._channels and not self._closed and self._connection is None:
            if not moved:
                await asyncio.sleep(RECONNECT_INTERVAL)
            moved = False
            try:
                await self._ensure_connected()
            except FAILURES:
                self._channels.on_connection_lost()


async def keeping_cancellation(awaitable: Awaitable[T]) -> T:
    """``await awaitable`` in a task of its own, so that cancelling the caller raises
    CancelledError here whatever the awaitable makes of it. redis-py's Sentinel master
    lookup (8.1) can return normally from a cancelled task: a waiter cancelled while it
    subscribed then went on waiting for the lock it had been told to give up."""
    task = asyncio.ensure_future(awaitable)
    try:
        await asyncio.wait({task})
    except asyncio.CancelledError:
        task.cancel()
        task.add_done_callback(_retrieved)
        raise
    return task.result()


def _retrieved(task: asyncio.Future[Any]) -> None:
    """Mark the outcome of a task nobody awaits any more as seen (no warning for it)."""
    if not task.cancelled():
        task.exception()


async def confirm_all(mailboxes: list[LoopMailbox], timeout: float) -> list[LoopMailbox]:
    """``notify.confirm_all``, awaited."""
    deadline = time.monotonic() + timeout
    try:
        for mailbox in mailboxes:
            if not await mailbox.wait_confirmed(max(0.0, deadline - time.monotonic())):
                raise BackendUnavailable(f"the server did not confirm the subscription to {mailbox.channel!r}")
    except BaseException:
        for mailbox in mailboxes:
            mailbox.close()
        raise
    return mailboxes


async def subscribe_each(
    subscribe: Callable[[str], Awaitable[LoopMailbox]], channels: Sequence[str]
) -> list[LoopMailbox | BackendUnavailable]:
    """``notify.subscribe_each``, awaited."""
    mailboxes: list[LoopMailbox | BackendUnavailable] = []
    try:
        for channel in channels:
            try:
                mailboxes.append(await subscribe(channel))
            except BackendUnavailable as error:
                mailboxes.append(error)
    except BaseException:
        for mailbox in mailboxes:
            if isinstance(mailbox, LoopMailbox):
                mailbox.close()
        raise
    return mailboxes


async def _disconnected(connection: Any) -> None:
    """Close ``connection``'s socket, however the connection was lost."""
    try:
        await connection.disconnect(nowait=True)
    except FAILURES:
        pass
