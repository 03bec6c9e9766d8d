"""A typed serializer over pydantic (optional: ``pip install 'stampede-guard[pydantic]'``):
values are validated into the loader's return annotation, so a pydantic model (or a list
of them, a dataclass, a datetime, ``Model | None``) comes back as itself, for the caller
who loaded and every later hit alike: what ``MsgspecSerializer`` does, for applications
whose types are pydantic's.

The layer hands each loader's return annotation to ``for_type`` when it decorates it. A
value that does not match it is refused when loaded (``SerializationError``: pydantic is
asked to fail, not to warn and write it as it can), and bytes that do not validate into
it are a miss, as any unreadable value is.
"""

from __future__ import annotations

from typing import Any

from .._errors import ConfigError
from .codec import reject_non_finite


class PydanticSerializer:
    """pydantic's JSON, through a ``TypeAdapter`` of ``type`` (Any: plain JSON types)."""

    def __init__(self, type: Any = Any) -> None:
        try:
            import pydantic
        except ImportError:
            raise ConfigError("PydanticSerializer needs pydantic 2: pip install 'stampede-guard[pydantic]'") from None
        self.type = type
        try:
            self._adapter: Any = pydantic.TypeAdapter(type)
        except Exception as error:  # PydanticSchemaGenerationError, or a TypeError from a bad type
            raise ConfigError(f"pydantic cannot validate into {type!r}: {error}") from None

    def for_type(self, type: Any) -> PydanticSerializer:
        """This serializer for a loader that returns ``type``. One made for a type of
        its own (``PydanticSerializer(Order)``) keeps it."""
        return PydanticSerializer(type) if self.type is Any else self

    def dumps(self, value: Any) -> bytes:
        payload: bytes = self._adapter.dump_json(value, warnings="error")
        reject_non_finite(payload, value)
        return payload

    def loads(self, data: bytes) -> Any:
        return self._adapter.validate_json(data)

    def __repr__(self) -> str:
        return f"stampede.PydanticSerializer({self.type!r})"
