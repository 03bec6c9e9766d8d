"""A warm start (``Stampede.warm``, ``awarm``): load the calls loaders' hot sets recorded
(``hot_sample``, ``_core.hotset``) before traffic finds them missing.

Each call goes through its loader as any call does, so the promises are a call's: each
key is loaded once across every process warming (or serving) at the same moment, the
others wait for that load or find its value, and every load holds a slot of its load
budget (``max_concurrent_loads``) if it has one. A key already cached is not called (a
``peek``, no load, no lease).

A many-key loader (``cached_loader_many``) records each id of a sampled call as a call
of that id alone; a warm start gathers its hottest ids into pages of ``max_batch`` ids
(the ids of calls that share every other argument), peeks at each page in one round
trip, and calls the loader once for the ids the cache lacks.

The calls are taken hottest first, in tiers of ``TIER`` x ``concurrency`` shuffled in
each process: processes booting together start on different keys of the hottest tier
rather than all waiting on the same few loads.
"""

from __future__ import annotations

import inspect
import random
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ._core import world
from ._core.hotset import EXPORT_FORMAT, Call, HotSet, decode_call, exported, imported_counts, ranked, scored
from ._core.store import HotSetStore
from ._drivers.observe import Events
from ._errors import ConfigError
from ._loader_many import _ManyLoader

TIER = 4  # a tier of the hot set is this many times concurrency calls


@dataclass
class WarmReport:
    """What a warm start did: ``calls`` entries taken from the hot sets (each id of a
    many-key loader's pages is one), of which ``cached`` were in the cache already (not
    loaded), ``loaded`` loaded (here, or by another process at the same moment),
    ``failed`` raised (the first few errors kept in ``errors``, none raised), in
    ``seconds``."""

    calls: int = 0
    cached: int = 0
    loaded: int = 0
    failed: int = 0
    seconds: float = 0.0
    errors: list[BaseException] = field(default_factory=list, repr=False)  # the first few

    @property
    def done(self) -> int:
        return self.cached + self.loaded + self.failed


@dataclass(frozen=True, slots=True)
class Job:
    """One call a warm start makes: of a one-key loader, one entry; of a many-key
    loader, a page of ``size`` ids (``ManyKeys.pages``)."""

    loader: Any
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    size: int = 1

    def rest(self, peeked: Any) -> tuple[int, Call | None, int]:
        """From what the loader's ``peek`` answered: how many entries are cached, and the
        call that loads the others with how many they are (None, 0: nothing to load)."""
        if not isinstance(self.loader, _ManyLoader):
            return (1, None, 0) if peeked is not None else (0, (self.args, self.kwargs), 1)
        missing = [id_ for id_, found in peeked.items() if found is None]
        if not missing:
            return len(peeked), None, 0
        keys = self.loader._keys
        return len(peeked) - len(missing), keys.with_ids(keys.bind(self.args, self.kwargs), missing), len(missing)


Progress = Callable[[WarmReport], None]
"""Told after each call (from the worker that made it; keep it quick)."""

_KEPT_ERRORS = 10


def hot_calls(store: HotSetStore, hot: HotSet, count: int, moment: float) -> list[Call]:
    """The ``count`` hottest calls of a hot set at ``moment`` (wall clock), hottest first.
    A member that is not a recorded call is left out."""
    current = store.hot_members(hot.key(moment), count)
    last = store.hot_members(hot.key(moment, 1), count)
    calls = []
    for member in ranked(current, last, count):
        try:
            calls.append(decode_call(member))
        except ValueError:
            continue
    return calls


def export_hot_sets(store: HotSetStore, loaders: Sequence[Any], count: int | None) -> dict[str, Any]:
    """``Stampede.export_hot_sets``: each loader's hot set, ranked, as JSON-ready data."""
    if count is not None:
        check(1, count)
    moment = world.wall()
    sets: dict[str, list[list[Any]]] = {}
    for loader in loaders:
        hot = hot_set_of(loader)
        size = hot.limit if count is None else count
        members = scored(store.hot_members(hot.key(moment), size), store.hot_members(hot.key(moment, 1), size), size)
        sets[hot.name] = exported(members)
    return {"stampede_hot_sets": EXPORT_FORMAT, "exported_at": moment, "sets": sets}


