"""What the Redis backend's commands reply, as the store contract's values: shared by the
blocking and asyncio stores and their many-key commands (``batches``)."""

from __future__ import annotations

from typing import Any

from ..._core.codec import stale_window_of
from ..._core.store import AcquireReply, LockState


def acquire_reply(reply: Any) -> AcquireReply:
    """The ACQUIRE script's reply as the flow's ``AcquireReply``."""
    state = reply[0]
    if state == 1:
        pttl = int(reply[2]) if len(reply) > 2 else -1
        return AcquireReply(LockState.VALUE, reply[1], ttl_left=pttl / 1000 if pttl >= 0 else -1.0)
    if state == 2:
        return AcquireReply(LockState.LOCKED, fence=int(reply[1]) if len(reply) > 1 else 0)
    if state == 4:
        return AcquireReply(LockState.LEASE_GONE)
    failed = len(reply) > 2 and int(reply[2]) == 1
    holder = reply[3] if len(reply) > 3 else b""
    if isinstance(holder, bytes):
        holder = holder.decode("ascii", "replace")
    return AcquireReply(LockState.HELD, lease_left=max(int(reply[1]), 0) / 1000, failed=failed, holder=holder)


def acquire_reading_clock_reply(reply: Any) -> AcquireReply:
    """The ACQUIRE_READING_CLOCK script's reply: ACQUIRE's, with the tag clock it read
    once the lock was taken (``AcquireReply.since``)."""
    if len(reply) > 1:  # ACQUIRE's {2}: the lock taken
        return AcquireReply(LockState.LOCKED, since=int(reply[1]))
    return acquire_reply(reply[0])


def queue_read_with_ttl(pipeline: Any, key: str) -> Any:
    """Queue the commands of ``Store.get_with_ttl`` on a pipeline, blocking or asyncio:
    GET and PTTL of ``key``. The pipeline's replies go to ``with_ttl``."""
    pipeline.get(key)
    pipeline.pttl(key)
    return pipeline


def with_ttl(raw: Any, pttl: Any) -> tuple[bytes | None, float, bool]:
    """A GET and a PTTL of one key, sent together: the value, its seconds left (-1: no
    expiry), and False (not known to be failing: see ``asks_failing``). They are not one
    atomic step: a key deleted between them (PTTL -2) is read as absent. A key rewritten
    between them pairs the old value with the new TTL, which serves a value replaced a
    moment ago as fresh, as a GET sent a moment earlier would have."""
    pttl = int(pttl)
    if raw is None or pttl == -2:
        return None, 0.0, False
    return raw, -1.0 if pttl < 0 else pttl / 1000, False


def asks_failing(read: tuple[bytes | None, float, bool], failing: bool) -> bool:
    """Whether the failing marker of a value ``read`` must be read too: if ``failing``
    asks, and only for a value past its ttl (its seconds left are within the stale window
    its envelope gives). A fresh hit never needs it, so it costs two commands, not three:
    the EXISTS is sent after, for a stale value only (see ``_core.freshness``)."""
    raw, ttl_left = read[0], read[1]
    return failing and raw is not None and 0 <= ttl_left <= stale_window_of(raw)


def marked(read: tuple[bytes | None, float, bool], exists: Any) -> tuple[bytes | None, float, bool]:
    """``read``, with what the EXISTS of its failing marker replied."""
    return read[0], read[1], bool(exists)


def relayed(reply: Any, after: int) -> list[bytes]:
    """The records of one relay's ``XREAD`` reply from place ``after`` on, in order, as
    long as their places follow each other: a relay whose first records expired reads as
    empty from the start, never as a stream that begins in its middle. RESP2 answers a
    list of ``[stream, entries]``, RESP3 a map of stream to entries, a read that found
    nothing None."""
    if not reply:
        return []
    streams = reply.values() if isinstance(reply, dict) else [entries for _, entries in reply]
    records: list[bytes] = []
    for entries in streams:
        for place, fields in entries or ():
            if _place(place) != after + len(records) + 1:
                return records
            if not isinstance(fields, dict):  # a flat field list
                fields = dict(zip(fields[::2], fields[1::2], strict=True))
            record = fields.get(b"r", fields.get("r"))
            if record is None:
                return records
            records.append(record if isinstance(record, bytes) else str(record).encode())
    return records


def _place(entry_id: Any) -> int:
    """The place of a relay's record from its stream entry id (``0-<place>``)."""
    text = entry_id.decode() if isinstance(entry_id, bytes) else str(entry_id)
    return int(text.partition("-")[2] or -1)
