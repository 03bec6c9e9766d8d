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
Bytes are ``~x`` and their hex; any other value is ``~`` plus its escaped canonical JSON;
no str or int renders as either. Without a template the entry is ``module.qualname`` and
every parameter in signature order. An entry longer than ``max_key_length`` keeps a
readable prefix and ends in ``#`` plus a SHA-256 of the whole; ``#`` never occurs otherwise.
"""

from __future__ import annotations

import hashlib
import inspect
import re
import string
from dataclasses import dataclass
from typing import Any, Callable

import orjson

from ._errors import ConfigError, InvalidKey

_ESCAPED = re.compile(r"[%:{}#~\x00-\x20\x7f\ud800-\udfff]")
_FORBIDDEN_IN_TEMPLATE = re.compile(r"[{}#~\x00-\x20\x7f]")
_HASH_CHARS = 40


@dataclass(frozen=True, slots=True)
class EntryKeys:
    """The Redis keys (and channel) of one cache entry; all in one hash slot."""

    value: str
    lock: str
    channel: str

    @property
    def queue(self) -> tuple[str, str, str]:
        """A fair lock's queue, its waiters' leases and its ticket counter."""
        return self.lock + ":queue", self.lock + ":waiters", self.lock + ":tickets"

    @property
    def on_lock_servers(self) -> EntryKeys:
        """The keys of a load's lease on Redlock's lock servers: a lock key (and a channel,
        which nobody listens to) of its own, so the cache server can be a lock server too."""
        return EntryKeys(self.value, self.lock + ":majority", self.channel + ":majority")

    @classmethod
    def for_value(cls, value_key: str) -> EntryKeys:
        """The lock and channel that go with a value key from ``KeyBuilder.value_key``."""
        return cls(value_key, value_key + ":lock", value_key + ":notify")


def lock_keys(namespace: str, name: str, max_key_length: int) -> EntryKeys:
    """The keys of the named lock ``name``: its lease, its channel and, in the place of a
    value, its fencing counter. The entry starts with ``~lock:``, which no template (no
    ``~`` allowed) and no argument (``~`` is escaped; values start ``~x`` or ``~`` and JSON)
    can produce, so a named lock never shares a key with a cache entry."""
    if not isinstance(name, str) or not name:
        raise ConfigError(f"a lock name must be a non-empty str, got {name!r}")
    entry = "~lock:" + escape(name)
    if len(entry) > max_key_length:
        digest = hashlib.sha256(entry.encode()).hexdigest()[:_HASH_CHARS]
        entry = entry[: max_key_length - _HASH_CHARS - 1] + "#" + digest
    base = f"{namespace}:{{{entry}}}"
    return EntryKeys(base + ":fence", base + ":lock", base + ":notify")


def escape(text: str) -> str:
    """Percent-escape the characters that could forge a separator or a hash tag."""
    if _ESCAPED.search(text) is None:
        return text
    return _ESCAPED.sub(lambda match: "%{:02X}".format(ord(match.group())), text)


def render(value: Any, *, name: str = "argument") -> str:
    """The key text of one argument value (see the module docstring for the rules)."""
    kind = type(value)
    if kind is str:
        return escape(value)
    if kind is int:
        return str(value)
    if kind is bytes:
        return "~x" + bytes(value).hex()
    try:
        encoded = orjson.dumps(value, option=orjson.OPT_SORT_KEYS | orjson.OPT_NON_STR_KEYS)
    except TypeError:
        raise InvalidKey(
            f"{name} of type {kind.__qualname__} cannot be part of a cache key: pass a str, an int "
            "or a JSON-encodable value, or give the loader a template without this parameter"
        ) from None
    return "~" + escape(encoded.decode())


class KeyBuilder:
    """Builds the keys of a loader's entries from the arguments of each call."""

    def __init__(
        self, func: Callable[..., Any], template: str | None, namespace: str, max_key_length: int
    ) -> None:
        self._signature = inspect.signature(func)
        params = self._signature.parameters
        self._names = list(params)
        # Plain positional calls bind by zip, which is what keeps the hit path cheap.
        self._zip_ok = all(
            p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) for p in params.values()
        )
        self._namespace = namespace
        self._max_length = max_key_length
        if template is None:
            prefix = f"{func.__module__}.{func.__qualname__}"
            fields: list[tuple[str, str | None]] = [(prefix, None)] + [(":", name) for name in self._names]
        else:
            fields = _parse_template(template, set(self._names))
        # The entry as a format string with one {} per field (literals never hold braces),
        # and the index of the parameter each {} takes.
        self._format = "".join(literal + ("" if name is None else "{}") for literal, name in fields)
        self._fields = [self._names.index(name) for _, name in fields if name is not None]

    def _render(self, value: Any, index: int) -> str:
        return render(value, name=f"argument {self._names[index]!r}")

    def keys(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> EntryKeys:
        """The keys of the entry that ``func(*args, **kwargs)`` loads."""
        return EntryKeys.for_value(self.value_key(args, kwargs))

    def value_key(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
        """The key of the value alone: all a hit needs."""
        if not kwargs and self._zip_ok and len(args) == len(self._names):
            values: Any = args
        else:
            call = self._signature.bind(*args, **kwargs)  # TypeError, as calling func would
            call.apply_defaults()
            values = [call.arguments[name] for name in self._names]
        rendered = []
        for index in self._fields:
            value = values[index]
            rendered.append(str(value) if type(value) is int else self._render(value, index))
        entry = self._format.format(*rendered)
        if len(entry) > self._max_length:
            entry = self._shorten(entry)
        return f"{self._namespace}:{{{entry}}}"

    def _shorten(self, entry: str) -> str:
        digest = hashlib.sha256(entry.encode()).hexdigest()[:_HASH_CHARS]
        return entry[: self._max_length - _HASH_CHARS - 1] + "#" + digest


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
            raise ConfigError(
                f"key template {template!r}: literal text may not contain braces, '#', '~' or whitespace"
            )
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
