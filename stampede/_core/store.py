"""The store contract: what the decisions need from a backend, blocking (``Store``) and
asyncio (``AsyncStore``: the same methods, awaited), with the replies they exchange.

A backend stores envelopes, holds leases (a lock key with a token and an expiry) and
wakes waiters. Methods raise ``BackendUnavailable`` when the store fails, never a
client library's own exception. Durations are in milliseconds, as Redis takes them.
Every backend passes the same contract suite (``tests/promises/test_store_contract.py``).

Lock servers (Redlock's majority) have a contract of their own: each command goes to
every server and is answered with a ``Round``, a server's failure counted, not raised.

The contract is split into the roles it has, so that a capability touches one:
``EntryStore`` (one entry's value, its load's lease, its waiters), ``ControlStore``
(invalidations and writes from outside a load), ``ManyKeyStore`` (many entries at once,
which ``OneByOne`` builds from the first), ``TagStore``, ``NamedLockStore`` and
``StoreAdmin`` every store has; ``BudgetStore`` (load budgets), ``HotSetStore`` (hot
sets), ``SlotLeaseStore`` (a budget that reads the entries' leases) and ``StreamStore``
(a streamed load's relay) only the stores
that declare them in ``optional_roles`` (``Roles``), so that a store of one's own need
not write them, and a capability that needs one is refused at decoration, by name.
``Store`` is all of them, and ``AsyncStore`` the same, awaited.

Rules of the imports: this module, like the decisions, imports nothing of a client
library, of threading or of asyncio. Backends implement it, drivers call it.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from .._errors import BackendUnavailable
from .keys import EntryKeys
from .tags import Tagged, TagKeys

FAILED_HOLD = "!failed"
"""What a lock key holds during a failed load's hold (``Store.hold``), in every backend
(the Redis scripts spell it out); never a token, which is hex."""


AcquireCall = tuple[EntryKeys, str, int, bool, bytes]
"""One entry's ``Store.acquire`` in ``Store.acquire_many``: keys, token, lease_ms, check_value, stale."""

WriteCall = tuple[EntryKeys, str, bytes, int, bool, Tagged | None]
"""One entry's ``Store.write_release`` in ``Store.write_release_many``: keys, token,
envelope, ttl_ms, inline, tagged."""


class Roles(enum.Flag):
    """The optional roles a store has, as it declares them (``optional_roles``)."""

    NONE = 0
    BUDGETS = enum.auto()  # ``BudgetStore``: load budgets (``max_concurrent_loads``)
    HOT_SETS = enum.auto()  # ``HotSetStore``: hot sets (``hot_sample``, warm starts)
    SLOT_LEASES = enum.auto()  # ``SlotLeaseStore``: a slot granted only while the entry's lease holds
    STREAMS = enum.auto()  # ``StreamStore``: a streamed load's chunks relayed to its listeners


def roles_of(store: object) -> Roles:
    """The optional roles ``store`` declares (none, for a store that declares nothing)."""
    roles = getattr(store, "optional_roles", Roles.NONE)
    return roles if isinstance(roles, Roles) else Roles.NONE


class LockState(enum.Enum):
    VALUE = "value"  # the value is there. No lock taken
    LOCKED = "locked"  # the lock is ours
    HELD = "held"  # another holder has it
    LEASE_GONE = "lease gone"  # a budget's slot asked for an entry whose lease is no longer the caller's


GRANTED = b"g"
"""What a load budget's waiter is told on its own channel when a released slot was handed
to it (``BudgetStore.release_slot``): it holds the slot already."""

LEASE_GONE = b"l"
"""What a load budget's waiter is told on its own channel when a released slot would
have been handed to it but the lease of the entry it would load was gone
(``SlotLeaseStore``): it has no slot and no place in the queue."""

