"""Many keys' call (``cached_loader_many``, ``_core.many``): every entry read in one round
trip, the hits served, the misses joined to flights in progress or led, and the led ones
filled together (``batch.together``): each entry's own steps on a lease of its own, the
rest in one round trip or one loader call.
"""

# many_keys.py, the blocking twin, is generated from this module by .ci/unasync.py.  # ASYNC
# UNASYNC: self._state() -> self.state
from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from .._core import world
from .._core.batch import together
from .._core.call import Joiner, Outcome
from .._core.codec import NOT_A_VALUE
from .._core.flight import Flight, refuse_recursion
from .._core.flow import (
    Flow,
    LoaderSpec,
    after_wait_timeout,
    fill,
    refresh,
)
from .._core.freshness import Served
from .._core.many import Found, failed_reads, read_many, take_hits
from .._errors import BackendUnavailable
from .abatched import AsyncBatchPerformer
from .aone_key import AsyncOneKey
from .aperform import AsyncPerformer, arun
from .batch_entries import Entry, new_entry, performers_for
from .many import aone_of, batch_name, finish_entry, first_failure, near_many, refreshed
from .near import MISSING
from .singleflight import AsyncWaiter
from .state import AsyncState


class AsyncManyKeys(AsyncOneKey):
    """Runs the calls of a loader of many ids."""

    async def call_many(
        self, keys: Sequence[str], spec: LoaderSpec, load: Callable[[list[int]], Awaitable[list[Any]]]
    ) -> list[Any]:
        """The values of many entries, in the order of ``keys`` (see ``_core.many``).
        ``load(positions)`` calls the loader with the ids at those positions of the call
        and returns their values in that order."""
        state = self._state()
        if not keys:
            return []
        if not spec.near and not spec.reads_ttl:  # a warm page: one MGET, one loop
            try:
                raws = await state.store.get_many(keys)
            except BackendUnavailable as error:
                return await self._call_many(
                    keys, spec, load, [MISSING] * len(keys), list(range(len(keys))), error, state
                )
            hits, missed = spec.codec.decode_hits(raws)
            self._events.incr("batch_reads")
            if spec.verify is not None:
                position = spec.verify.among(len(raws))
                if position >= 0 and hits[position] is not NOT_A_VALUE:
                    self._verify_entry(state, keys, spec, load, position, raws[position])
            if not missed:
                self._events.incr("hits", len(hits))
                return hits
            return await self._call_many(
                keys, spec, load, [MISSING] * len(keys), list(range(len(keys))), None, state, (raws, hits)
            )
        values = [MISSING] * len(keys)
        wanted = near_many(self.near, keys, spec, values)
        if spec.verify is not None and self.near is not None and len(wanted) < len(keys):
            position = spec.verify.among(len(keys) - len(wanted))
            if position >= 0:
                index = [index for index, value in enumerate(values) if value is not MISSING][position]
                self._verify_entry(state, keys, spec, load, index, self.near.raw(keys[index]))
        return await self._call_many(keys, spec, load, values, wanted, None, state)

    async def _call_many(
        self,
        keys: Sequence[str],
        spec: LoaderSpec,
        load: Callable[[list[int]], Awaitable[list[Any]]],
        values: list[Any],
        wanted: list[int],
        failed: BackendUnavailable | None,
        state: AsyncState,
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
                    raws = [found[0] for found in await self._read_many([keys[index] for index in wanted], spec, state)]
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
                joiner = Joiner(keys[index], aone_of(spec, load, index), self._events)  # RecursiveLoad, at once
                waits.append((index, joiner, flight, state.flights.waiter(flight, joiner.joins(flight))))
        except BaseException as error:
            for _, joiner, _, _ in waits:
                joiner.interrupted()  # its wait, reported begun, ends
            for index, flight in led.items():
                state.flights.finish(keys[index], flight, error=error)
            raise
        if led:
            await self._lead_many(keys, spec, load, led, values, state, failed, absent)
        again = []
        for index, joiner, flight, waiter in waits:  # in flight here: waited for once this call's own are done
            value = await self._wait_joined(keys[index], joiner, flight, waiter, state)
            if value is Outcome.START_OVER:
                if not started_over:
                    again.append(index)
                    continue
                value = await self.call(keys[index], joiner.spec, (), {})  # its wait is bounded anew by wait_timeout
            values[index] = value
        if again:
            await self._call_many(keys, spec, load, values, again, None, state, started_over=True)
        return values

    async def _wait_joined(
        self, value_key: str, joiner: Joiner, flight: Flight, waiter: AsyncWaiter, state: AsyncState
    ) -> Any:
        """Wait for another caller's flight of one entry of a many-key call, as ``call``
        waits: its value, or ``Outcome.START_OVER`` if the entry must be asked again."""
        spec = joiner.spec
        try:
            if True:  # ASYNC
                joined = await waiter
            else:
                joined = waiter.wait()
        except BaseException:
            joiner.interrupted()
            raise
        value = joiner.outcome(flight, joined)
        if value is Outcome.TIMED_OUT:
            ctx = self._context(value_key, spec)
            ctx.began = joiner.joined_first
            return await self._drive(after_wait_timeout(ctx), ctx, spec.func, state)
        return value

    async def _lead_many(
        self,
        keys: Sequence[str],
        spec: LoaderSpec,
        load: Callable[[list[int]], Awaitable[list[Any]]],
        led: dict[int, Flight],
        values: list[Any],
        state: AsyncState,
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
                reads = await self._read_many(unread_keys, spec, state) if unread else []
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

            failure = first_failure(await self._drive_many(flows, entries, load, state, ended))
            if failure is not None:
                raise failure
        except BaseException as error:
            for index, flight in unfinished.items():
                flights.finish(keys[index], flight, error=error)
            raise

    async def _read_many(
        self, keys: list[str], spec: LoaderSpec, state: AsyncState
    ) -> list[tuple[bytes | None, float, bool]]:
        """Read ``keys`` in one round trip, with their TTLs if a freshness setting or the
        near cache needs them, and copy each into the near cache under its rules (a read
        begun before an invalidation of its key copies nothing: ``_read_for_near``)."""
        near = self.near if spec.near else None
        if near is None:
            if spec.reads_ttl:
                return await state.store.get_many_with_ttl(keys, spec.reads_failing)
            return [(raw, -1.0, False) for raw in await state.store.get_many(keys)]
        tickets = [near.begin(key) for key in keys]
        try:
            reads = await state.store.get_many_with_ttl(keys, spec.reads_failing)
        except BaseException:
            for ticket in tickets:
                near.cancel(ticket)
            raise
        for ticket, (raw, ttl_left, _) in zip(tickets, reads, strict=True):
            near.fill(ticket, raw, ttl_left, spec)
        return reads

    def _refresh_many(
        self,
        state: AsyncState,
        keys: Sequence[str],
        spec: LoaderSpec,
        load: Callable[[list[int]], Awaitable[list[Any]]],
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

        async def work() -> None:
            failure = first_failure(await self._drive_many(flows, entries, load, state))
            if failure is not None:
                raise failure

        early = sum(1 for found in served.values() if found.early)
        if state.refresher.start(name, work) and early:
            self._events.incr("early_refreshes", early)

    async def _drive_many(
        self,
        flows: list[Flow],
        entries: list[Entry],
        load: Callable[[list[int]], Awaitable[list[Any]]],
        state: AsyncState,
        ended: Callable[[int, Any], None] = lambda index, outcome: None,
    ) -> list[Any]:
        """Perform the flows together (``batch.together``): each entry's own steps on a
        lease of its own, the rest in one round trip or one loader call."""
        leases, watchdog = state.leases, state.watchdog

        def performer(entry: Entry) -> AsyncPerformer:
            return AsyncPerformer(
                entry.lease, store=leases.store, servers=leases.servers, watchdog=watchdog, renewal=leases
            )

        perform = AsyncBatchPerformer(entries, leases.store, load, watchdog, leases, self._events)
        with performers_for(entries, performer):
            return await arun(together(flows, ended, entries[0].ctx.clock), perform)  # waits timed by the flows' clock
