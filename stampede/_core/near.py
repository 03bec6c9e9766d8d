"""The near cache's agreement across processes (sans-IO): who may serve copies, and what
an invalidation waits for.

A process serves a value from its near cache (``_drivers.near``) without asking Redis
only while it holds a **lease** on its invalidation stream (Gray and Cheriton's leases):

* Its tracker (``_backends.redis.tracking``) keeps one connection subscribed to every change of
  the namespace's keys (``CLIENT TRACKING ... BCAST``) and to the namespace's request
  channel, and every fifth of its lease it **registers** (a script puts its member
  id in the namespace's registry with a deadline of the server's clock plus its lease)
  and then sends a PING on the tracking connection. When the PONG comes back, every
  request published before the PING has been read and obeyed, and the lease runs until
  the lease's length after the registration was *sent*, so it always ends before the
  registry's deadline does.
* ``invalidate()`` deletes the value and, in the same script, reads the live members of
  the registry and, if there are any, publishes a request naming the key. Each member's
  tracker drops its copy and acknowledges (a list the invalidator blocks on). The
  invalidator returns once every live member has acknowledged, or its deadline passed
  (``AckWait``): a member that did not answer (paused, partitioned, its connection
  gone) has by then seen its lease run out, so it serves nothing it may have missed.
  A member whose connection the server closed is still in the registry until its
  deadline, so it is waited for too.
* A tracker that loses its connection revokes its lease at once and drops every copy.
  one that reconnects drops them again once subscribed, before its first lease.

On a Redis Cluster the registry lives on one primary (the *home*), the tracker keeps a
tracking connection to every primary but listens for requests and sends its PING on the
home one only, and an invalidation takes two steps: the entry's script, then
``REQUEST_NEAR`` on the home primary (read the live members and publish, atomically). A
lease that ran out drops every copy before it is renewed (everywhere: it is needed on a
cluster, where the DEL's tracking message and the PONG travel on different connections).

Writes other than stampede's (a plain SET or DEL, an expiry, an eviction, FLUSHDB) drop
copies through the tracking messages, as soon as they arrive, with no wait anywhere.

No two clocks are compared: deadlines are sent as milliseconds left by the server's
clock, and each process measures them from when it got the reply, by its own monotonic
clock (so it waits at least as long as the server would).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

NEAR_LEASE = 0.1
"""The default seconds a registration, and the lease it backs, last (``near_lease``): the
longest ``invalidate()`` waits for a member that does not answer, and the longest a
process cut off from its stream goes on serving copies. Each process registers with its
own, so layers may differ. Shorter leases lapse more often in a process whose threads
keep the GIL busy (a lapse costs Redis reads, not correctness): at 50 ms, two layers'
trackers beside one thread making near hits in a loop lapsed about 17 times a second;
at 100 ms, under once a second."""

RENEWALS_PER_LEASE = 5
"""A tracker renews every ``lease / RENEWALS_PER_LEASE``: four renewals may be slow or
lost before the lease lapses."""

MAX_BLOCK = 0.1
"""The longest one blocking command of an invalidator waits for acknowledgements."""

ACK_KEY_TTL_MS = 5000
"""How long an invalidation's acknowledgements outlive it: nobody reads them after its wait."""


class NearChannel:
    """Where the near caches of one namespace meet on the server: the registry of live
    members (a sorted set: member id -> deadline in the server's milliseconds), the
    channel requests go out on, and where acknowledgements go. ``own`` is this
    process's member id while its tracker is registered: an invalidator drops its own
    copy itself and does not wait for its own acknowledgement."""

    def __init__(self, namespace: str) -> None:
        self.prefix = f"{namespace}:{{"  # every entry's keys start so (see _core.keys)
        self.members = f"{namespace}:near:members"
        self.channel = f"{namespace}:near"
        self._acks = f"{namespace}:near:ack:"
        self.own: str | None = None

    def ack_key(self, nonce: str) -> str:
        return self._acks + nonce


def request(nonce: str, *value_keys: str) -> str:
    """The message that asks every member to drop ``value_keys`` (a tag invalidation's
    are many) and acknowledge ``nonce``. A key holds no whitespace (see ``_core.keys``)."""
    return " ".join((nonce, *value_keys))


