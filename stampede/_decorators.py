"""How a function becomes a loader: what ``cached_loader(...)`` and
``cached_loader_many(...)`` return, and the one preparation both take.

A decorator refuses at decoration what could hand one caller's value to another or fail
only under load (a classmethod below it, a generator, two loaders whose keys would meet,
a budget or a hot set the store cannot keep, a loader of a kind the layer has no client
for), then builds the loader from its parts: keys, codec, tags, load budget, versions and
hot set. The steps both kinds share are ``_Decorator.__call__``. What differs (their keys,
their value type, the loader made) is each one's own.
"""

from __future__ import annotations

import inspect
import threading
import typing
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar, overload

from ._acached import AsyncCachedLoader, AsyncCachedManyLoader
from ._astream import AsyncCachedStream
from ._cached import CachedLoader, CachedManyLoader
from ._core.budget import budget_name
from ._core.codec import Codec, Serializer, TypedSerializer
from ._core.config import Settings
from ._core.flow import LoaderSpec
from ._core.keys import KeyBuilder
from ._core.leases import ONE_SERVER
from ._core.store import Roles, roles_of
from ._core.tags import TagTemplates
from ._core.versions import EntryFamily, marker_ms, version_of
from ._drivers.abudget import AsyncBudgetSlots, abudgeted
from ._drivers.budget import BudgetSlots, budgeted
from ._drivers.budget_table import Budgets
from ._drivers.tracing import entry_attributes
from ._drivers.watchdog import LOOP_WATCHDOG
from ._errors import ConfigError
from ._hot_sets import HotSets
from ._invalidation import Invalidation
from ._loader import AsyncVersions, P, Versions
from ._loader_many import ManyKeys
from ._parts import LayerParts
from ._stream import CachedStream
from ._streaming import OnLeaderFailure, OnLeave, StreamSpec, whole_codec

R = TypeVar("R")


class Decorating:
    """A layer's loaders: the decorators it hands out, and what they share across the
    layer (the names of loaders without a template, the load budgets, the codec)."""

    def __init__(self, parts: LayerParts, codec: Codec, hot_sets: HotSets, invalidation: Invalidation) -> None:
        self.parts = parts
        self.hot_sets = hot_sets
        self.invalidation = invalidation
        self._codec = codec
        self._budgets = Budgets(parts.namespace, parts.settings.max_key_length)
        self._default_names: dict[str, Callable[..., Any]] = {}  # loaders without a template
        self._names_lock = threading.Lock()

    def settings_for(self, given: dict[str, Any], verify_equal: object) -> Settings:
        """The layer's settings with a loader's ``given`` ones, checked."""
        settings = self.parts.settings.replace(stacklevel=5, **given)
        self.check_near(settings)
        if verify_equal is not None and not callable(verify_equal):
            raise ConfigError(f"verify_equal must be a function of two values returning a bool, got {verify_equal!r}")
        return settings

    def codec_for(self, serializer: Serializer | None, settings: Settings) -> Codec:
        """The layer's codec, or one of ``serializer``, under a loader's ``settings``."""
        codec = self._codec if serializer is None else self._codec.with_serializer(serializer)
        return codec.like(
            compress_above=settings.compress_above,
            compression=settings.compression,
            max_value_bytes=settings.max_value_bytes,
        )

    def check_near(self, settings: Settings) -> None:
        """Refuse ``near_cache`` where it cannot keep its promise (see docs/near-cache.md).
        The embedded store is in this process already: the setting changes nothing there."""
        backend = self.parts.backend
        if not settings.near_cache or self.parts.near is not None or backend.in_process:
            return
        raise ConfigError(backend.near_refusal or f"near_cache is not available on {backend.name}")

    def claim_name(self, name: str, func: Callable[..., Any]) -> None:
        """Refuse a second loader whose keys, built from ``name``, would be another's."""
        with self._names_lock:
            owner = self._default_names.setdefault(name, func)
        if owner is not func:
            raise ConfigError(
                f"another loader of this layer is already named {name!r} (its keys would be this "
                "one's): give one of them a key template"
            )

    def budgeted(self, func: Callable[..., Any], settings: Settings, own: bool, template: str) -> Callable[..., Any]:
        """``func``, or ``func`` holding a slot of its load budget while each call runs
        (``_core.budget``): decided here, at decoration."""
        parts = self.parts
        name = budget_name(parts.settings, settings, own, template)
        if name is None:
            return func
        budget, local = self._budgets.get(name, settings)
        store = parts.runner.store if parts.runner is not None else None
        # An asyncio-only layer's store is made in its event loop: checked at its first load
        # instead (``AsyncBudgetSlots.held``). Otherwise the blocking store answers for both.
        if (store is not None or not is_async(func)) and Roles.BUDGETS not in roles_of(store):
            raise ConfigError(f"max_concurrent_loads needs a store with load budgets; {parts.backend.name} has none")
        if is_async(func):
            runner = parts.async_runner
            assert runner is not None, "an async loader on a layer without an asyncio client is refused before"
            return abudgeted(func, AsyncBudgetSlots(budget, local, runner.loop_store, LOOP_WATCHDOG, parts.events))
        assert store is not None
        blocking_store = store
        return budgeted(func, BudgetSlots(budget, local, lambda: blocking_store, parts.watchdog, parts.events))


