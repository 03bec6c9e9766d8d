"""What the blocking and asyncio Redis stores share of tags (see ``_core.tags``): the
steps of a tagged write on a cluster, and of a tag invalidation, as calls and replies.
The stores send them, in the order ``_core.tags`` gives."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from redis.crc import key_slot

from ..._core.keys import EntryKeys
from ..._core.store import WriteCall
from ..._core.tags import INVALIDATION_CHUNK, TagKeys
from ..._errors import BackendUnavailable
from . import scripts as _scripts
from .batches import error_reply

Member = tuple[bytes, bytes]  # a value key and its time, as MARK_TAG returned them


def by_slot(tags: tuple[TagKeys, ...], cluster: bool = True) -> list[list[TagKeys]]:
    """The tags of a tagged write, grouped by slot on a cluster (all in one group on one
    server): one ADMIT_TAGS each."""
    if not cluster:
        return [list(tags)]
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
        if entry_reply(reply)[0] > 0:
            found.append(key)
    return found


def entry_reply(reply: Any) -> tuple[int, bool]:
    """What an INVALIDATE, EXPIRE or PUT reply (or SEIZE's, which is INVALIDATE's) says of
    its entry: its count, and whether the versioned marker is there (``_core.versions``)."""
    count, versioned = reply[0]
    return int(count), bool(int(versioned))


def names_of(raw: Any) -> list[str] | None:
    """An entry's tags key, as the tags' names."""
    if raw is None:
        return None
    text = bytes(raw).decode(errors="replace")
    return text.split(" ") if text else []


def admissions(calls: Sequence[WriteCall], cluster: bool) -> tuple[list[int], list[_scripts.Call]]:
    """A page's tagged writes, first step: one ADMIT_TAGS call per write and slot of its
    tags (on one server too: a page's writes go in two pipelines, not a script each).
    Returns the write each call is for, and the calls."""
    owners, admit = [], []
    for index, (keys, _, _, ttl_ms, _, tagged) in enumerate(calls):
        assert tagged is not None
        for group in by_slot(tagged.tags.tags, cluster):
            owners.append(index)
            admit.append(_scripts.admit_tags_call(group, keys.value, tagged.since, ttl_ms))
    return owners, admit


def admitted(owners: list[int], replies: list[Any], calls: Sequence[WriteCall]) -> list[bool | BackendUnavailable]:
    """Whether each write was admitted by every tag (an error reply in its place)."""
    outcome: list[bool | BackendUnavailable] = [True] * len(calls)
    for owner, reply in zip(owners, replies, strict=True):
        if isinstance(reply, Exception):
            outcome[owner] = error_reply("admit a tagged write of", calls[owner][0].value, reply)
        elif not reply and outcome[owner] is True:
            outcome[owner] = False
    return outcome


def entry_writes(calls: Sequence[WriteCall]) -> list[_scripts.Call]:
    """A page's tagged writes, second step: WRITE_TAGGED of each admitted entry, its tags
    left out (they admitted it)."""
    found = []
    for keys, token, envelope, ttl_ms, inline, tagged in calls:
        assert tagged is not None
        found.append(_scripts.write_tagged_call(keys, token, envelope, ttl_ms, inline, tagged, False))
    return found
