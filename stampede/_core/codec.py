"""The value envelope: what a cache entry holds, and how raw bytes are classified.

Layout, a fixed header then the serializer's payload::

    0   2  magic b"\\xa7S"
    2   1  envelope version: 1, or 2 for a value kept past its ttl
    3   1  kind: 1 value, 2 null sentinel, 3 or 4 a value whose payload is compressed
           (zlib, zstd: see _core.compression)
    4   8  loaded_at: when the load started, seconds since the epoch (big-endian double)
    12  4  load_duration: seconds the loader took (big-endian float)
    16  8  version 2 only: stale_for, the seconds the value is kept past its ttl (double)
    -   -  payload: serializer.dumps(value). Empty for the null sentinel

A value written with a stale window (``Settings.stale_window``) lives in the store for
its ttl plus ``stale_for``, so it is fresh while the store's remaining TTL is more than
``stale_for``: no clock but the store's decides (see ``_core.freshness``). The first 16
bytes tell one load's value from another's (``identity``). load_duration is XFetch's
delta. Version 1 is still written when there is no stale window, so readers of either
version read what the other writes. Bytes that do not parse (another program's value,
an unknown version, a payload the serializer rejects) classify as CORRUPT, which callers
treat as a miss.
"""

from __future__ import annotations

import dataclasses
import enum
import math
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol, cast, runtime_checkable

import orjson

from .._errors import SerializationError
from .compression import BY_KIND, compressor
from .results import NOT_MODIFIED, Cached

_HEADER = struct.Struct(">2sBBdf")
_STALE_FOR = struct.Struct(">d")  # after the header, in version 2
_HEADER_2_SIZE = _HEADER.size + _STALE_FOR.size
_MAGIC = b"\xa7S"
_VERSION, _VERSION_2 = 1, 2
_VALUE, _NULL = 1, 2
_VALUE_PREFIX = _MAGIC + bytes((_VERSION, _VALUE))
_VALUE_PREFIX_2 = _MAGIC + bytes((_VERSION_2, _VALUE))
IDENTITY_BYTES = _HEADER.size
"""How many leading bytes of an envelope tell one load's value from another's."""


class Serializer(Protocol):
    """A dumps/loads pair. The default is orjson. Never pickle data others can write to."""

    def dumps(self, value: Any) -> bytes: ...

    def loads(self, data: bytes) -> Any: ...


class JsonSerializer:
    """orjson: JSON types, plus dataclasses, datetimes and UUIDs (which read back as str).
    NaN and infinities are refused: JSON has no form for them (orjson would write null)."""

    reads_back = True
    """Every payload ``dumps`` makes, ``loads`` reads (orjson writes only valid JSON): a
    write whose value nobody is handed (``set``) need not read it back to know."""

    def dumps(self, value: Any) -> bytes:
        payload = orjson.dumps(value)
        reject_non_finite(payload, value)
        return payload

    # orjson's own function, not a method calling it: a hit decodes with no Python frame
    loads = staticmethod(orjson.loads)


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
    stale_for: float = 0.0  # seconds the store keeps it past its ttl
    problem: str = ""


def identity(raw: bytes) -> bytes:
    """What tells this envelope's load from any other: its header (when the load began,
    how long it took). A refresh locks over a stale value only if it is still this one."""
    return raw[:IDENTITY_BYTES]


def loaded_at_of(raw: bytes) -> float | None:
    """When the load of the envelope ``raw`` began (its header's ``loaded_at``), without
    decoding its payload; None for bytes that are not an envelope of a known version."""
    if len(raw) < _HEADER.size or raw[:2] != _MAGIC or raw[2] not in (_VERSION, _VERSION_2):
        return None
    return float(_HEADER.unpack_from(raw)[3])


def stale_window_of(raw: bytes) -> float:
    """The ``stale_for`` written in an envelope (0 for version 1, or for bytes that are
    not an envelope)."""
    if len(raw) >= _HEADER_2_SIZE and raw[:2] == _MAGIC and raw[2] == _VERSION_2:
        (stale_for,) = _STALE_FOR.unpack_from(raw, _HEADER.size)
        return float(stale_for)
    return 0.0