TRACE_MARK = "."
"""What a lease token that carries its holder's trace holds, between its random part and
the trace's ids (``stampede._drivers.tracing``): never a hex digit. A store tells a caller
refused a lease who holds it (``AcquireReply.holder``) only if the holder's token holds
this mark, so that an untraced holder's token never leaves the server. Each store takes it
from here: the Redis scripts as an argument, PostgreSQL's schema and the in-memory store
as this constant, a store outside the package as part of this contract."""


@dataclass(frozen=True, slots=True)
class AcquireReply:
    state: LockState
    raw: bytes | None = None
    lease_left: float = 0.0  # seconds, for HELD
    fence: int = 0  # a named lock's fencing token, for LOCKED by ``take_lock``
    failed: bool = False  # HELD by a failed load's hold (``Store.hold``), not by a load
    # HELD: the holder's token where the store returns it and it carries the holder's
    # trace (holds ``TRACE_MARK``), else "". Read by traces only, never by a decision.
    holder: str = ""
    # VALUE: the seconds the store keeps the value (-1: no expiry, or the store does not
    # tell). A value found past its ttl (an ``expire`` since) is no fresh value (_core.flow).
    ttl_left: float = field(default=-1.0, compare=False)
    # LOCKED, asked with a tag clock: the clock read with the lease (None: not read; the
    # load reads it on its own, ``ReadTagClock``, before it begins). Read before the load
    # begins, as ``_core.tags`` asks, never after: an invalidation after it wins.
    since: int | None = field(default=None, compare=False)


class Written(enum.IntEnum):
    """What became of a write (the write script's reply)."""

    YES = 1  # written, the lease released, the waiters woken
    REFUSED = 0  # the lease was not ours: invalidated, or lapsed and taken over
    VANISHED = -1  # the lease was gone, and no invalidation had dropped it


@dataclass(frozen=True, slots=True)
class Round:
    """What the lock servers answered to one command sent to each of them."""

    agreed: int  # servers that granted (took, released, renewed) it
    failed: int  # servers that did not answer: down, timed out, or an error reply
    lease_left: float = 0.0  # a refused take: the shortest lease another holder has left (s)


class Subscription(Protocol):
    """A blocking waiter's confirmed mailbox on an entry's channel."""

    def wait(self, timeout: float) -> bytes | None:
        """The latest message since the last wait (``b""``: the state changed, else the
        written envelope), or None after ``timeout`` in silence."""

    def close(self) -> None:
        """Stop listening."""


class AsyncSubscription(Protocol):
    """``Subscription`` for a task."""

    async def wait(self, timeout: float) -> bytes | None: ...

    def close(self) -> None: ...


class Renewable(Protocol):
    """What the lease watchdog needs: a store, or a lock over several servers."""

    def renew(self, keys: EntryKeys, token: str, lease_ms: int) -> bool:
        """Extend the lease if ``token`` still holds it."""


class AsyncRenewable(Protocol):
    """``Renewable`` for an asyncio renewal task."""

    async def renew(self, keys: EntryKeys, token: str, lease_ms: int) -> bool: ...


