"""Process-local state after ``fork()``.

A forked child starts with copies of everything its parent's threads were doing: flights
led by threads that do not exist in the child (their joiners would wait a whole
wait_timeout, then each load for itself), locks those threads may have held at the
moment of the fork (held forever in the child), the subscriber's socket and reader
thread, the watchdog's leases. Locust's ``--processes``, gunicorn's ``--preload`` and
multiprocessing's fork start method all fork after a layer may have been used.

Objects with such state register here, and are reset in the child before any of its
own code runs: they start empty, with new locks, as if just made. The parent's
connections are dropped without being closed. They are the parent's.
"""

from __future__ import annotations

import os
import weakref
from typing import Protocol


class ForkAware(Protocol):
    def after_fork_in_child(self) -> None: ...


_registered: weakref.WeakSet[ForkAware] = weakref.WeakSet()


def reset_after_fork(obj: ForkAware) -> None:
    """Call ``obj.after_fork_in_child()`` in every child forked from now on."""
    _registered.add(obj)


def _reset_all() -> None:
    for obj in list(_registered):
        obj.after_fork_in_child()


if hasattr(os, "register_at_fork"):  # POSIX
    os.register_at_fork(after_in_child=_reset_all)
