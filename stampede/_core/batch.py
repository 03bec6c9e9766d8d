"""Many flows driven as one (sans-IO): the misses of a many-key call, each entry's flow
unchanged, with the steps that can go together performed together.

A many-key loader's caller leads the flows of the entries it missed (``flow.fill``,
``flow.refresh``: one per entry, each with its own lease). ``together`` steps them all
and, whenever several ask for the same kind of step at once, yields that step once for
all of them (``Each``): one round trip takes every lease (``Acquire``), writes every
value (``WriteRelease``) or subscribes every waiter (``Subscribe``), and one call of the
loader loads every entry whose flow is at ``Load``. Any other step is one flow's own
(``One``).

Rules of the order, so that one call of the loader covers every entry it can, and no
two batches wait for each other:

* A flow's own commands (release, hold, lock servers) go first, then every
  ``Subscribe`` (confirmed together), every ``Acquire``, every ``WriteRelease``, every
  ``ReadTagClock`` (the clock read once for every tagged load about to begin), every
  ``Load``, then ``Pause``. So when the loader is called, every flow is loading,
  waiting, or done.
* ``AwaitNotice`` goes last, one flow at a time: a caller waits for another holder only
  once every entry it leads is loaded and written. Two batches that each lead what the
  other waits for both load first, so neither waits on the other. Waiting for entries
  one after the other costs the longest of their waits, not their sum: a notice that
  comes in meanwhile is kept by its subscription, and a wait (or a ``Pause``) is
  performed for what is left of it since its flow asked for it. A wait whose time is
  over goes before anything else (it costs nothing), so the silent waits of entries
  whose holder went away end together, and their re-checks take the leases together and
  load them in one call. (Charged one after the other, a page waiting on three dead
  leases re-checked each once every three ``recheck_interval``, and took them over one
  by one, a loader call each.) (An entry whose notice came early is finished only once
  the waits before it end.)

A flow that raises ends with its exception (``Failed``), not the batch. An interruption
(a BaseException that is not an Exception: a cancelled task, a KeyboardInterrupt) is
thrown into every flow still running, so each releases its own lease as a single call
does, and then goes on.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from .effects import Acquire, AwaitNotice, Decision, Effect, Load, Pause, ReadTagClock, Subscribe, WriteRelease

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class One:
    """One flow's step. Reply: that step's reply (or its exception thrown in)."""

    index: int
    effect: Effect


@dataclass(frozen=True, slots=True)
class Each:
    """The same kind of step (one of ``GROUPED``) for several flows, performed together.
    Reply: a list with, for each step in order, its reply or the ``Failed`` it ended
    with. A failure of the whole round trip may be thrown in instead: it is each step's."""

    steps: tuple[One, ...]


@dataclass(frozen=True, slots=True)
class Failed:
    """A step's or a flow's exception, as a value."""

    error: BaseException


# A batch: yields steps, is sent their replies, returns its outcome.
Steps = Generator[One | Each, Any, T]

# the kinds of step ``Each`` carries, in the order they go
GROUPED = (Subscribe, Acquire, WriteRelease, ReadTagClock, Load)
LAST = (Pause, AwaitNotice)  # the kinds that wait: after everything else


def together(
    flows: Sequence[Decision[Any]],
    ended: Callable[[int, Any], None] = lambda index, outcome: None,
    clock: Callable[[], float] = time.monotonic,
) -> Steps[list[Any]]:
    """Drive ``flows`` together: the outcome of each, its value or the ``Failed`` it
    raised, in order. ``ended(index, outcome)`` is told of each as soon as its flow
    ends, so that those waiting for that entry alone need not wait for the others.
    ``clock`` (the flows' own) times the waits asked for, which are performed for what
    is left of them."""
    outcomes: list[Any] = [None] * len(flows)
    steps: dict[int, Effect] = {}  # each running flow's next step
    asked: dict[int, float] = {}  # when the wait a flow asked for (AwaitNotice, Pause) ends

    def advance(index: int, reply: Any) -> None:
        flow = flows[index]
        try:
            step = flow.throw(reply.error) if isinstance(reply, Failed) else flow.send(reply)
            steps[index] = step
            if type(step) in LAST:
                asked[index] = clock() + _length(step)
            return
        except StopIteration as stop:
            outcomes[index] = stop.value
        except Exception as error:
            outcomes[index] = Failed(error)
        del steps[index]
        ended(index, outcomes[index])

    for index in range(len(flows)):
        steps[index] = None  # type: ignore[assignment]  # started by the first send
        advance(index, None)
    while steps:
        now = clock()
        due = next((index for index, ends in asked.items() if ends <= now), None)
        batch = One(due, steps[due]) if due is not None else next_step(steps)  # a wait that is over goes first
        try:
            if isinstance(batch, One):
                if batch.index in asked:
                    batch = One(batch.index, _lasting(batch.effect, max(0.0, asked.pop(batch.index) - now)))
                try:
                    reply = yield batch  # a batch performer performs it
                except Exception as error:
                    reply = Failed(error)
                advance(batch.index, reply)
                continue
            try:
                replies = yield batch
            except Exception as error:
                replies = [Failed(error)] * len(batch.steps)
        except BaseException as interruption:  # not an Exception: every flow cleans up, then it goes on
            for index in list(steps):
                yield from _clean_up(flows[index], index, interruption)
            raise
        for step, reply in zip(batch.steps, replies, strict=True):
            advance(step.index, reply)
    return outcomes


def _length(wait: Effect) -> float:
    """How long ``wait`` (an ``AwaitNotice`` or a ``Pause``) lasts."""
    if isinstance(wait, AwaitNotice):
        return wait.timeout
    assert isinstance(wait, Pause)
    return wait.seconds


def _lasting(wait: Effect, seconds: float) -> Effect:
    """``wait`` for ``seconds``: what is left of it (none once its time is over: a notice
    that came meanwhile is still taken)."""
    if isinstance(wait, AwaitNotice):
        return dataclasses.replace(wait, timeout=seconds)
    assert isinstance(wait, Pause)
    return dataclasses.replace(wait, seconds=seconds)


def next_step(steps: dict[int, Effect]) -> One | Each:
    """What goes next, by the rules of the order: one pass over the steps, each sorted
    by its kind (effects are final classes: a step's kind is its type)."""
    kinds: dict[type, list[One]] = {}
    for index, effect in steps.items():
        kind = type(effect)
        if kind not in _ORDER:
            return One(index, effect)
        kinds.setdefault(kind, []).append(One(index, effect))
    for kind in GROUPED:
        if kind in kinds:
            return Each(tuple(kinds[kind]))
    for waiting in LAST:
        if waiting in kinds:
            return kinds[waiting][0]
    raise AssertionError(f"a step of no kind: {steps!r}")


_ORDER = frozenset((*GROUPED, *LAST))


def _clean_up(flow: Decision[Any], index: int, interruption: BaseException) -> Steps[None]:
    """Throw ``interruption`` into ``flow`` and perform the steps of its cleanup (its
    lease released by token) until it ends."""
    try:
        effect = flow.throw(interruption)
        while True:
            try:
                reply = yield One(index, effect)
            except Exception as error:
                effect = flow.throw(error)
            else:
                effect = flow.send(reply)
    except BaseException:  # the interruption, or whatever its cleanup raised: it goes on anyway
        return
