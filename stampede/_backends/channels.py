"""Who waits on which channel: the bookkeeping of a subscriber, without its I/O.

The blocking subscriber (a reader thread) and the asyncio one (a reader task per event
loop) differ only in how they send and read. The rules live here, once:

* Every mailbox that joins a channel makes the subscriber send SUBSCRIBE, even when the
  channel is subscribed already, and is confirmed by the reply to its own SUBSCRIBE
  (replies come in the order the commands were sent). The last one to leave makes it
  send UNSUBSCRIBE.
* A message goes to every *confirmed* mailbox on its channel. So a mailbox gets only
  messages published after the server ran its SUBSCRIBE, which was sent after its waiter
  began: never one still unread from before, however slow the reader. A waiter may take
  such a message's value as its own (``_core.flow``): it was written under a lease taken
  after every invalidation that had returned when the waiter began::

      t=0  process A writes v1 and publishes it; B's reader has not read it yet
      t=1  process C invalidates the entry: done. D takes the lease to load v2
      t=2  a caller in B finds D's lease, joins the channel (B subscribed it already)
      t=3  B's reader reads v1's message

  The caller at t=2 must not be handed v1. Its mailbox is confirmed by the reply to the
  SUBSCRIBE it sent at t=2, which comes after v1's message: v1 goes to the mailboxes
  confirmed before, and the caller waits for D's write.
* A lost connection wakes every mailbox with ``b""`` (a spurious wake-up is always safe:
  a waiter re-checks the entry) and fails every unconfirmed subscription. After a
  reconnect the subscriber subscribes again to every channel still awaited.
* Sharded pub/sub (Redis Cluster) speaks the same language with an ``s`` in front:
  ``smessage``, ``ssubscribe``. The server unsubscribes a shard channel by itself when its
  slot moves to another node. ``on_reply`` returns such a channel, still awaited, so the
  subscriber can hand its mailboxes to the new owner (``take``).

Not thread-safe: the blocking subscriber calls it under its lock, the asyncio one from
its loop only.
"""

from __future__ import annotations

from typing import Any, Protocol


class Mailbox(Protocol):
    """One waiter's end of a subscription."""

    channel: str

    def deliver(self, message: bytes) -> None:
        """Keep ``message`` as the latest and wake the waiter. Never blocks. Any thread."""

    def confirm(self, ok: bool) -> None:
        """The server confirmed the subscription (``ok``), or the connection was lost first."""


