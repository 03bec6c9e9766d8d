"""The many-key commands of the Redis stores, blocking and asyncio: each a pipeline, so a
batch of entries costs one round trip per server (a cluster client sends each slot's
commands to its primary, every primary at once).

Scripts go by EVALSHA. Those the server does not know (NOSCRIPT: a restarted or new
server) go again by EVAL, in a second pipeline. redis-py's own pipelined scripts would
ask SCRIPT EXISTS before every pipeline: one more round trip each time.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

from redis.exceptions import NoScriptError

from ..._core.store import AcquireCall, WriteCall, Written
from ..._errors import BackendUnavailable
from . import scripts as _scripts
from .replies import acquire_reply, queue_read_with_ttl, with_ttl


def script_text(script: Any) -> tuple[str, str]:
    """The SHA-1 and the text of a registered script (redis-py's ``Script`` or a ``SlotScript``)."""
    text: str = script.script
    return hashlib.sha1(text.encode()).hexdigest(), text


def queue_scripts(pipeline: Any, script: Any, calls: Sequence[_scripts.Call]) -> None:
    """EVALSHA each call (by ``execute_command``: a cluster pipeline refuses its ``evalsha``
    method, but routes the command by its keys as any other)."""
    sha, _ = script_text(script)
    for keys, args in calls:
        pipeline.execute_command("EVALSHA", sha, len(keys), *keys, *args)


def unknown_scripts(replies: list[Any]) -> list[int]:
    """Where the server answered NOSCRIPT."""
    return [index for index, reply in enumerate(replies) if isinstance(reply, NoScriptError)]


def queue_evals(pipeline: Any, script: Any, calls: Sequence[_scripts.Call], indexes: list[int]) -> None:
    _, text = script_text(script)
    for index in indexes:
        keys, args = calls[index]
        pipeline.execute_command("EVAL", text, len(keys), *keys, *args)


def acquire_calls(calls: Sequence[AcquireCall]) -> list[_scripts.Call]:
    return [_scripts.acquire_call(*call) for call in calls]


def write_calls(calls: Sequence[WriteCall]) -> list[_scripts.Call]:
    return [_scripts.write_release_call(*call) for call in calls]


def acquire_replies(replies: list[Any], calls: Sequence[AcquireCall], error_of: Any) -> list[Any]:
    """Each reply as an ``AcquireReply``, or the ``BackendUnavailable`` of its error reply."""
    return [
        error_of("lock", call[0].value, reply) if isinstance(reply, Exception) else acquire_reply(reply)
        for reply, call in zip(replies, calls, strict=True)
    ]


def write_replies(replies: list[Any], calls: Sequence[WriteCall], error_of: Any) -> list[Any]:
    """Each reply as a ``Written``, or the ``BackendUnavailable`` of its error reply."""
    return [
        error_of("write", call[0].value, reply) if isinstance(reply, Exception) else Written(int(reply))
        for reply, call in zip(replies, calls, strict=True)
    ]


def queue_reads_with_ttl(pipeline: Any, keys: Sequence[str], failing: bool) -> None:
    for key in keys:
        queue_read_with_ttl(pipeline, key, failing)


def reads_with_ttl(replies: list[Any], failing: bool) -> list[tuple[bytes | None, float, bool]]:
    """``queue_reads_with_ttl``'s replies, a ``with_ttl`` per key."""
    width = 3 if failing else 2
    return [with_ttl(*replies[start : start + width]) for start in range(0, len(replies), width)]


def error_reply(what: str, key: str, error: Exception) -> BackendUnavailable:
    """One command's error reply (OOM, READONLY) in a pipeline that went through."""
    return BackendUnavailable(f"redis failed to {what} {key!r}: {error}", key=key)
