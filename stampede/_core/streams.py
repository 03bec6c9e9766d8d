"""A streamed load's records: its chunks as they travel through the relay and as they
are kept, with the same boundaries, in one entry. No I/O here.

A chunk is ``bytes`` (kept as it is) or a value of the loader's serializer (a token's
``str``, an event's ``dict``). The relay of one run (``StreamStore``) holds, in order,
one record per chunk and then one record that ends the run: ``END`` (the whole stream
was relayed) or ``FAILED`` with what went wrong. The entry holds the chunks' records
framed, each behind its length, so that a replay hands out the chunks the leader made.
"""

from __future__ import annotations

import enum
import struct
from collections.abc import Iterable
from typing import Any

from .codec import Serializer

CHUNK = b"c"  # a chunk follows
END = b"e"  # the run made its whole stream
FAILED = b"x"  # the run stopped, and what went wrong follows, as text


class _Restarted(enum.Enum):
    STREAM_RESTARTED = "stream restarted"


STREAM_RESTARTED = _Restarted.STREAM_RESTARTED
"""What a streamed call with ``on_leader_failure="restart"`` hands its caller, between two
chunks, when the run it was receiving stopped and a new one began: drop what came
before it, the next chunk is the new run's first."""

_BYTES = b"b"  # a chunk that is bytes, as it is
_VALUE = b"v"  # a chunk that is a value, as the serializer wrote it
_LENGTH = struct.Struct(">I")
_WHOLE = b"S"  # what a whole stream's payload begins with


def chunk_record(chunk: Any, serializer: Serializer) -> bytes:
    """The relay record of ``chunk``."""
    if isinstance(chunk, (bytes, bytearray, memoryview)):
        return CHUNK + _BYTES + bytes(chunk)
    payload = serializer.dumps(chunk)
    if not isinstance(payload, bytes):
        raise TypeError(f"serializer.dumps returned {type(payload).__qualname__}, not bytes")
    return CHUNK + _VALUE + payload


def failed_record(error: BaseException) -> bytes:
    """The record that tells listeners the run stopped, and why (the type's name and its
    message, never a traceback)."""
    text = f"{type(error).__qualname__}: {error}" if str(error) else type(error).__qualname__
    return FAILED + text[:500].encode(errors="replace")


def chunk_of(record: bytes, serializer: Serializer) -> Any:
    """The chunk a chunk record carries (``record`` without its ``CHUNK`` mark)."""
    kind, payload = record[:1], record[1:]
    if kind == _BYTES:
        return payload
    if kind == _VALUE:
        return serializer.loads(payload)
    raise ValueError(f"not a chunk record: {bytes(record[:8])!r}")


class FramedChunks:
    """The serializer of a whole stream as its entry keeps it: a mark, then the chunk
    records (each with its kind, without the ``CHUNK`` mark), each behind its length. The
    mark makes an empty stream a payload too. A payload without it, or whose frames do not
    add up, reads as no value (the entry is then a miss)."""

    reads_back = True

    def dumps(self, value: Iterable[bytes]) -> bytes:
        return _WHOLE + b"".join(_LENGTH.pack(len(record)) + record for record in value)

    def loads(self, data: bytes) -> list[bytes]:
        if data[:1] != _WHOLE:
            raise ValueError("not a stream's payload")
        records, at, size = [], 1, len(data)
        view = memoryview(data)
        while at < size:
            if at + _LENGTH.size > size:
                raise ValueError("a stream's frame is cut short")
            (length,) = _LENGTH.unpack_from(view, at)
            at += _LENGTH.size
            if at + length > size:
                raise ValueError("a stream's frame is cut short")
            records.append(bytes(view[at : at + length]))
            at += length
        return records
