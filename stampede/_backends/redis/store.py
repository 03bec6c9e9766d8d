# Generated from astore.py by .ci/unasync.py: do not edit.
# Edit the asyncio source, then run `python .ci/unasync.py`.
"""The Redis store: the Store over a redis-py client (one server, the master Sentinel
names, or a Redis Cluster), its scripts and its subscriber. This asyncio store, for the
tasks of one event loop, is the source; ``store.py``, the blocking store, is generated
from it by ``.ci/unasync.py``. How each sends its commands differs, and is written by
hand side by side in ``sending``; what both share is ``commands``.

Every redis-py failure (connection refused, timeout, an error reply such as OOM or
READONLY) leaves a store as ``BackendUnavailable``, which the flow turns into policy.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any, TypeVar

from ..._core.keys import EntryKeys, check_key, entry_value_keys, failing_key
from ..._core.near import NearChannel, asked_of_a_tag
from ..._core.store import (
    AcquireCall,
    AcquireReply,
    LockState,
    Roles,
    Subscription,
    WriteCall,
    Written,
)
from ..._core.tags import Tagged, TagKeys
from ..._core.versions import saw_versions
from ..._errors import BackendUnavailable
from ..breaker import CircuitBreaker, NodeBreakers
from ..steps import put_in_steps
from . import batches, tagging
from . import scripts as _scripts
from .commands import (
    FAILURES,
    NOT_HEARD,
    TORN_DOWN,
    UNREAD,
    EvictionCheck,
    Scripts,
    ack_route,
    check_client,
    failure,
    follows_master,
    is_cluster,
    near_wait,
    new_nonce,
    node_of,
    torn_down_error,
    translated,
    warn_near,
    without_blmpop,
)
from .notify import Subscriber
from .replies import (
    acquire_reading_clock_reply,
    acquire_reply,
    asks_failing,
    marked,
    queue_read_with_ttl,
    relayed,
    with_ttl,
)
from .sending import NO_SWITCHES, Sending, Switches
from .shards import ShardedSubscriber

T = TypeVar("T")


class RedisStore(Sending):
    """A Store on one Redis server (or anything speaking its protocol), on the master
    Sentinel names, or on a Redis Cluster. ``owns_client``, ``slots``, ``slot_timeout``
    and ``switches``: how it sends (``sending``)."""

    def __init__(
        self,
        client: Any,
        subscribe_timeout: float,
        breaker: CircuitBreaker,
        eviction: EvictionCheck | None = None,
        node_breakers: NodeBreakers | None = None,
        near: NearChannel | None = None,
        *,
        owns_client: bool = False,
        slots: int | None = None,
        slot_timeout: float = 2.0,
        switches: Switches = NO_SWITCHES,
    ) -> None:
        check_client(client)
        self.client = client
        self.breaker = breaker  # the whole server's. On a cluster, for commands on no one node
        self._node_breakers = node_breakers if is_cluster(client) or follows_master(client) else None
        self._torn_down = TORN_DOWN if self._node_breakers is not None else ()
        self.eviction = eviction or EvictionCheck()
        self._scripts = Scripts(client)
        self.near = near
        # One server: invalidations ask near caches in their own script. A cluster: after it.
        self._near_in_script = near if not is_cluster(client) else None
        # One server: a budget's scripts read the lease of the entry a slot is for
        # (SlotLeaseStore). A cluster: the budget's keys live in a slot of their own.
        self.optional_roles = (
            Roles.BUDGETS | Roles.HOT_SETS | Roles.STREAMS | (Roles.NONE if is_cluster(client) else Roles.SLOT_LEASES)
        )
        self._blmpop = True  # until a server (before Redis 7) says it has no BLMPOP
        self._start_sending(owns_client, slots, slot_timeout, switches)
        self._subscriber: Subscriber | ShardedSubscriber = (
            ShardedSubscriber(client, subscribe_timeout)
            if is_cluster(client)
            else Subscriber(client.connection_pool, subscribe_timeout)
        )

    def get(self, key: str) -> bytes | None:
        # The hit path: a plain try costs less than the context manager the others use.
        breaker = self.breaker if self._node_breakers is None else self._breaker(key)
        breaker.check(key)
        try:
            raw: bytes | None = self.client.get(key)
        except FAILURES as error:
            raise failure(breaker, "read", key, error) from error
        except Exception as error:
            raise self._cut_short("read", key, error, breaker) from error
        breaker.succeeded()
        return raw

    @contextmanager
    def _translated(self, what: str, key: str, whole: bool = False) -> Iterator[None]:
        """``translated``, and a command cut short by ``close()``. ``whole``: a command on
        no one node (a check, a scan), guarded by the whole server's breaker."""
        breaker = self.breaker if whole else self._breaker(key)
        try:
            with translated(what, key, breaker):
                yield
        except BackendUnavailable:
            raise
        except Exception as error:
            raise self._cut_short(what, key, error, breaker) from error

    def _cut_short(self, what: str, key: str, error: Exception, breaker: CircuitBreaker) -> Exception:
        """A command whose connection another thread disconnected under it, which
        redis-py's parsers report as whatever they hit (``TORN_DOWN``): by ``close()``,
        which is the store being closed, not a bug. Through a cluster or Sentinel, by
        redis-py itself, a failure to reach the server. Any other exception is returned
        as it is."""
        if self.closed:
            return BackendUnavailable(f"the layer was closed while a command to {what} {key!r} ran", key=key)
        if isinstance(error, self._torn_down):
            return failure(breaker, what, key, torn_down_error(error))
        return error

    def get_with_ttl(self, key: str, failing: bool = False) -> tuple[bytes | None, float, bool]:
        # A hit of a loader with freshness settings: one round trip, and no context manager.
        breaker = self.breaker if self._node_breakers is None else self._breaker(key)
        breaker.check(key)
        try:
            pipeline = queue_read_with_ttl(self.client.pipeline(transaction=False), key)
            read = with_ttl(*pipeline.execute())
            if asks_failing(read, failing):
                read = marked(read, self.client.exists(failing_key(key)))
        except FAILURES as error:
            raise failure(breaker, "read", key, error) from error
        except Exception as error:
            raise self._cut_short("read", key, error, breaker) from error
        breaker.succeeded()
        return read

    def get_many(self, keys: Sequence[str]) -> list[bytes | None]:
        """The raw bytes at each of ``keys``: one MGET, or on a cluster one per slot (all
        sent at once). A warm page's one command: a plain try, as ``get``'s."""
        key = keys[0]
        if is_cluster(self.client):
            return self._read_cluster(keys, self._mget_nonatomic, None)
        breaker = self.breaker if self._node_breakers is None else self._breaker(key)
        breaker.check(key)
        try:
            raws: list[bytes | None] = self.client.mget(keys)
        except FAILURES as error:
            raise failure(breaker, "read", key, error) from error
        except Exception as error:
            raise self._cut_short("read", key, error, breaker) from error
        breaker.succeeded()
        return raws

    def _mget_nonatomic(self, keys: Sequence[str]) -> list[bytes | None]:
        return list(self.client.mget_nonatomic(keys))

    def get_many_with_ttl(self, keys: Sequence[str], failing: bool = False) -> list[tuple[bytes | None, float, bool]]:
        if is_cluster(self.client):
            return self._read_cluster(keys, functools.partial(self._reads_with_ttl, failing=failing), UNREAD)
        with self._translated("read", keys[0]):
            return self._reads_with_ttl(keys, failing)

    def _reads_with_ttl(self, keys: Sequence[str], failing: bool) -> list[tuple[bytes | None, float, bool]]:
        """Each key's value, its TTL and (if ``failing``, for a stale one) its failing
        marker: one round trip, and one more for the markers."""
        pipeline = self.client.pipeline(transaction=False)
        batches.queue_reads_with_ttl(pipeline, keys)
        reads = batches.reads_with_ttl(pipeline.execute())
        stale = batches.asking_failing(reads, failing)
        if stale:
            pipeline = self.client.pipeline(transaction=False)
            batches.queue_failing(pipeline, [keys[index] for index in stale])
            batches.mark_failing(reads, stale, pipeline.execute())
        return reads

    def _read_cluster(self, keys: Sequence[str], read: Callable[[Sequence[str]], list[T]], unread: T) -> list[T]:
        """``read(keys)`` on a cluster. If it fails, the keys are read again primary by
        primary: a key whose primary failed (or whose circuit is open) reads as
        ``unread``, a miss, so that the page's other entries are served. Its lease, asked
        for next, fails on its own and that entry falls to the policy (the lease script
        reads the value again, so a miss read this way never hides a value). When every
        primary failed the read fails as a whole."""
        try:
            with self._translated("read", keys[0]):
                return read(keys)
        except BackendUnavailable as error:
            parts = batches.keys_by_node(keys, lambda key: node_of(self.client, key))
            if self.closed or len(parts) < 2:
                raise
            failed: BackendUnavailable = error
        reads: list[T] = [unread] * len(keys)
        answered = False
        for part in parts:
            part_keys = [keys[index] for index in part]
            try:
                with self._translated("read", part_keys[0]):
                    batches.put(reads, part, read(part_keys))
                answered = True
            except BackendUnavailable as error:
                failed = error
        if not answered:
            raise failed
        return reads

    def acquire_many(self, calls: Sequence[AcquireCall]) -> list[AcquireReply | BackendUnavailable]:
        replies = self._run_scripts(self._scripts.acquires, batches.acquire_calls(calls), "lock", calls[0][0].value)
        acquired = batches.acquire_replies(replies, calls, batches.error_reply)
        if self.eviction.pending and any(getattr(reply, "state", None) is LockState.LOCKED for reply in acquired):
            self.eviction.pending = False
            self.eviction.found(self.server_config())
        return acquired

    def write_release_many(self, calls: Sequence[WriteCall]) -> list[Written | BackendUnavailable]:
        plain, tagged = batches.tagged_apart(calls)
        written: list[Written | BackendUnavailable] = [Written.REFUSED] * len(calls)
        if plain:
            together = [calls[index] for index in plain]
            calls_ = batches.write_calls(together)
            replies = self._run_scripts(self._scripts.writes, calls_, "write", together[0][0].value)
            batches.put(written, plain, batches.write_replies(replies, together, batches.error_reply))
        if tagged:
            batches.put(written, tagged, self._write_tagged_many([calls[index] for index in tagged]))
        return written

    def _write_tagged_many(self, calls: Sequence[WriteCall]) -> list[Written | BackendUnavailable]:
        """A page's tagged writes in two pipelines: every admission (the order
        ``_core.tags`` shows for a cluster, here on one server too), then the writes
        admitted. A write a tag refused releases its lease."""
        owners, admit = tagging.admissions(calls, is_cluster(self.client))
        replies = self._run_scripts(self._scripts.admissions, admit, "admit a tagged write of", calls[0][0].value, True)
        outcome = tagging.admitted(owners, replies, calls)
        written: list[Written | BackendUnavailable] = [Written.REFUSED] * len(calls)
        for index, ok in enumerate(outcome):
            if isinstance(ok, BackendUnavailable):
                written[index] = ok
            elif not ok:
                keys, token = calls[index][0], calls[index][1]
                try:
                    self.release(keys, token)
                except BackendUnavailable:
                    pass  # the lease runs out by itself
        go = [index for index, ok in enumerate(outcome) if ok is True]
        if go:
            admitted = [calls[index] for index in go]
            calls_ = tagging.entry_writes(admitted)
            replies = self._run_scripts(self._scripts.tagged_writes, calls_, "write", admitted[0][0].value)
            batches.put(written, go, batches.write_replies(replies, admitted, batches.error_reply))
        return written

    def _run_scripts(
        self, pair: batches.Pair, calls: list[_scripts.Call], what: str, key: str, alone: bool = False
    ) -> list[Any]:
        """Run a script for each call, one script call per slot group, in one pipeline
        (see ``batches``): each call's reply, an error reply in place as an exception."""
        groups = batches.slot_groups(calls, is_cluster(self.client), alone)
        nodes = self._nodes_of(calls, groups)
        if len(nodes) > 1:
            return batches.spread(groups, self._over_nodes(pair, calls, groups, nodes, what), len(calls))
        with self._translated(what, key):
            replies = self._pipelined(pair, calls, groups, key)
        return batches.spread(groups, replies, len(calls))

    def _nodes_of(self, calls: list[_scripts.Call], groups: list[list[int]]) -> list[list[int]]:
        """The groups by the cluster primary they go to (one part where there is one server).
        One part for the asyncio store too: its cluster pipeline is sent whole."""
        if len(groups) < 2 or self._node_breakers is None or not is_cluster(self.client):
            return [list(range(len(groups)))]
        firsts = [str(calls[group[0]].keys[0]) for group in groups]
        return batches.keys_by_node(firsts, lambda key: node_of(self.client, key))

    def _over_nodes(
        self, pair: batches.Pair, calls: list[_scripts.Call], groups: list[list[int]], nodes: list[list[int]], what: str
    ) -> list[Any]:
        """A cluster batch over several primaries: one pipeline for all, and if that fails
        as a whole, one per primary, so that a primary that failed (or whose circuit is
        open) fails its own entries only and the others' go through. redis-py fails a
        cluster pipeline whole, before sending anything, when it cannot connect to one of
        its primaries; sending again is safe for what was sent (see ``ACQUIRE``: a lease
        asked for twice with one token is granted twice)."""
        firsts = [str(calls[groups[part[0]][0]].keys[0]) for part in nodes]
        breakers = [self._breaker(first) for first in firsts]
        if not any(breaker.open for breaker in breakers):
            try:
                replies = self._pipelined(pair, calls, groups, firsts[0])
            except (*FAILURES, *self._torn_down) as error:
                if self.closed:
                    closed = f"the layer was closed while a command to {what} {firsts[0]!r} ran"
                    raise BackendUnavailable(closed, key=firsts[0]) from error
            else:
                for breaker in breakers:
                    breaker.succeeded()
                return replies
        replies = [None] * len(groups)
        for part, first in zip(nodes, firsts, strict=True):
            try:
                with self._translated(what, first):
                    part_groups = [groups[index] for index in part]
                    batches.put(replies, part, self._pipelined(pair, calls, part_groups, first))
            except BackendUnavailable as error:
                batches.put(replies, part, [error] * len(part))
        return replies

    def _route(self, key: str) -> Any:
        """The cluster node a script on ``key`` goes to, as the client knows it (None: not
        known yet; the pipeline finds it)."""
        try:
            return self.client.get_node_from_key(key)
        except Exception:  # slots not learned yet, or not covered
            return None

    def _pipelined(
        self, pair: batches.Pair, calls: list[_scripts.Call], groups: list[list[int]], key: str
    ) -> list[Any]:
        """One script call per group in one pipeline, and by EVAL again where the server
        did not know the script: each group's reply. The blocking cluster pipeline is told
        each script's node (``batches.queue_groups``); the asyncio one finds it."""
        route = self._route if is_cluster(self.client) else None
        pipeline = self.client.pipeline(transaction=False)
        batches.queue_groups(pipeline, pair, calls, groups, route=route)
        replies: list[Any] = pipeline.execute(raise_on_error=False)
        unknown = batches.unknown_scripts(replies)
        if unknown:
            pipeline = self.client.pipeline(transaction=False)
            batches.queue_groups(pipeline, pair, calls, [groups[index] for index in unknown], True, route)
            again = pipeline.execute(raise_on_error=False)
            for index, reply in zip(unknown, again, strict=True):
                replies[index] = reply
        return replies

    def acquire(
        self, keys: EntryKeys, token: str, lease_ms: int, check_value: bool, stale: bytes = b"", clock: str = ""
    ) -> AcquireReply:
        with self._translated("lock", keys.value):
            call = _scripts.acquire_call(keys, token, lease_ms, check_value, stale)
            if clock and not is_cluster(self.client):  # one script. A cluster's clock is in another slot
                call = _scripts.acquire_reading_clock_call(call, clock)
                acquired = acquire_reading_clock_reply(self._scripts.acquire_reading_clock(*call))
            else:
                acquired = acquire_reply(self._scripts.acquire(*call))
        if self.eviction.pending and acquired.state is LockState.LOCKED:
            self.eviction.pending = False
            self.eviction.found(self.server_config())
        return acquired

    def server_config(self) -> dict[Any, Any] | None:
        """``CONFIG GET maxmemory*``, or None where the server refuses CONFIG (an ACL user
        without it, a managed service that renamed it)."""
        try:
            config: dict[Any, Any] = self.client.config_get("maxmemory*")
        except FAILURES:
            return None
        return config

    def check(self, namespace: str) -> None:
        """Raise ``BackendUnavailable`` naming the cause unless the server answers and
        takes writes in ``namespace`` (a wrong password, a read-only replica, an ACL user
        outside its keys all fail here). Then warn if it may evict leases."""
        key = check_key(namespace)
        with self._translated("check the server with", key, whole=True):
            self.client.ping()
            self.client.set(key, b"1", px=1000)
            self.client.delete(key)
        self.eviction.pending = False
        self.eviction.found(self.server_config())

    def scan(self, namespace: str, match: str = "*") -> set[str]:
        """The value keys of the cache entries in ``namespace`` whose entry matches the glob
        ``match`` (at least: callers test each, named locks left out). SCAN, 1000 keys a
        step, never KEYS."""
        with self._translated("scan", namespace, whole=True):
            self._ready()
            keys = [key for key in self.client.scan_iter(match=f"{namespace}:{{{match}}}*", count=1000)]
        return entry_value_keys(keys)

    def renew(self, keys: EntryKeys, token: str, lease_ms: int) -> bool:
        with self._translated("renew the lease of", keys.value):
            call = _scripts.renew_call(keys, token, lease_ms)
            return bool(self._scripts.renew(*call))

    def write_release(
        self, keys: EntryKeys, token: str, envelope: bytes, ttl_ms: int, inline: bool, tagged: Tagged | None = None
    ) -> Written:
        if tagged is not None:
            return self._write_tagged(keys, token, envelope, ttl_ms, inline, tagged)
        with self._translated("write", keys.value):
            call = _scripts.write_release_call(keys, token, envelope, ttl_ms, inline)
            written = self._scripts.write_release(*call)
        return Written(int(written))

    def _write_tagged(
        self, keys: EntryKeys, token: str, envelope: bytes, ttl_ms: int, inline: bool, tagged: Tagged
    ) -> Written:
        """One script on one server. On a cluster the tags of each slot admit the entry
        first, then the entry is written (the order ``_core.tags`` shows)."""
        cluster = is_cluster(self.client)
        if cluster:
            for group in tagging.by_slot(tagged.tags.tags):
                with self._translated("admit a tagged write of", keys.value):
                    call = _scripts.admit_tags_call(group, keys.value, tagged.since, ttl_ms)
                    admitted = self._scripts.admit_tags(*call)
                if not admitted:
                    self.release(keys, token)
                    return Written.REFUSED
        with self._translated("write", keys.value):
            call = _scripts.write_tagged_call(keys, token, envelope, ttl_ms, inline, tagged, not cluster)
            written = self._scripts.write_tagged(*call)
        return Written(int(written))

    def touch(self, keys: EntryKeys, token: str, identity: bytes, ttl_ms: int) -> Written:
        with self._translated("keep", keys.value):
            call = _scripts.touch_call(keys, token, identity, ttl_ms)
            return Written(int(self._scripts.touch(*call)))

    def tag_clock(self, key: str) -> int:
        with self._translated("read the tag clock", key):
            return int(self._scripts.read_tag_clock([key], []))

    def invalidate_tag(self, clock: str, tag: TagKeys, soft: bool) -> list[str]:
        with self._translated("draw the tag clock", clock):
            drawn = int(self._scripts.draw_tag_clock([clock], []))
        with self._translated("mark the tag", tag.members):
            call = _scripts.mark_tag_call(tag, drawn)
            members = tagging.members_of(self._scripts.mark_tag(*call))
        pair = self._scripts.expires if soft else self._scripts.invalidates
        what = "expire" if soft else "invalidate"
        done: list[str] = []
        members_keys: list[str] = []  # every member's near copies go, dropped here or not (see below)
        for chunk in tagging.chunks(members):
            value_keys = tagging.value_keys(chunk)
            members_keys += value_keys
            replies = self._run_scripts(pair, tagging.entry_calls(value_keys), what, value_keys[0])
            done += tagging.dropped(replies, value_keys, what)
            if not soft:
                with self._translated("forget the members of", tag.members):
                    call = _scripts.forget_members_call(tag, chunk)
                    self._scripts.forget_members(*call)
        if self.near is not None:
            asked, own_too = asked_of_a_tag(members_keys, done, tag.members)
            nonce = new_nonce(self.near)
            with self._translated("ask near caches to drop", self.near.members):
                call = _scripts.request_near_call(self.near, nonce, *asked)
                reply = self._scripts.request_near(*call)
            self._await_near_caches(reply, nonce, own_too=own_too)
        return done

    def entry_tags(self, keys: EntryKeys) -> list[str] | None:
        with self._translated("read the tags of", keys.value):
            return tagging.names_of(self.client.get(keys.tags))

    def release(self, keys: EntryKeys, token: str) -> bool:
        with self._translated("release the lock of", keys.value):
            call = _scripts.release_call(keys, token)
            return bool(self._scripts.release(*call))

    def hold(self, keys: EntryKeys, token: str, hold_ms: int, failing_ms: int) -> bool:
        with self._translated("hold the lock of", keys.value):
            call = _scripts.hold_call(keys, token, hold_ms, failing_ms)
            return bool(self._scripts.hold(*call))

    def expire(self, keys: EntryKeys) -> None:
        nonce = new_nonce(self.near)
        with self._translated("expire", keys.value):
            call = _scripts.expire_call(keys, self._near_in_script, nonce)
            reply = _seen(keys, self._scripts.expire(*call))
        self._await_near_caches(self._ask_near_caches(reply, keys, nonce), nonce)

    def mark_versioned(self, keys: Sequence[EntryKeys], marker_ms: int) -> None:
        if not keys:
            return
        if len(keys) == 1:  # no pipeline: a script call
            with self._translated("mark", keys[0].value):
                self._scripts.marks.one([keys[0].versioned], [marker_ms])
            return
        calls = [_scripts.Call([entry.versioned], [marker_ms]) for entry in keys]
        replies = self._run_scripts(self._scripts.marks, calls, "mark", keys[0].value)
        for reply, entry in zip(replies, keys, strict=True):
            if isinstance(reply, Exception):
                raise batches.error_reply("mark", entry.value, reply)

    def holder(self, keys: EntryKeys) -> str | None:
        with self._translated("read the lock of", keys.lock):
            token = self.client.get(keys.lock)
        return None if token is None else bytes(token).decode(errors="replace")

    def relay_add(self, keys: EntryKeys, token: str, records: Sequence[bytes], first: int, linger_ms: int) -> None:
        # A Redis stream whose entry ids are the records' places (0-1, 0-2, ...): a listener
        # reads on from the last place it got, and a record added twice is refused.
        relay = keys.relay(token)
        with self._translated("relay the stream of", keys.value):
            pipeline = self.client.pipeline(transaction=False)
            for place, record in enumerate(records, first + 1):
                pipeline.xadd(relay, {b"r": record}, id=f"0-{place}")
            pipeline.pexpire(relay, linger_ms)
            pipeline.execute()

    def relay_read(self, keys: EntryKeys, token: str, after: int, block_ms: int) -> list[bytes]:
        relay = keys.relay(token)
        with self._translated("read the relayed stream of", keys.value):
            reply = self.client.xread({relay: f"0-{after}"}, None, block_ms or None)
        return relayed(reply, after)

    def take_lock(self, keys: EntryKeys, token: str, lease_ms: int, queue_ms: int = 0) -> AcquireReply:
        with self._translated("lock", keys.lock):
            if queue_ms:
                script, call = (
                    self._scripts.take_lock_fairly,
                    _scripts.take_lock_fairly_call(keys, token, lease_ms, queue_ms),
                )
            else:
                script, call = self._scripts.take_lock, _scripts.take_lock_call(keys, token, lease_ms)
            reply = script(*call)
        return acquire_reply(reply)

    def leave_queue(self, keys: EntryKeys, token: str) -> None:
        with self._translated("leave the queue of", keys.lock):
            self._scripts.leave_queue(*_scripts.leave_queue_call(keys, token))

    def take_slot(self, keys: EntryKeys, token: str, lease_ms: int, queue_ms: int, slots: int) -> AcquireReply:
        with self._translated("take a slot of", keys.lock):
            call = _scripts.take_slot_call(keys, token, lease_ms, queue_ms, slots)
            return acquire_reply(self._scripts.take_slot(*call))

    def take_slot_for(
        self, keys: EntryKeys, token: str, lease_ms: int, queue_ms: int, slots: int, entry: EntryKeys, lease: str
    ) -> AcquireReply:
        assert Roles.SLOT_LEASES in self.optional_roles, "a cluster's budget cannot read an entry's lease"
        with self._translated("take a slot of", keys.lock):
            call = _scripts.take_slot_call(keys, token, lease_ms, queue_ms, slots, entry, lease)
            return acquire_reply(self._scripts.take_slot(*call))

    def renew_slot(self, keys: EntryKeys, token: str, lease_ms: int) -> bool:
        with self._translated("renew a slot of", keys.lock):
            call = _scripts.renew_slot_call(keys, token, lease_ms)
            return bool(self._scripts.renew_slot(*call))

    def release_slot(self, keys: EntryKeys, token: str, slots: int, lease_ms: int) -> bool:
        with self._translated("release a slot of", keys.lock):
            call = _scripts.release_slot_call(keys, token, slots, lease_ms)
            return bool(self._scripts.release_slot(*call))

    def note_hot(self, key: str, counts: Mapping[bytes, int], limit: int, ttl_ms: int) -> None:
        if counts:
            with self._translated("record the hot set", key):
                self._scripts.note_hot(*_scripts.note_hot_call(key, counts, limit, ttl_ms))

    def hot_members(self, key: str, count: int) -> list[tuple[bytes, float]]:
        with self._translated("read the hot set", key):
            reply = self.client.zrevrange(key, 0, count - 1, True)
        return [(bytes(member), float(score)) for member, score in reply]

    def invalidate(self, keys: EntryKeys) -> None:
        nonce = new_nonce(self.near)
        with self._translated("invalidate", keys.value):
            call = _scripts.invalidate_call(keys, self._near_in_script, nonce)
            reply = _seen(keys, self._scripts.invalidate(*call))
        self._await_near_caches(self._ask_near_caches(reply, keys, nonce), nonce)

    def seize(self, keys: EntryKeys, token: str, lease_ms: int) -> None:
        nonce = new_nonce(self.near)
        with self._translated("invalidate", keys.value):
            call = _scripts.seize_call(keys, token, lease_ms, self._near_in_script, nonce)
            reply = _seen(keys, self._scripts.seize(*call))
        self._await_near_caches(self._ask_near_caches(reply, keys, nonce), nonce)

    def put(
        self, keys: EntryKeys, token: str, lease_ms: int, envelope: bytes, ttl_ms: int, inline: bool,
        tagged: Tagged | None = None,
    ) -> Written:  # fmt: skip
        """One script: the seizure and the write (``PUT``, which needs no lease of its
        own, or ``PUT_TAGGED``). On a cluster a tagged entry's tags admit it in their own
        slots between the two (``_write_tagged``), so there it is the seizure, then the
        write, the lease released if the write fails."""
        if tagged is not None and is_cluster(self.client):
            return put_in_steps(self, keys, token, lease_ms, envelope, ttl_ms, inline, tagged)
        nonce = new_nonce(self.near)
        with self._translated("write", keys.value):
            if tagged is None:  # no lease to lose and no tag to refuse it: always written
                call = _scripts.set_call(keys, envelope, ttl_ms, inline, self._near_in_script, nonce)
                written, reply = 1, self._scripts.put(*call)
            else:
                seize = _scripts.seize_call(keys, token, lease_ms, self._near_in_script, nonce)
                write = _scripts.write_tagged_call(keys, token, envelope, ttl_ms, inline, tagged, True)
                written, reply = self._scripts.put_tagged(*_scripts.put_call(seize, write))
        self._await_near_caches(self._ask_near_caches(_seen(keys, reply), keys, nonce), nonce)
        return Written(int(written))

    def _ask_near_caches(self, reply: Any, keys: EntryKeys, nonce: str) -> Any:
        """On a cluster, once the entry's script ran: ask the near caches on the
        registry's primary (``REQUEST_NEAR``). Elsewhere the script has asked them."""
        if self.near is None or self._near_in_script is not None:
            return reply
        with self._translated("ask near caches to drop", self.near.members):
            call = _scripts.request_near_call(self.near, nonce, keys.value)
            return self._scripts.request_near(*call)

    def _await_near_caches(self, reply: Any, nonce: str, own_too: bool = False) -> None:
        """Return once every near cache the script named (``own_too``: this process's as
        well) has dropped its copy, or run out of its lease (see ``_core.near``)."""
        wait = near_wait(reply, self.near, own_too)
        if wait is None or self.near is None:
            return
        ack_key = self.near.ack_key(nonce)
        while (command := wait.command(ack_key, time.monotonic(), self._blmpop)) is not None:
            try:
                route = ack_route(self.client, ack_key)
                wait.took(self.client.execute_command(*command, **route))
            except Exception as error:
                if without_blmpop(error, command):
                    self._blmpop = False
                    continue
                warn_near(NOT_HEARD, error)  # acknowledgements cannot be heard: the deadlines will do
                time.sleep(max(0.0, wait.last_deadline() - time.monotonic()))
                return

    def subscribe(self, keys: EntryKeys) -> Subscription:
        return self._subscriber.subscribe(keys.channel)

    def subscribe_many(self, keys: Sequence[EntryKeys]) -> Sequence[Subscription | BackendUnavailable]:
        return list(self._subscriber.subscribe_many([entry.channel for entry in keys]))


def _seen(keys: EntryKeys, reply: Any) -> Any:
    """An INVALIDATE, EXPIRE, SEIZE or PUT reply, once a versioned mark it found on the
    entry is reported (``_core.versions.saw_versions``)."""
    if tagging.entry_reply(reply)[1]:
        saw_versions(keys.value)
    return reply