class EntryStore(Protocol):
    """One entry's value, its lease and its waiters: what every call needs."""

    def get(self, key: str) -> bytes | None:
        """The raw bytes at ``key``, or None."""

    def get_with_ttl(self, key: str, failing: bool = False) -> tuple[bytes | None, float, bool]:
        """The raw bytes at ``key`` (or None), the seconds the store keeps them, by its own
        clock (-1: no expiry), and, if ``failing`` asks, whether the entry is marked failing
        (``hold``, else False), read in one round trip. The mark matters for a value past
        its ttl only (``_core.freshness``): a store may leave it unread, False, for a value
        still within it (Redis does: a fresh hit is GET and PTTL, an EXISTS after for a
        stale one)."""

    def acquire(
        self, keys: EntryKeys, token: str, lease_ms: int, check_value: bool, stale: bytes = b"", clock: str = ""
    ) -> AcquireReply:
        """Return the value if there is one (and ``check_value``), else take the lock or
        report how long another holder's lease has left (and whether that is a failed
        load's hold). ``stale``: the identity of a stale value the caller read. The lock
        is taken over that value, and only another one is returned. ``clock``: a tagged
        load's tag clock (``TagStore.tag_clock``), read once the lock is taken and
        returned as ``since``, in the same round trip where the store can (else ``since``
        is None, and the flow reads the clock in a step of its own)."""

    def hold(self, keys: EntryKeys, token: str, hold_ms: int, failing_ms: int) -> bool:
        """After a failed load whose callers get a stale value: if ``token`` still holds the
        lease, turn it into a hold that no token owns, for ``hold_ms``, mark the entry
        failing (``keys.failing``) for ``failing_ms``, and wake waiters. A successful
        ``write_release``, ``invalidate`` and ``expire`` remove the mark."""

    def renew(self, keys: EntryKeys, token: str, lease_ms: int) -> bool:
        """Extend the lease if ``token`` still holds it."""

    def write_release(
        self, keys: EntryKeys, token: str, envelope: bytes, ttl_ms: int, inline: bool, tagged: Tagged | None = None
    ) -> Written:
        """If ``token`` still holds the lease: write, release, wake waiters (with the
        envelope if ``inline``) and return ``Written.YES``. Else write nothing and say why
        (``REFUSED``: invalidated or taken over, ``VANISHED``: gone, not invalidated).
        ``tagged``: each tag admits the entry first, or the write is ``REFUSED``, the
        lease released and the waiters woken (see ``_core.tags``)."""

    def touch(self, keys: EntryKeys, token: str, identity: bytes, ttl_ms: int) -> Written:
        """If ``token`` still holds the lease: release it, wake the waiters, and if the
        value is still the one of ``identity`` (its first bytes), make it live ``ttl_ms``
        from now and drop the failing mark (``YES``), else keep nothing (``REFUSED``).
        Without the lease, as ``write_release``. A loader answered ``NOT_MODIFIED``."""

    def release(self, keys: EntryKeys, token: str) -> bool:
        """Release the lease if ``token`` holds it, wake waiters to re-check, and return
        True. Return False if the lease was not ``token``'s."""

    def holder(self, keys: EntryKeys) -> str | None:
        """The token holding the lease, or None."""

    def subscribe(self, keys: EntryKeys) -> Subscription:
        """A confirmed mailbox on the entry's channel."""


class ControlStore(Protocol):
    """What is done to an entry from outside its load: the controls (``invalidate``,
    ``expire``, ``set``'s seizure and write) and the mark a versioned load leaves. Each
    drops or takes over the entry's lease and wakes its waiters."""

    def expire(self, keys: EntryKeys) -> None:
        """Make the value stale but keep it for the stale window it was written with (or
        delete it, if none). Drop any lease and wake waiters, as ``invalidate`` does."""

    def mark_versioned(self, keys: Sequence[EntryKeys], marker_ms: int) -> None:
        """Mark each entry (of a loader without ``version=``) as one a versioned loader is
        about to load a version of (``keys.versioned``), for ``marker_ms`` at least: its
        ``invalidate``, ``expire``, ``seize`` and ``put`` from then on call
        ``_core.versions.saw_versions`` with its value key, in the step they take."""

    def invalidate(self, keys: EntryKeys) -> None:
        """Delete the value and any lease, and wake waiters to re-check. A holder's write
        after it is ``REFUSED``. A versioned mark on the entry is reported
        (``mark_versioned``)."""

    def seize(self, keys: EntryKeys, token: str, lease_ms: int) -> None:
        """``invalidate``, and take the lease for ``token``, in one step: a write-through's
        first step (see ``_core.controls``). The waiters it wakes find the lease taken."""

    def put(
        self, keys: EntryKeys, token: str, lease_ms: int, envelope: bytes, ttl_ms: int, inline: bool,
        tagged: Tagged | None = None,
    ) -> Written:  # fmt: skip
        """``seize`` for ``token``, then ``write_release`` under it: a write-through
        (``set``), in one step where the store can (one script on Redis), so that readers
        see the old value and then the new, never the entry absent between them. Where it
        is two steps, a failure between them releases the lease."""


