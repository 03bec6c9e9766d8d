"""``CachedLoader`` and ``AsyncCachedLoader``: what ``@cached_loader`` turns a function into."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, ParamSpec, TypeVar, overload

from ._core.keys import KeyBuilder
from ._core.results import Cached
from ._drivers.observe import Events
from ._drivers.refresh import reporting
from ._drivers.trace import GLOBALS, CallTrace, call_trace, entry_attributes, tracer

if TYPE_CHECKING:
    from ._core.flow import LoaderSpec
    from ._drivers.aio import AsyncRunner
    from ._drivers.blocking import Runner

P = ParamSpec("P")
R = TypeVar("R")
Self_ = TypeVar("Self_", bound="_Loader[Any, Any]")


@dataclass(frozen=True)
class Fetched(Generic[R]):
    """What ``fetch()`` returns: the value a call would return, and whether it was stale
    (past its ttl: served while it is refreshed, or instead of the loader's error)."""

    value: R
    stale: bool


class BoundLoader:
    """A blocking cached loader bound to an instance, as ``obj.method`` is: calls,
    ``invalidate`` and ``key`` take the arguments after ``self``."""

    __slots__ = ("_instance", "_loader")

    def __init__(self, loader: _Loader[Any, Any], instance: object) -> None:
        self._loader = loader
        self._instance = instance

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._loader(self._instance, *args, **kwargs)  # type: ignore[operator]

    def invalidate(self, *args: Any, **kwargs: Any) -> Any:  # Any: the async subclass returns a coroutine
        """The loader's ``invalidate``."""
        return self._loader.invalidate(self._instance, *args, **kwargs)  # type: ignore[attr-defined]

    def expire(self, *args: Any, **kwargs: Any) -> Any:  # Any: the async subclass returns a coroutine
        """The loader's ``expire``."""
        return self._loader.expire(self._instance, *args, **kwargs)  # type: ignore[attr-defined]

    def fetch(self, *args: Any, **kwargs: Any) -> Any:
        """The loader's ``fetch``."""
        return self._loader.fetch(self._instance, *args, **kwargs)  # type: ignore[attr-defined]

    def set(self, value: Any, *args: Any, **kwargs: Any) -> Any:  # Any: the async subclass returns a coroutine
        """The loader's ``set``."""
        return self._loader.set(value, self._instance, *args, **kwargs)  # type: ignore[attr-defined]

    def refresh(self, *args: Any, **kwargs: Any) -> Any:
        """The loader's ``refresh``."""
        return self._loader.refresh(self._instance, *args, **kwargs)  # type: ignore[attr-defined]

    def peek(self, *args: Any, **kwargs: Any) -> Any:
        """The loader's ``peek``."""
        return self._loader.peek(self._instance, *args, **kwargs)  # type: ignore[attr-defined]

    def key(self, *args: Any, **kwargs: Any) -> str:
        return self._loader.key(self._instance, *args, **kwargs)

    def __repr__(self) -> str:
        return f"<bound {self._loader!r} of {self._instance!r}>"


class AsyncBoundLoader(BoundLoader):
    """``BoundLoader`` of an async loader: its calls and methods are coroutine functions,
    so that frameworks asking ``inspect`` (FastAPI, Starlette) await a bound method."""

    __slots__ = ("_is_coroutine_marker",)  # set by inspect.markcoroutinefunction (3.12+)

    def __init__(self, loader: _Loader[Any, Any], instance: object) -> None:
        super().__init__(loader, instance)
        if hasattr(inspect, "markcoroutinefunction"):
            inspect.markcoroutinefunction(self)

    async def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return await self._loader(self._instance, *args, **kwargs)  # type: ignore[operator]

    async def invalidate(self, *args: Any, **kwargs: Any) -> None:
        """The loader's ``invalidate``, awaited."""
        await self._loader.invalidate(self._instance, *args, **kwargs)  # type: ignore[attr-defined]

    async def expire(self, *args: Any, **kwargs: Any) -> None:
        """The loader's ``expire``, awaited."""
        await self._loader.expire(self._instance, *args, **kwargs)  # type: ignore[attr-defined]

    async def fetch(self, *args: Any, **kwargs: Any) -> Any:
        """The loader's ``fetch``, awaited."""
        return await self._loader.fetch(self._instance, *args, **kwargs)  # type: ignore[attr-defined]

    async def set(self, value: Any, *args: Any, **kwargs: Any) -> bool:
        """The loader's ``set``, awaited."""
        return bool(await self._loader.set(value, self._instance, *args, **kwargs))  # type: ignore[attr-defined]

    async def refresh(self, *args: Any, **kwargs: Any) -> Any:
        """The loader's ``refresh``, awaited."""
        return await self._loader.refresh(self._instance, *args, **kwargs)  # type: ignore[attr-defined]

    async def peek(self, *args: Any, **kwargs: Any) -> Any:
        """The loader's ``peek``, awaited."""
        return await self._loader.peek(self._instance, *args, **kwargs)  # type: ignore[attr-defined]


class _Loader(Generic[P, R]):
    """What both kinds of cached loader share: the wrapped function's identity, its
    settings and its keys."""

    _bound: type[BoundLoader] = BoundLoader  # what it becomes looked up on an instance

    def __init__(self, spec: LoaderSpec, keys: KeyBuilder, forget: Callable[[str], None], static: bool = False) -> None:
        functools.update_wrapper(self, spec.func)  # type: ignore[arg-type]  # a callable object, not a function
        self._static = static  # decorated over @staticmethod: never bound
        self._spec = spec
        self._keys = keys
        self._forget = forget
        self.settings = spec.settings
        self._trace_attributes: dict[str, Any] | None = None  # its spans', once a call is traced

    def key(self, *args: P.args, **kwargs: P.kwargs) -> str:
        """The Redis key of the value these arguments load (for inspection and tooling)."""
        return self._keys.value_key(args, kwargs)

    def _trace(self, traces: Any, events: Events, value_key: str) -> CallTrace:
        """The trace of one call (``_drivers.trace``), fed by the layer's reports."""
        if self._trace_attributes is None:
            self._trace_attributes = entry_attributes(events.namespace, self._keys.template)
        own = {"stampede.key": value_key} if self._spec.settings.trace_keys else None
        return call_trace(traces, events, "stampede.get", self._trace_attributes, own, own is not None)

    @overload
    def __get__(self: Self_, instance: None, owner: type | None = None) -> Self_: ...

    @overload
    def __get__(self, instance: object, owner: type | None = None) -> BoundLoader: ...

    def __get__(self, instance: object, owner: type | None = None) -> Any:
        """Looked up on an instance, a loader decorated as a method binds it as a function
        does. ``self`` is passed to the loader but is not part of the key. One decorated
        over ``@staticmethod`` is never bound."""
        return self if instance is None or self._static else self._bound(self, instance)

    def __repr__(self) -> str:
        func = self._spec.func
        return f"<stampede.{type(self).__name__} {func.__module__}.{func.__qualname__}>"


class CachedLoader(_Loader[P, R]):
    """A loader whose calls read the cache first and collapse concurrent misses into one load.

    Call it as the function it wraps. ``invalidate(...)`` takes the same arguments and
    drops that entry. A load already in flight for it is not written afterwards.
    """

    def __init__(
        self,
        spec: LoaderSpec,
        runner: Runner,
        keys: KeyBuilder,
        forget: Callable[[str], None],
        static: bool = False,
    ) -> None:
        super().__init__(spec, keys, forget, static)
        self._runner = runner

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        value_key = self._keys.value_key(args, kwargs)
        # Nothing traced (no provider): one attribute read, no call (``_drivers.trace``).
        traces = None if GLOBALS._TRACER_PROVIDER is None else tracer()
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
            self._runner.invalidate(keys)
        finally:
            self._forget(keys.value)

    def expire(self, *args: P.args, **kwargs: P.kwargs) -> None:
        """The soft ``invalidate``: the entry of these arguments is no longer fresh, and a
        load in flight does not write it. The next caller refreshes it, but the old value
        may still be served stale (``stale_while_revalidate``, ``stale_if_error``) for the
        stale window it was written with. Without one, the same as ``invalidate``."""
        keys = self._keys.keys(args, kwargs)
        try:
            self._runner.expire(keys)
        finally:
            self._forget(keys.value)

    def set(self, value: R | Cached[R], *args: P.args, **kwargs: P.kwargs) -> bool:
        """Write ``value`` as the entry of these arguments (after a database write), as a
        load would have written it: a ``Cached`` sets its own ttl and tags. A load of the
        entry in flight, in any process, is not written afterwards, and its waiters get
        this value. Returns True, or False if a load that began after this call (and so
        read the database after it) holds the entry, or a tag invalidation came first.

        A value the serializer refuses raises ``SerializationError`` with nothing
        written. Raises BackendUnavailable if the store cannot be reached, whatever
        ``on_backend_error`` says: the old value may be gone, the new one not written.
        """
        value_key = self._keys.value_key(args, kwargs)
        try:
            return self._runner.set(value_key, self._spec, args, kwargs, value)
        finally:
            self._forget(value_key)

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


class AsyncCachedLoader(_Loader[P, R]):
    """``CachedLoader`` for an ``async def`` loader: awaiting a call reads the cache first
    and collapses concurrent misses (tasks, threads, processes) into one load.

    Concurrent tasks of one event loop share one read and one load. Cancelling one of
    them cancels only its own wait, and a cancelled loading task hands over to another.
    """

    _bound = AsyncBoundLoader

    def __init__(
        self,
        spec: LoaderSpec,
        runner: AsyncRunner,
        keys: KeyBuilder,
        forget: Callable[[str], None],
        static: bool = False,
    ) -> None:
        super().__init__(spec, keys, forget, static)
        if hasattr(inspect, "markcoroutinefunction"):  # Python 3.12+: frameworks see an async callable
            inspect.markcoroutinefunction(self)
        self._runner = runner

    async def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        value_key = self._keys.value_key(args, kwargs)
        # Nothing traced (no provider): one attribute read, no call (``_drivers.trace``).
        traces = None if GLOBALS._TRACER_PROVIDER is None else tracer()
        if traces is None:
            return await self._runner.call(value_key, self._spec, args, kwargs)  # type: ignore[no-any-return]
        with self._trace(traces, self._runner.events, value_key):
            return await self._runner.call(value_key, self._spec, args, kwargs)  # type: ignore[no-any-return]

    async def fetch(self, *args: P.args, **kwargs: P.kwargs) -> Fetched[R]:
        """``CachedLoader.fetch``, awaited."""
        with reporting() as report:
            value = await self(*args, **kwargs)
        return Fetched(value, report.stale)

    async def invalidate(self, *args: P.args, **kwargs: P.kwargs) -> None:
        """``CachedLoader.invalidate``, awaited."""
        keys = self._keys.keys(args, kwargs)
        try:
            await self._runner.invalidate(keys)
        finally:
            self._forget(keys.value)

    async def expire(self, *args: P.args, **kwargs: P.kwargs) -> None:
        """``CachedLoader.expire``, awaited."""
        keys = self._keys.keys(args, kwargs)
        try:
            await self._runner.expire(keys)
        finally:
            self._forget(keys.value)

    async def set(self, value: R | Cached[R], *args: P.args, **kwargs: P.kwargs) -> bool:
        """``CachedLoader.set``, awaited."""
        value_key = self._keys.value_key(args, kwargs)
        try:
            return await self._runner.set(value_key, self._spec, args, kwargs, value)
        finally:
            self._forget(value_key)

    async def refresh(self, *args: P.args, **kwargs: P.kwargs) -> R:
        """``CachedLoader.refresh``, awaited."""
        value_key = self._keys.value_key(args, kwargs)
        try:
            return await self._runner.refresh(value_key, self._spec, args, kwargs)  # type: ignore[no-any-return]
        finally:
            self._forget(value_key)

    async def peek(self, *args: P.args, **kwargs: P.kwargs) -> Fetched[R] | None:
        """``CachedLoader.peek``, awaited."""
        found = await self._runner.peek(self._keys.value_key(args, kwargs), self._spec)
        return None if found is None else Fetched(*found)
