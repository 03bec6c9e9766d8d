"""What the command line reads of a Redis store: an entry's keys, and the leases in
flight, found with SCAN (on every primary of a cluster)."""

from __future__ import annotations

from typing import Any

from ..._core.backend import EntryState, LeaseState
from ..._core.keys import EntryKeys
from ..._core.tags import TagKeys
from .commands import is_cluster
from .tagging import names_of


class RedisInspector:
    def __init__(self, client: Any) -> None:
        self._client = client
        self._cluster = is_cluster(client)

    def describe(self, keys: EntryKeys) -> EntryState:
        pipe = self._client.pipeline(transaction=False)
        for key in (keys.value, keys.lock):
            pipe.get(key)
            pipe.pttl(key)
        pipe.exists(keys.failing)
        pipe.get(keys.tags)
        raw, ttl_ms, holder, lock_ms, failing, tags = pipe.execute()
        return EntryState(
            raw=raw,
            ttl_ms=ttl_ms,
            holder=None if holder is None else holder.decode(errors="replace"),
            lock_ttl_ms=lock_ms,
            failing=bool(failing),
            waiting=self._subscribers(keys.channel),
            tags=names_of(tags) if raw is not None else None,
        )

    def tagged(self, tag: TagKeys) -> int:
        """Members whose time has not passed (by the server's clock) and whose value is
        there: a member invalidated by another of its tags stays one until its time."""
        seconds, micros = self._client.time()
        members = self._client.zrangebyscore(tag.members, f"({seconds * 1000 + micros / 1000:.3f}", "+inf")
        count = 0
        for start in range(0, len(members), 1000):
            pipe = self._client.pipeline(transaction=False)
            for member in members[start : start + 1000]:
                pipe.exists(member)
            count += sum(pipe.execute())
        return count

    def _subscribers(self, channel: str) -> int:
        """Processes waiting for the entry: each has one subscription to its channel while
        any of its callers waits (sharded pub/sub on a cluster)."""
        if self._cluster:
            node = self._client.get_node_from_key(channel)
            reply = self._client.execute_command("PUBSUB SHARDNUMSUB", channel, target_nodes=node)
        else:
            reply = self._client.execute_command("PUBSUB NUMSUB", channel)
        return subscriber_count(reply)

    def leases(self, namespace: str) -> list[LeaseState]:
        found = []
        for raw in self._client.scan_iter(match=f"{namespace}:{{*}}:lock", count=1000):
            lock_key = raw.decode(errors="replace")
            value_key = lock_key[: -len(":lock")]
            named = value_key[len(namespace) + 2 :].startswith("~lock:")
            pipe = self._client.pipeline(transaction=False)
            pipe.get(lock_key)
            pipe.pttl(lock_key)
            if named:
                pipe.get(value_key + ":fence")
                pipe.zcard(lock_key + ":queue")
            replies = pipe.execute()
            if replies[0] is None:
                continue  # released between the scan and the read
            fence = queued = None
            if named:
                fence = int(replies[2]) if replies[2] is not None else None
                queued = int(replies[3])
            found.append(LeaseState(lock_key, replies[0].decode(errors="replace"), replies[1], fence, queued))
        return found


def subscriber_count(reply: Any) -> int:
    """The count in a NUMSUB reply for one channel, however redis-py shaped it: a flat
    [channel, n], pairs [(channel, n)], or a dict per node on a cluster."""
    if isinstance(reply, dict):
        return sum(subscriber_count(part) for part in reply.values())
    flat: list[Any] = []
    for item in reply or []:
        flat.extend(item if isinstance(item, (list, tuple)) else [item])
    return int(flat[1]) if len(flat) > 1 else 0