@dataclass(frozen=True)
class _Named:
    """What a loader's entries are named by: its keys, their template, the tags of each
    entry, and (versioned) the entry's name across versions."""

    keys: Any
    template: str
    tags: TagTemplates | None = None
    entry: KeyBuilder | None = None


@dataclass(frozen=True)
class _Made:
    """What the shared steps made of a function, for the loader a subclass builds."""

    named: _Named
    loads: Callable[..., Any]  # the function, held to its load budget where it has one
    codec: Codec
    static: bool  # a staticmethod: called as it is, nothing bound
    asynchronous: bool
    marks: int  # how long a versioned entry's marker lasts, in ms (0: not versioned)


class _Decorator:
    """The steps every loader's decoration takes, in order. A subclass says how its
    keys are built, what its value type is, and which loader it makes."""

    name = ""  # the decorator, as errors name it
    classmethod_hint = ""  # why @classmethod goes above it

    def __init__(
        self,
        making: Decorating,
        template: str | None,
        settings: Settings,
        serializer: Serializer | None,
        tags: Sequence[str] | None,
        verify_equal: Callable[[Any, Any], bool] | None,
        own_budget: bool,
        version: str | bool | None,
    ) -> None:
        self._making = making
        self._template = template
        self._settings = settings
        self._codec = making.codec_for(serializer, settings)
        self._tags = tags
        self._verify_equal = verify_equal
        self._own_budget = own_budget  # the loader gave max_concurrent_loads itself
        self._version = version

    def __call__(self, func: Any) -> Any:
        making, parts, settings = self._making, self._making.parts, self._settings
        func, static = unwrapped(func, self.name, self.classmethod_hint)
        if not callable(func):
            raise ConfigError(f"{self.name} decorates a function, got {func!r}")
        refuse_generator(self.name, func)
        version = "" if self._version is None else self._version_of(func)
        named = self._named(func, version)
        codec = self._codec
        if isinstance(codec.serializer, TypedSerializer):
            codec = codec.with_serializer(self._typed(codec.serializer, func))
        asynchronous = is_async(func)
        check_client(parts, func, asynchronous, "async")
        loads = making.budgeted(func, settings, self._own_budget, named.template)
        marks = marker_ms(settings) if version else 0
        loader = self._loader(_Made(named, loads, codec, static, asynchronous, marks))
        making.hot_sets.attach(loader, named.template, isinstance(loader, (CachedManyLoader, AsyncCachedManyLoader)))
        return loader

    def _version_of(self, func: Callable[..., Any]) -> str:
        raise NotImplementedError

    def _named(self, func: Callable[..., Any], version: str) -> _Named:
        """How the loader's entries are named (keys of ``version``, tagged as asked)."""
        raise NotImplementedError

    def _typed(self, serializer: TypedSerializer, func: Callable[..., Any]) -> Serializer:
        raise NotImplementedError

    def _loader(self, made: _Made) -> Any:
        raise NotImplementedError


