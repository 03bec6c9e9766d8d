"""Hot sets (``hot_sample``): which calls of a loader are made most, kept in the store so
that a fleet starting cold can load them first (``Stampede.warm``). Sans-IO.

A call is recorded with probability ``hot_sample``: a countdown drawn from a geometric
law, so that a call not recorded costs one decrement. Recorded calls are counted in the
process and added to the store in batches (``_drivers.hotset``), a member per call (its
arguments as JSON, enough to call the loader again) with its count as score.

Bounded and decaying: the store keeps one sorted set per loader and period
(``hot_period`` seconds), at most ``hot_limit`` members each (the least counted dropped),
each set living two periods. The hot set is the current period's counts plus half the
last one's: a key hot yesterday and not since has fallen out by today.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import orjson

from .._errors import ConfigError
from . import world
from .keys import escape, shorten


@dataclass(frozen=True, slots=True)
class HotSet:
    """Where one loader's hot set lives, and how it is kept."""

    base: str  # the sets' key, less the period
    limit: int
    period: float
    name: str = ""  # the base less the namespace: the same in every namespace (an export's key)

    @classmethod
    def of(
        cls, namespace: str, template: str, limit: int, period: float, max_key_length: int, many: bool = False
    ) -> HotSet:
        """The hot set of the loader with key template ``template``: one per template, not
        per version (``version=``), so a new version warms from the old one's calls. A
        many-key loader's is its own (``many``): its calls take a list of ids where a
        one-key loader's take an id. The entry starts with ``~hot:`` or ``~hot-many:``,
        which no template or argument can produce."""
        kind = "~hot-many:" if many else "~hot:"
        name = shorten(kind + escape(template), max_key_length)
        return cls(f"{namespace}:{{{name}}}", limit, period, name)

    def key(self, moment: float, back: int = 0) -> str:
        """The set of the period ``moment`` (wall-clock seconds) falls in, or of the one
        ``back`` periods before."""
        return f"{self.base}:{int(moment // self.period) - back}"

    @property
    def ttl_ms(self) -> int:
        """How long a period's set lives: through the next period, where it counts half."""
        return int(self.period * 2000) + 1000


Call = tuple[tuple[Any, ...], dict[str, Any]]  # a loader's arguments: positional, keyword


def encode_call(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bytes | None:
    """A call's arguments as a member of the hot set, or None if they are not plain JSON
    (a bound method's ``self``, an object): such a call is not recorded."""
    try:
        return orjson.dumps([list(args), kwargs], option=orjson.OPT_SORT_KEYS)
    except TypeError:
        return None


def decode_call(member: bytes) -> Call:
    """The arguments ``encode_call`` recorded. ``ValueError`` for bytes it did not make."""
    try:
        args, kwargs = orjson.loads(member)
    except (orjson.JSONDecodeError, ValueError, TypeError):
        raise ValueError(f"not a recorded call: {member[:60]!r}") from None
    if not isinstance(args, list) or not isinstance(kwargs, dict):
        raise ValueError(f"not a recorded call: {member[:60]!r}")
    return tuple(args), kwargs


def ranked(current: Iterable[tuple[bytes, float]], last: Iterable[tuple[bytes, float]], count: int) -> list[bytes]:
    """The ``count`` hottest members: the current period's count plus half the last
    one's, highest first (ties by member, so every process ranks alike)."""
    return [member for member, _ in scored(current, last, count)]


def scored(
    current: Iterable[tuple[bytes, float]], last: Iterable[tuple[bytes, float]], count: int
) -> list[tuple[bytes, float]]:
    """``ranked``, each member with its score."""
    scores: dict[bytes, float] = {}
    for member, score in last:
        scores[member] = score / 2
    for member, score in current:
        scores[member] = scores.get(member, 0.0) + score
    return sorted(scores.items(), key=lambda item: (-item[1], item[0]))[:count]


EXPORT_FORMAT = 1  # ``Stampede.export_hot_sets``'s, checked by ``imported_counts``


def exported(members: list[tuple[bytes, float]]) -> list[list[Any]]:
    """A hot set's ranked members as an export's JSON: ``[call, score]`` pairs, each call
    the JSON ``encode_call`` made, as text."""
    return [[member.decode(), score] for member, score in members]


def imported_counts(snapshot: Any) -> dict[str, dict[bytes, int]]:
    """An export's sets, each name to its members' counts (a score rounded up, at least
    one), ready for ``note_hot``. ``ValueError`` naming what is wrong for anything that
    is not an export of this format, before anything is written."""
    if not isinstance(snapshot, dict) or snapshot.get("stampede_hot_sets") != EXPORT_FORMAT:
        raise ValueError(f"not an export of stampede hot sets (format {EXPORT_FORMAT}): {str(snapshot)[:80]!r}")
    sets = snapshot.get("sets")
    if not isinstance(sets, dict):
        raise ValueError("an export of hot sets without its sets")
    counts: dict[str, dict[bytes, int]] = {}
    for name, members in sets.items():
        if not isinstance(name, str) or not isinstance(members, list):
            raise ValueError(f"hot set {name!r} of the export is not a list of [call, score]")
        found = counts[name] = {}
        for pair in members:
            if not (isinstance(pair, list) and len(pair) == 2 and isinstance(pair[0], str)):
                raise ValueError(f"hot set {name!r} of the export has {str(pair)[:80]!r}, not [call, score]")
            call, score = pair[0].encode(), pair[1]
            if isinstance(score, bool) or not isinstance(score, (int, float)) or not math.isfinite(score):
                raise ValueError(f"hot set {name!r} of the export scores {pair[0][:60]!r} {score!r}")
            decode_call(call)  # ValueError for anything encode_call did not make
            found[call] = max(1, math.ceil(score))
    return counts


class Countdown:
    """Which calls a sample of ``rate`` records: the calls between two recorded ones are
    drawn from a geometric law of mean ``1 / rate``, so each call is recorded with
    probability ``rate`` and a call not recorded costs one decrement."""

    __slots__ = ("_log", "_random", "left")

    def __init__(self, rate: float, draw: random.Random | None = None) -> None:
        if not 0 < rate <= 1:
            raise ConfigError(f"hot_sample must be a fraction above 0 and at most 1, got {rate!r}")
        self._log = math.log1p(-rate) if rate < 1 else 0.0
        self._random = draw or random.Random(world.random())
        self.left = self.next()

    def next(self) -> int:
        """The calls to let pass before the next one recorded."""
        if not self._log:
            return 0
        return int(math.log(1.0 - self._random.random()) / self._log)
