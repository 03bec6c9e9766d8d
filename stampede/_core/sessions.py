"""The decisions of a layer whose leases are also ZooKeeper leases (sans-IO): an ephemeral
sequential node per load, released with its holder's session. A lease policy
(``_core.leases``), composed by the flow as Redlock's is (ZooKeeper is one replicated lock
service, a "majority" of one).

What a session adds to Redlock's order of steps (``_core.majority.RedlockLeases``):

* take: the ZooKeeper lease first (our node is the lowest of the entry's), then the cache
  key with the value's double-check. If the cache key is still held, it is held by a
  holder ZooKeeper no longer knows: its session ended (it died, or was cut off from the
  ensemble). It is taken over at once: the value is made stale (``Expire``: its lease
  dropped, an invalidation marker left), so that holder's write is refused, and the take
  is tried again. A failed load's hold (``Store.hold``) is no holder's and stays.
* every release of the node comes after the step on the cache server (write, release,
  hold), so that whoever is next in ZooKeeper finds the cache key settled: a key still
  held then can only be a holder ZooKeeper has forgotten, never one finishing up.
* wait: on the cache server's wake-ups, and on a watch of the holder's node
  (``ServersWatch``), so that a holder whose session ends is taken over at once.
* write: only while our node still exists. A holder whose session expired mid-load
  releases the cache key and writes nothing (``Written.REFUSED``), even if nobody took
  over yet: another caller may be loading already.

Timeline of a session expiry while loading::

    time 0    A takes node lease-01 and the cache key. Loads
    time 1    A's process stalls (GC, swap) and misses its heartbeats
    time 1+T  ZooKeeper expires A's session (T: the session timeout). Lease-01 is deleted.
              B's watch on lease-01 fires, B takes lease-02, finds A's cache key, takes
              it over (A's lease dropped, marker left), loads
    time 2    A resumes: its write finds lease-01 gone (or its cache key gone): refused
"""

from __future__ import annotations

from .effects import (
    Acquire,
    Decision,
    Expire,
    Hold,
    Release,
    ServersRelease,
    ServersRenew,
    ServersWatch,
    Subscribe,
    Touch,
    WriteRelease,
)
from .keys import EntryKeys
from .majority import Quorum, RedlockLeases, one, releasing_after, take_majority
from .store import AcquireReply, LockState, Round, Written
from .tags import Tagged

SESSION_QUORUM = Quorum(1, 0.0)  # one ensemble, whose leases have no term to drift


class SessionLeases(RedlockLeases):
    """``RedlockLeases`` for a lease service whose leases end with their holder's session."""

    session_leases = True  # a lease ends with its holder's session, not by a term

    def subscribe(self, keys: EntryKeys) -> Decision[None]:
        yield Subscribe()
        yield ServersWatch(keys.on_lock_servers)

    def acquire(
        self, keys: EntryKeys, token: str, lease_ms: int, check_value: bool, stale: bytes = b""
    ) -> Decision[AcquireReply]:
        taken, valid_until = yield from take_majority(self.quorum, keys.on_lock_servers, token, lease_ms, self.clock)
        if valid_until is None:
            return (yield from self.refused(keys, taken, check_value, stale))
        try:
            reply: AcquireReply = yield Acquire(check_value, stale)
            if reply.state is LockState.HELD and not reply.failed:
                yield Expire()  # a holder ZooKeeper no longer knows: taken over (see the module)
                reply = yield Acquire(check_value, stale)
        except GeneratorExit:
            raise
        except BaseException:
            yield ServersRelease(keys.on_lock_servers, token)
            raise
        if reply.state is not LockState.LOCKED:
            yield ServersRelease(keys.on_lock_servers, token)
        return reply

    def write_release(
        self, keys: EntryKeys, token: str, envelope: bytes, ttl_ms: int, inline: bool, tagged: Tagged | None = None
    ) -> Decision[Written]:
        step = WriteRelease(envelope, ttl_ms, inline, tagged)
        written: Written = yield from releasing_after(self._while_alive(keys, token, step), keys, token)
        return written

    def touch(self, keys: EntryKeys, token: str, identity: bytes, ttl_ms: int) -> Decision[Written]:
        step = Touch(identity, ttl_ms)
        kept: Written = yield from releasing_after(self._while_alive(keys, token, step), keys, token)
        return kept

    def _while_alive(self, keys: EntryKeys, token: str, step: WriteRelease | Touch) -> Decision[Written]:
        """``step`` (a write, or a touch) if our session still holds the lease."""
        alive: Round = yield ServersRenew(keys.on_lock_servers, token, 0)
        if not alive.agreed:  # our session ended mid-load: write nothing
            yield Release()
            return Written.REFUSED
        written: Written = yield step
        return written

    def release(self, keys: EntryKeys, token: str) -> Decision[bool]:
        released: bool = yield from releasing_after(one(Release()), keys, token)
        return released

    def hold(self, keys: EntryKeys, token: str, hold_ms: int, failing_ms: int) -> Decision[bool]:
        held: bool = yield from releasing_after(one(Hold(hold_ms, failing_ms)), keys, token)
        return held