class LoaderDecorator(_Decorator):
    """What ``cached_loader(...)`` returns: applied to a plain function it makes a
    ``CachedLoader``, to an ``async def`` an ``AsyncCachedLoader``."""

    name = "cached_loader"
    classmethod_hint = " (its first parameter, cls, is then not part of the key)"

    @overload
    def __call__(self, func: Callable[P, Coroutine[Any, Any, R]]) -> AsyncCachedLoader[P, R]: ...  # type: ignore[overload-overlap]

    @overload
    def __call__(self, func: Callable[P, R]) -> CachedLoader[P, R]: ...

    def __call__(self, func: Callable[P, Any]) -> CachedLoader[P, Any] | AsyncCachedLoader[P, Any]:
        loader: CachedLoader[P, Any] | AsyncCachedLoader[P, Any] = super().__call__(func)
        return loader

    def _version_of(self, func: Callable[..., Any]) -> str:
        assert self._version is not None
        return version_of(self._version, func)

    def _named(self, func: Callable[..., Any], version: str) -> _Named:
        namespace, longest = self._making.parts.namespace, self._settings.max_key_length
        keys = KeyBuilder(func, self._template, namespace, longest, version=version)
        entry = KeyBuilder(func, self._template, namespace, longest) if version else None
        tags = None
        if self._tags is not None or version:
            tags = TagTemplates(func, self._tags or [], set(keys.fields), namespace, longest, entry)
        if keys.default_name is not None:
            self._making.claim_name(keys.default_name, func)
        return _Named(keys, keys.template, tags, entry)

    def _typed(self, serializer: TypedSerializer, func: Callable[..., Any]) -> Serializer:
        """``serializer`` for the loader's return annotation (Any if it has none). An
        annotation that cannot be resolved is an error, unless the serializer has its type."""
        try:
            annotation, problem = typing.get_type_hints(func).get("return", Any), None
        except Exception as error:
            annotation, problem = Any, error
        typed = serializer.for_type(annotation)
        if problem is not None and typed is not serializer:
            raise ConfigError(
                f"cannot resolve the return annotation of {getattr(func, '__qualname__', func)!r} ({problem}): "
                "give the serializer its type, e.g. serializer=MsgspecSerializer(Order)"
            )
        return typed

    def _loader(self, made: _Made) -> Any:
        parts, invalidation, named = self._making.parts, self._making.invalidation, made.named
        spec = LoaderSpec(made.loads, self._settings, made.codec, named.tags, named.template, self._verify_equal)
        family = None if named.entry is None else EntryFamily(named.entry, parts.namespace)
        if made.asynchronous:
            assert parts.async_runner is not None
            aversions = AsyncVersions(invalidation.adrop_versions, parts.namespace, family, made.marks)
            return AsyncCachedLoader(spec, parts.async_runner, named.keys, parts.forget, made.static, aversions)
        assert parts.runner is not None
        versions = Versions(invalidation.drop_versions, parts.namespace, family, made.marks)
        return CachedLoader(spec, parts.runner, named.keys, parts.forget, made.static, versions)


class ManyLoaderDecorator(_Decorator):
    """What ``cached_loader_many(...)`` returns: applied to a plain function it makes a
    ``CachedManyLoader``, to an ``async def`` an ``AsyncCachedManyLoader``."""

    name = "cached_loader_many"

    def __init__(self, making: Decorating, template: str, batch: str | None, *args: Any) -> None:
        super().__init__(making, template, *args)
        self._batch = batch

    def _version_of(self, func: Callable[..., Any]) -> str:
        assert self._version is not None
        return version_of(self._version, func, value_type(func))

    def _named(self, func: Callable[..., Any], version: str) -> _Named:
        namespace, longest = self._making.parts.namespace, self._settings.max_key_length
        assert self._template is not None
        keys = ManyKeys(func, self._template, self._batch, namespace, longest, version)
        if self._tags is not None or version:
            keys.tag(self._tags or [], namespace, longest)  # each entry's, kept by the keys
        return _Named(keys, keys.template)

    def _typed(self, serializer: TypedSerializer, func: Callable[..., Any]) -> Serializer:
        return serializer.for_type(value_type(func))

    def _loader(self, made: _Made) -> Any:
        parts, invalidation, keys = self._making.parts, self._making.invalidation, made.named.keys
        spec = LoaderSpec(made.loads, self._settings, made.codec, None, made.named.template, self._verify_equal)
        if made.asynchronous:
            assert parts.async_runner is not None
            adrop = invalidation.adrop_versions
            return AsyncCachedManyLoader(spec, parts.async_runner, keys, parts.forget, made.static, adrop, made.marks)
        assert parts.runner is not None
        drop = invalidation.drop_versions
        return CachedManyLoader(spec, parts.runner, keys, parts.forget, made.static, drop, made.marks)


