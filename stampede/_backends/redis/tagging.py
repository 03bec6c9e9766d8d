"""What the blocking and asyncio Redis stores share of tags (see ``_core.tags``): the
steps of a tagged write on a cluster, and of a tag invalidation, as calls and replies.
The stores send them, in the order ``_core.tags`` gives."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from redis.crc import key_slot

from ..._core.keys import EntryKeys
from ..._core.tags import INVALIDATION_CHUNK, TagKeys
from . import scripts as _scripts
from .batches import error_reply

Member = tuple[bytes, bytes]  # a value key and its time, as MARK_TAG returned them


def by_slot(tags: tuple[TagKeys, ...]) -> list[list[TagKeys]]:
    """The tags of a tagged write on a cluster, grouped by slot: one ADMIT_TAGS each."""
    groups: dict[int, list[TagKeys]] = {}
    for tag in tags:
        groups.setdefault(key_slot(tag.members.encode()), []).append(tag)
    return list(groups.values())


def members_of(reply: Any) -> list[Member]:
    """MARK_TAG's reply: [member, time, member, time, ...] as pairs."""
    flat = list(reply or [])
    return [(bytes(flat[index]), bytes(flat[index + 1])) for index in range(0, len(flat) - 1, 2)]


def chunks(members: list[Member]) -> Iterator[list[Member]]:
    for start in range(0, len(members), INVALIDATION_CHUNK):
        yield members[start : start + INVALIDATION_CHUNK]


def value_keys(members: list[Member]) -> list[str]:
    return [member.decode() for member, _ in members]


def entry_calls(keys: list[str]) -> list[_scripts.Call]:
    """INVALIDATE's (or EXPIRE's) call for each member, without the near caches: they are
    asked once, for every member, when all are done."""
    return [_scripts.invalidate_call(EntryKeys.for_value(key)) for key in keys]


def dropped(replies: list[Any], keys: list[str], what: str) -> list[str]:
    """The members that held a value or a lease (INVALIDATE's or EXPIRE's first reply).
    A member's error reply (OOM, READONLY) fails the invalidation: it must not pass for
    done. What was done stays done, and the members not forgotten are found again."""
    found = []
    for reply, key in zip(replies, keys, strict=True):
        if isinstance(reply, Exception):
            raise error_reply(what, key, reply)
        if int(reply[0] if isinstance(reply, list) else reply) > 0:
            found.append(key)
    return found


def names_of(raw: Any) -> list[str] | None:
    """An entry's tags key, as the tags' names."""
    if raw is None:
        return None
    text = bytes(raw).decode(errors="replace")
    return text.split(" ") if text else []
