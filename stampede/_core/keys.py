"""Cache keys: from a template and a call's arguments to keys no other arguments can produce.

The keys of one entry share a Redis Cluster hash tag (the part between braces), so every
script touches one slot::

    <namespace>:{<entry>}          the value
    <namespace>:{<entry>}:lock     the distributed lock
    <namespace>:{<entry>}:notify   the channel waiters listen on

``<entry>`` is the template with each field replaced by its argument. A str argument is
percent-escaped (``%`` ``:`` ``{`` ``}`` ``#`` ``~``, whitespace, control characters, and
lone surrogates, which could not be encoded), so under ``"u:{a}:{b}"`` the calls
("x:y", "z") and ("x", "y:z") give ``u:x%3Ay:z`` and ``u:x:y%3Az``. An int is written in
decimal: ``1`` and ``"1"`` are deliberately one entry, the way a URL route treats them.
Any other value is ``~`` plus its escaped canonical form (``canonical``), which names its
type, so values that differ give different keys: None, ``1.0``, ``[1]``, ``(1,)``, a
dataclass and the dict of its fields are all distinct. NaN and infinities have no key
(``InvalidKey``). No str or int renders with a leading ``~``.

Without a template the entry is ``module.qualname`` and every parameter in signature
order, leaving out a method's ``self`` (or ``cls``). Such a name must identify one loader:
a lambda, a function defined inside another (``<locals>``) or an object without a
``__qualname__`` (a ``functools.partial``) has none, so it needs a template.

An entry longer than ``max_key_length`` keeps a readable prefix and ends in ``#`` plus a
SHA-256 of the whole. ``#`` never occurs otherwise.
"""

from __future__ import annotations

import dataclasses
import datetime
import decimal
import enum
import hashlib
import inspect
import json
import math
import re
import string
import sys
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from .._errors import ConfigError, InvalidKey

_ESCAPED = re.compile(r"[%:{}#~\x00-\x20\x7f\ud800-\udfff]")
_FORBIDDEN_IN_TEMPLATE = re.compile(r"[{}#~\x00-\x20\x7f]")
_HASH_CHARS = 40
_VERSIONED_MARK = ":versioned"


@dataclass(frozen=True, slots=True)
class EntryKeys:
    """The Redis keys (and channel) of one cache entry. All in one hash slot."""

    value: str
    lock: str
    channel: str

    @property
    def queue(self) -> tuple[str, str, str]:
        """A fair lock's queue, its waiters' leases and its ticket counter."""
        return self.lock + ":queue", self.lock + ":waiters", self.lock + ":tickets"

    def waiter(self, token: str) -> EntryKeys:
        """A load budget's keys as its waiter ``token`` subscribes to them: the channel its
        own, where a freed slot wakes the first waiter in line (``BudgetStore``)."""
        return EntryKeys(self.value, self.lock, f"{self.channel}:{token}")

    @property
    def invalidated(self) -> str:
        """Set by an invalidation that dropped a lease, for what was left of that lease: a
        refused write tells by it an invalidation from an eviction."""
        return self.lock + ":invalidated"

    @property
    def tags(self) -> str:
        """The tags the value was written with, beside it for as long (see ``_core.tags``)."""
        return self.value + ":tags"

    @property
    def versioned(self) -> str:
        """Set while a loader with ``version=`` may hold entries of this entry (the entry of
        the loader without it): its invalidations must reach theirs too (``_core.versions``)."""
        return self.value + _VERSIONED_MARK

    @property
    def failing(self) -> str:
        """Set while the entry's loader fails and its stale value stands in (see
        ``failing_key``)."""
        return failing_key(self.value)

    def relay(self, token: str) -> str:
        """The relay of the streamed load that holds lease ``token`` (``StreamStore``):
        one per run, beside the lock, in its slot."""
        return f"{self.lock}:relay:{token}"

    @property
    def on_lock_servers(self) -> EntryKeys:
        """The keys of a load's lease on Redlock's lock servers: a lock key (and a channel,
        which nobody listens to) of its own, so the cache server can be a lock server too."""
        return EntryKeys(self.value, self.lock + ":majority", self.channel + ":majority")

    @classmethod
    def for_value(cls, value_key: str) -> EntryKeys:
        """The lock and channel that go with a value key from ``KeyBuilder.value_key``."""
        return cls(value_key, value_key + ":lock", value_key + ":notify")


