"""Waiters' mailboxes: where a subscriber (Redis pub/sub, or the embedded store's
publish) delivers the messages of one channel to one waiter. ``ThreadMailbox`` wakes a
blocking waiter. ``LoopMailbox`` wakes a task on its event loop. Both are the store
contract's ``Subscription`` (and ``AsyncSubscription``) and ``_backends.channels``' ``Mailbox``.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any

from .._futures import settle


class ThreadMailbox:
    """One blocking waiter's mailbox on one channel (a ``Mailbox``)."""

    __slots__ = ("_confirmed", "_event", "_message", "_ok", "_on_close", "channel")

    def __init__(self, channel: str, on_close: Callable[[ThreadMailbox], None]) -> None:
        self.channel = channel
        self._event = threading.Event()
        self._message = b""  # the latest message. Read only after _event is set
        self._confirmed = threading.Event()
        self._ok = False  # written before _confirmed is set
        self._on_close = on_close

    def deliver(self, message: bytes) -> None:
        self._message = message
        self._event.set()

    def confirm(self, ok: bool) -> None:
        self._ok = ok
        self._confirmed.set()

    def wait_confirmed(self, timeout: float) -> bool:
        return self._confirmed.wait(timeout) and self._ok

    def wait(self, timeout: float) -> bytes | None:
        """The latest message since the last wait, or None after ``timeout`` in silence."""
        if not self._event.wait(timeout):
            return None
        self._event.clear()
        return self._message

    def close(self) -> None:
        self._on_close(self)


async def within(future: asyncio.Future[bool], timeout: float) -> bool:
    """The future's result, or False after ``timeout``. No task is made for the wait.
    ``future`` must be the caller's own: cancelling the caller cancels it."""
    handle = asyncio.get_running_loop().call_later(timeout, settle, future, False)
    try:
        return await future
    finally:
        handle.cancel()


class LoopMailbox:
    """One asyncio waiter's mailbox on one channel (a ``Mailbox``). ``deliver`` and
    ``confirm`` may be called from any thread (the embedded store's writer can be a
    thread). They hop onto the waiter's loop, where all the state lives."""

    __slots__ = ("_confirmed", "_fired", "_loop", "_message", "_on_close", "_waiter", "channel")

    def __init__(self, channel: str, loop: asyncio.AbstractEventLoop, on_close: Callable[[LoopMailbox], None]) -> None:
        self.channel = channel
        self._loop = loop
        self._message = b""
        self._fired = False  # a message arrived since the last wait
        self._waiter: asyncio.Future[bool] | None = None
        self._confirmed: asyncio.Future[bool] = loop.create_future()
        self._on_close = on_close

    def deliver(self, message: bytes) -> None:
        self._call_soon(self._fire, message)

    def confirm(self, ok: bool) -> None:
        self._call_soon(settle, self._confirmed, ok)

    async def wait_confirmed(self, timeout: float) -> bool:
        return await within(self._confirmed, timeout)

    async def wait(self, timeout: float) -> bytes | None:
        """The latest message since the last wait, or None after ``timeout`` in silence."""
        if not self._fired:
            self._waiter = self._loop.create_future()
            if not await within(self._waiter, timeout):
                return None
        self._fired = False
        return self._message

    def close(self) -> None:
        self._on_close(self)

    def _fire(self, message: bytes) -> None:
        self._message, self._fired = message, True
        if self._waiter is not None:
            settle(self._waiter, True)

    def _call_soon(self, callback: Callable[..., None], *args: Any) -> None:
        try:
            self._loop.call_soon_threadsafe(callback, *args)
        except RuntimeError:
            pass  # the loop is closed: nobody waits here any more
