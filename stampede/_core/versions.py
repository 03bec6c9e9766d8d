"""Entries safe across a rolling deploy: each entry of a versioned loader carries the
identity of the value type it was written for, in its key (``KeyBuilder(version=...)``).

During a rolling deploy two versions of an application share one namespace. If a
loader's value type changed, an old process must not read a new process's value (a
decode error, or a value of the wrong shape), nor the new one the old one's. With
``cached_loader(..., version=...)`` each version has entries of its own, so the two run
side by side, each loading a key once and neither overwriting the other's values; and
every entry is also tagged with its entry's name without the version (``entry_tag_of``), so
that an ``invalidate``, ``expire`` or ``set`` from either version reaches both versions'
entries (and refuses a load of either begun before it), through the tags' promises.

The entry of a loader without ``version=`` counts as one more version of the same entry
(``EntryFamily``): in the deploy that first adopts ``version=`` (or drops it) the two run
side by side, and each side's ``invalidate``, ``expire`` and ``set`` reach the other's:

* The versioned side's act on the unversioned entry too (its keys are the loader's
  without the version), and on every versioned one through the entry tag.
* The unversioned side cannot know that versioned entries exist without asking, and
  asking on every invalidation (the entry tag's invalidation) would cost every ``set``
  2.7 times its time and need the tag commands in a restricted ACL. So a versioned load first
  **marks** the unversioned entry (``EntryKeys.versioned``, in its slot, for longer than
  any value it writes lives: ``marker_ms``), before its loader reads the database; and the
  stores' invalidate, expire, set and seizure report the marker in the step they take
  anyway (``saw_versions``: no round trip more). Only an entry so marked costs its
  invalidator the entry tag's invalidation. The race is closed: a versioned load whose
  mark came after an invalidation read the database after it too; one whose mark came
  before is seen, and its write is refused by the entry tag's invalidation.

``version=True`` derives the identity from the loader's return annotation: its JSON
schema (msgspec's, for dataclasses, msgspec Structs, TypedDicts, and plain types; a
pydantic model's own), hashed. A schema that does not change keeps the entries across
deploys. ``version="2"`` names it by hand, for loaders of plain JSON.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import typing
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from typing import Any

from .._errors import ConfigError
from .config import Settings
from .keys import EntryKeys, KeyBuilder

ENTRY_TAG = "~e:"
"""What the tag every version of an entry shares starts with: no tag a user names holds a
``~`` (``_core.tags.tag_name``), so it is never one of theirs."""

_IDENTITY_CHARS = 12

MARK_BEYOND_MS = 86_400_000
"""How long past the longest life of what a versioned loader writes its mark lasts: longer
than any load runs (the mark is written as its loader starts)."""

_SEEN: ContextVar[list[str] | None] = ContextVar("stampede_versions_seen", default=None)


@contextlib.contextmanager
def versions_seen() -> Iterator[list[str]]:
    """Collect, while the block runs, the value keys of the entries a store's invalidate,
    expire, set or seizure found marked by a versioned loader (``saw_versions``)."""
    seen: list[str] = []
    token = _SEEN.set(seen)
    try:
        yield seen
    finally:
        _SEEN.reset(token)


def saw_versions(value_key: str) -> None:
    """What a store calls when the entry of ``value_key`` is marked (``EntryKeys.versioned``)
    in its invalidate, expire, put or seize: a caller collecting (``versions_seen``) then
    reaches every versioned entry of it. Outside a collection (a tag's members), nothing."""
    seen = _SEEN.get()
    if seen is not None:
        seen.append(value_key)


def marker_ms(settings: Settings) -> int:
    """How long a versioned loader's mark lasts: past the longest life of a value it writes
    by its settings (the ttl or a null's, and both stale windows), by ``MARK_BEYOND_MS``. A
    ``Cached(ttl=...)`` longer than that by a day is not covered (docs/deploys.md)."""
    longest = max(settings.ttl, settings.null_ttl) + settings.stale_while_revalidate + settings.stale_if_error
    return round(longest * 1000) + MARK_BEYOND_MS


@dataclasses.dataclass(frozen=True)
class EntryFamily:
    """Every version of a versioned loader's entries: ``entry`` builds the keys of the
    entry without ``version=``, whose name, past the namespace, is what the entry tag
    every versioned entry carries names."""

    entry: KeyBuilder
    namespace: str

    def tag(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
        """The entry tag every versioned entry of these arguments carries."""
        return entry_tag_of(self.entry.value_key(args, kwargs), self.namespace)

    def unversioned(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> EntryKeys:
        """The keys of the entry a loader without ``version=`` keeps for these arguments."""
        return self.entry.keys(args, kwargs)


def entry_tag_of(unversioned_key: str, namespace: str) -> str:
    """The entry tag of the entry whose unversioned value key is ``unversioned_key``
    (``ns:{product:42}``: ``~e:product:42``): the tag ``_core.tags.TagTemplates`` gives
    every versioned entry, and what its invalidation is asked for by."""
    return ENTRY_TAG + unversioned_key[len(namespace) + 2 : -1]


def version_of(version: str | bool, func: Callable[..., Any], value_type: Any = None) -> str:
    """The identity ``version=`` gives the loader ``func``'s entries: the string itself,
    or (True) a hash of the schema of its return annotation (of ``value_type``, a
    many-key loader's value type, when given). A ConfigError when there is none."""
    if isinstance(version, bool):
        if not version:
            return ""
        if value_type is not None:
            _return_type(func)  # an annotation there is, and readable
            return type_identity(value_type, func)
        return type_identity(_return_type(func), func)
    if not isinstance(version, str) or not version:
        raise ConfigError(f"version must be a non-empty str, or True (from the return annotation), got {version!r}")
    return version


def type_identity(value_type: Any, func: Callable[..., Any] | None = None) -> str:
    """A short hash of ``value_type``'s JSON schema: equal for equal schemas, whatever
    process computes it."""
    schema = _schema(value_type)
    if schema is None:
        where = f" of {func.__qualname__}" if func is not None else ""
        raise ConfigError(
            f"version=True: the return type{where}, {value_type!r}, has no schema stampede can read "
            "(a dataclass, a msgspec Struct, a TypedDict, a pydantic model, or a plain type): give version='...'"
        )
    text = json.dumps(schema, sort_keys=True, separators=(",", ":"), default=repr)
    return hashlib.sha256(text.encode()).hexdigest()[:_IDENTITY_CHARS]


def _return_type(func: Callable[..., Any]) -> Any:
    try:
        hints = typing.get_type_hints(func)
    except Exception as error:
        raise ConfigError(
            f"version=True: the return annotation of {func.__qualname__} cannot be read: {error}"
        ) from None
    if "return" not in hints:
        raise ConfigError(f"version=True needs a return annotation on {func.__qualname__} (or give version='...')")
    returned = hints["return"]
    origin = typing.get_origin(returned)
    if origin is not None and getattr(origin, "__name__", "") == "Coroutine":  # an async def's, unwrapped
        returned = typing.get_args(returned)[-1]
    return returned


def _schema(value_type: Any) -> Any:
    """The JSON schema of ``value_type``, or None if none can be made."""
    model_schema = getattr(value_type, "model_json_schema", None)
    if callable(model_schema):  # a pydantic model
        try:
            return model_schema()
        except Exception:
            return None
    try:
        import msgspec
    except ImportError:  # without msgspec (an extra): the type's fields, walked here
        return _described(value_type, set())
    try:
        return msgspec.json.schema(value_type)
    except (TypeError, ValueError):
        return None


def _described(value_type: Any, seen: set[int]) -> Any:
    """What a schema says of ``value_type``, without msgspec: each dataclass's and
    TypedDict's fields and their types, each generic's arguments, a class's name."""
    if id(value_type) in seen:
        return {"ref": getattr(value_type, "__qualname__", repr(value_type))}
    if dataclasses.is_dataclass(value_type) or typing.is_typeddict(value_type):
        seen = seen | {id(value_type)}
        hints = typing.get_type_hints(value_type)
        return {
            "name": value_type.__qualname__,
            "fields": {name: _described(hint, seen) for name, hint in hints.items()},
        }
    origin = typing.get_origin(value_type)
    if origin is not None:
        return {"origin": repr(origin), "args": [_described(arg, seen) for arg in typing.get_args(value_type)]}
    return {"type": getattr(value_type, "__qualname__", repr(value_type))}