def import_hot_sets(store: HotSetStore, loaders: Sequence[Any], snapshot: Any) -> int:
    """``Stampede.import_hot_sets``: the export's set of each loader, into a hot set that
    holds nothing (this period's and the last one's empty). Returns the calls imported."""
    counts = imported_counts(snapshot)
    hot_sets = [hot_set_of(loader) for loader in loaders]
    moment, imported = world.wall(), 0
    for hot in hot_sets:
        found = counts.get(hot.name)
        if not found or store.hot_members(hot.key(moment), 1) or store.hot_members(hot.key(moment, 1), 1):
            continue  # nothing exported, or recorded here already (another process imported it first)
        kept = dict(sorted(found.items(), key=lambda item: (-item[1], item[0]))[: hot.limit])
        store.note_hot(hot.key(moment), kept, hot.limit, hot.ttl_ms)
        imported += len(kept)
    return imported


def tiered(calls: Sequence[Any], tier: int, draw: random.Random) -> list[Any]:
    """``calls`` (hottest first) in tiers of ``tier``, the tiers in order, each shuffled."""
    ordered: list[Any] = []
    for start in range(0, len(calls), tier):
        part = list(calls[start : start + tier])
        draw.shuffle(part)
        ordered += part
    return ordered


def hot_set_of(loader: Any) -> HotSet:
    hot: HotSet | None = getattr(loader, "hot_set", None)
    if hot is None:
        raise ConfigError(f"warm() takes loaders of cached_loader, got {loader!r}")
    return hot


def check_kinds(loaders: Sequence[Any], asynchronous: bool) -> None:
    """Refuse, before anything is read or loaded, a loader of the other kind: ``warm``
    calling an ``async def`` loader would take its unawaited coroutine for a cached
    value (and report every call cached, loading nothing); ``awarm`` would await a
    blocking loader's plain value (and report every call failed)."""
    for loader in loaders:
        hot_set_of(loader)
        if inspect.iscoroutinefunction(loader.peek) != asynchronous:
            kind, method = ("a blocking", "warm()") if asynchronous else ("an async def", "await awarm()")
            called = "awarm()" if asynchronous else "warm()"
            raise ConfigError(f"{called} was given {loader!r}, {kind} loader: warm it with {method}")


def check(concurrency: int, count: int) -> None:
    if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
        raise ConfigError(f"concurrency must be an int of at least 1, got {concurrency!r}")
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise ConfigError(f"count must be an int of at least 1, got {count!r}")


class Tally:
    """The report, counted by every worker."""

    def __init__(self, report: WarmReport, events: Events, progress: Progress | None) -> None:
        self.report = report
        self._events = events
        self._progress = progress
        self._lock = threading.Lock()

    def add(self, cached: int, loaded: int = 0, failed: int = 0, error: BaseException | None = None) -> None:
        """Count what one job did, and tell the progress callback."""
        report = self.report
        with self._lock:
            report.cached += cached
            report.loaded += loaded
            report.failed += failed
            if error is not None and len(report.errors) < _KEPT_ERRORS:
                report.errors.append(error)
            if self._progress is not None:
                self._progress(report)
        for outcome, count in (("cached", cached), ("loaded", loaded), ("failed", failed)):
            if count:
                self._events.incr(f"warm_{outcome}", count)


def jobs(store: HotSetStore, loaders: Sequence[Any], count: int, concurrency: int) -> list[Job]:
    """Each loader's hottest calls, in shuffled tiers; a many-key loader's gathered into
    pages of ``max_batch`` ids first."""
    moment, draw = world.wall(), random.Random(world.random())  # the tiers' order: the layer's chance
    jobs: list[Job] = []
    for loader in loaders:
        calls = hot_calls(store, hot_set_of(loader), count, moment)
        if isinstance(loader, _ManyLoader):
            pages = loader._keys.pages(calls, loader.settings.max_batch)
            jobs += [
                Job(loader, args, kwargs, size) for (args, kwargs), size in tiered(pages, TIER * concurrency, draw)
            ]
        else:
            jobs += [Job(loader, args, kwargs) for args, kwargs in tiered(calls, TIER * concurrency, draw)]
    return jobs