class Channels:
    def __init__(self) -> None:
        self._members: dict[str, set[Mailbox]] = {}  # every mailbox on a channel
        self._confirmed: dict[str, set[Mailbox]] = {}  # those that get its messages
        # Per channel, one group of mailboxes for each SUBSCRIBE sent and not yet
        # confirmed, oldest first: the next confirmation is the first group's. A group is
        # kept when its mailboxes leave, so that later replies still meet their own.
        self._unconfirmed: dict[str, list[list[Mailbox]]] = {}

    def add(self, mailbox: Mailbox) -> bool:
        """Register ``mailbox``. Always True: the caller sends SUBSCRIBE for its channel,
        whose confirmation confirms this mailbox (see the module's rules)."""
        self._members.setdefault(mailbox.channel, set()).add(mailbox)
        self._unconfirmed.setdefault(mailbox.channel, []).append([mailbox])
        return True

    def remove(self, mailbox: Mailbox) -> bool:
        """Unregister ``mailbox``. True if the caller must send UNSUBSCRIBE for its channel."""
        channel = mailbox.channel
        members = self._members.get(channel)
        if members is None or mailbox not in members:
            return False
        members.discard(mailbox)
        confirmed = self._confirmed.get(channel)
        if confirmed is not None:
            confirmed.discard(mailbox)
        for group in self._unconfirmed.get(channel, ()):
            if mailbox in group:
                group.remove(mailbox)
        if members:
            return False
        del self._members[channel]
        self._confirmed.pop(channel, None)
        return True

    def on_reply(self, reply: Any) -> str | None:
        """Route one reply read from the subscriber's connection (RESP2 arrays). Returns
        a shard channel the server unsubscribed while mailboxes still wait on it (its slot
        moved, or our own SUNSUBSCRIBE crossed a new member's SSUBSCRIBE: handing such a
        channel over again is harmless), else None."""
        if not isinstance(reply, list) or len(reply) != 3:
            return None
        kind, channel_raw, data = reply
        channel = channel_raw.decode() if isinstance(channel_raw, bytes) else str(channel_raw)
        if kind in (b"message", b"smessage"):
            for mailbox in self._confirmed.get(channel, ()):
                mailbox.deliver(data)
        elif kind in (b"subscribe", b"ssubscribe"):
            groups = self._unconfirmed.get(channel)
            if groups:
                group = groups.pop(0)
                if not groups:
                    del self._unconfirmed[channel]
                if group:
                    self._confirmed.setdefault(channel, set()).update(group)
                for mailbox in group:
                    mailbox.confirm(True)
        elif kind == b"sunsubscribe" and channel in self._members and channel not in self._unconfirmed:
            return channel
        return None

    def fail_unconfirmed(self) -> list[str]:
        """An error reply (a MOVED to an SSUBSCRIBE sent to a node that no longer serves
        the slot): fail the subscriptions still waiting for a confirmation, and return
        their channels that mailboxes still wait on. A waiter still subscribing is told
        (``confirm(False)``) and asks again; a mailbox moved here from another node has
        nobody to tell, so a sharded subscriber routes those channels again (``take``).
        Which SSUBSCRIBE the error answers is not known: every unconfirmed one is failed,
        and a channel routed again to where it was confirms anew, which is harmless."""
        unconfirmed, self._unconfirmed = self._unconfirmed, {}
        for groups in unconfirmed.values():
            for group in groups:
                for mailbox in group:
                    mailbox.confirm(False)
        return [channel for channel in unconfirmed if channel in self._members]

    def take(self, channels: list[str] | None = None) -> list[Mailbox]:
        """Unregister and return the mailboxes of ``channels`` (None: all), without an
        UNSUBSCRIBE: they move to another connection."""
        names = list(self._members) if channels is None else channels
        taken: list[Mailbox] = []
        for channel in names:
            taken.extend(self._members.pop(channel, ()))
            self._confirmed.pop(channel, None)
            self._unconfirmed.pop(channel, None)
        return taken

    def on_connection_lost(self) -> None:
        """Fail unconfirmed subscriptions and wake every waiter to re-check."""
        self.fail_unconfirmed()
        for members in self._members.values():
            for mailbox in members:
                mailbox.deliver(b"")

    def resubscribe(self) -> list[str]:
        """The channels to subscribe to again on a new connection, one SUBSCRIBE each. The
        mailboxes confirmed before stay confirmed: the new connection carries only
        messages published after it subscribed."""
        for channel in self._members:
            self._unconfirmed.setdefault(channel, []).append([])
        return list(self._members)

    def clear(self) -> None:
        self._members.clear()
        self._confirmed.clear()
        self._unconfirmed.clear()

    def __bool__(self) -> bool:
        return bool(self._members)


class Waiting:
    """The mailboxes on each channel of a store that wakes its own waiters, with no
    SUBSCRIBE to send or confirm: the embedded store, and PostgreSQL's listener. Not
    thread-safe: the store calls it under its lock. Each channel's mailboxes are kept in
    the order they came (a dict, not a set, whose order would follow their addresses):
    waiters are woken first come, first served, and a simulated run wakes them in the
    same order every time (``stampede.testing.simulation``)."""

    def __init__(self) -> None:
        self._members: dict[str, dict[Mailbox, None]] = {}

    def add(self, mailbox: Mailbox) -> None:
        self._members.setdefault(mailbox.channel, {})[mailbox] = None

    def remove(self, mailbox: Mailbox) -> None:
        members = self._members.get(mailbox.channel)
        if members is not None:
            members.pop(mailbox, None)
            if not members:
                del self._members[mailbox.channel]

    def on(self, channel: str) -> list[Mailbox]:
        """The mailboxes on ``channel`` now (a copy: deliver to them outside the lock)."""
        return list(self._members.get(channel, ()))

    def everyone(self) -> list[Mailbox]:
        return [mailbox for members in self._members.values() for mailbox in members]
