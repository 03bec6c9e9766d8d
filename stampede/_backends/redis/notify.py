"""Wake-ups for blocking waiters: one subscriber connection per layer for every waiting entry.

A ``ThreadMailbox`` is one waiter's mailbox on one channel. Delivery never blocks and
keeps only the latest message: a waiter that is woken re-checks the entry anyway, so
what matters is that it wakes, not how many messages it missed. Who waits on what, and
what a lost connection means, is decided in ``_backends.channels``.

``Subscriber`` threading rules: commands (SUBSCRIBE, UNSUBSCRIBE) are sent by the calling
thread under ``_lock``. Only the reader thread reads replies and messages. Sending and
receiving touch different state of the connection, and connect/disconnect happen under
``_lock`` only. A caller's ``subscribe()`` returns once the server has confirmed it, so a
re-check made after it cannot miss the write's message.

On a Redis Cluster the layer keeps one such subscriber per primary with waiters, speaking
sharded pub/sub (``sharded=True``): they do not reconnect by themselves but hand their
mailboxes to ``on_lost`` (``_backends.redis.shards``), which routes them to the slot's current
owner. Through Sentinel the subscriber follows the master: while waiters wait it asks
the sentinels every ``FOLLOW_INTERVAL`` where the master is, and moves there. A waiter
that subscribes when nobody has asked for longer than that asks first, so however long
ago the master moved (a frozen master replaced while nobody waited), its subscription is
on the master that the holder's message will come from.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import redis

from ..._errors import BackendUnavailable
from ..._fork import reset_after_fork
from ..channels import Channels
from ..mailbox import ThreadMailbox

log = logging.getLogger("stampede.wakeups")

FOLLOW_INTERVAL = 0.5
"""How often a subscriber through Sentinel asks where the master is, while waiters wait."""

Handoff = Callable[[list[ThreadMailbox]], None]


class Subscriber:
    """One pub/sub connection for all blocking waiters of a process (per layer), or of
    one cluster node. ``pool`` is the redis-py pool whose settings (and, through
    Sentinel, whose master) the connection takes."""

    def __init__(self, pool: Any, timeout: float, *, sharded: bool = False, on_lost: Handoff | None = None) -> None:
        self._pool = pool
        self._timeout = timeout  # for connecting and for the server's confirmation
        self._subscribe_command = "SSUBSCRIBE" if sharded else "SUBSCRIBE"
        self._unsubscribe_command = "SUNSUBSCRIBE" if sharded else "UNSUBSCRIBE"
        self._on_lost = on_lost
        self._orphans: list[ThreadMailbox] = []  # for on_lost, handed over by the reader
        self._follows_master = callable(getattr(pool, "get_master_address", None))
        self._followed_at = 0.0  # monotonic: when the sentinels were last asked where the master is
        self._lock = threading.Lock()
        self._wake_reader = threading.Condition(self._lock)
        self._connection: Any = None  # a redis-py Connection while connected, else None
        self._channels = Channels()
        self._reader: threading.Thread | None = None
        self._closed = False
        reset_after_fork(self)

    def subscribe(self, channel: str) -> ThreadMailbox:
        """A mailbox on ``channel``, once the server has confirmed the subscription."""
        return self.join(ThreadMailbox(channel, self.leave))

    def subscribe_many(self, channels: Sequence[str]) -> list[ThreadMailbox]:
        """``subscribe`` of each of ``channels``: every SUBSCRIBE is sent before the first
        confirmation is awaited, so the waiters of a page cost one round trip, not one
        each. On a failure none is left subscribed."""
        mailboxes: list[ThreadMailbox] = []
        try:
            for channel in channels:
                mailboxes.append(self.join(ThreadMailbox(channel, self.leave), confirmed=False))
        except BaseException:
            for mailbox in mailboxes:
                mailbox.close()
            raise
        return confirm_all(mailboxes, self._timeout)

    def join(self, subscription: ThreadMailbox, confirmed: bool = True) -> ThreadMailbox:
        """Subscribe ``subscription`` (made by this subscriber or by its owner) and return it
        once the server has confirmed, or at once if ``confirmed`` is False (a mailbox
        moved here from another node's connection: its waiter re-checks on its own)."""
        channel = subscription.channel
        with self._lock:
            if self._closed:
                raise BackendUnavailable("the layer is closed")
            try:
                self._follow_master()
                self._ensure_connected()
                if self._channels.add(subscription):
                    self._connection.send_command(self._subscribe_command, channel)
            except Exception as error:  # the parser's own errors too (see _read)
                self._channels.remove(subscription)
                self._drop_connection()
                raise BackendUnavailable(f"cannot subscribe to {channel!r}: {error}") from error
        if confirmed and not subscription.wait_confirmed(self._timeout):
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

    def leave(self, subscription: ThreadMailbox) -> None:
        """Unsubscribe ``subscription``: its waiter is done (its mailbox's ``close``)."""
        with self._lock:
            if self._channels.remove(subscription) and self._connection is not None:
                try:  # fire and forget: the reader reads the confirmation
                    self._connection.send_command(self._unsubscribe_command, subscription.channel)
                except Exception:
                    self._drop_connection()

    def _follow_master(self) -> None:
        """Through Sentinel, under ``_lock``: leave a connection to a master that is no
        longer the master, unless the sentinels were asked within ``FOLLOW_INTERVAL``."""
        if not self._follows_master or self._connection is None:
            return
        if time.monotonic() - self._followed_at < FOLLOW_INTERVAL:
            return
        if self._master_moved(self._connection):
            log.info("stampede: the master moved while nobody waited; subscribing there")
            self._drop_connection()  # waiters re-check. The caller connects to the new one

    def _master_moved(self, connection: Any) -> bool:
        """Ask the sentinels whether the master is elsewhere than ``connection``, noting
        when (a float, written by either thread)."""
        self._followed_at = time.monotonic()
        return master_moved(self._pool, connection)

    def _ensure_connected(self) -> None:
        if self._connection is not None:
            return
        self._connection = connect_pubsub(self._pool, self._timeout)
        self._connection.connect()
        if self._channels:  # after a reconnect: subscribe again to what is awaited
            self._connection.send_command(self._subscribe_command, *self._channels.resubscribe())
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
        self._orphans = []

    def _drop_connection(self) -> None:
        """Disconnect and wake everyone: waiters re-check, unconfirmed subscribers fail.
        With an ``on_lost``, the waiters' mailboxes leave for it instead of waiting here
        for a reconnect."""
        connection, self._connection = self._connection, None
        if connection is not None:
            try:
                connection.disconnect()
            except Exception:
                pass  # it is gone either way
        self._channels.on_connection_lost()
        if self._on_lost is not None and not self._closed:
            self._hand_over(None)

    def _hand_over(self, channels: list[str] | None) -> None:
        """Take the mailboxes of ``channels`` (None: all) off this connection for the
        reader to give to ``on_lost``, outside the lock."""
        self._orphans.extend(self._channels.take(channels))  # type: ignore[arg-type]
        self._wake_reader.notify_all()

    def _give_orphans(self) -> None:
        """Called by the reader without the lock held."""
        with self._lock:
            orphans, self._orphans = self._orphans, []
        if orphans and self._on_lost is not None:
            self._on_lost(orphans)

    def _read(self) -> None:
        next_follow = time.monotonic() + FOLLOW_INTERVAL
        while True:
            self._give_orphans()
            with self._lock:
                while self._connection is None and not self._closed and not self._orphans:
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
                if self._orphans:
                    continue
                connection = self._connection
            if self._follows_master and time.monotonic() >= next_follow:
                next_follow = time.monotonic() + FOLLOW_INTERVAL
                if self._channels and self._master_moved(connection):
                    with self._lock:
                        if self._connection is connection and not self._closed:
                            log.info("stampede: the master moved; subscribing there")
                            self._drop_connection()  # waiters re-check
                            try:  # at once: the new master is up
                                self._ensure_connected()
                            except Exception:  # the reconnect loop tries again in 0.5 s
                                self._drop_connection()
                    continue
            try:
                if not connection.can_read(timeout=FOLLOW_INTERVAL if self._follows_master else 1.0):
                    continue
                if connection is not self._connection:
                    # Dropped while we polled (can_read reconnects a closed connection).
                    connection.disconnect()
                    continue
                reply = connection.read_response(disconnect_on_error=False)
            except redis.ResponseError as error:
                # An error reply, on a connection that still works: a subscription the
                # server refused (MOVED on a cluster, NOPERM), which fails its callers.
                log.info("stampede: the server refused a subscription (%s)", error)
                with self._lock:
                    refused = self._channels.fail_unconfirmed()
                    if refused and self._on_lost is not None:
                        self._hand_over(refused)  # to the slot's owner, as the cluster says now
                continue
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
                dropped = self._channels.on_reply(reply)
                if dropped is not None and self._on_lost is not None:
                    self._hand_over([dropped])


def confirm_all(mailboxes: list[ThreadMailbox], timeout: float) -> list[ThreadMailbox]:
    """Wait until the server has confirmed every subscription of ``mailboxes``, within
    ``timeout`` in all. On a failure every one is closed (unsubscribed)."""
    deadline = time.monotonic() + timeout
    try:
        for mailbox in mailboxes:
            if not mailbox.wait_confirmed(max(0.0, deadline - time.monotonic())):
                raise BackendUnavailable(f"the server did not confirm the subscription to {mailbox.channel!r}")
    except BaseException:
        for mailbox in mailboxes:
            mailbox.close()
        raise
    return mailboxes


def subscribe_each(
    subscribe: Callable[[str], ThreadMailbox], channels: Sequence[str]
) -> list[ThreadMailbox | BackendUnavailable]:
    """``subscribe`` of each of ``channels``, one after the other: a channel whose server
    failed gets that ``BackendUnavailable``, the others their mailbox (on a cluster one
    primary's failure costs its own channels only). On any other failure none is left
    subscribed."""
    mailboxes: list[ThreadMailbox | BackendUnavailable] = []
    try:
        for channel in channels:
            try:
                mailboxes.append(subscribe(channel))
            except BackendUnavailable as error:
                mailboxes.append(error)
    except BaseException:
        for mailbox in mailboxes:
            if isinstance(mailbox, ThreadMailbox):
                mailbox.close()
        raise
    return mailboxes


def master_moved(pool: Any, connection: Any) -> bool:
    """Through Sentinel: whether the master is now elsewhere than ``connection``."""
    try:
        address = pool.get_master_address()
    except Exception:  # the sentinels cannot say now. Ask again next time
        return False
    return tuple(address) != (connection.host, connection.port)


def connect_pubsub(pool: Any, timeout: float) -> Any:
    """A connection of ``pool``'s class and settings, outside the pool, for pub/sub only:
    RESP2 messages, and no health-check PINGs, which would read replies from the sender.
    Works for the blocking and the asyncio pools alike, and for an asyncio cluster node
    (which has the same two attributes). The caller connects it."""
    kwargs = {
        name: value
        for name, value in pool.connection_kwargs.items()
        if "maint_notifications" not in name  # RESP3-only. This connection speaks RESP2
    }
    kwargs.update(health_check_interval=0, protocol=2)
    if kwargs.get("socket_connect_timeout") is None:
        kwargs["socket_connect_timeout"] = timeout
    return pool.connection_class(**kwargs)