class StreamDecorator:
    """What ``cached_stream(...)`` returns: applied to a generator function it makes a
    ``CachedStream``, to an async generator function an ``AsyncCachedStream``."""

    name = "cached_stream"

    def __init__(
        self,
        making: Decorating,
        template: str | None,
        settings: Settings,
        serializer: Serializer | None,
        on_leave: OnLeave,
        on_leader_failure: OnLeaderFailure,
    ) -> None:
        if on_leave not in ("finish", "stop"):
            raise ConfigError(f'on_leave must be "finish" or "stop", got {on_leave!r}')
        if on_leader_failure not in ("raise", "restart"):
            raise ConfigError(f'on_leader_failure must be "raise" or "restart", got {on_leader_failure!r}')
        self._on_leader_failure: OnLeaderFailure = on_leader_failure
        self._making = making
        self._template = template
        self._settings = settings
        self._codec = making.codec_for(serializer, settings)
        self._on_leave: OnLeave = on_leave

    @overload
    def __call__(self, func: Callable[P, AsyncIterator[R]]) -> AsyncCachedStream[R]: ...

    @overload
    def __call__(self, func: Callable[P, Iterator[R]]) -> CachedStream[R]: ...

    def __call__(self, func: Any) -> Any:
        parts, settings = self._making.parts, self._settings
        func, static = unwrapped(func, self.name)
        asynchronous = inspect.isasyncgenfunction(func)
        if not asynchronous and not inspect.isgeneratorfunction(func):
            raise ConfigError(
                f"cached_stream decorates a generator function (a def or an async def that yields its chunks), "
                f"got {getattr(func, '__qualname__', func)!r}: for a function that returns its value, use cached_loader"
            )
        backend = parts.backend
        if backend.lease_policy is not ONE_SERVER:
            raise ConfigError(
                f"cached_stream cannot stream on {backend.name}: a run's relay follows the lease on the store, "
                "and this layer holds its leases on lock servers beside it"
            )
        store = parts.runner.store if parts.runner is not None else None
        # An asyncio-only layer's store is made in its event loop: checked at its first call.
        if store is not None and Roles.STREAMS not in roles_of(store):
            raise ConfigError(f"cached_stream needs a store that relays streams; {backend.name} has none")
        check_client(parts, func, asynchronous, "an async generator")
        keys = KeyBuilder(func, self._template, parts.namespace, settings.max_key_length)
        if keys.default_name is not None:
            self._making.claim_name(keys.default_name, func)
        chunks = self._codec.serializer
        if isinstance(chunks, TypedSerializer):
            chunks = chunks.for_type(Any)
        whole = whole_codec(self._codec)
        runner: Any = parts.runner if parts.runner is not None else parts.async_runner
        attributes = entry_attributes(parts.namespace, keys.template)
        spec = StreamSpec(
            func,
            keys,
            settings,
            chunks,
            whole,
            parts.events,
            parts.warn,
            self._on_leave,
            self._on_leader_failure,
            runner.tracing,
            attributes,
            static,
        )
        if asynchronous:
            assert parts.async_runner is not None
            return AsyncCachedStream(spec, parts.async_runner.loop_store, LOOP_WATCHDOG)
        assert store is not None
        blocking_store = store
        return CachedStream(spec, lambda: blocking_store, parts.watchdog)


def unwrapped(func: Any, decorator: str, hint: str = "") -> tuple[Any, bool]:
    """The function under a staticmethod (called as it is, from the class or an instance:
    nothing is bound), and whether it was one. A classmethod is refused: its ``cls``
    would be bound after the decorator, in the key."""
    if isinstance(func, classmethod):
        raise ConfigError(
            f"{decorator} cannot decorate the classmethod {func.__func__.__qualname__}: write "
            f"@classmethod above @{decorator}{hint}"
        )
    if isinstance(func, staticmethod):
        return func.__func__, True
    return func, False


def check_client(parts: LayerParts, func: Callable[..., Any], asynchronous: bool, kind: str) -> None:
    """Refuse a loader of a kind (``kind``: async, or not) the layer has no client for."""
    if asynchronous and parts.async_runner is None:
        raise ConfigError(
            f"{func.__qualname__} is {kind}, and this layer has no asyncio client: "
            "pass async_client= to Stampede, or use Stampede.from_url"
        )
    if not asynchronous and parts.runner is None:
        raise ConfigError(
            f"{func.__qualname__} is not {kind}, and this layer has only an asyncio client: "
            "pass a blocking client too, or use Stampede.from_url"
        )


def refuse_generator(decorator: str, func: Callable[..., Any]) -> None:
    """A generator function returns before its values are made: there is no one value
    to cache, and an async generator would pass for a blocking loader."""
    if inspect.isgeneratorfunction(func) or inspect.isasyncgenfunction(func):
        kind = "an async generator" if inspect.isasyncgenfunction(func) else "a generator"
        raise ConfigError(
            f"{decorator} cannot decorate {func.__qualname__}, {kind} function: its values are made while "
            "the caller iterates, after the call returned, so there is no one value to cache. Return a list "
            "(from a def or an async def) instead, or decorate it with cached_stream to share its chunks as they come"
        )


def value_type(func: Callable[..., Any]) -> Any:
    """The value type of a many-key loader's return annotation (``dict[int, Product]``:
    ``Product``), or Any."""
    try:
        annotation = typing.get_type_hints(func).get("return", Any)
    except Exception:
        return Any
    arguments = typing.get_args(annotation)
    return arguments[1] if len(arguments) == 2 else Any


def is_async(func: Callable[..., Any]) -> bool:
    """An ``async def`` function, or an object whose ``__call__`` is one."""
    return inspect.iscoroutinefunction(func) or inspect.iscoroutinefunction(type(func).__call__)
