"""The one vocabulary of effects: what a decision asks a performer to do (sans-IO).

Every decision in the package (the miss path of an entry in ``_core.flow``, taking a named
lock in ``_core.acquiring``, Redlock's majority in ``_core.majority``) is a generator that yields
these effects and is sent their replies. ``_drivers.perform`` runs any of them with blocking
calls (``run``) or with awaits (``arun``), and throws every exception, a store's failure
or an interruption, back into the generator at the ``yield`` that asked for it, so
cleanup after an interruption (release the lease, leave the queue) is written in the
decisions, once.

Two kinds of command:

* lease commands act on the one lease the performer was given (``Lease``: the entry's
  keys, the caller's token, the term). The decision never handles the token.
* lock-server commands name their keys and token, because a Redlock decision draws a
  fresh token for every try and addresses the cache server and the lock servers at once.

Effects are frozen dataclasses, and the performers dispatch on them with ``match``
ending in ``unreachable``: an effect without a performer branch fails ``mypy --strict``.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import Any, NoReturn, TypeVar

from .keys import EntryKeys
from .results import Previous
from .tags import Tagged

T = TypeVar("T")

# A wait for a lease to run out ends this long after it should have, so the re-check
# finds it expired rather than racing the server's clock.
LEASE_MARGIN = 0.005


def milliseconds(seconds: float) -> int:
    """A duration as Redis takes it: whole milliseconds, at least 1."""
    return max(1, int(seconds * 1000))


@dataclass(frozen=True, slots=True)
class Lease:
    """The lease a performer's lease commands act on."""

    keys: EntryKeys
    token: str = ""
    ms: int = 0  # the term asked for when it is taken
    queue_ms: int = 0  # a fair lock's place in the queue lasts this long
    # A tagged load's: the namespace's tag clock, which ``Acquire`` reads as it takes the
    # lease, in its round trip where the store can (``AcquireReply.since``, ``_core.tags``).
    clock: str = ""


# --- lease commands: the store, for the performer's lease -------------------------------


@dataclass(frozen=True, slots=True)
class Acquire:
    """Re-check the value and take the lease. Reply: ``AcquireReply``. ``stale``: the
    identity of a stale value the caller read, which the lease is taken over. A lease
    with a ``clock`` reads it too, once taken (``AcquireReply.since``)."""

    check_value: bool = True
    stale: bytes = b""


@dataclass(frozen=True, slots=True)
class TakeLock:
    """Take a named lock (with a fencing token, queued if fair). Reply: ``AcquireReply``."""


@dataclass(frozen=True, slots=True)
class ReadValue:
    """Read the entry's value. Reply: its bytes, or None."""


@dataclass(frozen=True, slots=True)
class ReadEntry:
    """Read the entry's value, the seconds the store keeps it (-1: no expiry, or not
    told) and whether it is marked failing (``Store.get_with_ttl``). Reply: that triple."""


@dataclass(frozen=True, slots=True)
class Renew:
    """Reset the lease to ``lease_ms`` if it is still ours. Reply: bool."""

    lease_ms: int


@dataclass(frozen=True, slots=True)
class WriteRelease:
    """Write the envelope, release the lease, wake the waiters, if the lease is still ours.
    Reply: a ``Written``. Nothing is written unless it is ``Written.YES``."""

    envelope: bytes
    ttl_ms: int
    inline: bool  # the envelope travels in the wake-up message
    tagged: Tagged | None = None  # a tagged entry's: admitted by each tag first (see _core.tags)


@dataclass(frozen=True, slots=True)
class Touch:
    """The loader kept the value (``NOT_MODIFIED``): if the lease is still ours, set the
    value's life to ``ttl_ms`` if it is still the one of ``identity``, release the lease
    and wake the waiters. Reply: a ``Written`` (``YES``: kept)."""

    identity: bytes
    ttl_ms: int


@dataclass(frozen=True, slots=True)
class ReadTagClock:
    """Read the namespace's tag clock at ``key``, before a tagged load begins (see
    ``_core.tags``). Reply: int."""

    key: str


@dataclass(frozen=True, slots=True)
class ReadEntryTags:
    """Read the tags the entry's value was written with (a value kept as not modified is
    written again under all of them). Reply: list[str] or None."""


@dataclass(frozen=True, slots=True)
class Release:
    """Release the lease (by token) without writing, and wake the waiters. Reply: bool."""


@dataclass(frozen=True, slots=True)
class Hold:
    """The loader failed and callers get a stale value: keep the lease as a hold that
    keeps every process from loading the key for ``hold_ms``, mark the entry failing for
    ``failing_ms`` (or until a write), and wake the waiters. Reply: bool (False: the
    lease was no longer ours)."""

    hold_ms: int
    failing_ms: int


@dataclass(frozen=True, slots=True)
class LeaveQueue:
    """Give up the place in a fair lock's queue, waking the others. Reply: None."""


@dataclass(frozen=True, slots=True)
class Invalidate:
    """Delete the value and any lease, and wake the waiters. Reply: None."""


@dataclass(frozen=True, slots=True)
class Seize:
    """Invalidate, and take the lease, in one step: a write-through's first step. Reply:
    None."""


