"""Tags (sans-IO): groups of entries that one call invalidates, and the rules that keep
stampede's promise for them.

A loader names its tags with templates over its arguments
(``tags=["category:{category_id}", "catalog"]``), rendered and escaped as entry
templates are. ``invalidate_tag(t)`` drops every entry that carries ``t``;
``expire_tag(t)`` makes them stale.

What the store keeps, per namespace:

* the **tag clock**: a counter that never goes back (``max(last + 1, server time in
  microseconds)``, as a named lock's fencing counter). Every tag invalidation draws the
  next value. A load reads it before the loader is called: that is when its load began.
  (It is read with the lease, in the step that takes it where the store can:
  ``AcquireReply.since``. Read earlier than the load, never later: an invalidation
  after the read refuses the write, which is safe, if now and then one more load.)
* per tag, its **generation**: the clock value its last invalidation drew. It is kept
  ``GENERATION_KEEP_MS``.
* per tag, its **members**: the value keys of the entries written with it, each with
  the time (the tag's server clock) after which its value cannot live, so expired
  members are pruned as the tag is written, and cost an invalidation nothing.

The rules:

* A tagged write is admitted by each of its tags before the value exists: if a tag's
  generation is newer than the clock the load read, the tag was invalidated after the
  load began, and nothing is written (``Written.REFUSED``: the lease is released and
  the waiters woken, so one of them loads afresh). Else the entry joins the tag's
  members. Membership comes first, the value second.
* An invalidation draws the next clock value, then (atomically, on the tag's server)
  sets the tag's generation to it and reads the live members, then invalidates each
  member as ``invalidate()`` does (value and lease dropped, waiters woken, near copies
  dropped), then forgets the members it invalidated unless another write re-admitted
  them meanwhile (their time changed).

On PostgreSQL the clock is a sequence, and the tags' advisory locks (shared by a write,
exclusive for an invalidation, which is one transaction) put each write wholly before or
after each invalidation of one of its tags. On one Redis server the admission and the
write are one script. On a Redis Cluster the tag
lives in another slot than the entry, so they are two steps, and the order closes the
race. Load L of an entry tagged ``t``, invalidation I of ``t``::

    L1  L reads the clock (since = 41). L loads
    I1  I draws the clock: 42
    I2  I, on t's server: generation(t) = 42, read the members
    L2  L, on t's server: admit: generation(t) 42 > since 41: refused. Nothing written

    or, if L2 ran before I2:

    L2  admitted: the entry is a member of t (score: its life)
    I2  generation(t) = 42, the members read include the entry
    L3  L writes the value under its lease (entry's server)
    I3  I invalidates the entry: the value is deleted (or, if L3 comes after I3, the
        lease is gone and L3 is refused)

Either way, once I returns, L's value is not in the cache. A load that read the clock
after I1 began after the invalidation did: it may write. A write's admission and its
value's life are measured on the tag's server alone (durations, no clock compared with
another's), and the member's time has ``MEMBER_MARGIN_MS`` to spare for the round trip
between admission and write.

A load that runs longer than ``TAGGED_LOAD_LIMIT`` is not written: a generation that
old may have been forgotten. Bookkeeping is bounded: members by the live entries of a
tag, generations by the tags invalidated within ``GENERATION_KEEP_MS``.

Tags may also come from a loaded value (``Cached(value, tags=...)``, ``_core.results``):
its tags join the entry's in the same ``Tagged`` write, which is why the clock is read
before the load and not by the tags' templates.
"""

from __future__ import annotations

import re
import string
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from .._errors import ConfigError, InvalidKey
from .keys import KeyBuilder, render, shorten
from .versions import ENTRY_TAG, entry_tag_of

_NOT_IN_A_TAG = re.compile(r"[{}#~\x00-\x20\x7f]")

GENERATION_KEEP_MS = 3_600_000
"""How long a tag's generation is kept after its invalidation: an hour."""

TAGGED_LOAD_LIMIT = GENERATION_KEEP_MS / 2000
"""The longest a tagged load may run and still write (seconds): half the generations'
life, so a generation drawn during it is still there when it writes."""

MEMBER_MARGIN_MS = 1000
"""How much longer than its value a member is kept: the admission precedes the write."""

INVALIDATION_CHUNK = 1000
"""Members invalidated, and forgotten, per step of a tag invalidation (each step one
round trip per server)."""


@dataclass(frozen=True, slots=True)
class TagKeys:
    """Where one tag lives. Both keys share the tag's hash tag: one Cluster slot."""

    name: str  # the tag as rendered: "category:7"
    members: str  # <ns>:tag:{<name>}   sorted set: value key -> until when it may live (ms)
    generation: str  # <ns>:tag:{<name>}:gen   the clock value of its last invalidation

    @classmethod
    def of(cls, namespace: str, name: str) -> TagKeys:
        members = f"{tag_prefix(namespace)}{{{name}}}"
        return cls(name, members, members + ":gen")


def tag_prefix(namespace: str) -> str:
    """What every tag's keys start with. No entry's key does (entries are ``<ns>:{``)."""
    return f"{namespace}:tag:"


CLOCK_SUFFIX = ":tags:clock"


def clock_key(namespace: str) -> str:
    """The namespace's tag clock. Never expires (see the module docstring)."""
    return namespace + CLOCK_SUFFIX