class ManyKeyStore(Protocol):
    """Many entries at once, for ``cached_loader_many``: each answered as its one-entry
    command would be. ``stampede.backends.OneByOne`` builds the role from ``EntryStore``'s
    commands, for a store with no faster way."""

    def get_many(self, keys: Sequence[str]) -> list[bytes | None]:
        """``get`` of each of ``keys`` (at least one), in one round trip per server where
        the store can: a many-key call's first read."""

    def get_many_with_ttl(self, keys: Sequence[str], failing: bool = False) -> list[tuple[bytes | None, float, bool]]:
        """``get_with_ttl`` of each of ``keys``, together."""

    def acquire_many(self, calls: Sequence[AcquireCall]) -> list[AcquireReply | BackendUnavailable]:
        """``acquire`` for each call (keys, token, lease_ms, check_value, stale), together.
        An entry's failure is its ``BackendUnavailable`` in its place. A failure of them
        all (the server unreachable) is raised."""

    def write_release_many(self, calls: Sequence[WriteCall]) -> list[Written | BackendUnavailable]:
        """``write_release`` for each call (keys, token, envelope, ttl_ms, inline),
        together, each answered as ``acquire_many`` answers."""

    def subscribe_many(self, keys: Sequence[EntryKeys]) -> Sequence[Subscription | BackendUnavailable]:
        """``subscribe`` of each entry, confirmed together where the store can (one round
        trip). A store over several servers (a cluster) answers a failed server's entries
        with its ``BackendUnavailable`` and subscribes the others; a failure of the whole
        raises. None is left subscribed for an entry that failed."""


class TagStore(Protocol):
    """Tags (``_core.tags``): the tag clock, a tag's members, its invalidation."""

    def tag_clock(self, key: str) -> int:
        """The tag clock at ``key`` (see ``_core.tags``): read before a tagged load."""

    def invalidate_tag(self, clock: str, tag: TagKeys, soft: bool) -> list[str]:
        """Draw the next tag clock, mark ``tag`` invalidated with it, and ``invalidate``
        (``soft``: ``expire``) each live member, near copies too. Return the value keys
        of the members. Members invalidated are forgotten (not after ``soft``: a stale
        value stays a member while it lives)."""

    def entry_tags(self, keys: EntryKeys) -> list[str] | None:
        """The tags the entry's value was written with (None: no value, or no tags)."""


class NamedLockStore(Protocol):
    """Named locks (``layer.lock()``): fenced, and fair when asked."""

    def take_lock(self, keys: EntryKeys, token: str, lease_ms: int, queue_ms: int = 0) -> AcquireReply:
        """Take a named lock (LOCKED, with the next fencing token from ``keys.value``) or
        report how long the holder's lease has left (HELD). With ``queue_ms``, in arrival
        order: join the queue (or renew the place in it for ``queue_ms``) and take the
        lock only when first in line."""

    def leave_queue(self, keys: EntryKeys, token: str) -> None:
        """Give up a place in a fair lock's queue, waking the other waiters."""


