"""Decisions written once as generators of named steps, performed by a blocking or an
asyncio driver.

The Redlock decisions (is the lock held by a majority, within its validity? undo a
minority; retry after a random delay) are the same for threads and tasks; only the I/O
differs. A decision yields ``Step("servers.take", ...)``; ``run`` calls that method of
a blocking target and sends the reply back, ``arun`` awaits it on an asyncio target
whose methods have the same names. An exception raised by a step is thrown into the
generator, so its ``try``/``finally`` clean up (undo grants) exactly as plain code would.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Generator, TypeVar

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Step:
    """Call ``method`` (a dotted path from the target: ``"servers.release"``) with ``args``."""

    method: str
    args: tuple[Any, ...] = ()


Steps = Generator[Step, Any, T]


def _bound(target: object, method: str) -> Any:
    return functools.reduce(getattr, method.split("."), target)


def run(steps: Steps[T], target: object) -> T:
    """Perform ``steps`` with blocking calls on ``target``; return what they return."""
    reply: Any = None
    error: BaseException | None = None
    while True:
        try:
            step = steps.send(reply) if error is None else steps.throw(error)
        except StopIteration as stop:
            return stop.value  # type: ignore[no-any-return]
        error = None
        try:
            reply = _bound(target, step.method)(*step.args)
        except BaseException as raised:
            error, reply = raised, None


async def arun(steps: Steps[T], target: object) -> T:
    """Perform ``steps`` by awaiting the methods of ``target``; return what they return."""
    reply: Any = None
    error: BaseException | None = None
    while True:
        try:
            step = steps.send(reply) if error is None else steps.throw(error)
        except StopIteration as stop:
            return stop.value  # type: ignore[no-any-return]
        error = None
        try:
            reply = await _bound(target, step.method)(*step.args)
        except BaseException as raised:
            error, reply = raised, None
