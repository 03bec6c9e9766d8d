"""A typed serializer (optional: ``pip install 'stampede-guard[msgspec]'``): values are decoded
into the loader's return annotation, so a dataclass, a datetime, a UUID, a tuple or an
enum comes back as itself, for the caller who loaded and every later hit alike.

The layer hands each loader's return annotation to ``for_type`` when it decorates it. A
value that does not match it is refused when loaded (``SerializationError``), and bytes
that do not decode into it are a miss, as any unreadable value is.
"""

from __future__ import annotations

from typing import Any

from .._errors import ConfigError
from .codec import reject_non_finite


class MsgspecSerializer:
    """msgspec's JSON, decoded into ``type`` (Any: plain JSON types, as orjson reads)."""

    def __init__(self, type: Any = Any) -> None:
        try:
            import msgspec
        except ImportError:
            raise ConfigError("MsgspecSerializer needs msgspec: pip install 'stampede-guard[msgspec]'") from None
        self.type = type
        self._encoder = msgspec.json.Encoder()
        try:
            self._decoder = msgspec.json.Decoder(type)
        except TypeError as error:
            raise ConfigError(f"msgspec cannot decode into {type!r}: {error}") from None

    def for_type(self, type: Any) -> MsgspecSerializer:
        """This serializer for a loader that returns ``type``. One made for a type of
        its own (``MsgspecSerializer(Order)``) keeps it."""
        return MsgspecSerializer(type) if self.type is Any else self

    def dumps(self, value: Any) -> bytes:
        payload: bytes = self._encoder.encode(value)
        reject_non_finite(payload, value)
        return payload

    def loads(self, data: bytes) -> Any:
        return self._decoder.decode(data)

    def __repr__(self) -> str:
        return f"stampede.MsgspecSerializer({self.type!r})"
