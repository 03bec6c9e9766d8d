"""Consistency measured in production (``verify_sample``): a sampled hit is loaded again
in the background and compared with what was served.

Meta's Polaris measures, in production, the fraction of cache reads that disagree with
the database. This is the same measure for one application: of the hits sampled, how
many served a value the loader no longer returns, while the entry still holds it.

One verification, off the request path (``_drivers``: a worker thread or a task, at most
a few at once, one per key):

* the hit served the entry ``raw`` (its envelope, as read from the store or the near
  cache); the loader is called again with the call's arguments, outside any lease, and
  nothing is written;
* **match**: the fresh value encodes to the payload served (or ``verify_equal``, the
  loader's comparator, says the two decoded values are equal);
* otherwise the entry is read again, at once and, if unchanged, after ``verify_grace``
  (a writer that commits and then invalidates has a moment between the two in which a
  reader may be served the old value without breaking a promise): if it changed
  (invalidated, expired, rewritten), **superseded**, no verdict; if it still holds what
  was served, **mismatch**: the cache serves a value the database no longer has, and
  nothing is on its way to replace it;
* **error**: the loader raised, or its value could not be encoded: no verdict;
* **skipped**: the limit of verifications at once was reached: the hit is not verified.

A loader can tell a verification's call from a real one by ``verifying()`` (to keep it
off a query log, say). The nines are ``-log10(mismatch / (match + mismatch))``.
"""

from __future__ import annotations

import contextvars
import logging
import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Literal

from . import world
from .codec import Codec, loaded_at_of
from .observer import log_extra

if TYPE_CHECKING:
    from .flow import WarningLog
from .results import unwrapped

Result = Literal["match", "mismatch", "superseded", "error", "skipped"]
RESULTS: tuple[Result, ...] = ("match", "mismatch", "superseded", "error", "skipped")
EVENT_OF: dict[Result, str] = {result: f"consistency_{result}" for result in RESULTS}
"""The ``stats()`` counter of each result (exported as one metric with a ``result`` label)."""
RESULT_OF: dict[str, Result] = {event: result for result, event in EVENT_OF.items()}

log = logging.getLogger("stampede.cache")

VERIFICATIONS_AT_ONCE = 4
"""Verifications under way at once per process (per event loop): a sample is a measure,
never a load on the database that grows with traffic."""

_verifying: contextvars.ContextVar[bool] = contextvars.ContextVar("stampede_verifying", default=False)


def verifying() -> bool:
    """Whether the loader is being called by a verification (``verify_sample``), not by a
    caller: its value is compared with a hit's and never written."""
    return _verifying.get()


def mark_verifying() -> contextvars.Token[bool]:
    """Mark this context's loader calls as a verification's (reset with the token)."""
    return _verifying.set(True)


def unmark_verifying(token: contextvars.Token[bool]) -> None:
    _verifying.reset(token)


class Sample:
    """Which hits of one loader are verified: on average one in ``1 / rate``, each hit
    with the same chance. A countdown drawn from the geometric distribution, so that a
    hit not sampled costs one decrement, not a random number. Unlocked: threads racing
    on it may sample a few hits more or fewer, never a hit twice."""

    __slots__ = ("_countdown", "_draw", "_log_miss", "rate")

    def __init__(self, rate: float, draw: Callable[[], float] | None = None) -> None:
        self.rate = rate
        self._log_miss = math.log1p(-rate) if rate < 1 else 0.0
        self._draw = world.random if draw is None else draw
        self._countdown = self._gap()

    def _gap(self) -> int:
        """Hits to pass over before the next one sampled."""
        if not self._log_miss:
            return 0
        return int(math.log(1.0 - self._draw()) / self._log_miss)

    def due(self) -> bool:
        """Whether this hit is verified."""
        self._countdown -= 1
        if self._countdown >= 0:
            return False
        self._countdown = self._gap()
        return True

    def among(self, hits: int) -> int:
        """Which of ``hits`` hits read together is verified (its position), or -1: one at
        most per call."""
        countdown = self._countdown - hits
        if countdown >= 0:
            self._countdown = countdown
            return -1
        position = self._countdown
        self._countdown = self._gap()
        return max(0, position)


def agrees(codec: Codec, served: bytes, loaded: Any, equal: Callable[[Any, Any], bool] | None, key: str) -> bool:
    """Whether the value the loader returned now is the one the envelope ``served`` holds:
    the same encoded payload, or ``equal(served value, loaded value)`` if the loader gave
    a comparator (both decoded, so a tuple and the list it reads back as compare alike).
    Raises ``SerializationError`` if ``loaded`` cannot be encoded."""
    value, _ = unwrapped(loaded)
    fresh = codec.encode(value, 0.0, 0.0, key=key)
    if equal is not None:
        return bool(equal(codec.read_back(served, key=key), codec.read_back(fresh, key=key)))
    return codec.is_null(served) == codec.is_null(fresh) and codec.payload_of(served) == codec.payload_of(fresh)


def unchanged(codec: Codec, served: bytes, now: bytes | None) -> bool:
    """Whether the entry read ``now`` is the one ``served`` was read from: the same load
    (its time) and the same payload. The near cache keeps payloads expanded, the store
    may keep them compressed, so payloads are compared expanded."""
    if now is None or loaded_at_of(now) != loaded_at_of(served):
        return False
    try:
        return codec.payload_of(now) == codec.payload_of(served)
    except ValueError:  # unreadable now: it changed
        return False


def log_mismatch(warn: WarningLog, key: str, template: str, trace_keys: bool) -> None:
    """A mismatch is logged with its loader's template, and the key itself only where
    ``trace_keys`` allows keys out of the process (they may hold user data). Each template
    is rate limited on its own (``warn``): a write path that never invalidates must not
    flood the log, nor hide another template's mismatches."""
    warn.warning(
        "stampede: a verified hit of " + template.replace("%", "%%") + " served a value its loader no longer "
        "returns, and the entry still held it after verify_grace: a write that did not invalidate? (key %s)",
        repr(key) if trace_keys else "not logged: trace_keys is off",
        key=key,
        outcome="consistency_mismatch",
    )


def verification_failed(key: str, template: str, trace_keys: bool, error: Exception) -> None:
    """A verification that could not reach a verdict says why, at debug level: its loader
    fails the callers too, and they hear of it."""
    log.debug(
        "stampede: the verification of a hit of %s (key %s) failed: %s: %s",
        template,
        repr(key) if trace_keys else "not logged",
        type(error).__name__,
        error,
        extra=log_extra(key, "consistency_error"),
    )