class Codec:
    """Encodes loaded values into envelopes and classifies what a key holds.
    ``compress_above``: payloads longer than this many bytes are compressed with
    ``compression`` (0: never). ``max_value_bytes``: a compressed payload that would
    expand past it reads as corrupt."""

    def __init__(
        self,
        serializer: Serializer | None = None,
        *,
        compress_above: int = 0,
        compression: str = "zlib",
        max_value_bytes: int = 4 * 1024 * 1024,
    ) -> None:
        self.serializer: Serializer = serializer if serializer is not None else JsonSerializer()
        self.compress_above = compress_above
        self._compressor = compressor(compression)
        self.max_value_bytes = max_value_bytes

    def like(self, *, compress_above: int, compression: str, max_value_bytes: int) -> Codec:
        """This codec, or one of the same serializer with these settings if they differ."""
        if (compress_above, compression, max_value_bytes) == (
            self.compress_above,
            self._compressor.name,
            self.max_value_bytes,
        ):
            return self
        return Codec(
            self.serializer, compress_above=compress_above, compression=compression, max_value_bytes=max_value_bytes
        )

    def with_serializer(self, serializer: Serializer) -> Codec:
        """A codec of ``serializer`` with this one's settings."""
        return Codec(
            serializer,
            compress_above=self.compress_above,
            compression=self._compressor.name,
            max_value_bytes=self.max_value_bytes,
        )

    def encode(self, value: Any, loaded_at: float, load_duration: float, *, key: str, stale_for: float = 0.0) -> bytes:
        """The envelope for ``value``. None becomes the null sentinel. ``stale_for``: the
        seconds the store will keep it past its ttl (version 2 if any)."""
        return self.encode_counted(value, loaded_at, load_duration, key=key, stale_for=stale_for)[0]

    def encode_counted(
        self, value: Any, loaded_at: float, load_duration: float, *, key: str, stale_for: float = 0.0
    ) -> tuple[bytes, int, bytes]:
        """``encode``, the bytes compression saved (0: not compressed), and the payload as
        it was before compression (for ``read_back``, which need not expand it again)."""
        kind = _NULL if value is None else _VALUE
        payload = b"" if value is None else self._payload(value, key)
        saved, plain = 0, payload
        if self.compress_above and len(payload) > self.compress_above:
            compressed = self._compressor.compress(payload)
            if len(compressed) < len(payload):
                kind, saved, payload = self._compressor.kind, len(payload) - len(compressed), compressed
        if stale_for > 0:
            header = _HEADER.pack(_MAGIC, _VERSION_2, kind, loaded_at, load_duration) + _STALE_FOR.pack(stale_for)
        else:
            header = _HEADER.pack(_MAGIC, _VERSION, kind, loaded_at, load_duration)
        return header + payload, saved, plain

    def _payload(self, value: Any, key: str) -> bytes:
        if value is NOT_MODIFIED or isinstance(value, Cached):  # (an Enum's isinstance is slow: 0.3 us)
            raise SerializationError(
                f"cannot cache {value!r} for {key!r}: "
                + (
                    "NOT_MODIFIED answers a refresh (the loader keeps the value it refreshes); it is no value to "
                    "cache or set"
                    if value is NOT_MODIFIED
                    else "a Cached holds a value, not another Cached: return Cached(value, ...) once"
                )
                + "; nothing was written",
                key=key,
            )
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
        return payload

    def read_back(self, envelope: bytes, *, key: str, plain: bytes | None = None) -> Any:
        """The value as every later reader will get it from ``envelope`` (which ``encode``
        made): the loader's own object goes to nobody, so the caller who loaded gets what
        the callers who hit get (a tuple comes back a list, a datetime a str, under JSON).
        ``plain``: its payload before compression, if the encoder kept it."""
        if self.is_null(envelope):
            return None
        try:
            return self.serializer.loads(self.payload_of(envelope) if plain is None else plain)
        except Exception as error:
            raise SerializationError(
                f"the value loaded for {key!r} does not read back through the serializer "
                f"({error}); nothing was written",
                key=key,
            ) from error

    def decode_hit(self, raw: bytes) -> Any:
        """The value in ``raw`` if it is a readable value envelope, else ``NOT_A_VALUE``
        (then ``decode`` tells why). The hit path: no metadata, no allocation."""
        prefix = raw[:4]
        if prefix == _VALUE_PREFIX:
            size = _HEADER.size
        elif prefix == _VALUE_PREFIX_2:
            size = _HEADER_2_SIZE
        else:
            return self._decode_compressed(raw)
        if len(raw) > size:
            try:
                return self.serializer.loads(raw[size:])
            except Exception:
                pass
        return NOT_A_VALUE

    def decode_hits(self, raws: Sequence[bytes | None]) -> tuple[list[Any], int]:
        """``decode_hit`` of each of ``raws`` (None stays ``NOT_A_VALUE``), and how many
        were not hits: a many-key call's values, in one loop with no call per value but
        the serializer's.

        A warm page is every entry a plain value of one envelope version: one
        comprehension decodes it, and anything else in it (a miss, a compressed or
        unreadable entry: the comprehension raises or leaves it out) is told apart by
        the loop below, entry by entry, as ``decode_hit`` would."""
        loads, header_size, values, missed = self.serializer.loads, _HEADER.size, [], 0
        first = raws[0] if raws else None
        if first is not None:
            prefix = first[:4]
            size = header_size if prefix == _VALUE_PREFIX else _HEADER_2_SIZE if prefix == _VALUE_PREFIX_2 else 0
            if size:
                page = cast("Sequence[bytes]", raws)  # a miss (None) raises in it: told apart below
                try:
                    values = [loads(raw[size:]) for raw in page if raw[:4] == prefix and len(raw) > size]
                except Exception:  # a miss, or a payload that does not read
                    values = []
                if len(values) == len(raws):
                    return values, 0
                values = []
        for raw in raws:
            value: Any = NOT_A_VALUE
            if raw is not None:
                prefix = raw[:4]
                size = header_size if prefix == _VALUE_PREFIX else _HEADER_2_SIZE if prefix == _VALUE_PREFIX_2 else 0
                if size and len(raw) > size:
                    try:
                        value = loads(raw[size:])
                    except Exception:
                        value = NOT_A_VALUE
                elif not size:
                    value = self._decode_compressed(raw)
            if value is NOT_A_VALUE:
                missed += 1
            values.append(value)
        return values, missed

    def decode(self, raw: bytes) -> Decoded:
        """Classify ``raw`` as a value, the null sentinel or corrupt. Never raises."""
        try:
            magic, version, kind, loaded_at, duration = _HEADER.unpack_from(raw)
        except struct.error:
            return Decoded(Kind.CORRUPT, problem=f"{len(raw)} bytes, shorter than an envelope")
        if magic != _MAGIC or version not in (_VERSION, _VERSION_2):
            return Decoded(Kind.CORRUPT, problem="not a stampede envelope of a known version")
        size = _header_size(raw)
        if len(raw) < size:
            return Decoded(Kind.CORRUPT, problem=f"{len(raw)} bytes, shorter than an envelope")
        stale_for = stale_window_of(raw)
        if kind == _NULL and len(raw) == size:
            return Decoded(Kind.NULL, None, loaded_at, duration, stale_for)
        if kind != _VALUE and kind not in BY_KIND:
            return Decoded(Kind.CORRUPT, problem=f"unknown envelope kind {kind}")
        try:
            payload = self.payload_of(raw)
        except ValueError as error:
            return Decoded(Kind.CORRUPT, problem=f"a compressed payload that does not read ({error})")
        try:
            value = self.serializer.loads(payload)
        except Exception as error:
            return Decoded(Kind.CORRUPT, problem=f"payload does not deserialize ({error})")
        return Decoded(Kind.VALUE, value, loaded_at, duration, stale_for)

    def is_null(self, raw: bytes) -> bool:
        """Whether the envelope ``raw`` is the null sentinel."""
        return len(raw) > 3 and raw[3] == _NULL

    def payload_of(self, raw: bytes) -> bytes:
        """The payload of the envelope ``raw``, expanded if compressed (``ValueError`` if
        that fails, or would pass ``max_value_bytes``)."""
        payload = raw[_header_size(raw) :]
        compressed = BY_KIND.get(raw[3])
        return payload if compressed is None else compressed.decompress(payload, self.max_value_bytes)

    def _decode_compressed(self, raw: bytes) -> Any:
        """``decode_hit`` of an envelope that is not a plain value: the value of a
        compressed one, else ``NOT_A_VALUE``."""
        if len(raw) <= _HEADER.size or raw[:2] != _MAGIC or raw[2] not in (_VERSION, _VERSION_2):
            return NOT_A_VALUE
        if raw[3] not in BY_KIND:
            return NOT_A_VALUE
        try:
            return self.serializer.loads(self.payload_of(raw))
        except Exception:
            return NOT_A_VALUE

    def expanded(self, raw: bytes) -> bytes:
        """``raw`` with its payload expanded, as an uncompressed envelope would be (the
        near cache keeps copies so, decoding each hit without expanding it again). The
        envelope itself if it is not compressed, or does not expand."""
        if len(raw) <= _HEADER.size or raw[3] not in BY_KIND:
            return raw
        try:
            payload = self.payload_of(raw)
        except ValueError:
            return raw
        header = bytearray(raw[: _header_size(raw)])
        header[3] = _VALUE
        return bytes(header) + payload


def _header_size(raw: bytes) -> int:
    return _HEADER_2_SIZE if raw[2] == _VERSION_2 else _HEADER.size
