"""What the Redis backend's commands reply, as the store contract's values: shared by the
blocking and asyncio stores and their many-key commands (``batches``)."""

from __future__ import annotations

from typing import Any

from ..._core.keys import failing_key
from ..._core.store import AcquireReply, LockState


def acquire_reply(reply: Any) -> AcquireReply:
    """The ACQUIRE script's reply as the flow's ``AcquireReply``."""
    state = reply[0]
    if state == 1:
        return AcquireReply(LockState.VALUE, reply[1])
    if state == 2:
        return AcquireReply(LockState.LOCKED, fence=int(reply[1]) if len(reply) > 1 else 0)
    failed = len(reply) > 2 and int(reply[2]) == 1
    return AcquireReply(LockState.HELD, lease_left=max(int(reply[1]), 0) / 1000, failed=failed)


def queue_read_with_ttl(pipeline: Any, key: str, failing: bool) -> Any:
    """Queue the commands of ``Store.get_with_ttl`` on a pipeline, blocking or asyncio:
    GET and PTTL of ``key``, and EXISTS of its failing marker if ``failing`` asks. The
    pipeline's replies go to ``with_ttl``."""
    pipeline.get(key)
    pipeline.pttl(key)
    if failing:
        pipeline.exists(failing_key(key))
    return pipeline


def with_ttl(raw: Any, pttl: Any, failing: Any = 0) -> tuple[bytes | None, float, bool]:
    """A GET and a PTTL of one key (and an EXISTS of its failing marker), sent together:
    the value, its seconds left (-1: no expiry), and whether it is marked failing. They
    are not one atomic step: a key deleted between them (PTTL -2) is read as absent. A key
    rewritten between them pairs the old value with the new TTL, which serves a value
    replaced a moment ago as fresh, as a GET sent a moment earlier would have."""
    pttl = int(pttl)
    if raw is None or pttl == -2:
        return None, 0.0, False
    return raw, -1.0 if pttl < 0 else pttl / 1000, bool(failing)