class BudgetStore(Protocol):
    """Load budgets (``max_concurrent_loads``): a semaphore of leased slots with a fair
    queue, its keys a named lock's (``_core.keys.budget_keys``): ``keys.lock`` holds the
    slots, ``keys.queue`` the waiters; a waiter listens on a channel of its own
    (``EntryKeys.waiter``)."""

    def take_slot(self, keys: EntryKeys, token: str, lease_ms: int, queue_ms: int, slots: int) -> AcquireReply:
        """Take a slot for ``lease_ms`` (LOCKED) if fewer than ``slots`` are held and no
        live waiter queued earlier is still owed one, else keep the caller's place in the
        queue for ``queue_ms`` and report (HELD) how long the earliest holder's lease has
        left (0 when a slot is free for a waiter ahead). A holder whose lease ran out has
        lost its slot; a take by a holder renews it."""

    def renew_slot(self, keys: EntryKeys, token: str, lease_ms: int) -> bool:
        """Extend a slot's lease while ``token`` holds it; False once it is lost."""

    def release_slot(self, keys: EntryKeys, token: str, slots: int, lease_ms: int) -> bool:
        """Give a slot, or a place in the queue, back, and hand each free slot of
        ``slots`` to the first live waiter in line: it holds the slot (for ``lease_ms``)
        and is told ``GRANTED`` on its own channel (``EntryKeys.waiter``). A freed slot
        wakes one waiter, not every one, and the woken waiter need not ask again. False
        if ``token`` held no slot."""


class HotSetStore(Protocol):
    """Hot sets (``hot_sample``, ``_core.hotset``): sorted sets of counted members, one per
    loader and period, with keys of their own (``{namespace}:{~hot:...}:...``)."""

    def note_hot(self, key: str, counts: Mapping[bytes, int], limit: int, ttl_ms: int) -> None:
        """Add each member's count to the set ``key``, keep its ``limit`` most counted
        members (the least counted go; of equal counts, the lowest bytes), and let the set
        live ``ttl_ms`` from now."""

    def hot_members(self, key: str, count: int) -> list[tuple[bytes, float]]:
        """The ``count`` most counted members of the set, with their counts, highest first
        (of equal counts, the highest bytes first). Empty once the set ran out."""


class StreamStore(Protocol):
    """A streamed load's relay: the records its leader (the holder of lease ``token``)
    appends, in order, for listeners in any process to read as they come. A run's relay
    is its own (``EntryKeys.relay``): two runs never share one, so a listener that follows
    the holder it read never receives another run's records."""

    def relay_add(self, keys: EntryKeys, token: str, records: Sequence[bytes], first: int, linger_ms: int) -> None:
        """Append ``records`` (the run's ``first``-th onwards, counted from 0) to the run's
        relay, which the store keeps ``linger_ms`` past this call."""

    def relay_read(self, keys: EntryKeys, token: str, after: int, block_ms: int) -> list[bytes]:
        """The run's records from the ``after``-th on (counted from 0), waiting up to
        ``block_ms`` for one if there is none yet (0: do not wait). An empty list: none."""


class StoreAdmin(Protocol):
    """What the layer and the command line ask of a store as a whole."""

    def check(self, namespace: str) -> None:
        """Raise ``BackendUnavailable`` naming the cause unless the store answers and takes
        writes in ``namespace``."""

    def scan(self, namespace: str, match: str = "*") -> set[str]:
        """The value keys of every cache entry in ``namespace``, named locks left out."""

    def close(self) -> None:
        """Release connections and threads the store started."""


class Store(
    EntryStore, ControlStore, ManyKeyStore, TagStore, NamedLockStore, BudgetStore, HotSetStore, StoreAdmin, Protocol
):
    """Every role: what a backend's blocking store implements (``stampede.backends``)."""


