"""What the blocking and asyncio drivers of a many-key call share (``_core.many``): how
a batch's outcomes finish its flights, and the single-key loader of one of its ids."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Protocol

from .._core.batch import Failed
from .._core.flight import Flight
from .._core.flow import LoaderSpec
from .._core.freshness import Served
from .._core.tags import FixedTags
from .batch_entries import Entry
from .near import MISSING, NearCache


class Flights(Protocol):
    def finish(self, key: str, flight: Flight, value: Any = None, error: BaseException | None = None) -> None: ...


def finish_entry(
    flights: Flights, keys: Sequence[str], entry: Entry, outcome: Any, unfinished: dict[int, Flight], values: list[Any]
) -> None:
    """Finish an entry's flight with its flow's outcome, as a single call's leader does,
    and put its value in its place: as soon as the flow ends, so that callers who joined
    that entry do not wait for the rest of the batch."""
    flight = unfinished.pop(entry.position)
    key = keys[entry.position]
    if isinstance(outcome, Failed):
        flights.finish(key, flight, error=outcome.error)
        return
    ctx = entry.ctx
    flight.decided(ctx.unwritten, ctx.via_notice, ctx.served_stale, ctx.raw)
    flights.finish(key, flight, value=outcome)
    values[entry.position] = outcome


def first_failure(outcomes: Sequence[Any]) -> BaseException | None:
    return next((outcome.error for outcome in outcomes if isinstance(outcome, Failed)), None)


def near_many(near: NearCache | None, keys: Sequence[str], spec: LoaderSpec, values: list[Any]) -> list[int]:
    """What the near cache holds of a many-key call's entries, put in ``values``; the
    indexes of the rest."""
    if near is None or not spec.near:
        return list(range(len(keys)))
    wanted = []
    for index, key in enumerate(keys):
        value = near.get(key, spec.codec, spec.near_shared)
        if value is MISSING:
            wanted.append(index)
        else:
            values[index] = value
    return wanted


def refreshed(served: Served) -> tuple[bytes, float, bytes | None]:
    """A served value's refresh: the stale value's identity, its life left, its envelope."""
    assert served.refresh is not None
    return served.refresh, served.life_left, served.raw


def batch_name(keys: Sequence[str], indexes: dict[int, Any]) -> str:
    """The name a background refresh of these entries goes by (one refresh per name)."""
    return "\n".join(keys[index] for index in indexes)


def one_of(spec: LoaderSpec, load: Callable[[list[int]], list[Any]], position: int) -> LoaderSpec:
    """A single-key loader of the id at ``position``: a many-key call waits for an entry in
    flight in this process, and starts it over if it must, as a single call does."""
    return dataclasses.replace(spec, func=functools.partial(_one, load, position), tags=tags_at(spec, position))


def aone_of(spec: LoaderSpec, load: Callable[[list[int]], Awaitable[list[Any]]], position: int) -> LoaderSpec:
    """``one_of`` for an async loader."""
    return dataclasses.replace(spec, func=functools.partial(_aone, load, position), tags=tags_at(spec, position))


def tags_at(spec: LoaderSpec, position: int) -> FixedTags | None:
    """The tags of the entry at ``position`` of a many-key call (its spec's tags render
    a position: ``_loader_many.PageTags``)."""
    return None if spec.tags is None else FixedTags(spec.tags.render((position,), {}))


def _one(load: Callable[[list[int]], list[Any]], position: int) -> Any:
    return load([position])[0]


async def _aone(load: Callable[[list[int]], Awaitable[list[Any]]], position: int) -> Any:
    return (await load([position]))[0]
