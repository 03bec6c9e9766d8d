# Generated from arunner.py by .ci/unasync.py: do not edit.
# Edit the asyncio source, then run `python .ci/unasync.py`.
"""The runner: the hit path, the in-process singleflight, and the effects of the flow,
performed with awaits or with blocking calls (threads, or greenlets under gevent): one
text, the asyncio source and the blocking module ``.ci/unasync.py`` makes of it. The
decisions are the flow's and the flight's. This module only performs I/O. Where the
shared state lives (one for the threads of a process, one per event loop) is
``_drivers.state``.

Interruptions: a leader stopped by something other than an Exception (a cancelled task,
a KeyboardInterrupt, a killed greenlet) passes it into the flow like any interruption, so
the lock is released (by token, shielded from a second cancellation) before it
propagates. Those who joined its flight start over, and one of them leads. An interrupted
joiner only ends its own wait.
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Callable, Sequence
from typing import Any

from .._core import world
from .._core.batch import together
from .._core.call import DECIDED, Joiner, Outcome, read_found
from .._core.codec import NOT_A_VALUE
from .._core.controls import no_load, peeked, put, reload
from .._core.effects import Effect, Lease, milliseconds
from .._core.flight import Flight, fallback_key, refuse_recursion, shares_fallback
from .._core.flow import (
    Context,
    Flow,
    LoaderSpec,
    after_wait_timeout,
    failed_read,
    fill,
    new_context,
    refresh,
)
from .._core.freshness import Served
from .._core.keys import EntryKeys
from .._core.many import Found, failed_reads, read_many, take_hits
from .._core.store import Store
from .._core.verify import (
    EVENT_OF,
    Result,
    agrees,
    log_mismatch,
    mark_verifying,
    unchanged,
    unmark_verifying,
    verification_failed,
)
from .._errors import BackendUnavailable
from .batch import Entry, new_entry, performers_for
from .batched import BatchPerformer
from .many import batch_name, finish_entry, first_failure, near_many, one_of, refreshed
from .near import MISSING, NearCache
from .perform import Performer, run
from .refresh import report_stale
from .singleflight import Waiter
from .state import State, States
from .tracing import joining, lease_token


class Runner(States):
    """Runs calls of loaders against the state its base keeps (``_drivers.state``)."""

    def call(self, value_key: str, spec: LoaderSpec, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """The value of the entry: from the cache, from another caller's read or load, or loaded.

        Of the callers of one key in this process (on this event loop), the first leads
        and the rest wait for its outcome: concurrent callers share one read, and on a
        miss one load.
        """
        near = self.near
        if spec.near and near is not None:
            value = near.get(value_key, spec.codec, spec.near_shared)
            if value is not MISSING:
                if spec.verify is not None and spec.verify.due():
                    self._verify_near(near, value_key, spec, args, kwargs)
                return value
        state = self.state
        flights = state.flights
        joiner: Joiner | None = None  # made when a flight is in progress: hits make none
        while True:
            flight, leads = flights.join(value_key)
            if leads:
                break
            if joiner is None:
                joiner = Joiner(value_key, spec, self._events)
            timeout = joiner.joins(flight)
            try:
                joined = flights.wait(flight, timeout)
            except BaseException:
                joiner.interrupted()  # a cancelled task, a KeyboardInterrupt, a killed greenlet
                raise
            joining(flight)  # its trace links to the leader's load
            value = joiner.outcome(flight, joined)
            if value is Outcome.START_OVER:
                continue
            if value is Outcome.TIMED_OUT:
                ctx = self._context(value_key, spec, args, kwargs)
                ctx.began = joiner.joined_first  # it shares a load without the lease begun after that
                loader = functools.partial(spec.func, *args, **kwargs)
                return self._drive(after_wait_timeout(ctx), ctx, loader, state)
            if flight.stale:
                report_stale()
            return value
        if joiner is not None:
            joiner.leads()
        try:
            value = self._lead(value_key, spec, args, kwargs, state, flight, joiner)
        except BaseException as error:
            flights.finish(value_key, flight, error=error)
            raise
        flights.finish(value_key, flight, value=value)
        if flight.stale:
            report_stale()
        return value

    def _lead(
        self,
        value_key: str,
        spec: LoaderSpec,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        state: State,
        flight: Flight,
        joiner: Joiner | None = None,
    ) -> Any:
        """Lead ``flight``: read, and on a miss fill (``flow.fill``). ``joiner``: the
        caller's waits before it led (it started over), from whose first its bounds run."""
        flight.sent, flight.codec = 1, spec.codec
        store = state.store
        near = self.near if spec.near else None
        ttl_left, failing = -1.0, False
        try:
            if near is not None:
                raw, ttl_left, failing = self._read_for_near(near, store, value_key, spec)
            elif spec.reads_ttl:
                raw, ttl_left, failing = store.get_with_ttl(value_key, spec.reads_failing)
            else:
                raw = store.get(value_key)
        except BackendUnavailable as error:
            found: Any = failed_read(self._events, self._warn, error)
        else:
            found = read_found(flight, spec, raw, ttl_left, failing, self._events, self._warn, value_key, world.random)
            if type(found) not in DECIDED:
                if spec.verify is not None and raw is not None and spec.verify.due():
                    self._verify(state, value_key, spec, functools.partial(spec.func, *args, **kwargs), raw)
                return found  # a value, as it was read
            if isinstance(found, Served):
                if found.refresh is not None:
                    self._refresh(state, value_key, spec, args, kwargs, found)
                if not found.stale and spec.verify is not None and raw is not None and spec.verify.due():
                    self._verify(state, value_key, spec, functools.partial(spec.func, *args, **kwargs), raw)
                return found.value
        refuse_recursion(value_key)
        ctx = self._context(value_key, spec, args, kwargs)
        if joiner is not None:
            ctx.began = joiner.joined_first  # a load it waits for is bounded from there (load_soft_timeout)
        loader = functools.partial(spec.func, *args, **kwargs)
        return self._drive(fill(ctx, found), ctx, loader, state, flight)

    def call_many(self, keys: Sequence[str], spec: LoaderSpec, load: Callable[[list[int]], list[Any]]) -> list[Any]:
        """The values of many entries, in the order of ``keys`` (see ``_core.many``).
        ``load(positions)`` calls the loader with the ids at those positions of the call
        and returns their values in that order."""
        state = self.state
        if not keys:
            return []
        if not spec.near and not spec.reads_ttl:  # a warm page: one MGET, one loop
            try:
                raws = state.store.get_many(keys)
            except BackendUnavailable as error:
                return self._call_many(keys, spec, load, [MISSING] * len(keys), list(range(len(keys))), error, state)
            hits, missed = spec.codec.decode_hits(raws)
            self._events.incr("batch_reads")
            if spec.verify is not None:
                position = spec.verify.among(len(raws))
                if position >= 0 and hits[position] is not NOT_A_VALUE:
                    self._verify_entry(state, keys, spec, load, position, raws[position])
            if not missed:
                self._events.incr("hits", len(hits))
                return hits
            return self._call_many(
                keys, spec, load, [MISSING] * len(keys), list(range(len(keys))), None, state, (raws, hits)
            )
        values = [MISSING] * len(keys)
        wanted = near_many(self.near, keys, spec, values)
        if spec.verify is not None and self.near is not None and len(wanted) < len(keys):
            position = spec.verify.among(len(keys) - len(wanted))
            if position >= 0:
                index = [index for index, value in enumerate(values) if value is not MISSING][position]
                self._verify_entry(state, keys, spec, load, index, self.near.raw(keys[index]))
        return self._call_many(keys, spec, load, values, wanted, None, state)

    def _call_many(
        self,
        keys: Sequence[str],
        spec: LoaderSpec,
        load: Callable[[list[int]], list[Any]],
        values: list[Any],
        wanted: list[int],
        failed: BackendUnavailable | None,
        state: State,
        read: tuple[list[bytes | None], list[Any]] | None = None,
        started_over: bool = False,
    ) -> list[Any]:
        """``call_many`` past the near cache: the entries ``wanted`` read (unless that
        read ``failed``, or was made already: ``read``, the bytes and what they decode to),
        the rest in flights.

        An entry whose joined flight's outcome cannot be handed to this call (it must
        start over: the value came from a command sent before it joined, or was not
        written) is asked again once every joined flight is done, together with the
        others that must, as a call of its own: one read for them all, not a single
        call each, one after another (in a storm across processes, a tenth to a half of
        a process's joins came to that). ``started_over``: this is that call, whose own
        start-overs go one by one, so that it recurses once at most."""
        absent: set[int] = set()
        if wanted and not spec.reads_ttl and failed is None:
            try:
                if read is None:
                    raws = [found[0] for found in self._read_many([keys[index] for index in wanted], spec, state)]
                    read = raws, spec.codec.decode_hits(raws)[0]
                    self._events.incr("batch_reads")
            except BackendUnavailable as error:
                failed = error
            else:
                if spec.verify is not None:
                    position = spec.verify.among(len(wanted))
                    if position >= 0 and read[1][position] is not NOT_A_VALUE:
                        self._verify_entry(state, keys, spec, load, wanted[position], read[0][position])
                wanted = take_hits(*read, wanted, values, self._events, absent)
        led: dict[int, Flight] = {}
        joined: list[tuple[int, Flight]] = []
        for index in wanted:
            flight, leads = state.flights.join(keys[index])
            if leads:
                led[index] = flight
            else:
                joined.append((index, flight))
        waits = []  # each joined flight's wait, begun now: it may finish during this call's own loads
        try:
            for index, flight in joined:
                joiner = Joiner(keys[index], one_of(spec, load, index), self._events)  # RecursiveLoad, at once
                waits.append((index, joiner, flight, state.flights.waiter(flight, joiner.joins(flight))))
        except BaseException as error:
            for _, joiner, _, _ in waits:
                joiner.interrupted()  # its wait, reported begun, ends
            for index, flight in led.items():
                state.flights.finish(keys[index], flight, error=error)
            raise
        if led:
            self._lead_many(keys, spec, load, led, values, state, failed, absent)
        again = []
        for index, joiner, flight, waiter in waits:  # in flight here: waited for once this call's own are done
            value = self._wait_joined(keys[index], joiner, flight, waiter, state)
            if value is Outcome.START_OVER:
                if not started_over:
                    again.append(index)
                    continue
                value = self.call(keys[index], joiner.spec, (), {})  # its wait is bounded anew by wait_timeout
            values[index] = value
        if again:
            self._call_many(keys, spec, load, values, again, None, state, started_over=True)
        return values

    def _wait_joined(self, value_key: str, joiner: Joiner, flight: Flight, waiter: Waiter, state: State) -> Any:
        """Wait for another caller's flight of one entry of a many-key call, as ``call``
        waits: its value, or ``Outcome.START_OVER`` if the entry must be asked again."""
        spec = joiner.spec
        try:
            joined = waiter.wait()
        except BaseException:
            joiner.interrupted()
            raise
        value = joiner.outcome(flight, joined)
        if value is Outcome.TIMED_OUT:
            ctx = self._context(value_key, spec)
            ctx.began = joiner.joined_first
            return self._drive(after_wait_timeout(ctx), ctx, spec.func, state)
        return value

    def _lead_many(
        self,
        keys: Sequence[str],
        spec: LoaderSpec,
        load: Callable[[list[int]], list[Any]],
        led: dict[int, Flight],
        values: list[Any],
        state: State,
        failed: BackendUnavailable | None,
        absent: set[int],
    ) -> None:
        """Read the entries this call leads in one round trip, and fill their misses
        together. An entry the call's first read found ``absent`` is not read again (a
        miss has no value to hand a joiner), nor is any after that read ``failed``.
        Every flight it leads is finished, whatever happens."""
        flights, unfinished = state.flights, dict(led)
        try:
            for flight in led.values():
                flight.sent, flight.codec = 1, spec.codec
            unread = [index for index in led if index not in absent]
            unread_keys = [keys[index] for index in unread]
            found = Found()
            try:
                if failed is not None:
                    raise failed
                reads = self._read_many(unread_keys, spec, state) if unread else []
            except BackendUnavailable as error:
                self._events.incr("batch_reads")
                found = failed_reads(unread, self._events, self._warn, error)
            else:
                if unread:
                    self._events.incr("batch_reads")
                found = read_many(
                    unread, [led[index] for index in unread], spec, reads, unread_keys, self._events, self._warn,
                    world.random,
                )  # fmt: skip
            found.absent([index for index in led if index in absent], self._events)
            for index, value in found.values.items():
                values[index] = value
                flights.finish(keys[index], unfinished.pop(index), value=value)
            if found.fresh and spec.verify is not None:
                position = spec.verify.among(len(found.fresh))
                if position >= 0:
                    self._verify_entry(state, keys, spec, load, *list(found.fresh.items())[position])
            if found.refreshes:
                self._refresh_many(state, keys, spec, load, found.refreshes)
            if not found.misses:
                return
            misses = sorted(found.misses)  # the ids in the order asked
            for index in misses:
                refuse_recursion(keys[index])
            entries = [
                new_entry(index, self._context(keys[index], spec, (index,)), state.leases.policy, led[index])
                for index in misses
            ]
            flows = [fill(entry.ctx, found.misses[entry.position]) for entry in entries]

            def ended(index: int, outcome: Any) -> None:
                finish_entry(flights, keys, entries[index], outcome, unfinished, values)

            failure = first_failure(self._drive_many(flows, entries, load, state, ended))
            if failure is not None:
                raise failure
        except BaseException as error:
            for index, flight in unfinished.items():
                flights.finish(keys[index], flight, error=error)
            raise

    def _read_many(self, keys: list[str], spec: LoaderSpec, state: State) -> list[tuple[bytes | None, float, bool]]:
        """Read ``keys`` in one round trip, with their TTLs if a freshness setting or the
        near cache needs them, and copy each into the near cache under its rules (a read
        begun before an invalidation of its key copies nothing: ``_read_for_near``)."""
        near = self.near if spec.near else None
        if near is None:
            if spec.reads_ttl:
                return state.store.get_many_with_ttl(keys, spec.reads_failing)
            return [(raw, -1.0, False) for raw in state.store.get_many(keys)]
        tickets = [near.begin(key) for key in keys]
        try:
            reads = state.store.get_many_with_ttl(keys, spec.reads_failing)
        except BaseException:
            for ticket in tickets:
                near.cancel(ticket)
            raise
        for ticket, (raw, ttl_left, _) in zip(tickets, reads, strict=True):
            near.fill(ticket, raw, ttl_left, spec)
        return reads

    def _refresh_many(
        self,
        state: State,
        keys: Sequence[str],
        spec: LoaderSpec,
        load: Callable[[list[int]], list[Any]],
        served: dict[int, Served],
    ) -> None:
        """Start one background refresh of every stale entry ``served``: one loader call
        (``_refresh``'s rules)."""
        name = batch_name(keys, served)
        if state.refresher.busy(name):
            return
        entries = [
            new_entry(index, self._context(keys[index], spec, (index,)), state.leases.policy, None) for index in served
        ]
        flows = [refresh(entry.ctx, *refreshed(served[entry.position])) for entry in entries]

        def work() -> None:
            failure = first_failure(self._drive_many(flows, entries, load, state))
            if failure is not None:
                raise failure

        early = sum(1 for found in served.values() if found.early)
        if state.refresher.start(name, work) and early:
            self._events.incr("early_refreshes", early)

    def _drive_many(
        self,
        flows: list[Flow],
        entries: list[Entry],
        load: Callable[[list[int]], list[Any]],
        state: State,
        ended: Callable[[int, Any], None] = lambda index, outcome: None,
    ) -> list[Any]:
        """Perform the flows together (``batch.together``): each entry's own steps on a
        lease of its own, the rest in one round trip or one loader call."""
        leases, watchdog = state.leases, state.watchdog

        def performer(entry: Entry) -> Performer:
            return Performer(entry.lease, store=leases.store, servers=leases.servers, watchdog=watchdog, renewal=leases)

        perform = BatchPerformer(entries, leases.store, load, watchdog, leases, self._events)
        with performers_for(entries, performer):
            return run(together(flows, ended, entries[0].ctx.clock), perform)  # waits timed by the flows' clock

    def _read_for_near(
        self, near: NearCache, store: Store, value_key: str, spec: LoaderSpec
    ) -> tuple[bytes | None, float, bool]:
        """Read the value with its TTL, and copy it into the near cache unless an
        invalidation of the key came in since the read began (see ``_drivers.near``)."""
        ticket = near.begin(value_key)
        try:
            raw, ttl_left, failing = store.get_with_ttl(value_key, spec.reads_failing)
        except BaseException:
            near.cancel(ticket)
            raise
        near.fill(ticket, raw, ttl_left, spec)
        return raw, ttl_left, failing

    def _refresh(
        self,
        state: State,
        value_key: str,
        spec: LoaderSpec,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        found: Served,
    ) -> None:
        """Start a background refresh of the value ``found``, as ``_drivers.refresh``
        says: one per key, at most ``refreshes`` at once."""
        assert found.refresh is not None
        if state.refresher.busy(value_key):
            return
        ctx = self._context(value_key, spec, args, kwargs)
        loader = functools.partial(spec.func, *args, **kwargs)
        flow = refresh(ctx, found.refresh, found.life_left, found.raw)
        work = functools.partial(self._drive, flow, ctx, loader, state)
        if state.refresher.start(value_key, work) and found.early:
            self._events.incr("early_refreshes")

    def _verify(self, state: State, value_key: str, spec: LoaderSpec, reload: Callable[[], Any], raw: bytes) -> None:
        """Start the verification of a hit that served the envelope ``raw``
        (``_core.verify``): one per key in this process (event loop), a few at once. A
        hit of the same envelope meanwhile shares its verdict."""
        leads = state.verdicts.join(value_key, raw)
        if leads is None:  # another envelope of the key is being verified
            self._events.incr("consistency_skipped")
        elif leads:
            work = functools.partial(self._verification, state, value_key, spec, reload, raw)
            if not state.verifier.start(value_key, work):  # at the limit of verifications at once
                self._events.incr("consistency_skipped", state.verdicts.done(value_key))

    def _verify_near(
        self, near: NearCache, value_key: str, spec: LoaderSpec, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> None:
        """``_verify`` of a near-cache hit, whose envelope is the copy's."""
        raw = near.raw(value_key)
        if raw is not None:
            self._verify(self.state, value_key, spec, functools.partial(spec.func, *args, **kwargs), raw)

    def _verify_entry(
        self,
        state: State,
        keys: Sequence[str],
        spec: LoaderSpec,
        load: Callable[[list[int]], list[Any]],
        index: int,
        raw: bytes | None,
    ) -> None:
        """``_verify`` of the hit at ``index`` of a many-key call (one at most per call):
        the loader is asked for that id alone."""
        if raw is not None:
            self._verify(state, keys[index], spec, one_of(spec, load, index).func, raw)

    def _verification(
        self, state: State, value_key: str, spec: LoaderSpec, reload: Callable[[], Any], raw: bytes
    ) -> None:
        """Load the entry again, compare, and count the result (``_core.verify``)."""
        codec = spec.codec
        token = mark_verifying()
        result: Result = "error"
        try:
            result = "match"
            if not agrees(codec, raw, reload(), spec.verify_equal, value_key):
                result = "superseded"
                if unchanged(codec, raw, state.store.get(value_key)):
                    state.verifier.release()  # the wait asks nothing of the database (``_core.verify``)
                    time.sleep(spec.settings.verify_grace)  # a writer's invalidation on its way
                    if unchanged(codec, raw, state.store.get(value_key)):
                        result = "mismatch"
        except Exception as error:
            result = "error"
            verification_failed(value_key, spec.name, spec.settings.trace_keys, error)
        finally:
            unmark_verifying(token)
            hits = state.verdicts.done(value_key)  # cancelled (the loop's state closes): none counted
        if result == "mismatch":
            log_mismatch(self._warn, value_key, spec.name, spec.settings.trace_keys)
        self._events.incr(EVENT_OF[result], hits)

    def _context(
        self, value_key: str, spec: LoaderSpec, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None
    ) -> Context:
        """A miss's context. ``args`` and ``kwargs``: the call's, which the entry's tags are
        rendered from (rendered on a miss only: a hit never needs them). A many-key call's
        are the entry's position (``_loader_many.PageTags``)."""
        tags = spec.tags.render(args, kwargs or {}) if spec.tags is not None else None
        return new_context(value_key, spec, self._events, self._warn, tags)

    def set(self, value_key: str, spec: LoaderSpec, args: tuple[Any, ...], kwargs: dict[str, Any], result: Any) -> bool:
        """Write ``result`` over the entry, overtaking any load in flight (``controls.put``)."""
        ctx = self._context(value_key, spec, args, kwargs)
        return bool(self._drive(put(ctx, result), ctx, no_load, self.state))

    def refresh(self, value_key: str, spec: LoaderSpec, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """Load the entry now, shared with every refresh and miss of it at the same moment
        (``controls.reload``), and return the value."""
        refuse_recursion(value_key)
        ctx = self._context(value_key, spec, args, kwargs)
        return self._drive(reload(ctx), ctx, functools.partial(spec.func, *args, **kwargs), self.state)

    def peek(self, value_key: str, spec: LoaderSpec) -> tuple[Any, bool] | None:
        """What the entry holds that a caller could be served (``controls.peeked``)."""
        store = self.state.store
        if not spec.reads_ttl:
            return peeked(store.get(value_key), -1.0, False, spec.codec, spec.settings)
        raw, ttl_left, failing = store.get_with_ttl(value_key, True)
        return peeked(raw, ttl_left, failing, spec.codec, spec.settings)

    def peek_many(self, keys: Sequence[str], spec: LoaderSpec) -> list[tuple[Any, bool] | None]:
        """``peek`` of each of ``keys``, in one round trip per server."""
        store = self.state.store
        codec, settings = spec.codec, spec.settings
        if not spec.reads_ttl:
            return [peeked(raw, -1.0, False, codec, settings) for raw in store.get_many(keys)]
        reads = store.get_many_with_ttl(keys, True)
        return [peeked(raw, ttl_left, failing, codec, settings) for raw, ttl_left, failing in reads]

    def invalidate(self, keys: EntryKeys) -> None:
        self.state.leases.invalidate(keys)

    def mark_versioned(self, keys: list[EntryKeys], marker_ms: int) -> None:
        """A versioned load's mark on the entries of its loader without ``version=``, before
        its loader reads the database (``_core.versions``). A store that cannot take it is
        warned of, and the load goes on: its value is not written where the store is down,
        and elsewhere the mark is what an invalidation by the other side would miss."""
        try:
            self.state.store.mark_versioned(keys, marker_ms)
        except BackendUnavailable as error:
            self._warn.warning(
                "stampede: a versioned load could not mark its entry (%s); an invalidation by a loader "
                "without version= may not reach what it writes (docs/deploys.md)",
                error,
                key=keys[0].value if keys else "",
                outcome="versions",
            )

    def expire(self, keys: EntryKeys) -> None:
        self.state.leases.expire(keys)

    def _unleased(self, state: State, value_key: str, began: float, load: Callable[[], Any]) -> Any:
        """A load of ``value_key`` without the lease, for a call that began at ``began``:
        one at a time per key in this process (event loop), shared by the callers that
        need one meanwhile and began before it did (``_core.flight.shares_fallback``).
        Each caller encodes and reads back the loader's value for itself
        (``flow._load_uncached``)."""
        key = fallback_key(value_key)
        flights = state.flights
        while True:
            flight, leads = flights.join(key)
            if leads:
                break
            flights.wait(flight, math.inf)
            if shares_fallback(flight, began):
                self._events.incr("collapsed")
                if flight.error is not None:
                    raise flight.error
                return flight.value
            # It began after that load did: the next one is its own, led or shared.
        flight.opened_at = world.monotonic()
        try:
            value = load()
        except BaseException as error:
            flights.finish(key, flight, error=error)
            raise
        flights.finish(key, flight, value=value)
        return value

    def _drive(
        self,
        flow: Flow,
        ctx: Context,
        loader: Callable[[], Any],
        state: State,
        flight: Flight | None = None,
    ) -> Any:
        """Perform the flow (``perform.arun``) on a lease of a new token, held where the
        layer's policy holds leases. The leader's ``flight`` counts the steps that may
        produce the value (see Flight)."""
        clock = ctx.tags.clock if ctx.tags is not None else ""  # read with the lease (_core.tags)
        lease = Lease(ctx.keys, lease_token(ctx, flight), milliseconds(ctx.settings.lock_ttl), clock=clock)
        leases = state.leases
        ctx.leases = leases.policy.bind(lease)
        performer = Performer(
            lease,
            store=leases.store,
            servers=leases.servers,
            loader=loader,
            watchdog=state.watchdog,
            renewal=leases,
            unleased=functools.partial(self._unleased, state, ctx.keys.value, ctx.began),
        )
        with performer:
            if flight is None:
                return run(flow, performer)

            def perform(effect: Effect) -> Any:
                flight.count(effect)
                return performer(effect)

            value = run(flow, perform)
        flight.decided(ctx.unwritten, ctx.via_notice, ctx.served_stale, ctx.raw)
        return value