def parse_request(data: bytes) -> tuple[str, list[str]] | None:
    """(nonce, value keys) of a request, or None if ``data`` is not one."""
    nonce, *value_keys = data.decode(errors="replace").split(" ")
    return (nonce, value_keys) if nonce and value_keys and all(value_keys) else None


def asked_of_a_tag(members: list[str], dropped: list[str], tag_key: str) -> tuple[list[str], bool]:
    """What a tag invalidation asks the near caches to drop, and whether it waits for this
    process's own cache too (``dropped``: the members this invalidation deleted).

    Every member, dropped here or not: a member another invalidation deleted first may
    still be copied somewhere, as that invalidation may not have asked the near caches
    yet (asking is a step after the deletions, and it may fail or never come). A member
    another *tag* invalidation deleted and forgot is no longer named at all, so the
    request is sent even when no member is left (naming the tag's own key), and every
    live cache is waited for, this process's too: a cache acknowledges a request after
    it has read every message its connection carried before it, the tracking message of
    each earlier deletion among them (on one server; a cluster's tracking messages come
    on one connection per primary, in no order with the request)."""
    return list(members) or [tag_key], True


def members_in(reply: Any) -> list[tuple[str, float]]:
    """The live members an invalidation script named, each with the seconds left of its
    registration: the reply is ``[result, member, ms_left, member, ms_left, ...]``."""
    if not isinstance(reply, list) or registry_problem(reply) is not None:
        return []
    pairs = reply[1:]
    found = []
    for index in range(0, len(pairs) - 1, 2):
        member = pairs[index]
        name = member.decode(errors="replace") if isinstance(member, bytes) else str(member)
        found.append((name, max(0.0, float(pairs[index + 1]) / 1000)))
    return found


def registry_problem(reply: Any) -> str | None:
    """Why the script could not read the registry (an ACL user without TIME or
    ZRANGEBYSCORE), or None."""
    if isinstance(reply, list) and len(reply) == 3 and reply[1] in (b"!", "!"):
        problem = reply[2]
        return problem.decode(errors="replace") if isinstance(problem, bytes) else str(problem)
    return None


class AckWait:
    """Who must still acknowledge an invalidation, and until when.

    ``members`` are the live members and their seconds left, as the script read them.
    ``now`` is the invalidator's monotonic clock when the reply arrived, so each deadline
    falls no earlier than the server's. ``own`` (this process) is left out."""

    def __init__(self, members: Iterable[tuple[str, float]], now: float, own: str | None = None) -> None:
        self._deadlines = {member: now + left for member, left in members if member != own}

    def acked(self, member: str) -> None:
        self._deadlines.pop(member, None)

    def timeout(self, now: float) -> float | None:
        """Seconds to wait for the next acknowledgement, or None: every member has
        acknowledged or is past its deadline, so the invalidation is complete."""
        for member in [member for member, deadline in self._deadlines.items() if deadline <= now]:
            del self._deadlines[member]
        if not self._deadlines:
            return None
        return max(self._deadlines.values()) - now

    def command(self, ack_key: str, now: float, blmpop: bool = True) -> tuple[Any, ...] | None:
        """The next command to wait for acknowledgements with (None: done): BLMPOP takes
        every acknowledgement already there in one round trip (Redis 7+). BLPOP, one. A
        wait is at most ``MAX_BLOCK`` seconds, well inside any socket timeout."""
        timeout = self.timeout(now)
        if timeout is None:
            return None
        block = min(max(timeout, 0.001), MAX_BLOCK)
        if blmpop:
            return ("BLMPOP", block, 1, ack_key, "LEFT", "COUNT", len(self._deadlines))
        return ("BLPOP", ack_key, block)

    def took(self, reply: Any) -> None:
        """Note the members a BLMPOP or BLPOP reply acknowledged (None: none yet)."""
        if not reply:
            return
        members = reply[1] if isinstance(reply[1], list) else [reply[1]]
        for member in members:
            self.acked(member.decode(errors="replace") if isinstance(member, bytes) else str(member))

    def last_deadline(self) -> float:
        """When every member still waited for is past its deadline (-inf: none is)."""
        return max(self._deadlines.values(), default=-math.inf)
