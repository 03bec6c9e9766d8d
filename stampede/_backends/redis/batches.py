"""The many-key commands of the Redis stores, blocking and asyncio: one script call per
slot group (``scripts.for_each``: every entry on one server, each slot's on a cluster),
sent in one pipeline, so a batch of entries costs one round trip per server (a cluster
client sends each slot's commands to its primary, every primary at once).

Scripts go by EVALSHA. Those the server does not know (NOSCRIPT: a restarted or new
server) go again by EVAL, in a second pipeline. redis-py's own pipelined scripts would
ask SCRIPT EXISTS before every pipeline: one more round trip each time.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any, NamedTuple

from redis.crc import key_slot
from redis.exceptions import NoScriptError

from ..._core.keys import failing_key
from ..._core.store import AcquireCall, WriteCall, Written
from ..._errors import BackendUnavailable
from . import scripts as _scripts
from .replies import acquire_reply, asks_failing, marked, queue_read_with_ttl, with_ttl

GROUP_LIMIT = 500
"""The most entries one script call takes (``max_batch``'s default): a larger group is split."""


class Pair(NamedTuple):
    """A script for one entry, and its ``scripts.for_each`` form for several."""

    one: Any
    each: Any


def script_text(script: Any) -> tuple[str, str]:
    """The SHA-1 and the text of a registered script (redis-py's ``Script`` or a ``SlotScript``)."""
    text: str = script.script
    return hashlib.sha1(text.encode()).hexdigest(), text


def slot_groups(calls: Sequence[_scripts.Call], cluster: bool, alone: bool = False) -> list[list[int]]:
    """The calls (by index) that go together in one script: on a cluster those of one
    slot (a script runs in one), elsewhere all of them, ``GROUP_LIMIT`` at most each.
    ``alone``: each call a script call of its own (a script whose keys vary per call)."""
    if alone:
        return [[index] for index in range(len(calls))]
    if not cluster:
        return [list(range(start, min(start + GROUP_LIMIT, len(calls)))) for start in range(0, len(calls), GROUP_LIMIT)]
    by_slot: dict[int, list[int]] = {}
    for index, call in enumerate(calls):
        by_slot.setdefault(key_slot(str(call.keys[0]).encode()), []).append(index)
    return [
        group[start : start + GROUP_LIMIT] for group in by_slot.values() for start in range(0, len(group), GROUP_LIMIT)
    ]


def queue_groups(
    pipeline: Any,
    pair: Pair,
    calls: Sequence[_scripts.Call],
    groups: Sequence[list[int]],
    by_text: bool = False,
    route: Any = None,
) -> None:
    """One script call per group: ``pair.one`` for a group of one, else ``pair.each``. By
    EVALSHA (or, ``by_text``, EVAL: after NOSCRIPT), through ``execute_command``: a cluster
    pipeline refuses its ``evalsha`` method, but routes the command by its keys as any
    other. ``route(key)``: the node to send it to (None: let the pipeline find it). The
    blocking cluster pipeline finds a script's node by asking the default node COMMAND
    GETKEYS, one round trip per script call, and fails every pipeline while that node is
    down; a command sent to its node is not asked about."""
    for group in groups:
        script, call = (pair.one, calls[group[0]]) if len(group) == 1 else (
            pair.each, _scripts.each_call([calls[index] for index in group]))  # fmt: skip
        sha, text = script_text(script)
        node = None if route is None else route(str(call.keys[0]))
        options = {} if node is None else {"target_nodes": node}
        pipeline.execute_command("EVAL" if by_text else "EVALSHA", text if by_text else sha, len(call.keys),
                                 *call.keys, *call.args, **options)  # fmt: skip


def keys_by_node(keys: Sequence[str], node_of: Any) -> list[list[int]]:
    """The keys (by index) that live on one server, server by server, as ``node_of(key)``
    names it (None: not known yet, kept apart as a server of its own)."""
    parts: dict[object, list[int]] = {}
    for index, key in enumerate(keys):
        node = node_of(key)
        parts.setdefault(("unknown", index) if node is None else node, []).append(index)
    return list(parts.values())


def spread(groups: Sequence[list[int]], replies: Sequence[Any], count: int) -> list[Any]:
    """Each call's reply, from its group's: a group's error reply is each of its calls'."""
    spread_out: list[Any] = [None] * count
    for group, reply in zip(groups, replies, strict=True):
        if len(group) == 1:
            spread_out[group[0]] = reply
        elif isinstance(reply, Exception):
            for index in group:
                spread_out[index] = reply
        else:
            for index, one in zip(group, reply, strict=True):
                spread_out[index] = one
    return spread_out


def unknown_scripts(replies: list[Any]) -> list[int]:
    """Where the server answered NOSCRIPT."""
    return [index for index, reply in enumerate(replies) if isinstance(reply, NoScriptError)]


def acquire_calls(calls: Sequence[AcquireCall]) -> list[_scripts.Call]:
    return [_scripts.acquire_call(*call) for call in calls]


def write_calls(calls: Sequence[WriteCall]) -> list[_scripts.Call]:
    return [_scripts.write_release_call(*call[:5]) for call in calls]


def put(into: list[Any], indexes: Sequence[int], replies: Sequence[Any]) -> None:
    """Each of ``replies`` in its place in ``into``: the replies of some of a batch's calls."""
    for index, reply in zip(indexes, replies, strict=True):
        into[index] = reply


def tagged_apart(calls: Sequence[WriteCall]) -> tuple[list[int], list[int]]:
    """The writes (by index) that go together in ``for_each`` scripts, and the tagged
    ones, each of which its tags admit first (``RedisStore.write_release``)."""
    tagged = [index for index, call in enumerate(calls) if len(call) > 5 and call[5] is not None]
    plain = [index for index, call in enumerate(calls) if len(call) < 6 or call[5] is None]
    return plain, tagged


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


def queue_reads_with_ttl(pipeline: Any, keys: Sequence[str]) -> None:
    for key in keys:
        queue_read_with_ttl(pipeline, key)


def reads_with_ttl(replies: list[Any]) -> list[tuple[bytes | None, float, bool]]:
    """``queue_reads_with_ttl``'s replies, a ``with_ttl`` per key."""
    return [with_ttl(*replies[start : start + 2]) for start in range(0, len(replies), 2)]


def asking_failing(reads: list[tuple[bytes | None, float, bool]], failing: bool) -> list[int]:
    """The positions of the ``reads`` whose failing marker must be read (``asks_failing``)."""
    return [index for index, read in enumerate(reads) if asks_failing(read, failing)]


def queue_failing(pipeline: Any, keys: Sequence[str]) -> None:
    for key in keys:
        pipeline.exists(failing_key(key))


def mark_failing(reads: list[tuple[bytes | None, float, bool]], stale: list[int], replies: list[Any]) -> None:
    """Put the EXISTS replies of ``queue_failing`` in ``reads``, at the ``stale`` positions."""
    for index, exists in zip(stale, replies, strict=True):
        reads[index] = marked(reads[index], exists)


def error_reply(what: str, key: str, error: Exception) -> BackendUnavailable:
    """One command's error reply (OOM, READONLY) in a pipeline that went through."""
    return BackendUnavailable(f"redis failed to {what} {key!r}: {error}", key=key)
