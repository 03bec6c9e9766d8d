"""What the performers of a batch of flows (``_core.batch``, ``abatched``, ``batched``)
share: a batch's entries, and the store calls and replies of its steps.

Each entry of a batch has its own lease (a token of its own), its own ``Performer`` (its
subscription, its lock-server commands) and, when a caller leads its key, its flight,
which counts the steps that may produce its value as a single call's does.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Any, TypeVar

from .._core.batch import Failed, One
from .._core.effects import Acquire, Effect, Lease, Load, ReadTagClock, WriteRelease, milliseconds
from .._core.flight import Flight
from .._core.flow import Context
from .aperform import AsyncPerformer
from .perform import Performer
from .tracing import lease_token

T = TypeVar("T")


@dataclass(slots=True)
class Entry:
    """One entry of a batch: where its id is in the call, its flow's context and lease,
    and its flight if the caller leads it (a refresh has none)."""

    position: int
    ctx: Context
    lease: Lease
    flight: Flight | None
    performer: Any = None  # its Performer or AsyncPerformer

    def count(self, effect: Effect) -> None:
        if self.flight is not None:
            self.flight.count(effect)


def new_entry(position: int, ctx: Context, policy: Any, flight: Flight | None) -> Entry:
    """An entry with a lease of a new token, held where ``policy`` holds leases."""
    lease = Lease(ctx.keys, lease_token(ctx), milliseconds(ctx.settings.lock_ttl))
    ctx.leases = policy.bind(lease)
    return Entry(position, ctx, lease, flight)


def replies(answers: Sequence[Any]) -> list[Any]:
    """A store's many-key answers as a batch's replies: a failure in place as ``Failed``."""
    return [Failed(answer) if isinstance(answer, BaseException) else answer for answer in answers]


def subscribed(entries: Sequence[Entry], subscriptions: Sequence[Any]) -> list[Any]:
    """Each entry's subscription handed to its performer: the replies of a ``Subscribe``
    step, with a subscription its server failed (one cluster primary) as ``Failed``."""
    for entry, subscription in zip(entries, subscriptions, strict=True):
        if not isinstance(subscription, BaseException):
            entry.performer.subscribed(subscription)
    return [Failed(answer) if isinstance(answer, BaseException) else None for answer in subscriptions]


def acquire_calls(entries: Sequence[Entry], steps: Sequence[One]) -> list[Any]:
    calls = []
    for entry, step in zip(entries, steps, strict=True):
        effect = step.effect
        assert isinstance(effect, Acquire)
        lease = entry.lease
        calls.append((lease.keys, lease.token, lease.ms, effect.check_value, effect.stale))
    return calls


def write_calls(entries: Sequence[Entry], steps: Sequence[One]) -> list[Any]:
    calls = []
    for entry, step in zip(entries, steps, strict=True):
        effect = step.effect
        assert isinstance(effect, WriteRelease)
        lease = entry.lease
        calls.append((lease.keys, lease.token, effect.envelope, effect.ttl_ms, effect.inline, effect.tagged))
    return calls


def clock_keys(steps: Sequence[One]) -> list[str]:
    """The tag clocks these loads read before they begin: each read once for them all
    (every load of a namespace reads one)."""
    return list(dict.fromkeys(step.effect.key for step in steps if isinstance(step.effect, ReadTagClock)))


def leased(entries: Sequence[Entry], steps: Sequence[One]) -> list[Lease]:
    """The leases of the entries whose load is under their lease (renewed while it runs)."""
    return [
        entry.lease
        for entry, step in zip(entries, steps, strict=True)
        if isinstance(step.effect, Load) and step.effect.leased
    ]


async def to_the_end(work: Awaitable[T]) -> T:
    """Await ``work``, which must not be cut short (a batch's writes): a cancellation
    meanwhile waits for it to end, then goes on. (A shield alone would let the task end
    first, and a loop closing after it would destroy the writes still pending.)"""
    task = asyncio.ensure_future(work)
    interrupted: BaseException | None = None
    while not task.done():
        try:
            await asyncio.shield(task)
        except asyncio.CancelledError as error:
            interrupted = error
    if interrupted is not None:
        raise interrupted
    return task.result()


def performers_for(entries: Sequence[Entry], make: Callable[[Entry], Performer | AsyncPerformer]) -> ExitStack:
    """Give each entry its performer; the stack closes their subscriptions on exit."""
    stack = ExitStack()
    for entry in entries:
        entry.performer = stack.enter_context(make(entry))
    return stack
