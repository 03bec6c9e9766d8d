# Generated from adrive.py by .ci/unasync.py: do not edit.
# Edit the asyncio source, then run `python .ci/unasync.py`.
"""How the runner performs one entry's decision: the context of a miss, the flow run on
a lease of a new token held where the layer's policy holds leases, and a load without the
lease (one at a time per key in this process). The base of the runner's rooms
(``_drivers.runner``), each of which builds on the one before.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any

from .._core import world
from .._core.effects import Effect, Lease, milliseconds
from .._core.flight import Flight, fallback_key, shares_fallback
from .._core.flow import (
    Context,
    Flow,
    LoaderSpec,
    new_context,
)
from .perform import Performer, run
from .state import State, States
from .tracing import lease_token


class Driving(States):
    """Performs flows against the state its base keeps (``_drivers.state``)."""

    def _context(
        self, value_key: str, spec: LoaderSpec, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None
    ) -> Context:
        """A miss's context. ``args`` and ``kwargs``: the call's, which the entry's tags are
        rendered from (rendered on a miss only: a hit never needs them). A many-key call's
        are the entry's position (``_loader_many.PageTags``)."""
        tags = spec.tags.render(args, kwargs or {}) if spec.tags is not None else None
        return new_context(value_key, spec, self._events, self._warn, tags)

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