def failing_key(value_key: str) -> str:
    """The marker a failed load leaves (``Store.hold``) for as long as the entry may be
    served stale, and a successful write, an invalidation or an expire() deletes: while it
    is there, a read past ``stale_while_revalidate`` still serves the stale value and
    refreshes it in the background, instead of making a caller wait for a load that is
    likely to fail. Built from the value key alone, so the hit path needs no ``EntryKeys``."""
    return value_key + ":lock:failing"


def check_key(namespace: str) -> str:
    """The key ``Stampede.check()`` writes and deletes: no entry is ``~check``."""
    return f"{namespace}:{{~check}}"


def entry_value_keys(keys: Iterable[bytes | str]) -> set[str]:
    """The value keys (``ns:{entry}``) of the cache entries that ``keys`` (values, leases,
    markers, of one namespace) belong to. A named lock's, a budget's, a hot set's keys, the
    check key and the marks versioned loaders leave (``EntryKeys.versioned``: no entry of
    its own) left out."""
    found = set()
    for key in keys:
        text = key.decode(errors="replace") if isinstance(key, bytes) else key
        close = text.find("}")
        if close < 0 or text.endswith(_VERSIONED_MARK):
            continue
        if not any(mark in text[:close] for mark in ("{~lock:", "{~budget:", "{~hot:", "{~check")):
            found.add(text[: close + 1])
    return found


def lock_keys(namespace: str, name: str, max_key_length: int) -> EntryKeys:
    """The keys of the named lock ``name``: its lease, its channel and, in the place of a
    value, its fencing counter. The entry starts with ``~lock:``, which no template (no
    ``~`` allowed) and no argument (``~`` is escaped, values start ``~x`` or ``~`` and JSON)
    can produce, so a named lock never shares a key with a cache entry."""
    if not isinstance(name, str) or not name:
        raise ConfigError(f"a lock name must be a non-empty str, got {name!r}")
    entry = shorten("~lock:" + escape(name), max_key_length)
    base = f"{namespace}:{{{entry}}}"
    return EntryKeys(base + ":fence", base + ":lock", base + ":notify")


def budget_keys(namespace: str, name: str, max_key_length: int) -> EntryKeys:
    """The keys of the load budget ``name`` (``BudgetStore``): its slots' holders (in the
    place of a lease), its queue beside them, its channel. The entry starts with
    ``~budget:``, which no template or argument can produce (see ``lock_keys``)."""
    if not isinstance(name, str) or not name:
        raise ConfigError(f"a load budget's name must be a non-empty str, got {name!r}")
    base = f"{namespace}:{{{shorten('~budget:' + escape(name), max_key_length)}}}"
    return EntryKeys(base, base + ":slots", base + ":notify")


def escape(text: str) -> str:
    """Percent-escape the characters that could forge a separator or a hash tag."""
    if _ESCAPED.search(text) is None:
        return text
    return _ESCAPED.sub(lambda match: f"%{ord(match.group()):02X}", text)


def render(value: Any, *, name: str = "argument") -> str:
    """The key text of one argument value (see the module docstring for the rules)."""
    kind = type(value)
    if kind is str:
        return escape(value)
    if kind is int:
        return _int_key(value)
    try:
        return "~" + escape(canonical(value))
    except _NoKey as error:
        raise InvalidKey(f"{name} cannot be part of a cache key: {error}") from None


class _NoKey(Exception):
    """A value, or a part of it, that has no canonical form."""


def canonical(value: Any) -> str:
    """A text that names ``value`` and its type: two values get the same text only if they
    are of the same type and equal. Each form starts so that no other type's can::

        null  true  false       None, bools
        12  -3  0x1f...         ints (hex beyond the decimal digits Python will print)
        1.5  1e+100             floats (repr: always a '.' or an 'e'). NaN, inf refused
        "text"                  str (JSON, ASCII)
        x00ff                   bytes (hex)
        [a,b]  (a,b)            list, tuple
        {k:v}  set{a}  frozenset{a}   dict, set, frozenset (sorted by their forms)
        UUID(...)  Decimal(...)  datetime(...)  date(...)  time(...)  timedelta(...)
        module.Enum.MEMBER      an enum member, by name
        module.Class{field:value}     a dataclass instance, its fields in order
    """
    try:
        return _canonical(value)
    except RecursionError:
        raise _NoKey("it is nested too deeply (or contains itself)") from None


