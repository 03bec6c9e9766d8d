"""Named locks' line in ZooKeeper, as the lock stores see it (``ZooKeeperQueue``), and
the mailboxes of this process waiting on each lock (``Wakers``)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Protocol

from ..._core.keys import EntryKeys


class ZooKeeperQueue(Protocol):
    """Named locks' line in ZooKeeper (``_backends.zookeeper.servers.ZooKeeperQueue``)."""

    def enqueue(self, keys: EntryKeys, token: str) -> tuple[int, str | None]: ...

    def leave(self, keys: EntryKeys, token: str) -> None: ...

    def holds(self, keys: EntryKeys, token: str) -> bool: ...

    def watch(self, node: str, wake: Callable[[], None]) -> None: ...


class Wakers:
    """The mailboxes of this process waiting on each named lock, woken by a ZooKeeper
    watch (any thread)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._waiting: dict[str, set[Callable[[bytes], None]]] = {}

    def add(self, channel: str, deliver: Callable[[bytes], None]) -> None:
        with self._lock:
            self._waiting.setdefault(channel, set()).add(deliver)

    def remove(self, channel: str, deliver: Callable[[bytes], None]) -> None:
        with self._lock:
            waiting = self._waiting.get(channel)
            if waiting is not None:
                waiting.discard(deliver)
                if not waiting:
                    del self._waiting[channel]

    def waker(self, channel: str) -> Callable[[], None]:
        def wake() -> None:
            with self._lock:
                waiting = list(self._waiting.get(channel, ()))
            for deliver in waiting:
                deliver(b"")

        return wake
