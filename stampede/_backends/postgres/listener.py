"""The one connection per process that LISTENs for the wake-ups of every PostgreSQL
store (blocking, and each event loop's) on one database.

Waiters sleep on ``LISTEN``: ``PostgresListener`` hears every ``NOTIFY`` and hands each to
the mailboxes of its entry. A lost connection wakes them all to re-check (a spurious
wake-up is always safe), and the listener reconnects by itself. A wake-up carries no
value: the woken waiter reads it (one round trip more than Redis's inline message, and
no payload limit to mind).
"""

from __future__ import annotations

import itertools
import logging
import secrets
import threading
from typing import Any

import psycopg

from ..._errors import BackendUnavailable
from ..._fork import reset_after_fork
from ..channels import Mailbox, Waiting
from . import schema as sql

wakeups_log = logging.getLogger("stampede.wakeups")


class PostgresListener:
    """One connection that LISTENs for every store of the process on one database, and
    the mailboxes waiting on each entry's channel. Started by the first waiter.

    A mailbox gets only the wake-ups committed after its waiter began. NOTIFYs reach the
    listener in the order their transactions committed, and some may still be unread when
    a waiter joins: one of them may carry a value an invalidation has removed since (see
    ``_backends.channels``). So a mailbox that joins a listening connection is confirmed
    by a fence: its store NOTIFYs ``f<fence>`` after the join, and the mailbox is given
    wake-ups from the moment the listener reads that fence. A mailbox that joins while
    nothing listens is confirmed when LISTEN is in place: the connection hears nothing
    older."""

    def __init__(self, conninfo: str, settings: dict[str, Any], timeout: float) -> None:
        self._conninfo = conninfo
        self._settings = {key: value for key, value in settings.items() if key != "options"}
        self._settings["autocommit"] = True
        self.timeout = timeout
        self._lock = threading.Lock()
        self._fence_prefix = f"{secrets.token_hex(6)}."
        self._fences = itertools.count()
        self._reset()
        self._stop = threading.Event()
        reset_after_fork(self)

    def _reset(self) -> None:
        self._waiting = Waiting()  # confirmed mailboxes: they get their channel's wake-ups
        self._unconfirmed: dict[str, Mailbox] = {}  # by fence ("": joined while nothing listened: a key each)
        self._listening = False  # LISTEN is in place. Written under _lock
        self._thread: threading.Thread | None = None

    def after_fork_in_child(self) -> None:
        self._lock = threading.Lock()
        self._reset()  # the parent's thread and connection are not in the child

    def join(self, mailbox: Mailbox) -> str | None:
        """Register ``mailbox``, unconfirmed (starting the listener at the first). The
        fence its store must NOTIFY (``sql.fence``) for the listener to confirm it, or
        None: nothing listens yet, and LISTEN will confirm it. The caller then waits for
        the mailbox's confirmation."""
        with self._lock:
            if self._stop.is_set():
                raise BackendUnavailable("the layer is closed")
            fence = f"{self._fence_prefix}{next(self._fences)}"
            self._unconfirmed[fence] = mailbox
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="stampede-pg-listener", daemon=True)
                self._thread.start()
            return fence if self._listening else None

    def detach(self, mailbox: Mailbox) -> None:
        with self._lock:
            self._waiting.remove(mailbox)
            for fence, unconfirmed in list(self._unconfirmed.items()):
                if unconfirmed is mailbox:
                    del self._unconfirmed[fence]

    def close(self) -> None:
        self._stop.set()
        with self._lock:
            thread, self._thread = self._thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join()

    def _run(self) -> None:
        backoff, reconnect = 0.05, False
        while not self._stop.is_set():
            try:
                connection = psycopg.Connection.connect(self._conninfo, **self._settings)
            except psycopg.Error as error:
                wakeups_log.info("stampede: cannot connect to listen for wake-ups (%s)", error)
                self._stop.wait(backoff)
                backoff = min(1.0, backoff * 2)
                continue
            backoff = 0.05
            try:
                connection.execute(f"LISTEN {sql.NOTIFY_CHANNEL}")
                if reconnect:
                    self._wake_all()  # whatever was sent while no connection listened is lost
                reconnect = True
                self._listening_now()
                while not self._stop.is_set():
                    for notice in connection.notifies(timeout=0.2):
                        self._deliver(notice.payload)
            except psycopg.Error as error:
                if not self._stop.is_set():
                    wakeups_log.warning("stampede: lost the connection that listens for wake-ups (%s)", error)
            finally:
                with self._lock:
                    self._listening = False
                connection.close()
                self._wake_all()

    def _listening_now(self) -> None:
        """LISTEN is in place on a new connection: every mailbox waiting for a fence is
        confirmed, the fence's NOTIFY perhaps lost with the old connection. This one
        carries only what committed after it listened."""
        with self._lock:
            self._listening = True
            unconfirmed, self._unconfirmed = list(self._unconfirmed.values()), {}
            for mailbox in unconfirmed:
                self._waiting.add(mailbox)
        for mailbox in unconfirmed:
            mailbox.confirm(True)

    def _deliver(self, payload: str) -> None:
        if payload.startswith(sql.FENCE):
            with self._lock:
                mailbox = self._unconfirmed.pop(payload[len(sql.FENCE) :], None)
                if mailbox is not None:
                    self._waiting.add(mailbox)
            if mailbox is not None:
                mailbox.confirm(True)
            return
        channel, message = sql.wake_up(payload)
        if channel == "*":  # a channel too long for a wake-up of its own
            self._wake_all()
            return
        with self._lock:
            members = self._waiting.on(channel)
        for mailbox in members:
            mailbox.deliver(message)

    def _wake_all(self) -> None:
        with self._lock:
            members = self._waiting.everyone()
        for mailbox in members:
            mailbox.deliver(b"")
