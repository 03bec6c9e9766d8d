"""What ``@cached_loader_many`` turns a loader of many ids into: the keys of its entries,
and what ``CachedManyLoader`` and ``AsyncCachedManyLoader`` (``_cached``, ``_acached``)
share.

A many-key loader takes a collection of ids (its batched parameter) beside any fixed
parameters, and returns a mapping of id to value. Each id's entry is the one
``cached_loader`` with the same template gives, so single-key and many-key loaders of a
template share entries, leases and wake-ups::

    @layer.cached_loader_many("price:{shop}:{product_id}")
    def prices(shop: str, product_ids: list[int]) -> dict[int, Price]: ...

The template names the fixed parameters (``shop``) and one field that is not a
parameter (``product_id``): an id of the batched parameter. That parameter is the one
the template leaves out, or the one named ``batch=``.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import string
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, Generic, TypeVar

import orjson

from ._core.hotset import Call, HotSet
from ._core.keys import KeyBuilder
from ._core.tags import TagSet, TagTemplates
from ._core.versions import entry_tag_of
from ._drivers.observe import Events
from ._drivers.tracing import CallTrace, call_trace, entry_attributes
from ._errors import ConfigError
from ._loader import BoundLoader

if TYPE_CHECKING:
    from ._core.flow import LoaderSpec
    from ._drivers.hotset import HotSampler

K = TypeVar("K")
V = TypeVar("V")

SINGLE_IDS = (str, bytes, bytearray, memoryview)  # iterable, but one id each, never a collection of ids


class EntryShape:
    """The signature a many-key loader's entries are keyed by: its own, with the batched
    parameter replaced by one id (the template's field of that name)."""

    def __init__(self, signature: inspect.Signature) -> None:
        self.__signature__ = signature

    def __call__(self, *args: Any, **kwargs: Any) -> None:  # pragma: no cover - never called
        raise TypeError("an entry's shape is not called")


def template_fields(template: str) -> list[str]:
    try:
        return [field for _, field, _, _ in string.Formatter().parse(template) if field is not None]
    except ValueError as error:
        raise ConfigError(f"key template {template!r} is malformed: {error}") from None


class ManyKeys:
    """Where a many-key loader's ids are and what their entries are named."""

    def __init__(
        self,
        func: Callable[..., Any],
        template: str | None,
        batch: str | None,
        namespace: str,
        max_key_length: int,
        version: str = "",
    ) -> None:
        """``version``: the identity of the value type the entries hold (``_core.versions``):
        in each entry's key, and each entry tagged with the name every version shares."""
        name = getattr(func, "__qualname__", repr(func))
        if not isinstance(template, str) or not template:
            raise ConfigError(
                f"cached_loader_many needs a key template naming one id's entry, e.g. "
                f'cached_loader_many("product:{{product_id}}") (for {name})'
            )
        self.signature = inspect.signature(func)
        params = self.signature.parameters
        for param in params.values():
            if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
                raise ConfigError(f"a many-key loader takes no *args or **kwargs: {name} has {param}")
        fields = template_fields(template)
        id_fields = [field for field in dict.fromkeys(fields) if field not in params]
        if len(id_fields) != 1:
            raise ConfigError(
                f"key template {template!r} of the many-key loader {name} must name exactly one field "
                f"that is not a parameter (an id of the batched parameter), got {id_fields or 'none'}"
            )
        self.id_field = id_fields[0]
        self.batch = self._batched(batch, fields, name)
        shape = [
            param.replace(name=self.id_field, kind=param.POSITIONAL_OR_KEYWORD, default=param.empty)
            if param.name == self.batch
            else param.replace(kind=param.POSITIONAL_OR_KEYWORD, default=param.empty)
            for param in params.values()
        ]
        self.names = list(params)
        self._positional = all(param.kind is param.POSITIONAL_OR_KEYWORD for param in params.values())
        self._position = self.names.index(self.batch)
        self._shape = EntryShape(inspect.Signature(shape))
        self._keys = KeyBuilder(self._shape, template, namespace, max_key_length, version=version)
        self._entry = KeyBuilder(self._shape, template, namespace, max_key_length) if version else None
        self._namespace = namespace
        self.template = template  # what traces name the entries by
        self.tags: TagTemplates | None = None  # the entries' tags, if the loader has any (``tag``)
        self.loader_name = f"{getattr(func, '__module__', '?')}.{name}"

    def _batched(self, batch: str | None, fields: list[str], name: str) -> str:
        params = self.signature.parameters
        if batch is not None:
            if batch not in params:
                raise ConfigError(f"batch={batch!r} is not a parameter of {name}")
            if batch in fields:
                raise ConfigError(
                    f"batch={batch!r} is in the key template: the template names one id as {{{self.id_field}}}"
                )
            return batch
        keyed = {"self", "cls"} if list(params)[:1] in (["self"], ["cls"]) else set()
        candidates = [param for param in params if param not in fields and param not in keyed]
        if len(candidates) == 1:
            return candidates[0]
        plural = self.id_field + "s"
        if plural in candidates:
            return plural
        raise ConfigError(
            f"which parameter of {name} holds the ids? {', '.join(candidates) or 'none'} are not in its "
            "key template: name it with batch=..."
        )

    def bind(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
        """Every parameter's value in this call, defaults applied."""
        if not kwargs and len(args) == len(self.names) and self._positional:
            return dict(zip(self.names, args, strict=True))  # the common call, without inspect's binding
        call = self.signature.bind(*args, **kwargs)  # TypeError, as calling the loader would
        call.apply_defaults()
        return dict(call.arguments)

    def ids(self, call: dict[str, Any], *, single_allowed: bool = False) -> list[Any]:
        """The distinct ids asked, in the order first asked. With ``single_allowed``, a
        value that is not a collection is one id (``invalidate(7)``)."""
        asked = call[self.batch]
        if type(asked) is not list and (isinstance(asked, SINGLE_IDS) or not isinstance(asked, Iterable)):
            if single_allowed:
                return [asked]
            raise TypeError(
                f"{self.loader_name} takes its ids ({self.batch}) as a collection, got {type(asked).__name__}: "
                f"pass a list, e.g. [{asked!r}]"
            )
        ids = asked if type(asked) is list else list(asked)
        try:
            if len(set(ids)) == len(ids):  # (a set is built faster than a dict: most pages repeat no id)
                return ids[:] if ids is asked else ids  # a copy: the caller's list may change under a call
            return list(dict.fromkeys(ids))
        except TypeError:
            raise TypeError(
                f"the ids of {self.loader_name} must be hashable (they key the mapping it returns), got {ids!r}"
            ) from None

    def keys(self, call: dict[str, Any], ids: Sequence[Any]) -> list[str]:
        """The value key of each id's entry (``InvalidKey`` for an id that cannot key one)."""
        values = [call[name] for name in self.names]
        return self._keys.value_keys(values, self._position, ids)

    def tag(self, templates: Sequence[str], namespace: str, max_key_length: int) -> None:
        """Tag each entry with ``templates`` over the entry's fields (``TagTemplates``)."""
        self.tags = TagTemplates(self._shape, templates, set(self._keys.fields), namespace, max_key_length, self._entry)

    def tags_of(self, call: dict[str, Any], id_: Any) -> TagSet:
        """The tags of the entry of ``id_`` in ``call``."""
        assert self.tags is not None
        values = [call[name] for name in self.names]
        values[self._position] = id_
        return self.tags.render(tuple(values), {})

    @property
    def versioned(self) -> bool:
        """Whether the loader has ``version=`` (``_core.versions``)."""
        return self._entry is not None

    def entry_tags_of(self, value_keys: Sequence[str]) -> list[str]:
        """The entry tags of the entries (without ``version=``) of ``value_keys``."""
        return [entry_tag_of(key, self._namespace) for key in value_keys]

    def family_of(self, call: dict[str, Any], ids: Sequence[Any]) -> tuple[list[str], list[str]]:
        """What reaches every other version of each id's entry (a versioned loader's,
        ``_core.versions``): the entry tag every versioned entry of it carries, and the
        value key of its entry without ``version=``."""
        if self._entry is None:
            return [], []
        values = [call[name] for name in self.names]
        tags, unversioned = [], []
        for id_ in ids:
            values[self._position] = id_
            key = self._entry.value_key(tuple(values), {})
            tags.append(entry_tag_of(key, self._namespace))
            unversioned.append(key)
        return tags, unversioned

    def one_id_calls(self, call: dict[str, Any], ids: Sequence[Any]) -> Iterator[Call]:
        """``call`` as a call of each of its ids alone: what a hot set records of it, so
        that a warm start can gather the hottest ids into pages of its own (``pages``)."""
        for id_ in ids:
            yield self.with_ids(call, [id_])

    def pages(self, calls: Iterable[Call], size: int) -> list[tuple[Call, int]]:
        """Recorded calls (``one_id_calls``, hottest first) gathered into calls of at most
        ``size`` ids, each with its count of ids: the calls that share every argument but
        the ids share pages, in the order their hottest id came. A recorded call this
        loader cannot take (its signature changed since) is left out."""
        groups: dict[bytes, tuple[dict[str, Any], list[Any]]] = {}
        for args, kwargs in calls:
            try:
                call = self.bind(args, kwargs)
                ids = self.ids(call)
                rest = orjson.dumps({name: value for name, value in call.items() if name != self.batch},
                                    option=orjson.OPT_SORT_KEYS)  # fmt: skip
            except (TypeError, orjson.JSONEncodeError):
                continue
            found = groups.setdefault(rest, (call, []))
            found[1].extend(ids)
        pages = []
        for call, ids in groups.values():
            ids = list(dict.fromkeys(ids))
            pages += [(self.with_ids(call, list(part)), len(part)) for part in chunks(ids, size)]
        return pages

    def with_ids(self, call: dict[str, Any], ids: list[Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """The loader's arguments with a copy of ``ids`` as its batched one: the loader may
        sort it, pop from it or append to it, and its values are still mapped back by the
        ids asked (``_core.many.values_of``), never by a list it can change."""
        arguments = {**call, self.batch: list(ids)}
        bound = inspect.BoundArguments(self.signature, arguments)
        return bound.args, bound.kwargs


class PageTags:
    """The tags of a many-key call's entries: rendered for one entry at a time, by its
    position in the call (``render((position,), {})``), on a miss only."""

    def __init__(self, keys: ManyKeys, call: dict[str, Any], ids: Sequence[Any]) -> None:
        self._keys, self._call, self._ids = keys, call, ids

    def render(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> TagSet:
        return self._keys.tags_of(self._call, self._ids[args[0]])


def chunks(items: Sequence[K], size: int) -> Iterable[Sequence[K]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


class _ManyLoader(Generic[K, V]):
    """What both kinds of many-key loader share."""

    _bound: type[BoundLoader] = BoundLoader  # what it becomes looked up on an instance

    def __init__(self, spec: LoaderSpec, keys: ManyKeys, forget: Callable[[str], None], static: bool = False) -> None:
        functools.update_wrapper(self, spec.func)  # type: ignore[arg-type]
        self._spec = spec
        self._keys = keys
        self._forget = forget
        self._static = static
        self.settings = spec.settings
        self._trace_attributes: dict[str, Any] | None = None  # its spans', once a call is traced
        self.hot_set: HotSet | None = None  # where its hot set is kept (``Stampede.warm``), set by its layer
        self._hot: HotSampler | None = None  # its sampling of calls into it (``hot_sample``)

    def _trace(self, traces: Any, events: Events, keys: list[str]) -> CallTrace:
        """The trace of one call (``_drivers.tracing``): how many entries it asked for, and
        their keys with ``trace_keys``."""
        if self._trace_attributes is None:
            self._trace_attributes = entry_attributes(events.namespace, self._keys.template)
        own: dict[str, Any] = {"stampede.entries": len(keys)}
        if self.settings.trace_keys:
            own["stampede.keys"] = keys
        return call_trace(traces, events, "stampede.get_many", self._trace_attributes, own, self.settings.trace_keys)

    def key(self, *args: Any, **kwargs: Any) -> str:
        """The key of one id's entry: the loader's arguments with one id in place of the
        collection (``products.key(7)``)."""
        call = self._keys.bind(args, kwargs)
        return self._keys.keys(call, self._keys.ids(call, single_allowed=True)[:1])[0]

    def _asked(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[dict[str, Any], list[Any], list[str]]:
        call = self._keys.bind(args, kwargs)
        ids = self._keys.ids(call)
        return call, ids, self._keys.keys(call, ids)

    def _spec_of(self, call: dict[str, Any], ids: Sequence[Any]) -> LoaderSpec:
        """The loader's spec for one call: with the tags of its entries, if it has tags."""
        if self._keys.tags is None:
            return self._spec
        return dataclasses.replace(self._spec, tags=PageTags(self._keys, call, ids))

    def _invalidated(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[list[str], list[str]]:
        """The value keys of these ids' entries, with (a versioned loader's) those of
        their entries without ``version=``, and the entry tags every versioned entry of
        each carries (``_core.versions``)."""
        call = self._keys.bind(args, kwargs)
        ids = self._keys.ids(call, single_allowed=True)
        entry_tags, unversioned = self._keys.family_of(call, ids)
        return self._keys.keys(call, ids) + unversioned, entry_tags

    def _reached(self, entry_tags: list[str], seen: list[str]) -> list[str]:
        """The entry tags an invalidation of these entries reaches: a versioned loader's
        own (``entry_tags``), or, a loader without ``version=``, those of the entries its
        store found marked by a versioned one (``seen``, ``_core.versions``)."""
        return entry_tags if self._keys.versioned else self._keys.entry_tags_of(seen)

    def __get__(self, instance: object, owner: type | None = None) -> Any:
        """Looked up on an instance, a many-key loader decorated as a method binds it as
        a function does. ``self`` is passed to the loader but is not part of the keys."""
        return self if instance is None or self._static else self._bound(self, instance)  # type: ignore[arg-type]

    def __repr__(self) -> str:
        return f"<stampede.{type(self).__name__} {self._keys.loader_name}>"