class AsyncEntryStore(Protocol):
    """``EntryStore`` for the tasks of one event loop."""

    async def get(self, key: str) -> bytes | None: ...

    async def get_with_ttl(self, key: str, failing: bool = False) -> tuple[bytes | None, float, bool]: ...

    async def acquire(
        self, keys: EntryKeys, token: str, lease_ms: int, check_value: bool, stale: bytes = b"", clock: str = ""
    ) -> AcquireReply: ...

    async def hold(self, keys: EntryKeys, token: str, hold_ms: int, failing_ms: int) -> bool: ...

    async def renew(self, keys: EntryKeys, token: str, lease_ms: int) -> bool: ...

    async def write_release(
        self, keys: EntryKeys, token: str, envelope: bytes, ttl_ms: int, inline: bool, tagged: Tagged | None = None
    ) -> Written: ...

    async def touch(self, keys: EntryKeys, token: str, identity: bytes, ttl_ms: int) -> Written: ...

    async def release(self, keys: EntryKeys, token: str) -> bool: ...

    async def holder(self, keys: EntryKeys) -> str | None: ...

    async def subscribe(self, keys: EntryKeys) -> AsyncSubscription: ...


class AsyncControlStore(Protocol):
    """``ControlStore`` for the tasks of one event loop."""

    async def expire(self, keys: EntryKeys) -> None: ...

    async def mark_versioned(self, keys: Sequence[EntryKeys], marker_ms: int) -> None: ...

    async def invalidate(self, keys: EntryKeys) -> None: ...

    async def seize(self, keys: EntryKeys, token: str, lease_ms: int) -> None: ...

    async def put(
        self, keys: EntryKeys, token: str, lease_ms: int, envelope: bytes, ttl_ms: int, inline: bool,
        tagged: Tagged | None = None,
    ) -> Written: ...  # fmt: skip


class AsyncManyKeyStore(Protocol):
    """``ManyKeyStore`` for the tasks of one event loop."""

    async def get_many(self, keys: Sequence[str]) -> list[bytes | None]: ...

    async def get_many_with_ttl(
        self, keys: Sequence[str], failing: bool = False
    ) -> list[tuple[bytes | None, float, bool]]: ...

    async def acquire_many(self, calls: Sequence[AcquireCall]) -> list[AcquireReply | BackendUnavailable]: ...

    async def write_release_many(self, calls: Sequence[WriteCall]) -> list[Written | BackendUnavailable]: ...

    async def subscribe_many(self, keys: Sequence[EntryKeys]) -> Sequence[AsyncSubscription | BackendUnavailable]: ...


class AsyncTagStore(Protocol):
    """``TagStore`` for the tasks of one event loop."""

    async def tag_clock(self, key: str) -> int: ...

    async def invalidate_tag(self, clock: str, tag: TagKeys, soft: bool) -> list[str]: ...

    async def entry_tags(self, keys: EntryKeys) -> list[str] | None: ...


class SlotLeaseStore(Protocol):
    """A ``BudgetStore`` that checks, as it grants a slot, that the lease of the entry the
    slot is for is still the caller's, so that a load need not ask after its slot came
    (one round trip on the path from one load to the next: ``_drivers.abudget``). Only
    where the budget and the entries' leases live in one store that a single step can
    read both in: such a store declares ``Roles.SLOT_LEASES`` (a Redis Cluster's does
    not: its budget lives in a slot of its own)."""

    def take_slot_for(
        self, keys: EntryKeys, token: str, lease_ms: int, queue_ms: int, slots: int, entry: EntryKeys, lease: str
    ) -> AcquireReply:
        """``take_slot`` for a load holding ``entry``'s lease with the token ``lease``:
        LEASE_GONE, and out of the queue, when that lease is no longer ``lease``. The
        place it keeps in the queue carries the lease, so that ``release_slot`` hands a
        freed slot to it only while its lease holds, else tells it ``LEASE_GONE`` and
        hands the slot to the next waiter."""


class AsyncNamedLockStore(Protocol):
    """``NamedLockStore`` for the tasks of one event loop."""

    async def take_lock(self, keys: EntryKeys, token: str, lease_ms: int, queue_ms: int = 0) -> AcquireReply: ...

    async def leave_queue(self, keys: EntryKeys, token: str) -> None: ...


