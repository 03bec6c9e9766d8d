"""What ``CachedLoader`` and ``AsyncCachedLoader`` (``_cached``, ``_acached``) share: the
wrapped function's identity, settings and keys, and binding to an instance."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, ParamSpec, TypeVar, overload

from ._core.keys import KeyBuilder
from ._core.versions import EntryFamily
from ._drivers.observe import Events
from ._drivers.tracing import CallTrace, call_trace, entry_attributes

if TYPE_CHECKING:
    from ._core.flow import LoaderSpec
    from ._core.hotset import HotSet
    from ._drivers.hotset import HotSampler

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


@dataclass(frozen=True)
class Versions:
    """How a loader reaches every version of an entry (``_core.versions``): the layer's
    invalidation (or, ``soft``, expiry) of the entry tag they share, in ``namespace``;
    and, for a loader with ``version=``, its family and how long its marks last. A loader
    without one reaches the versions of the entries its store found marked."""

    drop: Callable[[str, bool], int]
    namespace: str
    family: EntryFamily | None = None
    marker_ms: int = 0


@dataclass(frozen=True)
class AsyncVersions:
    """``Versions`` for an ``async def`` loader: the layer's drop is awaited."""

    drop: Callable[[str, bool], Awaitable[int]]
    namespace: str
    family: EntryFamily | None = None
    marker_ms: int = 0


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
        self.hot_set: HotSet | None = None  # where its hot set is kept (``Stampede.warm``), set by its layer
        self._hot: HotSampler | None = None  # its sampling of calls into it (``hot_sample``)

    def key(self, *args: P.args, **kwargs: P.kwargs) -> str:
        """The Redis key of the value these arguments load (for inspection and tooling)."""
        return self._keys.value_key(args, kwargs)

    def _trace(self, traces: Any, events: Events, value_key: str) -> CallTrace:
        """The trace of one call (``_drivers.tracing``), fed by the layer's reports."""
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