def _canonical(value: Any) -> str:
    if value is None:
        return "null"
    if value is True or value is False:
        return "true" if value else "false"
    if isinstance(value, enum.Enum):  # before int and str: IntEnum, StrEnum
        kind = type(value)
        return f"{kind.__module__}.{kind.__qualname__}.{value.name}"
    if isinstance(value, int):
        return _int_text(int(value))
    if isinstance(value, float):
        if not math.isfinite(value):
            raise _NoKey(f"{value!r} is not a finite number (NaN equals nothing; pass a str instead)")
        return repr(float(value))
    if isinstance(value, str):
        return json.dumps(str(value))  # ASCII: lone surrogates too
    if isinstance(value, (bytes, bytearray, memoryview)):
        return "x" + bytes(value).hex()
    if isinstance(value, list):
        return "[" + ",".join(map(_canonical, value)) + "]"
    if isinstance(value, tuple) and not hasattr(value, "_fields"):
        return "(" + ",".join(map(_canonical, value)) + ")"
    if isinstance(value, dict):
        items = sorted(_canonical(key) + ":" + _canonical(item) for key, item in value.items())
        return "{" + ",".join(items) + "}"
    if isinstance(value, (set, frozenset)):
        prefix = "frozenset" if isinstance(value, frozenset) else "set"
        return prefix + "{" + ",".join(sorted(map(_canonical, value))) + "}"
    if isinstance(value, uuid.UUID):
        return f"UUID({value})"
    if isinstance(value, decimal.Decimal):
        if not value.is_finite():
            raise _NoKey(f"{value!r} is not a finite number")
        return f"Decimal({value})"
    if isinstance(value, (datetime.date, datetime.time)):  # datetime is a date
        return f"{type(value).__name__}({value.isoformat()})"
    if isinstance(value, datetime.timedelta):
        return f"timedelta({value.days},{value.seconds},{value.microseconds})"
    if (dataclasses.is_dataclass(value) and not isinstance(value, type)) or hasattr(value, "_fields"):
        fields = (
            [(field.name, getattr(value, field.name)) for field in dataclasses.fields(value)]
            if dataclasses.is_dataclass(value)
            else list(zip(value._fields, value, strict=True))  # a named tuple
        )
        return _type_name(value) + "{" + ",".join(f"{name}:{_canonical(item)}" for name, item in fields) + "}"
    raise _NoKey(
        f"{type(value).__qualname__} has no canonical form: pass a str, an int or a value built "
        "of None, bools, numbers, str, bytes, lists, tuples, dicts, sets, UUIDs, decimals, "
        "dates, enums and dataclasses, or give the loader a template without this parameter"
    )


def _type_name(value: Any) -> str:
    kind = type(value)
    return f"{kind.__module__}.{kind.__qualname__}"


_INTS_ONLY = {int}  # the types of a page of plain int ids (a bool is not one)
_INT_KEYS_KEPT = 4096  # a many-key loader's int ids whose keys it keeps printed (``KeyBuilder.value_keys``)
# Ints shorter than this print in decimal under any limit Python allows (none is below
# the threshold, 640 digits): a kept key never depends on sys.set_int_max_str_digits.
_ALWAYS_DECIMAL = 10 ** (getattr(getattr(sys, "int_info", None), "str_digits_check_threshold", 640) - 1)


def _max_int_digits() -> int:
    """The most decimal digits Python prints of an int (0: no limit)."""
    limit = getattr(sys, "get_int_max_str_digits", None)
    return int(limit()) if limit is not None else 0


def _int_key(value: int) -> str:
    """An int argument's key text: decimal, as its str would be. ``~0x..`` when too long."""
    try:
        return str(value)
    except ValueError:
        return "~" + _int_text(value)


