"""Loads a caller stops waiting for (``load_timeout``, ``load_soft_timeout``): how the
performers run a loader under a timeout, and finish a load that outlived its caller.

A blocking loader cannot be stopped, so under a timeout it runs in a thread of its own
while its caller waits on a future (with the caller's context variables, so that what
the loader reads of them is what it would read in the caller's thread). At the timeout
the caller goes on (the flow answers it) and the load keeps its lease, renewed by the
watchdog, until it ends: then the flow's ``Finish`` step writes its value, or releases
the lease after an error. An async loader is a task: at the timeout it is cancelled, or
left to finish the same way.

The effects that must finish once started (a write, a release) outlive a cancelled task
too: ``shielded`` runs them as tasks of their own, and ``finish_started`` lets a loop's
close wait for them before it closes their store.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import threading
from collections.abc import Awaitable, Callable
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from typing import Any, TypeVar

from .._core.effects import Decision, LoadDetached
from .._errors import LoadTimeout

log = logging.getLogger("stampede.cache")

T = TypeVar("T")


@dataclass(eq=False)
class Pending:
    """A load its caller stopped waiting for: the future or task it runs as, and what
    keeps its lease renewed until it is finished (``stop``)."""

    load: Future[Any] | asyncio.Future[Any]
    stop: Callable[[], None] = lambda: None


def bounded(loader: Callable[[], Any], timeout: float, detach: bool) -> Any:
    """``loader()``, from a thread of its own, waited for ``timeout`` seconds at most; then
    ``LoadDetached``: the load goes on, ``detach`` or not, for a thread cannot be stopped
    (``cancel_on_timeout`` is for async loaders)."""
    future: Future[Any] = Future()
    context = contextvars.copy_context()

    def work() -> None:
        try:
            future.set_result(context.run(loader))
        except BaseException as error:  # handed to whoever takes the outcome
            future.set_exception(error)

    threading.Thread(target=work, name="stampede-load", daemon=True).start()
    try:
        return future.result(timeout)
    except FutureTimeout:
        raise LoadDetached(Pending(future)) from None


async def abounded(loader: Callable[[], Awaitable[Any]], timeout: float, detach: bool) -> Any:
    """``await loader()``, for ``timeout`` seconds at most; then ``LoadDetached`` if
    ``detach`` (the task goes on), else the task is cancelled and ``LoadTimeout`` raised.
    A caller cancelled meanwhile cancels the load, as awaiting it directly would."""
    task = asyncio.ensure_future(loader())
    try:
        done, _ = await asyncio.wait({task}, timeout=timeout)
    except BaseException:
        task.cancel()
        raise
    if done:
        return task.result()
    if detach:
        raise LoadDetached(Pending(task))
    task.cancel()
    task.add_done_callback(_outcome_taken)
    raise LoadTimeout("the load ran past load_timeout and was cancelled (cancel_on_timeout)")


def finish(pending: Pending, then: Callable[[Any, BaseException | None], Decision[None]], run: Any) -> None:
    """When the blocking load ``pending`` ends, perform ``then`` with its outcome (in the
    load's thread, by ``run``: the decision's performer), then stop renewing its lease."""
    load = pending.load
    assert isinstance(load, Future)

    def done(ended: Future[Any]) -> None:
        error = ended.exception()
        try:
            run(then(None if error is not None else ended.result(), error))
        except BaseException as failure:  # nobody is waiting to be told: say it
            log.warning("stampede: finishing a load that ran past its timeout failed (%r)", failure)
        finally:
            pending.stop()

    load.add_done_callback(done)


_finishing: set[asyncio.Task[None]] = set()  # finishing tasks, kept from the garbage collector


def afinish(
    pending: Pending,
    then: Callable[[Any, BaseException | None], Decision[None]],
    arun: Callable[[Decision[None]], Awaitable[None]],
) -> None:
    """``finish`` for a task: when it ends, a new task performs ``then``."""
    load = pending.load
    assert isinstance(load, asyncio.Future)

    async def finishing(decision: Decision[None]) -> None:
        try:
            await arun(decision)
        except BaseException as failure:
            log.warning("stampede: finishing a load that ran past its timeout failed (%r)", failure)
        finally:
            pending.stop()

    def done(ended: asyncio.Future[Any]) -> None:
        error: BaseException | None = asyncio.CancelledError() if ended.cancelled() else ended.exception()
        task = asyncio.ensure_future(finishing(then(None if error is not None else ended.result(), error)))
        _finishing.add(task)
        task.add_done_callback(_finishing.discard)

    load.add_done_callback(done)


_shielded: set[asyncio.Task[Any]] = set()  # shielded effects under way, of every loop


def cancel_count() -> Callable[[], int]:
    """How many cancellations of the current task have been asked for, as a function (0
    where the task does not count them: Python 3.10, or no task)."""
    cancelling: Callable[[], int] | None = getattr(asyncio.current_task(), "cancelling", None)
    return cancelling if cancelling is not None else _none_counted


def _none_counted() -> int:
    return 0


async def shielded(effect: Awaitable[T]) -> T:
    """``await effect``, finished even if the awaiting task is cancelled meanwhile.

    The cancellation is held until the effect has ended: what a cancelled caller does
    next (release its lease) must come after its write, not beside it, or the release
    can reach the server first (the write's script not yet loaded there, say) and the
    write, finding the lease gone, keep nothing. A second cancellation ends the wait,
    not the effect."""
    task = asyncio.ensure_future(effect)
    _shielded.add(task)
    task.add_done_callback(_shielded.discard)
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        if not task.done():
            await asyncio.wait([task])
        raise


async def finish_started(timeout: float) -> None:
    """Wait, at most ``timeout`` seconds, for this loop's ``shielded`` effects under way.

    A cancelled caller leaves its write or release running; a loop's close must let them
    end before it closes their store, or they are cut mid-command and destroyed pending
    with the loop, their lease left to lapse."""
    loop = asyncio.get_running_loop()
    started = [task for task in list(_shielded) if task.get_loop() is loop and not task.done()]
    if started:
        await asyncio.wait(started, timeout=timeout)


def _outcome_taken(task: asyncio.Future[Any]) -> None:
    """A cancelled load's outcome, taken so that asyncio does not report it unretrieved."""
    if not task.cancelled():
        task.exception()
