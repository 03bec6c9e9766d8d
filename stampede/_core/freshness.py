"""Freshness: what a hit may serve once its value's ttl has passed (sans-IO).

Three settings, named after RFC 5861's Cache-Control extensions, all off by default:

* ``stale_while_revalidate``: for this long past ttl a hit returns the old value at once
  and one background refresh runs for the key, across processes (it takes the lease, as
  a load does).
* ``stale_if_error``: for this long past ttl, a caller whose load fails gets the old
  value instead of the error. The failed holder keeps the lease for
  ``stale_retry_interval`` (a hold, ``Store.hold``), so the loader is retried about once
  per interval per key, however many callers and processes there are. And it marks the
  entry failing until a load succeeds, so that meanwhile callers are served the old value
  at once and the retries run in the background, as under ``stale_while_revalidate``.
* ``early_refresh`` (XFetch, Vattani et al., VLDB 2015): a hit on a fresh value refreshes
  it in the background when ``delta * beta * -ln(random()) >= fresh_left``, ``delta`` being
  the last load's duration (in the envelope), so a hot key is reloaded shortly before it
  expires and no caller finds it missing.

Which clock decides: the store's, alone. A value is written to live ``ttl + stale_for``
(``stale_for``: the longer stale window, kept in its envelope), and it is fresh while the
store's remaining TTL, read with the value in one step, is more than ``stale_for``. No
machine's clock is compared with another's, so a client whose clock is minutes off
serves and refreshes on time.

One key's life (ttl 60, stale_while_revalidate 10, stale_if_error 300)::

    0 ........ 60 ........ 70 ........................ 360
    | fresh    | stale,    | stale only if the         | gone: a miss
    |          | served,   | load fails (callers       |
    |          | refreshed | wait for a healthy load)  |

A value found past both windows (written under longer windows than the reader's) is a
miss: the lease is taken over it and it is never served.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .codec import Codec, Kind, identity
from .config import Settings


@dataclass(frozen=True, slots=True)
class Served:
    """A value a hit returns at once. ``refresh``: the identity of the value to refresh in
    the background (None: no refresh). ``early``: that refresh is XFetch's, before ttl."""

    value: Any
    stale: bool = False
    refresh: bytes | None = None
    early: bool = False
    on_error: bool = False  # stale, past stale_while_revalidate: served because the loader fails
    life_left: float = field(default=-1.0, compare=False)  # with a refresh: the seconds the store keeps it (-1: no TTL)
    raw: bytes | None = field(default=None, compare=False)  # with a refresh: the envelope, which its load may keep


@dataclass(frozen=True, slots=True)
class Stale:
    """A value past its ttl that a hit may not return at once. The miss path takes the
    lease over it (``identity``), and returns it if the load fails (``on_error``: within
    ``stale_if_error``)."""

    value: Any
    identity: bytes
    on_error: bool
    raw: bytes | None = field(default=None, compare=False)  # the envelope, which the load may keep


def classify(
    raw: bytes,
    ttl_left: float,
    codec: Codec,
    settings: Settings,
    random: Callable[[], float],
    failing: bool = False,
) -> Served | Stale | None:
    """What a value read with its remaining TTL (seconds, -1: none) may be used for. None
    if ``raw`` is not readable (the caller counts it and treats it as corrupt). ``failing``:
    the entry's last load failed (the store's failing marker), so within
    ``stale_if_error`` the stale value is served at once and refreshed in the background,
    rather than a caller waiting for a load that is likely to fail."""
    decoded = codec.decode(raw)
    if decoded.kind is Kind.CORRUPT:
        return None
    fresh_left = math.inf if ttl_left < 0 else ttl_left - decoded.stale_for
    if fresh_left > 0:
        beta = settings.early_refresh
        if beta and decoded.load_duration * beta * -math.log(1.0 - random()) >= fresh_left:
            return Served(decoded.value, refresh=identity(raw), early=True, life_left=ttl_left, raw=raw)
        return Served(decoded.value)
    past_ttl = -fresh_left
    if past_ttl < settings.stale_while_revalidate:
        return Served(decoded.value, stale=True, refresh=identity(raw), life_left=ttl_left, raw=raw)
    on_error = past_ttl < settings.stale_if_error
    if on_error and failing:
        return Served(decoded.value, stale=True, refresh=identity(raw), on_error=True, life_left=ttl_left, raw=raw)
    return Stale(decoded.value, identity(raw), on_error=on_error, raw=raw)
