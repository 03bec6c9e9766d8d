"""Wake-ups on a Redis Cluster for asyncio waiters: ``_backends.redis.shards``' rules, per event
loop, with one ``AsyncSubscriber`` per primary with waiters.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import Any

from ..._errors import BackendUnavailable
from ..mailbox import LoopMailbox
from .notify_async import AsyncSubscriber, confirm_all, subscribe_each
from .shards import REHOME_PAUSES

log = logging.getLogger("stampede.wakeups")


class AsyncShardedSubscriber:
    """Asyncio waiters' wake-ups on a ``redis.asyncio.cluster.RedisCluster``, for the
    tasks of one event loop."""

    def __init__(self, client: Any, timeout: float) -> None:
        self._client = client
        self._timeout = timeout
        self._nodes: dict[str, AsyncSubscriber] = {}
        self._homes: dict[LoopMailbox, AsyncSubscriber] = {}
        self._moves: dict[LoopMailbox, int] = {}  # how often each mailbox was moved
        self._closed = False

    async def subscribe(self, channel: str) -> LoopMailbox:
        """``ShardedSubscriber.subscribe``, awaited."""
        for attempt in (1, 2):
            mailbox = LoopMailbox(channel, asyncio.get_running_loop(), self._leave)
            node = await self._node_for(channel)
            self._homes[mailbox] = node
            try:
                return await node.join(mailbox)
            except BackendUnavailable:
                self._homes.pop(mailbox, None)
                if attempt == 2 or self._closed:
                    raise
                await self._refresh()
        raise AssertionError("unreachable")

    async def subscribe_many(self, channels: Sequence[str]) -> Sequence[LoopMailbox | BackendUnavailable]:
        """``ShardedSubscriber.subscribe_many``, awaited."""
        loop = asyncio.get_running_loop()
        mailboxes: list[LoopMailbox] = []
        try:
            for channel in channels:
                mailbox = LoopMailbox(channel, loop, self._leave)
                node = await self._node_for(channel)
                self._homes[mailbox] = node
                mailboxes.append(await node.join(mailbox, confirmed=False))
            return await confirm_all(mailboxes, self._timeout)
        except BackendUnavailable:
            for mailbox in mailboxes:
                mailbox.close()
        except BaseException:
            for mailbox in mailboxes:
                mailbox.close()
            raise
        return await subscribe_each(self.subscribe, channels)

    async def aclose(self) -> None:
        self._closed = True
        self._homes.clear()
        self._moves.clear()
        for node in list(self._nodes.values()):
            await node.aclose()

    async def _node_for(self, channel: str) -> AsyncSubscriber:
        if self._closed:
            raise BackendUnavailable("the layer is closed")
        if not self._client.nodes_manager.slots_cache:
            await self._client.initialize()
        node = self._client.get_node_from_key(channel)
        subscriber = self._nodes.get(node.name)
        if subscriber is None:
            subscriber = AsyncSubscriber(node, self._timeout, sharded=True, on_lost=self._rehome)
            self._nodes[node.name] = subscriber
        return subscriber

    def _leave(self, mailbox: LoopMailbox) -> None:
        self._moves.pop(mailbox, None)
        node = self._homes.pop(mailbox, None)
        if node is not None:
            node.leave(mailbox)

    async def _refresh(self) -> None:
        try:
            await self._client.nodes_manager.initialize()
        except Exception as error:
            log.info("stampede: cannot refresh the cluster's slots (%s)", error)

    async def _rehome(self, mailboxes: list[LoopMailbox]) -> None:
        """``ShardedSubscriber._rehome``, in the loop."""
        moves = max((self._moves.get(mailbox, 0) for mailbox in mailboxes), default=0)
        if 0 < moves < len(REHOME_PAUSES):
            await asyncio.sleep(REHOME_PAUSES[moves])
        await self._refresh()
        for mailbox in mailboxes:
            if self._homes.pop(mailbox, None) is None:
                continue
            moved = self._moves.get(mailbox, 0)
            if moved < len(REHOME_PAUSES):
                try:
                    node = await self._node_for(mailbox.channel)
                    await node.join(mailbox, confirmed=False)
                    self._homes[mailbox] = node
                    self._moves[mailbox] = moved + 1
                except Exception as error:
                    log.info("stampede: cannot subscribe at the new owner of a slot yet (%s)", error)
            elif moved == len(REHOME_PAUSES):
                log.info("stampede: %r was refused at every try; its waiter re-checks", mailbox.channel)
            mailbox.deliver(b"")
