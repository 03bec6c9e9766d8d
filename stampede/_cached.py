# Generated from _acached.py by .ci/unasync.py: do not edit.
# Edit the asyncio source, then run `python .ci/unasync.py`.
"""The loaders applications call: what ``@cached_loader`` and ``@cached_loader_many``
turn a function into. What they share with their twins is in ``_loader`` and
``_loader_many``; the calls themselves are the runner's (``_drivers``)."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from ._core.keys import EntryKeys, KeyBuilder
from ._core.many import values_of
from ._core.results import Cached
from ._core.versions import entry_tag_of, versions_seen
from ._drivers.refresh import reporting
from ._drivers.tracing import Tracing
from ._loader import BoundLoader, Fetched, P, R, Versions, _Loader
from ._loader_many import K, ManyKeys, V, _ManyLoader, chunks

if TYPE_CHECKING:
    from ._core.flow import LoaderSpec
    from ._drivers.runner import Runner


class CachedLoader(_Loader[P, R]):
    """A loader whose calls read the cache first and collapse concurrent misses (threads,
    tasks, processes) into one load.

    Call it as the function it wraps. ``invalidate(...)`` takes the same arguments and
    drops that entry. A load already in flight for it is not written afterwards. A
    cancelled task cancels only its own wait, and a cancelled load hands over to another
    caller.
    """

    _bound = BoundLoader

    def __init__(
        self,
        spec: LoaderSpec,
        runner: Runner,
        keys: KeyBuilder,
        forget: Callable[[str], None],
        static: bool = False,
        versions: Versions | None = None,
    ) -> None:
        if versions is not None and versions.family is not None:  # its loads mark the entry without version=
            spec = dataclasses.replace(spec, func=_marking(spec.func, versions, runner))
        super().__init__(spec, keys, forget, static)
        self._versions = versions  # the loader's reach to every version of an entry
        self._runner = runner
        self._tracing: Tracing = runner.tracing

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        hot = self._hot
        if hot is not None:  # one call in 1 / hot_sample is recorded (``_drivers.hotset``)
            hot.countdown.left -= 1
            if hot.countdown.left < 0:
                hot.record(((args, kwargs),))
        value_key = self._keys.value_key(args, kwargs)
        # Nothing traced: an attribute read, and a countdown while it may ask (``Tracing``).
        tracing = self._tracing
        traces = tracing.tracer
        if traces is None and tracing.asking:
            tracing.countdown -= 1
            if tracing.countdown < 0:
                traces = tracing.ask()
        if traces is None:
            return self._runner.call(value_key, self._spec, args, kwargs)  # type: ignore[no-any-return]
        with self._trace(traces, self._runner.events, value_key):
            return self._runner.call(value_key, self._spec, args, kwargs)  # type: ignore[no-any-return]

    def fetch(self, *args: P.args, **kwargs: P.kwargs) -> Fetched[R]:
        """Call the loader as ``loader(...)`` does, and also tell whether the value is stale."""
        with reporting() as report:
            value = self(*args, **kwargs)
        return Fetched(value, report.stale)

    def invalidate(self, *args: P.args, **kwargs: P.kwargs) -> None:
        """Drop the entry of these arguments, and keep any load in flight from writing it.
        Once it returns, no caller in any process gets the old value, stale or not.

        Raises BackendUnavailable if Redis cannot be reached, whatever ``on_backend_error``
        says: an invalidation must not fail silently.
        """
        keys = self._keys.keys(args, kwargs)
        try:
            with versions_seen() as seen:
                self._runner.invalidate(keys)
            self._reach_versions(args, kwargs, False, seen)
        finally:
            self._forget(keys.value)

    def expire(self, *args: P.args, **kwargs: P.kwargs) -> None:
        """The soft ``invalidate``: the entry of these arguments is no longer fresh, and a
        load in flight does not write it. The next caller refreshes it, but the old value
        may still be served stale (``stale_while_revalidate``, ``stale_if_error``) for the
        stale window it was written with. Without one, the same as ``invalidate``."""
        keys = self._keys.keys(args, kwargs)
        try:
            with versions_seen() as seen:
                self._runner.expire(keys)
            self._reach_versions(args, kwargs, True, seen)
        finally:
            self._forget(keys.value)

    def set(self, value: R | Cached[R], *args: P.args, **kwargs: P.kwargs) -> bool:
        """Write ``value`` as the entry of these arguments (after a database write), as a
        load would have written it: a ``Cached`` sets its own ttl and tags. A load of the
        entry in flight, in any process, is not written afterwards, and its waiters get
        this value. Returns True, or False if the write was refused: a tag invalidation
        came first, or (with lock servers, whose seizure and write are two steps) a load
        that began after this call, and so read the database after it, took the entry
        between them. Untagged on one Redis server, Sentinel or a Cluster, one script
        does both, and a set is always written.

        A value the serializer refuses raises ``SerializationError`` with nothing
        written. Raises BackendUnavailable if the store cannot be reached, whatever
        ``on_backend_error`` says: the old value may be gone, the new one not written.
        """
        value_key = self._keys.value_key(args, kwargs)
        versions = self._versions
        try:
            if versions is not None and versions.family is not None:  # the other versions' entries go first
                unversioned = versions.family.unversioned(args, kwargs)
                self._runner.mark_versioned([unversioned], versions.marker_ms)  # as a load marks it
                self._reach_versions(args, kwargs, False, [])
            with versions_seen() as seen:
                written: bool = self._runner.set(value_key, self._spec, args, kwargs, value)
            if versions is not None and versions.family is None:  # a loader without version=: what marked it
                self._reach_versions(args, kwargs, False, seen)
            return written
        finally:
            self._forget(value_key)

    def _reach_versions(self, args: tuple[Any, ...], kwargs: dict[str, Any], soft: bool, seen: list[str]) -> None:
        """Every other version of the entry (``_core.versions``). A loader without
        ``version=``: every versioned one, through the entry tag they carry, if its store
        found the entry marked (``seen``). A versioned loader (``seen`` is left alone): the
        entry of the loader without ``version=``, then every versioned one. Expired rather
        than dropped when ``soft``."""
        versions = self._versions
        if versions is None:
            return
        if versions.family is None:
            for value_key in seen:
                versions.drop(entry_tag_of(value_key, versions.namespace), soft)
            return
        other = versions.family.unversioned(args, kwargs)
        try:
            if soft:
                self._runner.expire(other)
            else:
                self._runner.invalidate(other)
        finally:
            self._forget(other.value)
        versions.drop(versions.family.tag(args, kwargs), soft)

    def refresh(self, *args: P.args, **kwargs: P.kwargs) -> R:
        """Load the entry of these arguments now, and return the new value. Callers
        meanwhile get the current value. Refreshes and misses of the entry at the same
        moment, in any process, share this one load."""
        value_key = self._keys.value_key(args, kwargs)
        try:
            return self._runner.refresh(value_key, self._spec, args, kwargs)  # type: ignore[no-any-return]
        finally:
            self._forget(value_key)

    def peek(self, *args: P.args, **kwargs: P.kwargs) -> Fetched[R] | None:
        """What a call would be served from the cache now, with no load and no lease:
        ``Fetched(value, stale)``, or None if nothing is cached (a cached None is
        ``Fetched(None, False)``). Raises BackendUnavailable if the store cannot answer."""
        found = self._runner.peek(self._keys.value_key(args, kwargs), self._spec)
        return None if found is None else Fetched(*found)


class CachedManyLoader(_ManyLoader[K, V]):
    """A loader of many ids whose calls read every entry in one round trip and load the
    missing ones in one call, each entry loaded once across every caller and process.

    Call it as the function it wraps: a dict of each id asked to its value, in the order
    asked (an id the loader left out is None). ``invalidate(...)`` and ``expire(...)``
    take the same arguments, with a collection of ids or one id.
    """

    _bound = BoundLoader

    def __init__(
        self,
        spec: LoaderSpec,
        runner: Runner,
        keys: ManyKeys,
        forget: Callable[[str], None],
        static: bool = False,
        drop_versions: Callable[[str, bool], int] | None = None,
        marker_ms: int = 0,
    ) -> None:
        super().__init__(spec, keys, forget, static)
        self._runner = runner
        self._drop_versions = drop_versions  # the reach to every version of an entry (``_core.versions``)
        self._marker_ms = marker_ms  # a versioned loader's: how long the marks its loads leave last
        self._tracing: Tracing = runner.tracing

    def __call__(self, *args: Any, **kwargs: Any) -> dict[K, V]:
        call, ids, keys = self._asked(args, kwargs)
        hot = self._hot
        if hot is not None:  # one call in 1 / hot_sample records each of its ids (``_drivers.hotset``)
            hot.countdown.left -= 1
            if hot.countdown.left < 0:
                hot.record(self._keys.one_id_calls(call, ids))
        tracing = self._tracing  # as CachedLoader's
        traces = tracing.tracer
        if traces is None and tracing.asking:
            tracing.countdown -= 1
            if tracing.countdown < 0:
                traces = tracing.ask()
        if traces is None:
            return self._call(call, ids, keys)
        with self._trace(traces, self._runner.events, keys):
            return self._call(call, ids, keys)

    def _call(self, call: dict[str, Any], ids: list[Any], keys: list[str]) -> dict[K, V]:
        size = self.settings.max_batch
        if len(ids) <= size:
            values = self._runner.call_many(keys, self._spec_of(call, ids), self._loading(call, ids))
            return dict(zip(ids, values, strict=True))
        found: dict[K, V] = {}
        for part, part_keys in zip(chunks(ids, size), chunks(keys, size), strict=True):
            values = self._runner.call_many(part_keys, self._spec_of(call, part), self._loading(call, part))
            found.update(zip(part, values, strict=True))
        return found

    def peek(self, *args: Any, **kwargs: Any) -> dict[K, Fetched[V] | None]:
        """What a call would be served from the cache now, with no load and no lease: each
        id asked to ``Fetched(value, stale)``, or to None if nothing is cached for it (as
        ``CachedLoader.peek``). Raises BackendUnavailable if the store cannot answer."""
        _, ids, keys = self._asked(args, kwargs)
        found = self._runner.peek_many(keys, self._spec)
        return {id_: None if one is None else Fetched(*one) for id_, one in zip(ids, found, strict=True)}

    def _loading(self, call: dict[str, Any], ids: Sequence[Any]) -> Callable[[list[int]], list[Any]]:
        func, keys, runner, marker_ms = self._spec.func, self._keys, self._runner, self._marker_ms

        def load(positions: list[int]) -> list[Any]:
            asked = [ids[position] for position in positions]
            args, kwargs = keys.with_ids(call, asked)
            if marker_ms:  # before the database is read: the entries without version= are marked
                unversioned = keys.family_of(call, asked)[1]
                runner.mark_versioned([EntryKeys.for_value(key) for key in unversioned], marker_ms)
            return values_of(func(*args, **kwargs), asked, keys.loader_name)

        return load

    def invalidate(self, *args: Any, **kwargs: Any) -> None:
        """Drop the entries of these ids (a collection, or one id), as
        ``CachedLoader.invalidate`` drops one: once it returns, no caller in any process
        gets their old values, and no load in flight writes them."""
        self._drop(args, kwargs, False)

    def expire(self, *args: Any, **kwargs: Any) -> None:
        """``CachedLoader.expire`` of each of these ids' entries."""
        self._drop(args, kwargs, True)

    def _drop(self, args: tuple[Any, ...], kwargs: dict[str, Any], soft: bool) -> None:
        """``invalidate`` (``soft``: ``expire``) each of these ids' entries, then every
        version of each (``_core.versions``)."""
        keys, entries = self._invalidated(args, kwargs)
        step = self._runner.expire if soft else self._runner.invalidate
        with versions_seen() as seen:
            for key in keys:
                try:
                    step(EntryKeys.for_value(key))
                finally:
                    self._forget(key)
        for entry in self._reached(entries, seen):
            assert self._drop_versions is not None
            self._drop_versions(entry, soft)


def _marking(func: Callable[..., Any], versions: Versions, runner: Runner) -> Callable[..., Any]:
    """``func``, a versioned loader's, which first marks the entry of the loader without
    ``version=`` (``_core.versions``): before it reads the database."""
    family, marker_ms = versions.family, versions.marker_ms
    assert family is not None

    def marked(*args: Any, **kwargs: Any) -> Any:
        runner.mark_versioned([family.unversioned(args, kwargs)], marker_ms)
        return func(*args, **kwargs)

    return functools.wraps(func)(marked)
