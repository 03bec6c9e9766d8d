"""Taking a named lock, as a decision (sans-IO): when to try, subscribe, wait or poll,
when to give up, and what to undo when interrupted.

Rules:

* Without ``retry_interval`` a waiter subscribes to the lock's channel, tries once more
  (a release between the first try and the subscription is not missed), then waits for
  a release message, at most the holder's remaining lease or ``recheck_interval``. With
  it, the waiter polls every ``retry_interval`` and never subscribes.
* A fair lock (``queue_lease`` > 0) queues its waiters: each try keeps the caller's
  place for ``queue_lease``, so it tries at least every third of that. A caller that
  stops waiting, for any reason, gives its place up.
* Interrupted while a try may have run (a cancelled task, KeyboardInterrupt: anything
  but an Exception thrown in at ``TakeLock``), the lock may be ours: it is released by
  token, safe either way, so other waiters need not wait out a lease nobody renews.
  Cleanup is best effort: a store that fails it lets the lease or the place lapse.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from .._errors import BackendUnavailable
from .effects import (
    LEASE_MARGIN,
    AwaitNotice,
    Decision,
    LeaveQueue,
    Pause,
    Release,
    Subscribe,
    TakeLock,
)
from .store import AcquireReply, LockState

Acquiring = Decision[int | None]


def acquiring(
    blocking: bool,
    timeout: float | None,
    retry_interval: float | None,
    retries: int | None,
    recheck_interval: float,
    clock: Callable[[], float] = time.monotonic,
    queue_lease: float = 0.0,
) -> Acquiring:
    """Take the lock: once if not ``blocking``. Else until taken, ``timeout`` has passed,
    or ``retries`` more tries have failed. Returns the fencing token, or None."""
    deadline = None if timeout is None else clock() + timeout
    subscribed = False
    tries_left = retries
    while True:
        try:
            reply: AcquireReply = yield TakeLock()
        except GeneratorExit:
            raise
        except BaseException as error:
            yield from _give_up(queued=bool(queue_lease), possibly_held=not isinstance(error, Exception))
            raise
        if reply.state is LockState.LOCKED:
            return reply.fence
        remaining = None if deadline is None else deadline - clock()
        if not blocking or (remaining is not None and remaining <= 0) or tries_left == 0:
            yield from _give_up(queued=bool(queue_lease), possibly_held=False)
            return None
        if retry_interval is None and not subscribed:
            next_effect: Subscribe | Pause | AwaitNotice = Subscribe()
            subscribed = True
        else:
            if tries_left is not None:
                tries_left -= 1
            if retry_interval is not None:
                next_effect = Pause(retry_interval if remaining is None else min(retry_interval, remaining))
            else:
                wait = recheck_interval if not queue_lease else min(recheck_interval, queue_lease / 3)
                if reply.lease_left > 0:
                    wait = min(wait, reply.lease_left + LEASE_MARGIN)
                next_effect = AwaitNotice(wait if remaining is None else min(wait, remaining))
        try:
            yield next_effect
        except GeneratorExit:
            raise
        except BaseException:
            yield from _give_up(queued=bool(queue_lease), possibly_held=False)
            raise


def _give_up(queued: bool, possibly_held: bool) -> Decision[None]:
    """Stop trying: release what a cut-short try may have taken, leave the queue."""
    if possibly_held:
        try:
            yield Release()
        except BackendUnavailable:
            pass
    if queued:
        try:
            yield LeaveQueue()
        except BackendUnavailable:
            pass
