"""The value envelope: what a cache entry holds, and how raw bytes are classified.

Layout (version 1), a fixed header then the serializer's payload::

    0   2  magic b"\\xa7S"
    2   1  envelope version (1)
    3   1  kind: 1 value, 2 null sentinel
    4   8  loaded_at: when the load started, seconds since the epoch (big-endian double)
    12  4  load_duration: seconds the loader took (big-endian float)
    16  -  payload: serializer.dumps(value); empty for the null sentinel

loaded_at and load_duration are what stale-while-revalidate and probabilistic early
refresh need. Bytes that do not parse (another program's value, an old version, a
payload the serializer rejects) classify as CORRUPT, which callers treat as a miss.
"""

from __future__ import annotations

import dataclasses
import enum
import math
import struct
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import orjson

from .._errors import SerializationError

_HEADER = struct.Struct(">2sBBdf")
_MAGIC = b"\xa7S"
_VERSION = 1
_VALUE, _NULL = 1, 2
_VALUE_PREFIX = _MAGIC + bytes((_VERSION, _VALUE))


class Serializer(Protocol):
    """A dumps/loads pair; the default is orjson. Never pickle data others can write to."""

    def dumps(self, value: Any) -> bytes: ...

    def loads(self, data: bytes) -> Any: ...


class JsonSerializer:
    """orjson: JSON types, plus dataclasses, datetimes and UUIDs (which read back as str).
    NaN and infinities are refused: JSON has no form for them (orjson would write null)."""

    def dumps(self, value: Any) -> bytes:
        payload = orjson.dumps(value)
        reject_non_finite(payload, value)
        return payload

    def loads(self, data: bytes) -> Any:
        return orjson.loads(data)


@runtime_checkable
class TypedSerializer(Serializer, Protocol):
    """A serializer that decodes into a loader's return type: the layer calls
    ``for_type`` with each loader's return annotation when it decorates it."""

    def for_type(self, type: Any) -> Serializer: ...


def reject_non_finite(payload: bytes, value: Any) -> None:
    """Raise ValueError if ``value`` held NaN or an infinity, which JSON writes as null."""
    if b"null" in payload and _has_non_finite(value):
        raise ValueError("NaN and infinity have no JSON form (they would read back as None)")


def _has_non_finite(value: Any) -> bool:
    """Whether a float that is NaN or infinite hides in ``value`` (as orjson walks it)."""
    if isinstance(value, float):
        return not math.isfinite(value)
    if isinstance(value, (list, tuple)):
        return any(map(_has_non_finite, value))
    if isinstance(value, dict):
        return any(map(_has_non_finite, value.values()))
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return any(_has_non_finite(getattr(value, field.name)) for field in dataclasses.fields(value))
    return False


class _NotAValue(enum.Enum):
    NOT_A_VALUE = "not a value"


NOT_A_VALUE = _NotAValue.NOT_A_VALUE


class Kind(enum.Enum):
    VALUE = "value"
    NULL = "null"
    CORRUPT = "corrupt"


@dataclass(frozen=True, slots=True)
class Decoded:
    kind: Kind
    value: Any = None
    loaded_at: float = 0.0
    load_duration: float = 0.0
    problem: str = ""


class Codec:
    """Encodes loaded values into envelopes and classifies what a key holds."""

    def __init__(self, serializer: Serializer | None = None) -> None:
        self.serializer: Serializer = serializer if serializer is not None else JsonSerializer()

    def encode(self, value: Any, loaded_at: float, load_duration: float, *, key: str) -> bytes:
        """The envelope for ``value``; None becomes the null sentinel."""
        if value is None:
            return _HEADER.pack(_MAGIC, _VERSION, _NULL, loaded_at, load_duration)
        try:
            payload = self.serializer.dumps(value)
        except Exception as error:
            raise SerializationError(
                f"cannot cache the value loaded for {key!r}: {type(value).__qualname__} "
                f"is not serializable ({error}); nothing was written",
                key=key,
            ) from error
        if not isinstance(payload, bytes):
            raise SerializationError(
                f"serializer.dumps returned {type(payload).__qualname__}, not bytes, for {key!r}",
                key=key,
            )
        return _HEADER.pack(_MAGIC, _VERSION, _VALUE, loaded_at, load_duration) + payload

    def read_back(self, envelope: bytes, *, key: str) -> Any:
        """The value as every later reader will get it from ``envelope`` (which ``encode``
        made): the loader's own object goes to nobody, so the caller who loaded gets what
        the callers who hit get (a tuple comes back a list, a datetime a str, under JSON)."""
        if envelope[3] == _NULL:
            return None
        try:
            return self.serializer.loads(envelope[_HEADER.size :])
        except Exception as error:
            raise SerializationError(
                f"the value loaded for {key!r} does not read back through the serializer "
                f"({error}); nothing was written",
                key=key,
            ) from error

    def decode_hit(self, raw: bytes) -> Any:
        """The value in ``raw`` if it is a readable value envelope, else ``NOT_A_VALUE``
        (then ``decode`` tells why). The hit path: no metadata, no allocation."""
        if raw[:4] == _VALUE_PREFIX and len(raw) > _HEADER.size:
            try:
                return self.serializer.loads(raw[_HEADER.size :])
            except Exception:
                pass
        return NOT_A_VALUE

    def decode(self, raw: bytes) -> Decoded:
        """Classify ``raw`` as a value, the null sentinel or corrupt; never raises."""
        try:
            magic, version, kind, loaded_at, duration = _HEADER.unpack_from(raw)
        except struct.error:
            return Decoded(Kind.CORRUPT, problem=f"{len(raw)} bytes, shorter than an envelope")
        if magic != _MAGIC or version != _VERSION:
            return Decoded(Kind.CORRUPT, problem="not a stampede envelope of a known version")
        if kind == _NULL and len(raw) == _HEADER.size:
            return Decoded(Kind.NULL, None, loaded_at, duration)
        if kind != _VALUE:
            return Decoded(Kind.CORRUPT, problem=f"unknown envelope kind {kind}")
        try:
            value = self.serializer.loads(raw[_HEADER.size :])
        except Exception as error:
            return Decoded(Kind.CORRUPT, problem=f"payload does not deserialize ({error})")
        return Decoded(Kind.VALUE, value, loaded_at, duration)
