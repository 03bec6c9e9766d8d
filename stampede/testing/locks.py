"""Histories of named locks (``layer.lock(name)``), checked against what a lock promises.

Each acquisition is recorded as a ``Hold``: who asked, when it asked, when it held the
lock and with which fencing token, when it began to release and how that ended, on one
clock (nanoseconds). ``check_holds`` judges the whole history:

* ``two holders``: one holder's acquisition was complete before another's began, the
  other then held the lock before the first began to release, and the first's release
  succeeded. A release succeeds only while its lease stands (compare-and-delete), so
  both held the lock at once. A holder whose lease ran out (a pause, a lost renewal)
  learns it at release (``LockLost``) and is not counted: that is what fences are for.
* ``fence went back``: an acquisition begun after another was complete got a fencing
  token no greater than that one's. A protected resource that refuses a token lower
  than one it has seen would then take a paused ex-holder's late write.

Neither rule is weakened by a fault: a restart that loses the lease ends its holder's
hold with ``LockLost``, and fences are drawn never lower than the store's clock.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass
class Hold:
    """One acquisition of a named lock (nanoseconds on the history's clock)."""

    holder: str  # who: a process's caller
    asked: int
    acquired: int | None = None  # None: not acquired (timed out, failed, never returned)
    fence: int | None = None
    releasing: int | None = None  # when its release began
    released: int | None = None  # when its release returned
    outcome: str = "never returned"  # "ok", the exception's name, "not acquired"

    @property
    def released_cleanly(self) -> bool:
        """Its release found its lease standing: it held the lock throughout."""
        return self.outcome == "ok" and self.acquired is not None and self.releasing is not None

    def describe(self, start: int) -> str:
        def at(ns: int | None) -> str:
            return "-" if ns is None else f"{(ns - start) / 1e9:.6f}"

        return (
            f"hold by {self.holder}: asked {at(self.asked)} s, acquired {at(self.acquired)} (fence {self.fence}), "
            f"releasing {at(self.releasing)}, released {at(self.released)}: {self.outcome}"
        )


@dataclass(frozen=True)
class LockViolation:
    rule: str
    holds: tuple[Hold, Hold]

    def describe(self, start: int) -> str:
        first, second = self.holds
        return f"{self.rule}:\n    {first.describe(start)}\n    {second.describe(start)}"


def check_holds(holds: Sequence[Hold]) -> list[LockViolation]:
    """Every hold that breaks a rule, with the earlier hold it broke it against (one
    violation per later hold). In order of acquisition, each hold is compared with the
    greatest fence, and the latest clean release, among the holds acquired before it
    asked: O(n log n)."""
    acquired = sorted((hold for hold in holds if hold.acquired is not None), key=lambda hold: hold.acquired or 0)
    times = [hold.acquired or 0 for hold in acquired]
    highest: list[Hold | None] = []  # of acquired[:i + 1], the hold of the greatest fence
    latest: list[Hold | None] = []  # ... and the clean hold that began to release last
    for hold in acquired:
        best, last = (highest[-1], latest[-1]) if highest else (None, None)
        if hold.fence is not None and (best is None or (best.fence or 0) < hold.fence):
            best = hold
        if hold.released_cleanly and (last is None or (last.releasing or 0) < (hold.releasing or 0)):
            last = hold
        highest.append(best)
        latest.append(last)
    violations = []
    for later in acquired:
        before = bisect.bisect_left(times, later.asked)  # acquired before it asked: surely first
        if not before:
            continue
        best, last = highest[before - 1], latest[before - 1]
        if best is not None and later.fence is not None and later.fence <= (best.fence or 0):
            violations.append(LockViolation("fence went back", (best, later)))
        elif last is not None and (later.acquired or 0) < (last.releasing or 0):
            violations.append(LockViolation("two holders", (last, later)))
    return violations


__all__ = ["Hold", "LockViolation", "check_holds"]