@dataclass(frozen=True, slots=True)
class Put:
    """A write-through (``set``) in one step: ``Seize``, then ``WriteRelease`` under the
    lease just taken, with nothing between them; readers see the old value, then the
    new. Reply: a ``Written``."""

    envelope: bytes
    ttl_ms: int
    inline: bool
    tagged: Tagged | None = None


@dataclass(frozen=True, slots=True)
class Expire:
    """Make the value stale, keeping it for its stale window. Drop any lease and wake the
    waiters. Reply: None."""


@dataclass(frozen=True, slots=True)
class Subscribe:
    """Start listening on the entry's channel. Reply: None."""


@dataclass(frozen=True, slots=True)
class AwaitNotice:
    """Wait for a message on the channel. Reply: None if ``timeout`` passed in silence,
    ``b""`` if the state changed (released, invalidated), else the written envelope."""

    timeout: float


@dataclass(frozen=True, slots=True)
class SettleNotice:
    """Once every message published on the channel before this step has come in (the
    performer subscribes again and waits for that confirmation: ``_backends.channels``),
    the latest message the subscription holds, without waiting. Reply as ``AwaitNotice``'s
    (None: nothing came). A waiter that found the lease free on a re-check takes a value
    its holder handed only to its waiters (``Cached(store=False)``) this way, rather than
    loading again because the message was still on its way."""


# --- work and time -----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Load:
    """Call the loader. Reply: its return value. ``leased``: the performer keeps the
    lease renewed while it runs. ``timeout`` (seconds, 0: none): past it the caller stops
    waiting. The load goes on (``LoadDetached`` is thrown in, its lease still renewed)
    if ``detach``, else it is cancelled and ``LoadTimeout`` thrown in."""

    leased: bool
    timeout: float = 0.0
    detach: bool = True
    previous: Previous | None = None  # the value this load refreshes (``_core.results.previous``)


class LoadDetached(Exception):
    """Thrown into a decision at ``Load``: the load ran past its timeout and goes on.
    ``pending`` is the performer's handle on it, for ``Finish``."""

    def __init__(self, pending: Any) -> None:
        super().__init__("the load ran past its timeout and goes on")
        self.pending = pending


class LeaseLost(Exception):
    """Thrown into a decision at ``Load``: the loader did not run. It had waited for a slot
    of its load budget (``_drivers.abudget``), and its lease was gone when one came: an
    invalidation took it. Loaded now, its value could not be written, and the caller who
    took the lease since loads the key too."""

    def __init__(self) -> None:
        super().__init__("the lease was lost while the load waited for a slot of its budget")


@dataclass(frozen=True, slots=True)
class Finish:
    """When the detached load ``pending`` ends, perform ``then(value, error)`` on this
    lease, in the background (the lease is renewed until then). Reply: None."""

    pending: Any
    then: Callable[[Any, BaseException | None], Decision[None]]


@dataclass(frozen=True, slots=True)
class Pause:
    """Sleep before the next try (bounded polling, a random retry delay). Reply: None."""

    seconds: float


# --- lock-server commands (Redlock): every server, by name and token --------------------


@dataclass(frozen=True, slots=True)
class ServersTake:
    """SET NX PX on every lock server. Reply: ``Round``."""

    keys: EntryKeys
    token: str
    lease_ms: int


@dataclass(frozen=True, slots=True)
class ServersRenew:
    """Compare-and-extend on every lock server. Reply: ``Round``."""

    keys: EntryKeys
    token: str
    lease_ms: int


@dataclass(frozen=True, slots=True)
class ServersRelease:
    """Compare-and-delete on every lock server. Reply: ``Round``."""

    keys: EntryKeys
    token: str


@dataclass(frozen=True, slots=True)
class ServersDrop:
    """Delete the lease on every lock server, whoever holds it. Reply: ``Round``."""

    keys: EntryKeys


@dataclass(frozen=True, slots=True)
class ServersWatch:
    """Wake the performer's subscription (as a message with no value would) when the
    lease at ``keys`` ends: ZooKeeper's watch on the holder's node, so that a holder whose
    session ended is taken over at once. Reply: None."""

    keys: EntryKeys


Effect = (
    Acquire
    | TakeLock
    | ReadValue
    | ReadEntry
    | Renew
    | WriteRelease
    | Touch
    | ReadTagClock
    | ReadEntryTags
    | Release
    | Hold
    | LeaveQueue
    | Invalidate
    | Seize
    | Put
    | Expire
    | Subscribe
    | AwaitNotice
    | SettleNotice
    | Load
    | Finish
    | Pause
    | ServersTake
    | ServersRenew
    | ServersRelease
    | ServersDrop
    | ServersWatch
)

# A decision: yields effects, is sent their replies, returns its outcome.
Decision = Generator[Effect, Any, T]

# The lock-server commands: none of them reads or writes the entry's value.
SERVERS = (ServersTake, ServersRenew, ServersRelease, ServersDrop, ServersWatch)

# The effects a performer shields from a second cancellation: cleanup and the write,
# which must not be cut short once started.
MUST_FINISH = (WriteRelease, Put, Touch, Release, Hold, LeaveQueue, ServersRelease)


def unreachable(effect: NoReturn) -> NoReturn:
    """The end of a ``match`` over ``Effect``: mypy proves it is never reached."""
    raise TypeError(f"no performer branch for {effect!r}")
