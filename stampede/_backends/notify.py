"""Wake-ups for blocking waiters: one subscriber connection per layer for every waiting entry.

A ``ThreadMailbox`` is one waiter's mailbox on one channel. Delivery never blocks and
keeps only the latest message: a waiter that is woken re-checks the entry anyway, so
what matters is that it wakes, not how many messages it missed. Who waits on what, and
what a lost connection means, is decided in ``_backends.channels``.

``Subscriber`` threading rules: commands (SUBSCRIBE, UNSUBSCRIBE) are sent by the calling
thread under ``_lock``; only the reader thread reads replies and messages. Sending and
receiving touch different state of the connection, and connect/disconnect happen under
``_lock`` only. A caller's ``subscribe()`` returns once the server has confirmed it, so a
re-check made after it cannot miss the write's message.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

import redis

from .._errors import BackendUnavailable
from .._fork import reset_after_fork
from .channels import Channels
from .mailbox import ThreadMailbox

log = logging.getLogger("stampede")


class Subscriber:
    """One pub/sub connection for all blocking waiters of a process (per layer)."""

    def __init__(self, client: redis.Redis, timeout: float) -> None:
        self._client = client
        self._timeout = timeout  # for connecting and for the server's confirmation
        self._lock = threading.Lock()
        self._wake_reader = threading.Condition(self._lock)
        self._connection: Any = None  # a redis-py Connection while connected, else None
        self._channels = Channels()
        self._reader: threading.Thread | None = None
        self._closed = False
        reset_after_fork(self)

    def subscribe(self, channel: str) -> ThreadMailbox:
        """A mailbox on ``channel``, once the server has confirmed the subscription."""
        subscription = ThreadMailbox(channel, self._unsubscribe)
        with self._lock:
            if self._closed:
                raise BackendUnavailable("the layer is closed")
            try:
                self._ensure_connected()
                if self._channels.add(subscription):
                    self._connection.send_command("SUBSCRIBE", channel)
            except Exception as error:  # the parser's own errors too (see _read)
                self._drop_connection()
                self._channels.remove(subscription)
                raise BackendUnavailable(f"cannot subscribe to {channel!r}: {error}") from error
        if not subscription.wait_confirmed(self._timeout):
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

    def _unsubscribe(self, subscription: ThreadMailbox) -> None:
        with self._lock:
            if self._channels.remove(subscription) and self._connection is not None:
                try:  # fire and forget: the reader reads the confirmation
                    self._connection.send_command("UNSUBSCRIBE", subscription.channel)
                except Exception:
                    self._drop_connection()

    def _ensure_connected(self) -> None:
        if self._connection is not None:
            return
        self._connection = connect_pubsub(self._client.connection_pool, self._timeout)
        self._connection.connect()
        if self._channels:  # after a reconnect: subscribe again to what is awaited
            self._connection.send_command("SUBSCRIBE", *self._channels.resubscribe())
        if self._reader is None or not self._reader.is_alive():
            self._reader = threading.Thread(target=self._read, name="stampede-subscriber", daemon=True)
            self._reader.start()
        self._wake_reader.notify_all()

    def after_fork_in_child(self) -> None:
        """The parent's socket, reader and waiters are not ours to touch."""
        self._lock = threading.Lock()
        self._wake_reader = threading.Condition(self._lock)
        self._connection, self._reader = None, None
        self._channels.clear()

    def _drop_connection(self) -> None:
        """Disconnect and wake everyone: waiters re-check, unconfirmed subscribers fail."""
        connection, self._connection = self._connection, None
        if connection is not None:
            try:
                connection.disconnect()
            except Exception:
                pass  # it is gone either way
        self._channels.on_connection_lost()

    def _read(self) -> None:
        while True:
            with self._lock:
                while self._connection is None and not self._closed:
                    if self._channels:
                        # Waiters are still there: try to reconnect now and then.
                        self._wake_reader.wait(0.5)
                        try:
                            self._ensure_connected()
                        except Exception:  # any failure: the next try is 0.5 s away
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
            except Exception as error:
                # Whatever the parser raises: a lost connection, or one disconnected by
                # another thread mid-read (hiredis then raises TypeError, the Python
                # parser ValueError or AttributeError). The reader must outlive it, or
                # waiters are left to their re-check interval.
                with self._lock:
                    if self._connection is connection and not self._closed:
                        log.info("stampede: subscriber connection lost (%s: %s)", type(error).__name__, error)
                        self._drop_connection()
                continue
            with self._lock:
                self._channels.on_reply(reply)


def connect_pubsub(pool: Any, timeout: float) -> Any:
    """A connection of ``pool``'s class and settings, outside the pool, for pub/sub only:
    RESP2 messages, and no health-check PINGs, which would read replies from the sender.
    Works for the blocking and the asyncio pools alike; the caller connects it."""
    kwargs = {
        name: value
        for name, value in pool.connection_kwargs.items()
        if "maint_notifications" not in name  # RESP3-only; this connection speaks RESP2
    }
    kwargs.update(health_check_interval=0, protocol=2)
    if kwargs.get("socket_connect_timeout") is None:
        kwargs["socket_connect_timeout"] = timeout
    return pool.connection_class(**kwargs)