def _int_text(value: int) -> str:
    """Decimal, or ``0x`` hex for an int longer than Python will print in decimal."""
    try:
        return str(value)
    except ValueError:  # beyond sys.get_int_max_str_digits()
        return ("-0x" if value < 0 else "0x") + format(abs(value), "x")


class KeyBuilder:
    """Builds the keys of a loader's entries from the arguments of each call."""

    def __init__(
        self, func: Callable[..., Any], template: str | None, namespace: str, max_key_length: int, version: str = ""
    ) -> None:
        """``version``: the identity of the value type the entries hold (``_core.versions``),
        ended to each entry as ``~v:<version>``: no argument renders a ``~`` (it is
        escaped), so two versions of a loader never share an entry, nor one with a loader
        without a version."""
        self._signature = inspect.signature(func)
        params = self._signature.parameters
        self._names = list(params)
        # Plain positional calls bind by zip, which is what keeps the hit path cheap.
        self._zip_ok = all(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) for p in params.values())
        self._namespace = namespace
        self._max_length = max_key_length
        self.default_name: str | None = None
        if template is None:
            self.default_name = default_name(func)
            keyed = self._names[1:] if self._names[:1] in (["self"], ["cls"]) else self._names
            fields: list[tuple[str, str | None]] = [(self.default_name, None)] + [(":", name) for name in keyed]
        else:
            fields = _parse_template(template, set(self._names))
        self.template = template if template is not None else str(self.default_name)  # what traces name entries by
        # The entry as a format string with one {} per field (literals never hold braces),
        # and the index of the parameter each {} takes.
        self._format = "".join(literal + ("" if name is None else "{}") for literal, name in fields)
        if version:
            self._format += "~v:" + escape(version)  # escaped: no brace, no "~"
        self._fields = [self._names.index(name) for _, name in fields if name is not None]
        self.fields = frozenset(name for _, name in fields if name is not None)  # the parameters it renders
        # The entry of a template without fields: the same for every call.
        self.fixed_entry = shorten(self._format, max_key_length) if not self._fields else None
        # Most templates have one field: their entry is text before + argument + text after,
        # joined with no format call (the hit path renders a key on every call).
        self._single = self._fields[0] if len(self._fields) == 1 else None
        self._before, _, self._after = self._format.partition("{}")
        self._arity = len(self._names)
        self._unkeyed_first = self._names[:1] in (["self"], ["cls"]) and 0 not in self._fields
        self._prefix = f"{namespace}:{{"
        # A many-key loader's page keys of plain int ids, by id (``value_keys``): printing
        # an int costs more than the rest of a warm entry's own work. Bounded: emptied
        # when full.
        self._int_keys: dict[int, str] = {}

    def _render(self, value: Any, index: int) -> str:
        return render(value, name=f"argument {self._names[index]!r}")

    def _text(self, value: Any, index: int) -> str:
        """``_render``, with a plain int's ``str()`` first (the common case, and cheap)."""
        if type(value) is int:
            try:
                return str(value)
            except ValueError:  # too long for str(): _render writes it in hex
                pass
        return self._render(value, index)

    def keys(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> EntryKeys:
        """The keys of the entry that ``func(*args, **kwargs)`` loads."""
        return EntryKeys.for_value(self.value_key(args, kwargs))

    def value_key(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
        """The key of the value alone: all a hit needs."""
        if not kwargs and self._zip_ok and len(args) == self._arity:
            values: Any = args
        else:
            try:
                call = self._signature.bind(*args, **kwargs)  # TypeError, as calling func would
            except TypeError:
                if not self._unkeyed_first:
                    raise
                # Cls.method.key(x): the self or cls the key leaves out may be left out here
                # (a classmethod over the loader is not bound on Python 3.13+).
                call = self._signature.bind(None, *args, **kwargs)
            call.apply_defaults()
            values = [call.arguments[name] for name in self._names]
        index = self._single
        if index is not None:
            entry = self._before + self._text(values[index], index) + self._after
        else:
            entry = self._format.format(*[self._text(values[index], index) for index in self._fields])
        if len(entry) > self._max_length:
            entry = shorten(entry, self._max_length)
        return self._prefix + entry + "}"

    def value_keys(self, values: list[Any], index: int, ids: Sequence[Any]) -> list[str]:
        """The value key of each of ``ids`` put in place of ``values[index]`` (every
        parameter's value, in order): a many-key loader's entries. A template whose one
        field is the id joins text, as ``value_key`` does."""
        if self._single != index:
            keys = []
            for id_ in ids:
                values[index] = id_
                keys.append(self.value_key(tuple(values), {}))
            return keys
        prefix, before, after, limit, text = self._prefix, self._before, self._after, self._max_length, self._text
        ints = bool(ids) and {*map(type, ids)} == _INTS_ONLY  # (a bool is not one: True would find 1's key)
        if ints:
            try:
                return list(map(self._int_keys.__getitem__, ids))
            except KeyError:
                pass
        digits = max(0, limit - len(before) - len(after) - 1)  # ints within it need no shortening,
        printable = _max_int_digits()  # nor another form (``_int_key``): one canonical form for both paths
        bound = 10 ** (min(digits, printable - 1) if printable else digits)
        if ints and -bound < (low := min(ids)) and (high := max(ids)) < bound:  # one join each
            head, tail = prefix + before, after + "}"
            keys = [f"{head}{id_}{tail}" for id_ in ids]
            if -_ALWAYS_DECIMAL < low and high < _ALWAYS_DECIMAL:  # their keys are these under any limit
                known = self._int_keys
                if len(known) + len(keys) > _INT_KEYS_KEPT:
                    known.clear()  # (another thread's page may be filling it too: a key is the same whoever prints it)
                known.update(zip(ids, keys, strict=True))
            return keys
        keys = []
        for id_ in ids:
            entry = before + text(id_, index) + after
            if len(entry) > limit:
                entry = shorten(entry, limit)
            keys.append(prefix + entry + "}")
        return keys


def shorten(entry: str, max_length: int) -> str:
    """``entry``, or when longer than ``max_length`` a readable prefix, ``#`` and a hash of
    the whole (see the module docstring)."""
    if len(entry) <= max_length:
        return entry
    digest = hashlib.sha256(entry.encode()).hexdigest()[:_HASH_CHARS]
    return entry[: max_length - _HASH_CHARS - 1] + "#" + digest


def default_name(func: Callable[..., Any]) -> str:
    """``module.qualname`` of a loader without a template, if that names it alone."""
    module, qualname = getattr(func, "__module__", None), getattr(func, "__qualname__", None)
    if not isinstance(module, str) or not isinstance(qualname, str):
        raise ConfigError(
            f"{func!r} has no module and qualified name to build its keys from (a functools.partial "
            'or a callable object?): give it a key template, e.g. cached_loader("orders:{order_id}")'
        )
    if "<" in qualname:
        raise ConfigError(
            f"{module}.{qualname} is not a unique name: every lambda, and every function defined "
            "inside another (each loader a factory makes), has the same one, and they would share "
            "cached values. Give it a key template naming what it loads, e.g. "
            'cached_loader("orders:{order_id}")'
        )
    name = f"{module}.{qualname}"
    if _FORBIDDEN_IN_TEMPLATE.search(name):
        raise ConfigError(f"{name!r} cannot start a key (braces, '#', '~' or whitespace): give it a key template")
    return name


def _parse_template(template: str, names: set[str]) -> list[tuple[str, str | None]]:
    if not isinstance(template, str) or not template:
        raise ConfigError(f"a key template must be a non-empty str, got {template!r}")
    parts: list[tuple[str, str | None]] = []
    try:
        parsed = list(string.Formatter().parse(template))
    except ValueError as error:
        raise ConfigError(f"key template {template!r} is malformed: {error}") from None
    for literal, field, spec, conversion in parsed:
        if _FORBIDDEN_IN_TEMPLATE.search(literal):
            raise ConfigError(f"key template {template!r}: literal text may not contain braces, '#', '~' or whitespace")
        if field is not None:
            if field not in names:
                raise ConfigError(
                    f"key template {template!r} names {{{field}}}, which is not a parameter "
                    f"of the loader (parameters: {', '.join(sorted(names)) or 'none'})"
                )
            if spec or conversion:
                raise ConfigError(f"key template {template!r}: fields take no format spec or conversion")
        parts.append((literal, field))
    return parts
