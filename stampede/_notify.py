"""Wake-ups for waiters: one subscriber connection per process for every waiting entry.

A ``Subscription`` is one waiter's mailbox on one channel. Delivery never blocks and
keeps only the latest message: a waiter that is woken re-checks the entry anyway, so
what matters is that it wakes, not how many messages it missed. For the same reason a
spurious wake-up (``b""``) is always safe, and the subscriber sends one to everybody
whenever its connection breaks.

``Subscriber`` threading rules: commands (SUBSCRIBE, UNSUBSCRIBE) are sent by the calling
thread under ``_lock``; only the reader thread reads replies and messages. Sending and
receiving touch different state of the connection, and connect/disconnect happen under
``_lock`` only. A caller's ``subscribe()`` returns once the server has confirmed it, so a
re-check made after it cannot miss the write's message.
"""

from __future__ import annotations

import logging
import os
import threading
from typing import Any, Callable

import redis
from redis.exceptions import RedisError

from ._errors import BackendUnavailable

log = logging.getLogger("stampede")


class Subscription:
    """One waiter's mailbox on one channel."""

    __slots__ = ("channel", "_event", "_message", "_on_close")

    def __init__(self, channel: str, on_close: Callable[[Subscription], None]) -> None:
        self.channel = channel
        self._event = threading.Event()
        self._message = b""  # the latest message; read only after _event is set
        self._on_close = on_close

    def deliver(self, message: bytes) -> None:
        self._message = message
        self._event.set()

    def wait(self, timeout: float) -> bytes | None:
        """The latest message since the last wait, or None after ``timeout`` in silence."""
        if not self._event.wait(timeout):
            return None
        self._event.clear()
        return self._message

    def close(self) -> None:
        self._on_close(self)


class _Confirmation:
    __slots__ = ("event", "ok")

    def __init__(self) -> None:
        self.event = threading.Event()
        self.ok = False


class Subscriber:
    """One pub/sub connection for all waiting entries of a process (per layer)."""

    def __init__(self, client: redis.Redis, timeout: float) -> None:
        self._client = client
        self._timeout = timeout  # for connecting and for the server's confirmation
        self._lock = threading.Lock()
        self._wake_reader = threading.Condition(self._lock)
        self._connection: Any = None  # a redis-py Connection while connected, else None
        self._subscriptions: dict[str, set[Subscription]] = {}
        self._unconfirmed: dict[str, _Confirmation] = {}
        self._reader: threading.Thread | None = None
        self._closed = False
        self._pid = os.getpid()

    def subscribe(self, channel: str) -> Subscription:
        """A mailbox on ``channel``, once the server has confirmed the subscription."""
        subscription = Subscription(channel, self._unsubscribe)
        with self._lock:
            if self._closed:
                raise BackendUnavailable("the layer is closed")
            if self._pid != os.getpid():
                self._forget_parent()
            try:
                self._ensure_connected()
                members = self._subscriptions.setdefault(channel, set())
                members.add(subscription)
                confirmation = self._unconfirmed.get(channel)
                if len(members) == 1:
                    confirmation = self._unconfirmed[channel] = _Confirmation()
                    self._connection.send_command("SUBSCRIBE", channel)
            except (RedisError, OSError) as error:
                self._drop_connection()
                raise BackendUnavailable(f"cannot subscribe to {channel!r}: {error}") from error
        if confirmation is not None and not (
            confirmation.event.wait(self._timeout) and confirmation.ok
        ):
            subscription.close()
            raise BackendUnavailable(f"the server did not confirm the subscription to {channel!r}")
        return subscription

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._drop_connection()
            self._wake_reader.notify_all()
        if self._reader is not None and self._reader is not threading.current_thread():
            self._reader.join(self._timeout + 1.0)

    def _unsubscribe(self, subscription: Subscription) -> None:
        with self._lock:
            members = self._subscriptions.get(subscription.channel)
            if members is None:
                return
            members.discard(subscription)
            if members:
                return
            del self._subscriptions[subscription.channel]
            if self._connection is not None:
                try:  # fire and forget: the reader reads the confirmation
                    self._connection.send_command("UNSUBSCRIBE", subscription.channel)
                except (RedisError, OSError):
                    self._drop_connection()

    def _ensure_connected(self) -> None:
        if self._connection is not None:
            return
        pool = self._client.connection_pool
        # Our own connection, outside the pool: RESP2 messages, and no health-check
        # PINGs, which would read replies from the sending thread.
        kwargs = {
            name: value
            for name, value in pool.connection_kwargs.items()
            if "maint_notifications" not in name  # RESP3-only; this connection speaks RESP2
        }
        kwargs.update(health_check_interval=0, protocol=2)
        if kwargs.get("socket_connect_timeout") is None:
            kwargs["socket_connect_timeout"] = self._timeout
        connection = pool.connection_class(**kwargs)
        connection.connect()
        self._connection = connection
        if self._subscriptions:  # after a reconnect: subscribe again to what is awaited
            self._connection.send_command("SUBSCRIBE", *self._subscriptions)
        if self._reader is None or not self._reader.is_alive():
            self._reader = threading.Thread(target=self._read, name="stampede-subscriber", daemon=True)
            self._reader.start()
        self._wake_reader.notify_all()

    def _forget_parent(self) -> None:
        """After a fork: the parent's socket, reader and waiters are not ours to touch."""
        self._pid = os.getpid()
        self._connection, self._reader = None, None
        self._subscriptions.clear()
        self._unconfirmed.clear()

    def _drop_connection(self) -> None:
        """Disconnect and wake everyone: waiters re-check, unconfirmed subscribers fail."""
        connection, self._connection = self._connection, None
        if connection is not None:
            try:
                connection.disconnect()
            except (RedisError, OSError):
                pass
        for confirmation in self._unconfirmed.values():
            confirmation.event.set()
        self._unconfirmed.clear()
        for members in self._subscriptions.values():
            for subscription in members:
                subscription.deliver(b"")

    def _read(self) -> None:
        while True:
            with self._lock:
                while self._connection is None and not self._closed:
                    if self._subscriptions:
                        # Waiters are still there: try to reconnect now and then.
                        self._wake_reader.wait(0.5)
                        try:
                            self._ensure_connected()
                        except (RedisError, OSError):
                            self._drop_connection()
                    else:
                        self._wake_reader.wait()
                if self._closed:
                    return
                connection = self._connection
            try:
                if not connection.can_read(timeout=1.0):
                    continue
                if connection is not self._connection:
                    # Dropped while we polled (can_read reconnects a closed connection).
                    connection.disconnect()
                    continue
                reply = connection.read_response(disconnect_on_error=False)
            except (RedisError, OSError, ValueError, AttributeError) as error:
                with self._lock:
                    if self._connection is connection:
                        log.info("stampede: subscriber connection lost (%s)", error)
                        self._drop_connection()
                continue
            self._dispatch(reply)

    def _dispatch(self, reply: Any) -> None:
        if not isinstance(reply, list) or len(reply) != 3:
            return
        kind, channel_raw, data = reply
        channel = channel_raw.decode() if isinstance(channel_raw, bytes) else str(channel_raw)
        with self._lock:
            if kind == b"message":
                for subscription in self._subscriptions.get(channel, ()):
                    subscription.deliver(data)
            elif kind == b"subscribe":
                confirmation = self._unconfirmed.pop(channel, None)
                if confirmation is not None:
                    confirmation.ok = True
                    confirmation.event.set()
