"""What the layer reads of time and chance, in one place: its monotonic clock, its wall
clock, its random numbers and the tokens of its leases and slots.

Every module of the asyncio side reads them here, at the moment it needs them
(``world.monotonic()``, never a ``time.monotonic`` bound at import), so that the
simulator (``stampede.testing.simulation``) can run the package's own code on virtual
time and on one seeded source of chance: a run is then a function of its seed. Outside
a simulation these are the standard library's functions themselves; reading one costs
what ``time.monotonic()`` costs (a module attribute and a call).

The blocking side's threads wait on ``threading`` primitives, which count real seconds:
the clocks they compare with those waits stay ``time.monotonic`` (the watchdog's and the
refresher's threads, a blocking joiner's event). Only an event loop's time can be
simulated, and the asyncio side reads it (``loop.time()``) wherever it schedules.
"""

from __future__ import annotations

import random as _random
import secrets
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

monotonic: Callable[[], float] = time.monotonic
"""Seconds, for deadlines and durations within one process."""
wall: Callable[[], float] = time.time
"""Seconds since the epoch, for what other processes read (an envelope's ``loaded_at``)."""
random: Callable[[], float] = _random.random
"""A float in [0, 1): early refreshes, sampled verifications."""
uniform: Callable[[float, float], float] = _random.uniform
"""A float between two bounds: TTL jitter, retry pauses."""


def _token(nbytes: int = 16) -> str:
    return secrets.token_hex(nbytes)


token: Callable[[int], str] = _token
"""``nbytes`` random bytes, in hex: a lease's, a slot's or a named lock's token."""


@contextmanager
def installed(
    *,
    monotonic: Callable[[], float],
    wall: Callable[[], float],
    random: Callable[[], float],
    uniform: Callable[[float, float], float],
    token: Callable[[int], str],
) -> Iterator[None]:
    """Make these the layer's clocks and chance for the ``with`` block, in this process
    (every thread of it: run nothing else in the process meanwhile), and put the real
    ones back after it."""
    names = ("monotonic", "wall", "random", "uniform", "token")
    kept = {name: globals()[name] for name in names}
    globals().update(monotonic=monotonic, wall=wall, random=random, uniform=uniform, token=token)
    try:
        yield
    finally:
        globals().update(kept)
