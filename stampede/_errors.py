"""The errors stampede raises: one base class, each error naming the cache key it concerns.

Each subclass also derives from the built-in exception a caller would already catch
(TimeoutError, ValueError, ConnectionError), so code written against the standard
taxonomy keeps working.
"""

from __future__ import annotations


class StampedeError(Exception):
    """Base of every error stampede raises. ``key`` is the cache key concerned, if any."""

    def __init__(self, message: str, *, key: str | None = None) -> None:
        super().__init__(message)
        self.key = key


class ConfigError(StampedeError, ValueError):
    """A setting, template or namespace is invalid. Raised when it is given, not at call time."""


class InvalidKey(StampedeError, ValueError):
    """A cache key cannot be built from the arguments of a call."""


class SerializationError(StampedeError, ValueError):
    """A loaded value cannot be encoded. Nothing was written and the lock was released."""


class ValueTooLarge(SerializationError):
    """A loaded value encodes to more than ``max_value_bytes``. Nothing was written and the
    lock was released. The limit keeps one oversized value from filling the server's
    memory or stalling its single thread, and every reader's connection, on each read."""


class WaitTimeout(StampedeError, TimeoutError):
    """A caller waited ``wait_timeout`` for another caller's load and policy is "raise"."""


class BudgetTimeout(WaitTimeout):
    """A load waited ``wait_timeout`` for a slot of its load budget
    (``max_concurrent_loads``) and did not run: loading anyway would break the budget, so
    the caller (and every caller sharing the load) gets this error, or a stale value under
    ``stale_if_error``. ``budget`` names the budget."""

    def __init__(self, budget: str, waited: float) -> None:
        super().__init__(f"no slot of load budget {budget!r} came free within {waited:g} s (wait_timeout)")
        self.budget = budget


class LoadTimeout(StampedeError, TimeoutError):
    """The load a caller waited for (its own or another's) ran past ``load_timeout``. A
    blocking load, or an async one with ``cancel_on_timeout=False``, goes on, keeps its
    lease and writes its value when it ends: nobody starts a second load meanwhile."""


class StreamInterrupted(StampedeError, RuntimeError):
    """The streamed load a caller was receiving stopped before its end: its leader raised,
    was cancelled, or lost its lease (its process died). ``received``: the chunks this
    caller had been given. Nothing of that run was kept: a later call starts a new one."""

    def __init__(self, message: str, *, key: str | None = None, received: int = 0) -> None:
        super().__init__(message, key=key)
        self.received = received


class RecursiveLoad(StampedeError, RuntimeError):
    """A loader called itself for the same key (directly, or through other loaders, in the
    same thread or task): it would wait for its own load. Raised at once."""


class LockNotOwned(StampedeError, RuntimeError):
    """A named lock was released or extended by a caller that does not hold it."""


class LockLost(LockNotOwned):
    """A named lock's lease ran out, or was taken, while its holder still thought it held
    it: the work done under it may have overlapped another holder's. Raised when the
    holder releases or extends it (leaving a ``with`` block, too)."""


class BackendUnavailable(StampedeError, ConnectionError):
    """Redis did not answer, or answered with an error, and policy is "raise".

    Also raised by ``invalidate()`` whatever the policy: an invalidation that silently
    failed would leave stale data behind. ``timed_out``: the server did not answer in
    time (stalled, or the network), so another command now would most likely wait as long.
    """

    def __init__(self, message: str, *, key: str | None = None, timed_out: bool = False) -> None:
        super().__init__(message, key=key)
        self.timed_out = timed_out