@dataclass(frozen=True, slots=True)
class TagSet:
    """The tags of one entry, and the clock they are measured by."""

    clock: str
    tags: tuple[TagKeys, ...]

    @property
    def names(self) -> str:
        """The tags as one text (space between: a rendered tag holds no whitespace)."""
        return " ".join(tag.name for tag in self.tags)

    def joined(self, names: Iterable[str], max_key_length: int) -> TagSet:
        """These tags and ``names`` (a loaded value's own: ``Cached.tags``), each checked
        and shortened as ``invalidate_tag`` names a tag, so both name the same keys.
        ``InvalidKey`` for a name no tag could be."""
        namespace = self.clock[: -len(CLOCK_SUFFIX)]
        extra = [TagKeys.of(namespace, tag_name(name, {}, max_key_length)) for name in names]
        unique = {tag.name: tag for tag in (*self.tags, *extra)}  # in order, once each
        return TagSet(self.clock, tuple(unique.values()))


@dataclass(frozen=True, slots=True)
class Tagged:
    """What a tagged write carries: the entry's tags and the clock its load read first."""

    tags: TagSet
    since: int


class Tagging(Protocol):
    """What a loader's entries are tagged with, from a call's arguments."""

    def render(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> TagSet: ...


class FixedTags:
    """The tags of one entry already rendered (a many-key call's entry, loaded alone)."""

    def __init__(self, tags: TagSet) -> None:
        self._tags = tags

    def render(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> TagSet:
        return self._tags


class TagTemplates:
    """A loader's tag templates, rendered from a call's arguments as its key is. Each
    field a tag names must be a field of the key: an entry gets one set of tags whoever
    loads it, so a tag may not depend on an argument the key ignores."""

    def __init__(
        self,
        func: Callable[..., Any],
        templates: Sequence[str],
        key_fields: set[str] | None,
        namespace: str,
        max_key_length: int,
        entry: KeyBuilder | None = None,
    ) -> None:
        """``entry``: a versioned loader's keys without the version; each entry is also
        tagged with its name (``ENTRY_TAG`` + the entry), which every version shares
        (``_core.versions``)."""
        if isinstance(templates, str) or not isinstance(templates, (list, tuple)):
            raise ConfigError(
                f'tags must be a list of templates, e.g. ["category:{{id}}"] ([] when the loader tags its '
                f"values itself with Cached(value, tags=...)), got {templates!r}"
            )
        self._namespace = namespace
        self._clock = clock_key(namespace)
        self._prefix = len(tag_prefix(namespace)) + 1
        names: list[str | None] = []  # a template without fields renders once, here
        self._builders: list[KeyBuilder | None] = []
        for template in templates:
            if not isinstance(template, str):
                raise ConfigError(f"a tag template must be a str, got {template!r}")
            try:
                builder = KeyBuilder(func, template, f"{namespace}:tag", max_key_length)
            except ConfigError as error:
                raise ConfigError(f"tag {error}") from None
            outside = sorted(builder.fields - key_fields) if key_fields is not None else []
            if outside:
                raise ConfigError(
                    f"tag template {template!r} names {', '.join(outside)}, which the key template leaves "
                    "out: two calls of one entry would tag it differently. Tag by the key's fields"
                )
            fixed = builder.fixed_entry
            names.append(fixed)
            self._builders.append(None if fixed is not None else builder)
        if entry is not None:
            names.append(None if entry.fixed_entry is None else ENTRY_TAG + entry.fixed_entry)
            self._builders.append(None if entry.fixed_entry is not None else entry)
        self._entry = entry
        self._namespace = namespace
        self._names = names
        self._fixed = self._tag_set(names) if all(name is not None for name in names) else None

    def render(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> TagSet:
        """The tags of the entry ``func(*args, **kwargs)`` loads."""
        if self._fixed is not None:
            return self._fixed
        prefix, entry = self._prefix, self._entry
        return self._tag_set(
            [
                name
                if builder is None
                else entry_tag_of(builder.value_key(args, kwargs), self._namespace)
                if builder is entry
                else builder.value_key(args, kwargs)[prefix:-1]
                for name, builder in zip(self._names, self._builders, strict=True)
            ]
        )

    def _tag_set(self, names: Sequence[str | None]) -> TagSet:
        unique = dict.fromkeys(name for name in names if name is not None)  # in order, once each
        return TagSet(self._clock, tuple(TagKeys.of(self._namespace, name) for name in unique))


def tag_name(tag: str, fields: dict[str, Any], max_key_length: int) -> str:
    """The tag ``invalidate_tag`` names: ``tag`` as it is (``"category:7"``), or a tag
    template with its fields' values rendered as a loader renders them
    (``"category:{id}"``, ``id=7``). ``InvalidKey`` for text no loader could render."""
    if not isinstance(tag, str) or not tag:
        raise InvalidKey(f"a tag must be a non-empty str, got {tag!r}")
    try:
        parsed = list(string.Formatter().parse(tag))
    except ValueError as error:
        raise InvalidKey(f"bad tag {tag!r}: {error}") from None
    unused = dict(fields)
    parts = []
    for literal, field, spec, conversion in parsed:
        if _NOT_IN_A_TAG.search(literal):
            raise InvalidKey(f"bad tag {tag!r}: a tag holds no braces, '#', '~', whitespace or control characters")
        parts.append(literal)
        if field is None:
            continue
        if not field or spec or conversion or field not in unused:
            raise InvalidKey(f"bad tag {tag!r}: give a value for each {{field}}, as invalidate_tag(tag, {field}=...)")
        parts.append(render(unused.pop(field), name=f"field {field!r}"))
    if unused:
        raise InvalidKey(f"tag {tag!r} has no placeholder for {', '.join(sorted(unused))}")
    return shorten("".join(parts), max_key_length)