class AsyncBudgetStore(Protocol):
    """``BudgetStore`` for the tasks of one event loop."""

    async def take_slot(
        self, keys: EntryKeys, token: str, lease_ms: int, queue_ms: int, slots: int
    ) -> AcquireReply: ...

    async def renew_slot(self, keys: EntryKeys, token: str, lease_ms: int) -> bool: ...

    async def release_slot(self, keys: EntryKeys, token: str, slots: int, lease_ms: int) -> bool: ...


class AsyncSlotLeaseStore(Protocol):
    """``SlotLeaseStore`` for the tasks of one event loop."""

    async def take_slot_for(
        self, keys: EntryKeys, token: str, lease_ms: int, queue_ms: int, slots: int, entry: EntryKeys, lease: str
    ) -> AcquireReply: ...


class AsyncHotSetStore(Protocol):
    """``HotSetStore`` for the tasks of one event loop."""

    async def note_hot(self, key: str, counts: Mapping[bytes, int], limit: int, ttl_ms: int) -> None: ...

    async def hot_members(self, key: str, count: int) -> list[tuple[bytes, float]]: ...


class AsyncStreamStore(Protocol):
    """``StreamStore`` for a task."""

    async def relay_add(
        self, keys: EntryKeys, token: str, records: Sequence[bytes], first: int, linger_ms: int
    ) -> None: ...

    async def relay_read(self, keys: EntryKeys, token: str, after: int, block_ms: int) -> list[bytes]: ...


class AsyncStoreAdmin(Protocol):
    """``StoreAdmin`` for the tasks of one event loop."""

    async def check(self, namespace: str) -> None: ...

    async def scan(self, namespace: str, match: str = "*") -> set[str]: ...

    async def aclose(self) -> None: ...


class AsyncStore(
    AsyncEntryStore,
    AsyncControlStore,
    AsyncManyKeyStore,
    AsyncTagStore,
    AsyncNamedLockStore,
    AsyncBudgetStore,
    AsyncHotSetStore,
    AsyncStoreAdmin,
    Protocol,
):
    """``Store`` for the tasks of one event loop. See ``Store``'s roles for each method."""


class LockServers(Protocol):
    """Redlock's servers, for blocking callers: every command goes to each server."""

    def take(self, keys: EntryKeys, token: str, lease_ms: int) -> Round:
        """SET NX PX on each server (``lease_left``: the shortest lease of a refusal)."""

    def release(self, keys: EntryKeys, token: str) -> Round:
        """Compare-and-delete on each server."""

    def renew(self, keys: EntryKeys, token: str, lease_ms: int) -> Round:
        """Compare-and-extend on each server."""

    def drop(self, keys: EntryKeys) -> Round:
        """Delete the lease on each server, whoever holds it."""

    def holders(self, keys: EntryKeys) -> list[bytes | None]:
        """Each server's holder token (None: free, or no answer)."""


class WatchingServers(LockServers, Protocol):
    """Lock servers whose leases end with their holder's session (ZooKeeper's): a waiter
    can watch the holder's lease (``_core.effects.ServersWatch``)."""

    def watch(self, keys: EntryKeys, wake: Callable[[], None]) -> None:
        """Call ``wake`` once when the current holder's lease at ``keys`` ends."""


class AsyncLockServers(Protocol):
    """``LockServers`` for the tasks of one event loop (all servers asked at once)."""

    async def take(self, keys: EntryKeys, token: str, lease_ms: int) -> Round: ...

    async def release(self, keys: EntryKeys, token: str) -> Round: ...

    async def renew(self, keys: EntryKeys, token: str, lease_ms: int) -> Round: ...

    async def drop(self, keys: EntryKeys) -> Round: ...

    async def holders(self, keys: EntryKeys) -> list[bytes | None]: ...

    async def aclose(self) -> None: ...


class AsyncWatchingServers(AsyncLockServers, Protocol):
    """``WatchingServers`` for the tasks of one event loop."""

    async def watch(self, keys: EntryKeys, wake: Callable[[], None]) -> None: ...
