"""Wake-ups on a Redis Cluster: sharded pub/sub, one connection per primary with waiters.

A write script SPUBLISHes on the entry's channel, which shares the entry's hash tag, so
the message stays in the shard of the entry's slot. A waiter subscribes (SSUBSCRIBE) on
the connection to the primary that owns that slot, per process for blocking waiters
(``ShardedSubscriber``, one ``Subscriber`` thread per primary) and per event loop for
asyncio ones (``_backends.redis.shards_async``). Commands per stampede still grow with
processes (and loops), not with threads or coroutines: waiters of one channel share one
subscription.

Slots move (a resharding, a failover): the old owner unsubscribes the channel by itself
(or its connection is lost), and its waiters' mailboxes come here (``rehome``), which
asks the cluster for its slots again and subscribes them at the slot's new owner. They
are woken to re-check meanwhile, since a message may have gone while they moved. A
primary that does not own the slot refuses the subscription (MOVED: the cluster's nodes
do not agree yet where it lives), and hands the mailbox back to be moved again, after a
pause (``REHOME_PAUSES``). One that cannot be placed (no owner answers yet, or refused
at every try) is left to its waiter's re-checks, every ``recheck_interval`` at most.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from typing import Any

from ..._errors import BackendUnavailable
from ..._fork import reset_after_fork
from ..mailbox import ThreadMailbox
from .notify import Subscriber, confirm_all, subscribe_each

log = logging.getLogger("stampede.wakeups")

REHOME_PAUSES = (0.0, 0.02, 0.05, 0.1, 0.2, 0.5)
"""The pause before each move of one mailbox to its slot's owner, in seconds: the first
at once, the next ones (each refused) spaced out while the cluster agrees on the slot.
After the last, the mailbox is left to its waiter's re-checks."""


class ShardedSubscriber:
    """Blocking waiters' wake-ups on a ``redis.cluster.RedisCluster``."""

    def __init__(self, client: Any, timeout: float) -> None:
        self._client = client
        self._timeout = timeout
        self._lock = threading.Lock()  # taken before a node's lock, never after
        self._nodes: dict[str, Subscriber] = {}
        self._homes: dict[ThreadMailbox, Subscriber] = {}
        self._moves: dict[ThreadMailbox, int] = {}  # how often each mailbox was moved
        self._closed = False
        reset_after_fork(self)

    def subscribe(self, channel: str) -> ThreadMailbox:
        """A mailbox on ``channel`` at the primary of its slot, once confirmed. Asked once
        more after a refresh of the slots if that node refused it (MOVED) or is gone."""
        for attempt in (1, 2):
            mailbox = ThreadMailbox(channel, self._leave)
            node = self._node_for(channel)
            with self._lock:
                self._homes[mailbox] = node
            try:
                return node.join(mailbox)
            except BackendUnavailable:
                with self._lock:
                    self._homes.pop(mailbox, None)
                if attempt == 2 or self._closed:
                    raise
                self._refresh()
        raise AssertionError("unreachable")

    def subscribe_many(self, channels: Sequence[str]) -> Sequence[ThreadMailbox | BackendUnavailable]:
        """``subscribe`` of each of ``channels``, every SSUBSCRIBE sent (to the primary of
        each slot) before a confirmation is awaited. If a node fails or refuses one, each
        is asked again as ``subscribe`` asks, one at a time, and a channel whose node still
        fails gets that ``BackendUnavailable``: the others are subscribed."""
        mailboxes: list[ThreadMailbox] = []
        try:
            for channel in channels:
                mailbox = ThreadMailbox(channel, self._leave)
                node = self._node_for(channel)
                with self._lock:
                    self._homes[mailbox] = node
                mailboxes.append(node.join(mailbox, confirmed=False))
            return confirm_all(mailboxes, self._timeout)
        except BackendUnavailable:
            for mailbox in mailboxes:
                mailbox.close()
        except BaseException:
            for mailbox in mailboxes:
                mailbox.close()
            raise
        return subscribe_each(self.subscribe, channels)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            nodes = list(self._nodes.values())
            self._homes.clear()
            self._moves.clear()
        for node in nodes:
            node.close()

    def after_fork_in_child(self) -> None:
        self._lock = threading.Lock()
        self._nodes, self._homes, self._moves = {}, {}, {}

    def _node_for(self, channel: str) -> Subscriber:
        """The subscriber of the primary that owns ``channel``'s slot, as the client's
        slot table says."""
        node = self._client.get_node_from_key(channel)
        with self._lock:
            if self._closed:
                raise BackendUnavailable("the layer is closed")
            subscriber = self._nodes.get(node.name)
            if subscriber is None:
                pool = node.redis_connection.connection_pool
                subscriber = Subscriber(pool, self._timeout, sharded=True, on_lost=self._rehome)
                self._nodes[node.name] = subscriber
            return subscriber

    def _leave(self, mailbox: ThreadMailbox) -> None:
        with self._lock:
            self._moves.pop(mailbox, None)
            node = self._homes.pop(mailbox, None)
            if node is not None:
                node.leave(mailbox)

    def _refresh(self) -> None:
        """Ask the cluster which node owns which slots (CLUSTER SLOTS)."""
        try:
            self._client.nodes_manager.initialize()
        except Exception as error:  # no node answers now: the waiters re-check meanwhile
            log.info("stampede: cannot refresh the cluster's slots (%s)", error)

    def _rehome(self, mailboxes: list[ThreadMailbox]) -> None:
        """Mailboxes whose node dropped or refused them (its connection, or their slot,
        is gone): subscribe them where their slots live now, and wake their waiters to
        re-check. Called by that node's reader thread, which the pause holds up."""
        with self._lock:
            moves = max((self._moves.get(mailbox, 0) for mailbox in mailboxes), default=0)
        if 0 < moves < len(REHOME_PAUSES):
            time.sleep(REHOME_PAUSES[moves])
        self._refresh()
        for mailbox in mailboxes:
            with self._lock:
                moved = self._moves.get(mailbox, 0)
            node = None
            if moved < len(REHOME_PAUSES):
                try:
                    node = self._node_for(mailbox.channel)
                except Exception:
                    pass
            with self._lock:
                if mailbox not in self._homes:
                    continue  # its waiter left meanwhile
                self._homes.pop(mailbox)
                if node is not None:
                    try:
                        node.join(mailbox, confirmed=False)
                        self._homes[mailbox] = node
                        self._moves[mailbox] = moved + 1
                    except BackendUnavailable as error:
                        log.info("stampede: cannot subscribe at the new owner of a slot yet (%s)", error)
                elif moved == len(REHOME_PAUSES):
                    log.info("stampede: %r was refused at every try; its waiter re-checks", mailbox.channel)
            mailbox.deliver(b"")
