"""The embedded store's tags (see ``_core.tags``): the clock, each tag's generation and
members, in this process's memory. Its caller holds the store's lock, so an admission
and the write it admits are one step, as in one Redis script."""

from __future__ import annotations

from collections.abc import Callable

from ..._core.tags import GENERATION_KEEP_MS, MEMBER_MARGIN_MS, Tagged, TagKeys


class Tags:
    def __init__(self, wall_us: Callable[[], int]) -> None:
        self._wall_us = wall_us  # the store's wall clock, in microseconds
        self._clocks: dict[str, int] = {}  # clock key -> the last value drawn
        self._generations: dict[str, tuple[int, float]] = {}  # generation key -> (value, kept until)
        self._members: dict[str, dict[str, float]] = {}  # members key -> {value key: may live until}

    def clock(self, key: str) -> int:
        """The clock a tagged load reads before it begins (never drawn: the time in µs,
        kept as the last value, so that a draw in the same microsecond still exceeds it)."""
        value = self._clocks.get(key)
        if value is None:
            value = self._clocks[key] = self._wall_us()
        return value

    def admit(self, tagged: Tagged, value_key: str, now: float, expires_at: float) -> bool:
        """Whether every tag admits the write (none was invalidated after the load
        began); if so the entry joins each tag's members."""
        for tag in tagged.tags.tags:
            generation = self._generations.get(tag.generation)
            if generation is not None and generation[1] > now and generation[0] > tagged.since:
                return False
        until = expires_at + MEMBER_MARGIN_MS / 1000
        for tag in tagged.tags.tags:
            members = self._members.setdefault(tag.members, {})
            self._prune(members, now)
            members[value_key] = until
        return True

    def mark(self, clock: str, tag: TagKeys, now: float, forget: bool) -> list[str]:
        """Draw the clock, set the tag's generation, and return its live members (gone
        from the tag if ``forget``)."""
        drawn = self._clocks[clock] = max(self._clocks.get(clock, 0) + 1, self._wall_us())
        self._generations = {key: kept for key, kept in self._generations.items() if kept[1] > now}
        self._generations[tag.generation] = (drawn, now + GENERATION_KEEP_MS / 1000)
        members = self._members.get(tag.members, {})
        self._prune(members, now)
        live = list(members)
        if forget or not members:
            self._members.pop(tag.members, None)
        return live

    @staticmethod
    def _prune(members: dict[str, float], now: float) -> None:
        for value_key in [key for key, until in members.items() if until <= now]:
            del members[value_key]
