"""The Lua scripts of the Redis backend, one constant each, and beside each the one
function that builds its KEYS and ARGV (``Call``), which every caller uses: the blocking
and asyncio stores and Redlock's servers cannot drift apart on what a script takes.

Every script touches only the keys of one entry, which share a hash tag, so each runs in
one Redis Cluster slot. Channels are not keys and travel in ARGV. They share the entry's
hash tag too, so on a cluster (``sharded``) the wake-up is an SPUBLISH in the entry's own
shard. A script runs atomically, so "check the lock token, then act" has no window
between the two steps.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple

from ..._core.keys import EntryKeys
from ..._core.near import NearChannel, request
from ..._core.store import TRACE_MARK
from ..._core.tags import GENERATION_KEEP_MS, MEMBER_MARGIN_MS, Tagged, TagKeys


def sharded(script: str) -> str:
    """``script`` for a Redis Cluster: its wake-ups go by SPUBLISH to the subscribers of
    the channel's shard (the primary and replicas of the entry's slot), where PUBLISH
    would be copied to every node of the cluster."""
    return script.replace("redis.call('PUBLISH',", "redis.call('SPUBLISH',")


class Call(NamedTuple):
    """A script's KEYS and ARGV, in the order redis-py's ``Script(keys, args)`` takes."""

    keys: list[str]
    args: list[str | int | bytes]


ACQUIRE = """
-- Double-check the value and take the lock, in one step.
-- KEYS[1] value key, KEYS[2] lock key
-- ARGV[1] token, ARGV[2] lease in ms,
-- ARGV[3] '1' to return an existing value rather than lock; '0' to lock over it (it was corrupt)
-- ARGV[4] '' or the identity (first bytes) of a stale value the caller read: with '1', lock
--         over the value if it is still that one; return it only if it is another
-- Returns {1, value, pttl}: the value exists (and is not the caller's stale one), and the
--                 ms it has left (-1: no expiry)
--         {2}: the lock is now held with our token (also when it already was)
--         {3, pttl, failed, holder}: another holder has the lock for pttl more ms (-1: no
--                 expiry set); failed is 1 if that is a failed load's hold (HOLD_AFTER_FAILURE);
--                 holder is its token if the token carries a trace (holds ARGV[5]), else ''
-- ARGV[5] the mark of a token that carries a trace (_core.store.TRACE_MARK)
if ARGV[3] == '1' then
  local value = redis.call('GET', KEYS[1])
  if value and (ARGV[4] == '' or string.sub(value, 1, #ARGV[4]) ~= ARGV[4]) then
    return {1, value, redis.call('PTTL', KEYS[1])}
  end
end
if redis.call('SET', KEYS[2], ARGV[1], 'NX', 'PX', ARGV[2]) then return {2} end
local holder = redis.call('GET', KEYS[2]) or ''
if holder == ARGV[1] then
  -- asked again with our own token: a command sent twice (a pipeline sent again after it
  -- failed on another server) is granted again rather than waited on
  redis.call('PEXPIRE', KEYS[2], ARGV[2])
  return {2}
end
local failed = 0
if holder == '!failed' then failed = 1 end
if not string.find(holder, ARGV[5], 1, true) then holder = '' end
return {3, redis.call('PTTL', KEYS[2]), failed, holder}
"""


def acquire_call(keys: EntryKeys, token: str, lease_ms: int, check_value: bool, stale: bytes = b"") -> Call:
    return Call([keys.value, keys.lock], [token, lease_ms, "1" if check_value else "0", stale, TRACE_MARK])


HOLD_AFTER_FAILURE = """
-- A failed load's lease becomes a hold: while callers are served a stale value instead of
-- the loader's error, nobody loads the key again for ARGV[2] ms, in any process; the
-- waiters are woken to be served. The failing marker says, for ARGV[4] ms or until a write
-- succeeds, that the loader fails (see keys.failing_key).
-- KEYS[1] lock key, KEYS[2] failing marker; ARGV[1] token, ARGV[2] hold in ms, ARGV[3] channel,
-- ARGV[4] the marker's life in ms
-- Returns 1: held; 0: the lease was not ours any more (nothing done)
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('SET', KEYS[1], '!failed', 'PX', ARGV[2])
  redis.call('SET', KEYS[2], '1', 'PX', ARGV[4])
  redis.call('PUBLISH', ARGV[3], '')
  return 1
end
return 0
"""


def hold_call(keys: EntryKeys, token: str, hold_ms: int, failing_ms: int) -> Call:
    return Call([keys.lock, keys.failing], [token, hold_ms, keys.channel, failing_ms])


WRITE_AND_RELEASE = """
-- Write the loaded value, release the lock and wake the waiters, if our lease still holds;
-- the loader works again, so the failing marker goes.
-- KEYS[1] value key, KEYS[2] lock key, KEYS[3] invalidation marker (see INVALIDATE),
-- KEYS[4] failing marker (see HOLD_AFTER_FAILURE)
-- ARGV[1] token, ARGV[2] envelope, ARGV[3] ttl in ms, ARGV[4] channel,
-- ARGV[5] '1' to publish the envelope itself, '0' to publish '' (waiters read the key)
-- A ttl of 0 keeps nothing (a store=False value): the old value goes, the envelope is
-- only published
-- Returns 1: written
--         0: the lease was lost to an invalidation, or taken over; nothing written
--        -1: the lease is not ours and no invalidation dropped it lately (it expired, or
--            the server evicted or lost it); nothing written
if redis.call('GET', KEYS[2]) ~= ARGV[1] then
  if redis.call('GET', KEYS[3]) then return 0 end
  return -1
end
if ARGV[3] == '0' then
  redis.call('DEL', KEYS[1])
else
  redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
end
redis.call('DEL', KEYS[2], KEYS[4])
if ARGV[5] == '1' then
  redis.call('PUBLISH', ARGV[4], ARGV[2])
else
  redis.call('PUBLISH', ARGV[4], '')
end
return 1
"""


TOUCH = """
-- A refresh whose loader answered "not modified": if our lease still holds, release it and
-- wake the waiters (they read the value), and if the value is still the one the loader
-- kept (its first bytes are ARGV[2]), it lives ARGV[3] ms from now and the loader works
-- again (the failing marker goes). Its bytes are neither read whole nor written.
-- KEYS as WRITE_AND_RELEASE's; ARGV[1] token, ARGV[2] identity, ARGV[3] ttl in ms, ARGV[4] channel
-- Returns 1: kept; 0: the lease was lost to an invalidation or taken over, or the value
-- is gone or another (nothing kept); -1: as WRITE_AND_RELEASE's
if redis.call('GET', KEYS[2]) ~= ARGV[1] then
  if redis.call('GET', KEYS[3]) then return 0 end
  return -1
end
redis.call('DEL', KEYS[2])
redis.call('PUBLISH', ARGV[4], '')
if redis.call('GETRANGE', KEYS[1], 0, #ARGV[2] - 1) ~= ARGV[2] then return 0 end
redis.call('PEXPIRE', KEYS[1], ARGV[3])
redis.call('DEL', KEYS[4])
return 1
"""


def touch_call(keys: EntryKeys, token: str, identity: bytes, ttl_ms: int) -> Call:
    return Call([keys.value, keys.lock, keys.invalidated, keys.failing], [token, identity, ttl_ms, keys.channel])


def for_each(script: str, keys_each: int, args_each: int) -> str:
    """``script`` run once for each of several entries, in one call: a many-key command's
    one script per slot group. The script's text becomes a function whose parameters
    shadow KEYS and ARGV, so it runs unchanged for each entry.
    KEYS: each entry's ``keys_each`` keys, entry after entry.
    ARGV[1] the number of entries n; then each entry's ``args_each`` arguments, in order.
    Returns a list of n replies, each what ``script`` returns for that entry."""
    return (
        f"local function one(KEYS, ARGV)\n{script}\nend\n"
        "local replies = {}\n"
        "for i = 0, tonumber(ARGV[1]) - 1 do\n"
        "  local keys, args = {}, {}\n"
        f"  for j = 1, {keys_each} do keys[j] = KEYS[i * {keys_each} + j] end\n"
        f"  for j = 1, {args_each} do args[j] = ARGV[1 + i * {args_each} + j] end\n"
        "  replies[i + 1] = one(keys, args)\n"
        "end\n"
        "return replies\n"
    )


def each_call(calls: list[Call]) -> Call:
    """The KEYS and ARGV of a ``for_each`` script over ``calls`` (one script's calls)."""
    return Call(
        [key for call in calls for key in call.keys], [len(calls), *(arg for call in calls for arg in call.args)]
    )


def release_call(keys: EntryKeys, token: str) -> Call:
    return Call([keys.lock], [token, keys.channel])


def write_release_call(keys: EntryKeys, token: str, envelope: bytes, ttl_ms: int, inline: bool) -> Call:
    return Call(
        [keys.value, keys.lock, keys.invalidated, keys.failing],
        [token, envelope, ttl_ms, keys.channel, "1" if inline else "0"],
    )


RENEW = """
-- Extend our lease (the watchdog), only if we still hold the lock.
-- KEYS[1] lock key; ARGV[1] token, ARGV[2] lease in ms
-- Returns 1: renewed; 0: the lock is gone or someone else's
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
"""


def renew_call(keys: EntryKeys, token: str, lease_ms: int) -> Call:
    return Call([keys.lock], [token, lease_ms])


RELEASE = """
-- Release the lock without writing (the loader raised, or a named lock's holder is done),
-- and wake the waiters to retry.
-- KEYS[1] lock key; ARGV[1] token, ARGV[2] channel
-- Returns 1: released; 0: the lock was not ours any more
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  redis.call('PUBLISH', ARGV[2], '')
  return 1
end
return 0
"""

NEXT_CLOCK = """
-- The next value of a counter that never goes back: one more than the last, and never
-- less than the server's clock in microseconds, so it keeps growing even if the counter
-- is deleted or lost (a failover). Draws of a tag clock, or of a named lock's fence.
local function next_clock(counter)
  local clock = redis.call('TIME')
  local now = tonumber(clock[1]) * 1000000 + tonumber(clock[2])
  local value = redis.call('INCR', counter)
  if value < now then
    value = now
    redis.call('SET', counter, string.format('%d', value))
  end
  return value
end
-- A named lock's fence: the counter outlives its last draw by a minute and twice the
-- lease, then goes (a lock taken once must not leave a key for ever). Its next draw is
-- then the server's clock, which has passed every fence drawn before by far.
local function next_fence(counter, lease_ms)
  local fence = next_clock(counter)
  redis.call('PEXPIRE', counter, 60000 + 2 * tonumber(lease_ms))
  return fence
end
"""

TAKE_LOCK = (
    NEXT_CLOCK
    + """
-- Take a named lock and draw its fencing token, in one step.
-- KEYS[1] fence counter key (see next_fence), KEYS[2] lock key
-- ARGV[1] token, ARGV[2] lease in ms
-- Returns {2, fence}: the lock is now held with our token; fence is greater than every
--                     one drawn before for this lock (see NEXT_CLOCK)
--         {3, pttl}: another holder has the lock for pttl more ms
if redis.call('SET', KEYS[2], ARGV[1], 'NX', 'PX', ARGV[2]) then
  return {2, next_fence(KEYS[1], ARGV[2])}
end
return {3, redis.call('PTTL', KEYS[2])}
"""
)


def take_lock_call(keys: EntryKeys, token: str, lease_ms: int) -> Call:
    return Call([keys.value, keys.lock], [token, lease_ms])


TAKE_LOCK_FAIRLY = (
    NEXT_CLOCK
    + """
-- Take a named lock in arrival order, and draw its fencing token.
-- KEYS[1] fence counter, KEYS[2] lock key, KEYS[3] queue (sorted set: token -> ticket),
-- KEYS[4] waiters' leases (hash: token -> expiry, server ms), KEYS[5] ticket counter
-- ARGV[1] token, ARGV[2] lease in ms, ARGV[3] a waiter's lease in ms
-- A waiter joins the queue on its first try and renews its place on every try; a
-- waiter at the head whose lease ran out (it died, or stopped trying) is dropped.
-- Returns {2, fence}: taken (we were first in line and the lock was free)
--         {3, pttl}: not yet: the holder's lease has pttl ms left (-2: free, but another
--                    waiter is first in line)
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
while true do
  local head = redis.call('ZRANGE', KEYS[3], 0, 0)[1]
  if not head or head == ARGV[1] then break end
  if tonumber(redis.call('HGET', KEYS[4], head) or '0') > now then break end
  redis.call('ZREM', KEYS[3], head)
  redis.call('HDEL', KEYS[4], head)
end
if not redis.call('ZSCORE', KEYS[3], ARGV[1]) then
  redis.call('ZADD', KEYS[3], redis.call('INCR', KEYS[5]), ARGV[1])
end
redis.call('HSET', KEYS[4], ARGV[1], now + tonumber(ARGV[3]))
local keep = 2 * tonumber(ARGV[3])
redis.call('PEXPIRE', KEYS[3], keep)
redis.call('PEXPIRE', KEYS[4], keep)
redis.call('PEXPIRE', KEYS[5], keep)
if redis.call('ZRANGE', KEYS[3], 0, 0)[1] == ARGV[1] then
  if redis.call('SET', KEYS[2], ARGV[1], 'NX', 'PX', ARGV[2]) then
    redis.call('ZREM', KEYS[3], ARGV[1])
    redis.call('HDEL', KEYS[4], ARGV[1])
    return {2, next_fence(KEYS[1], ARGV[2])}
  end
end
return {3, redis.call('PTTL', KEYS[2])}
"""
)


def take_lock_fairly_call(keys: EntryKeys, token: str, lease_ms: int, queue_ms: int) -> Call:
    return Call([keys.value, keys.lock, *keys.queue], [token, lease_ms, queue_ms])


LEAVE_QUEUE = """
-- A waiter gives up its place in a fair lock's queue, and wakes the others (it may have
-- been first in line).
-- KEYS[1] queue, KEYS[2] waiters' leases; ARGV[1] token, ARGV[2] channel
-- Returns 1 if it was in the queue, else 0
local removed = redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('HDEL', KEYS[2], ARGV[1])
if removed == 1 then redis.call('PUBLISH', ARGV[2], '') end
return removed
"""


def leave_queue_call(keys: EntryKeys, token: str) -> Call:
    queue, waiters, _ = keys.queue
    return Call([queue, waiters], [token, keys.channel])


TAKE_SLOT = """
-- Take a slot of a load budget (a semaphore of ARGV[4] slots), in arrival order.
-- KEYS[1] holders (sorted set: token -> lease end, server ms), KEYS[2] queue (sorted set:
-- token -> ticket), KEYS[3] waiters' leases (hash: token -> expiry), KEYS[4] tickets
-- ARGV[1] token, ARGV[2] lease in ms, ARGV[3] a waiter's lease in ms, ARGV[4] slots
-- KEYS[5], ARGV[5] (one server only): the lock of the entry the slot is for, and the
--   caller's token on it. Its place in the queue carries them ('k:' and 't:' fields of
--   KEYS[3]), so that RELEASE_SLOT hands it a slot only while that lease is its own.
-- A holder whose lease ended (it died) frees its slot. A waiter joins the queue on its
-- first try and renews its place on every try; a waiter ahead of it whose lease ran out
-- is dropped. The first (slots - holders) live waiters may take a slot.
-- Returns {2, 0}: taken (or held already: a retried take)
--         {3, ms}: not yet: the earliest holder's lease ends in ms (-2: a slot is free,
--                  but other waiters are first in line)
--         {4, 0}: the entry's lease is not the caller's: out of the queue, no slot
if KEYS[5] and redis.call('GET', KEYS[5]) ~= ARGV[5] then
  redis.call('ZREM', KEYS[2], ARGV[1])
  redis.call('HDEL', KEYS[3], ARGV[1], 'k:' .. ARGV[1], 't:' .. ARGV[1])
  return {4, 0}
end
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
local lease = tonumber(ARGV[2])
local keep = 2 * math.max(lease, tonumber(ARGV[3]))
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if redis.call('ZSCORE', KEYS[1], ARGV[1]) then
  redis.call('ZADD', KEYS[1], now + lease, ARGV[1])
  return {2, 0}
end
if not redis.call('ZSCORE', KEYS[2], ARGV[1]) then
  redis.call('ZADD', KEYS[2], redis.call('INCR', KEYS[4]), ARGV[1])
end
redis.call('HSET', KEYS[3], ARGV[1], now + tonumber(ARGV[3]))
if KEYS[5] then redis.call('HSET', KEYS[3], 'k:' .. ARGV[1], KEYS[5], 't:' .. ARGV[1], ARGV[5]) end
redis.call('PEXPIRE', KEYS[2], keep)
redis.call('PEXPIRE', KEYS[3], keep)
redis.call('PEXPIRE', KEYS[4], keep)
local free = tonumber(ARGV[4]) - redis.call('ZCARD', KEYS[1])
local live = 0
local index = 0
while live < free do
  local waiter = redis.call('ZRANGE', KEYS[2], index, index)[1]
  if not waiter then break end
  if waiter == ARGV[1] then
    redis.call('ZREM', KEYS[2], ARGV[1])
    redis.call('HDEL', KEYS[3], ARGV[1], 'k:' .. ARGV[1], 't:' .. ARGV[1])
    redis.call('ZADD', KEYS[1], now + lease, ARGV[1])
    if redis.call('PTTL', KEYS[1]) < keep then redis.call('PEXPIRE', KEYS[1], keep) end
    return {2, 0}
  end
  if tonumber(redis.call('HGET', KEYS[3], waiter) or '0') > now then
    live = live + 1
    index = index + 1
  else
    redis.call('ZREM', KEYS[2], waiter)
    redis.call('HDEL', KEYS[3], waiter, 'k:' .. waiter, 't:' .. waiter)
  end
end
if free > 0 then return {3, -2} end
local earliest = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')[2]
return {3, math.max(tonumber(earliest) - now, 0)}
"""


def take_slot_call(
    keys: EntryKeys,
    token: str,
    lease_ms: int,
    queue_ms: int,
    slots: int,
    entry: EntryKeys | None = None,
    lease: str = "",
) -> Call:
    """TAKE_SLOT's call; with ``entry``, for a load holding its lease as ``lease`` (one
    server only: the entry's lock is in another slot than the budget's keys)."""
    if entry is None:
        return Call([keys.lock, *keys.queue], [token, lease_ms, queue_ms, slots])
    return Call([keys.lock, *keys.queue, entry.lock], [token, lease_ms, queue_ms, slots, lease])


NOTE_HOT = """
-- Add each member's count to a hot set (_core.hotset), keep its ARGV[1] most counted
-- members (the least counted go), and let it live ARGV[2] ms from now.
-- KEYS[1] the period's set; ARGV[3..] member, count pairs
for i = 3, #ARGV, 2 do redis.call('ZINCRBY', KEYS[1], ARGV[i + 1], ARGV[i]) end
local extra = redis.call('ZCARD', KEYS[1]) - tonumber(ARGV[1])
if extra > 0 then redis.call('ZREMRANGEBYRANK', KEYS[1], 0, extra - 1) end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return 0
"""


def note_hot_call(key: str, counts: Mapping[bytes, int], limit: int, ttl_ms: int) -> Call:
    args: list[str | int | bytes] = [limit, ttl_ms]
    for member, count in counts.items():
        args += [member, count]
    return Call([key], args)


RENEW_SLOT = """
-- Extend a budget slot's lease (the watchdog), only while the slot is still ours.
-- KEYS[1] holders; ARGV[1] token, ARGV[2] lease in ms
-- Returns 1: renewed; 0: the slot is gone (its lease ran out and it was taken back)
if not redis.call('ZSCORE', KEYS[1], ARGV[1]) then return 0 end
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), ARGV[1])
if redis.call('PTTL', KEYS[1]) < 2 * tonumber(ARGV[2]) then redis.call('PEXPIRE', KEYS[1], 2 * tonumber(ARGV[2])) end
return 1
"""


def renew_slot_call(keys: EntryKeys, token: str, lease_ms: int) -> Call:
    return Call([keys.lock], [token, lease_ms])


RELEASE_SLOT = """
-- Give a budget slot, or a place in its queue, back, and hand each free slot to the
-- first live waiter in line: it holds the slot now (for ARGV[4] ms), and is told so on
-- its own channel ('g'), so a freed slot wakes one waiter, not every one, and the woken
-- waiter need not ask again. A waiter whose place carries the lease of the entry it
-- would load (TAKE_SLOT's KEYS[5], on one server) gets the slot only while that lease is
-- still its own; else it is told 'l' and leaves the queue, and the slot goes on down
-- the line. That lock is read here though not declared: one server only.
-- KEYS[1] holders, KEYS[2] queue, KEYS[3] waiters' leases; ARGV[1] token, ARGV[2] the
-- budget's channel (a waiter's is it, ':', its token), ARGV[3] slots, ARGV[4] lease in ms
-- Returns 1: a slot was released; 0: the token held none
local released = redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('HDEL', KEYS[3], ARGV[1], 'k:' .. ARGV[1], 't:' .. ARGV[1])
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
local free = tonumber(ARGV[3]) - redis.call('ZCARD', KEYS[1])
local dropped = 0
while free > 0 and dropped < 64 do  -- past at most 64 waiters whose place or lease ran out
  local waiter = redis.call('ZRANGE', KEYS[2], 0, 0)[1]
  if not waiter then break end
  local live = tonumber(redis.call('HGET', KEYS[3], waiter) or '0') > now
  local entry = redis.call('HMGET', KEYS[3], 'k:' .. waiter, 't:' .. waiter)
  redis.call('ZREM', KEYS[2], waiter)
  redis.call('HDEL', KEYS[3], waiter, 'k:' .. waiter, 't:' .. waiter)
  if live and entry[1] and redis.call('GET', entry[1]) ~= entry[2] then
    redis.call('PUBLISH', ARGV[2] .. ':' .. waiter, 'l')  -- its load could not be written
    dropped = dropped + 1
  elseif live then
    redis.call('ZADD', KEYS[1], now + tonumber(ARGV[4]), waiter)
    redis.call('PUBLISH', ARGV[2] .. ':' .. waiter, 'g')
    free = free - 1
  else
    dropped = dropped + 1
  end
end
if redis.call('PTTL', KEYS[1]) < 2 * tonumber(ARGV[4]) then redis.call('PEXPIRE', KEYS[1], 2 * tonumber(ARGV[4])) end
return released
"""


def release_slot_call(keys: EntryKeys, token: str, slots: int, lease_ms: int) -> Call:
    queue, waiters, _ = keys.queue
    return Call([keys.lock, queue, waiters], [token, keys.channel, slots, lease_ms])


INVALIDATE = """
-- Drop the value and any holder's lease, so an in-flight load cannot write its (stale)
-- result afterwards, and wake the waiters so one of them loads afresh. A dropped lease
-- leaves a marker for as long as it had left, so the holder's refused write can tell an
-- invalidation from an eviction (best effort: a marker refused under OOM is not needed).
-- The failing marker goes too: what is loaded next is loaded afresh.
-- KEYS[1] value key, KEYS[2] lock key, KEYS[3] invalidation marker, KEYS[4] failing marker,
-- KEYS[5] the value's tags (see WRITE_TAGGED), KEYS[6] the versioned marker (see
-- NEAR_REQUEST's versioned: read, never changed), KEYS[7] near caches' registry (optional: see
-- NEAR_REQUEST); ARGV[1] channel, ARGV[2..3] NEAR_REQUEST's
-- Returns {the number of keys deleted, 1 if the versioned marker is there else 0}, then
-- NEAR_REQUEST's members
local lease = redis.call('PTTL', KEYS[2])
local deleted = redis.call('DEL', KEYS[1], KEYS[2])
redis.call('DEL', KEYS[4], KEYS[5])
redis.call('PUBLISH', ARGV[1], '')
if lease > 0 then redis.pcall('SET', KEYS[3], '1', 'PX', lease) end
return near_request({deleted, versioned(KEYS[6])}, KEYS[7], ARGV[2], ARGV[3])
"""


NEAR_REQUEST = """
-- 1 if a versioned loader marked the entry (see _core.versions), else 0. PTTL, not EXISTS:
-- an ACL user of an older README may run the scripts' commands only.
local function versioned(marker)
  if redis.call('PTTL', marker) == -2 then return 0 end
  return 1
end
-- Ask the near caches of the namespace to drop the value (see _core.near): if
-- ``registry`` (their sorted set) has live members, publish ``message`` (a nonce and the
-- value key) on ``channel``, and return them, each with the milliseconds left of its
-- registration, after ``result``: {result, member, ms_left, ...}. The invalidator waits
-- for their acknowledgements, or their deadlines. An ACL user without TIME or
-- ZRANGEBYSCORE gets {result, '!', the error}: the invalidation is done, and it warns.
local function near_request(result, registry, channel, message)
  local reply = {result}
  if registry then
    local time = redis.pcall('TIME')
    if time.err then return {result, '!', time.err} end
    local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
    local live = redis.pcall('ZRANGEBYSCORE', registry, '(' .. now, '+inf', 'WITHSCORES')
    if live.err then return {result, '!', live.err} end
    if #live > 0 then
      redis.pcall('PUBLISH', channel, message)
      for i = 1, #live, 2 do
        reply[#reply + 1] = live[i]
        reply[#reply + 1] = tonumber(live[i + 1]) - now
      end
    end
  end
  return reply
end
"""

_SEIZE = (
    "local function invalidate(KEYS, ARGV)\n"
    + INVALIDATE
    + """
end
-- A write-through's first step (set): INVALIDATE, and the lease is ours, in one step, so
-- no waiter woken by it can take the lease before the write (see _core.controls).
-- KEYS and ARGV as INVALIDATE's, then ARGV[n-1] our token, ARGV[n] the lease in ms
-- Returns INVALIDATE's reply
local reply = invalidate(KEYS, ARGV)
redis.call('SET', KEYS[2], ARGV[#ARGV - 1], 'PX', ARGV[#ARGV])
return reply
"""
)
SEIZE = NEAR_REQUEST + _SEIZE


_WAKE = "redis.call('PUBLISH', ARGV[1], '')\n"


def _put(write: str) -> str:
    """A tagged write-through (set) in one script: SEIZE, then ``write`` (WRITE_TAGGED,
    whose tags may refuse it) under the lease it took, with nothing between them, so
    that readers see the old value and then the new one, never the entry absent (an
    untagged one is ``PUT``). SEIZE's wake-up is left out: the write's own message, sent
    in the same step, wakes the waiters (with the value, where it goes inline), and an
    empty one first would send each of them to read the entry for nothing."""
    assert _SEIZE.count(_WAKE) == 1, "SEIZE's wake-up is not where _put looks for it"
    return (
        NEAR_REQUEST
        + "local function seize(KEYS, ARGV)\n"
        + _SEIZE.replace(_WAKE, "")
        + "\nend\nlocal function write(KEYS, ARGV)\n"
        + write
        + """
end
-- KEYS: SEIZE's, then the write's; ARGV[1] how many of KEYS are SEIZE's, ARGV[2] how many
-- arguments are, then SEIZE's arguments, then the write's
-- Returns {the write's reply, SEIZE's reply}
local seized, seizing = tonumber(ARGV[1]), tonumber(ARGV[2])
local seize_keys, seize_args, write_keys, write_args = {}, {}, {}, {}
for i = 1, #KEYS do
  if i <= seized then seize_keys[i] = KEYS[i] else write_keys[i - seized] = KEYS[i] end
end
for i = 3, #ARGV do
  if i - 2 <= seizing then seize_args[i - 2] = ARGV[i] else write_args[i - 2 - seizing] = ARGV[i] end
end
local reply = seize(seize_keys, seize_args)
return {write(write_keys, write_args), reply}
"""
    )


def put_call(seize: Call, write: Call) -> Call:
    """``PUT_TAGGED``'s call: ``seize_call``'s, then the write's."""
    return Call([*seize.keys, *write.keys], [len(seize.keys), len(seize.args), *seize.args, *write.args])


PUT = (
    NEAR_REQUEST
    + """
-- A write-through (set) of an untagged entry, in one step: what SEIZE and then
-- WRITE_AND_RELEASE under the lease it took do together, less the lease's own steps
-- (taken, found ours and dropped inside one script: nothing can come between them) and
-- the deletion of the value the write replaces. Readers see the old value and then the
-- new one, never the entry absent. A load in flight loses its lease, and the marker
-- tells it an invalidation took it (as INVALIDATE's does), so it writes nothing.
-- The near caches are asked to drop their copies before the waiters are woken, as SEIZE
-- and the write did one after the other.
-- KEYS as INVALIDATE's (value, lock, invalidation marker, failing marker, tags, versioned
-- marker[, near caches' registry]); ARGV[1] channel, ARGV[2] envelope, ARGV[3] ttl in ms
-- (0: keep nothing, as WRITE_AND_RELEASE's), ARGV[4] '1' to publish the envelope itself,
-- '0' to publish '' (waiters read the key), ARGV[5..6] NEAR_REQUEST's
-- Returns NEAR_REQUEST's reply: {{1 (written), the versioned marker as INVALIDATE's},
-- member, ms_left, ...}
local lease = redis.call('PTTL', KEYS[2])
if ARGV[3] == '0' then
  redis.call('DEL', KEYS[1], KEYS[2], KEYS[4], KEYS[5])
else
  redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
  redis.call('DEL', KEYS[2], KEYS[4], KEYS[5])
end
if lease > 0 then redis.pcall('SET', KEYS[3], '1', 'PX', lease) end
local reply = near_request({1, versioned(KEYS[6])}, KEYS[7], ARGV[5], ARGV[6])
if ARGV[4] == '1' then
  redis.call('PUBLISH', ARGV[1], ARGV[2])
else
  redis.call('PUBLISH', ARGV[1], '')
end
return reply
"""
)


def set_call(keys: EntryKeys, envelope: bytes, ttl_ms: int, inline: bool, near: NearChannel | None, nonce: str) -> Call:
    """``PUT``'s call."""
    invalidate = invalidate_call(keys, near, nonce)
    channel, *asking = invalidate.args
    return Call(invalidate.keys, [channel, envelope, ttl_ms, "1" if inline else "0", *asking])


INVALIDATE = NEAR_REQUEST + INVALIDATE


def invalidate_call(keys: EntryKeys, near: NearChannel | None = None, nonce: str = "") -> Call:
    """``near``: the namespace's near caches, asked to drop their copies in the same
    script (on one server, on a cluster the registry is in another slot: ``REQUEST_NEAR``
    asks them in a second step)."""
    return _with_near(
        Call([keys.value, keys.lock, keys.invalidated, keys.failing, keys.tags, keys.versioned], [keys.channel]),
        keys,
        near,
        nonce,
    )


def seize_call(keys: EntryKeys, token: str, lease_ms: int, near: NearChannel | None = None, nonce: str = "") -> Call:
    call = invalidate_call(keys, near, nonce)
    return Call(call.keys, [*call.args, token, lease_ms])


def _with_near(call: Call, keys: EntryKeys, near: NearChannel | None, nonce: str) -> Call:
    if near is None:
        return call
    return Call([*call.keys, near.members], [*call.args, near.channel, request(nonce, keys.value)])


EXPIRE = """
-- Make the value stale now, but keep it for the stale window it was written with
-- (stale_for, in a version 2 envelope: see _core.codec), so it may still be served stale
-- while it is refreshed or while the loader fails; without one, delete it. Drop any
-- holder's lease as INVALIDATE does, so a load in flight writes nothing that predates
-- the change, and wake the waiters.
-- KEYS and ARGV as INVALIDATE's
-- Returns {1 if there was a value or a lease (as INVALIDATE's count: the caller forgets
-- the entry's flight in its process) else 0, the versioned marker as INVALIDATE's}, then
-- NEAR_REQUEST's members
local value = redis.call('GET', KEYS[1])
if value then
  local keep = 0
  if #value >= 24 and string.sub(value, 1, 3) == '\\167S\\2' then
    keep = math.floor(struct.unpack('>d', value, 17) * 1000)
  end
  local left = redis.call('PTTL', KEYS[1])
  if keep < 1 then
    redis.call('DEL', KEYS[1], KEYS[5])
  elseif left < 0 or left > keep then
    redis.call('PEXPIRE', KEYS[1], keep)
    redis.call('PEXPIRE', KEYS[5], keep)
  end
end
local lease = redis.call('PTTL', KEYS[2])
redis.call('DEL', KEYS[2], KEYS[4])
redis.call('PUBLISH', ARGV[1], '')
if lease > 0 then redis.pcall('SET', KEYS[3], '1', 'PX', lease) end
local marked = versioned(KEYS[6])
if value or lease > 0 then return near_request({1, marked}, KEYS[7], ARGV[2], ARGV[3]) end
return near_request({0, marked}, KEYS[7], ARGV[2], ARGV[3])
"""

EXPIRE = NEAR_REQUEST + EXPIRE


def expire_call(keys: EntryKeys, near: NearChannel | None = None, nonce: str = "") -> Call:
    return invalidate_call(keys, near, nonce)  # the same KEYS and ARGV


REQUEST_NEAR = (
    NEAR_REQUEST
    + """
-- On a Redis Cluster, after an invalidation or expire script (see _core.near): ask the
-- near caches to drop the value. Runs on the registry's primary, where every tracker
-- listens for requests and renews its lease; the PUBLISH stays a PUBLISH (not sharded).
-- KEYS[1] registry; ARGV[1] channel, ARGV[2] message. Returns {0, member, ms_left, ...}
return near_request(0, KEYS[1], ARGV[1], ARGV[2])
"""
)


def request_near_call(near: NearChannel, nonce: str, *value_keys: str) -> Call:
    return Call([near.members], [near.channel, request(nonce, *value_keys)])


REGISTER_NEAR = """
-- A near cache's tracker renews its registration (see _core.near): its member id with a
-- deadline of now plus the lease, by the server's clock; members past theirs leave. The
-- registry itself goes once nobody renews it.
-- KEYS[1] registry; ARGV[1] member, ARGV[2] lease ms
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), ARGV[1])
redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[2]) * 100)
return 1
"""


ACQUIRE_EACH = for_each(ACQUIRE, 2, 5)
WRITE_AND_RELEASE_EACH = for_each(WRITE_AND_RELEASE, 4, 5)


# --- tags (see _core.tags) --------------------------------------------------------------

DRAW_TAG_CLOCK = (
    NEXT_CLOCK
    + """
-- A tag invalidation's first step: draw the next value of the namespace's tag clock.
-- KEYS[1] the tag clock. Returns the value
return next_clock(KEYS[1])
"""
)

READ_TAG_CLOCK = """
-- What a tagged load reads before it begins: the tag clock, or if it was never drawn
-- (or lost), the server's clock in microseconds, which every later draw exceeds.
-- KEYS[1] the tag clock. Returns the value
local value = redis.call('GET', KEYS[1])
if value then return tonumber(value) end
local clock = redis.call('TIME')
return tonumber(clock[1]) * 1000000 + tonumber(clock[2])
"""

ACQUIRE_READING_CLOCK = (
    "local function acquire(KEYS, ARGV)\n"
    + ACQUIRE
    + "\nend\nlocal function read_clock(KEYS)\n"
    + READ_TAG_CLOCK
    + """
end
-- A tagged load's ACQUIRE: once the lock is taken, the tag clock is read in the same
-- step, before the load begins (see _core.tags), instead of in a round trip of its own.
-- KEYS: ACQUIRE's, then the tag clock; ARGV: ACQUIRE's
-- Returns {ACQUIRE's reply}, or once the lock is taken {ACQUIRE's reply, the tag clock}
local reply = acquire({KEYS[1], KEYS[2]}, ARGV)
if reply[1] ~= 2 then return {reply} end
return {reply, read_clock({KEYS[3]})}
"""
)


def acquire_reading_clock_call(call: Call, clock: str) -> Call:
    """``ACQUIRE_READING_CLOCK``'s call: ``acquire_call``'s, and the tag clock's key."""
    return Call([*call.keys, clock], call.args)


ADMIT = """
-- Each tag admits a tagged write before its value exists: none if a tag's generation is
-- newer than the clock the load read (the tag was invalidated after the load began).
-- Else the entry joins each tag's members, for as long as its value may live (server
-- ms, microsecond precision), and members whose time passed leave.
-- tags: a list of {members key, generation key}; since: the clock the load read
local function admitted(tags, since)
  for _, tag in ipairs(tags) do
    local last = redis.call('GET', tag[2])
    if last and tonumber(last) > tonumber(since) then return false end
  end
  return true
end
local function admit(tags, value_key, life_ms)
  local clock = redis.call('TIME')
  local now = tonumber(clock[1]) * 1000 + tonumber(clock[2]) / 1000
  for _, tag in ipairs(tags) do
    redis.call('ZREMRANGEBYSCORE', tag[1], '-inf', string.format('%.3f', now))
    redis.call('ZADD', tag[1], string.format('%.3f', now + life_ms), value_key)
    if redis.call('PTTL', tag[1]) < life_ms then redis.call('PEXPIRE', tag[1], life_ms) end
  end
end
"""

ADMIT_TAGS = (
    ADMIT
    + """
-- On a Redis Cluster, the first step of a tagged write: the tags of one slot admit it.
-- KEYS: each tag's members key and generation key, tag after tag
-- ARGV[1] the clock the load read, ARGV[2] the value key, ARGV[3] the member's life in ms
-- Returns 1: admitted; 0: a tag was invalidated after the load began (nothing done)
local tags = {}
for i = 1, #KEYS, 2 do tags[#tags + 1] = {KEYS[i], KEYS[i + 1]} end
if not admitted(tags, ARGV[1]) then return 0 end
admit(tags, ARGV[2], tonumber(ARGV[3]))
return 1
"""
)

WRITE_TAGGED = (
    ADMIT
    + "local function write_and_release(KEYS, ARGV)\n"
    + WRITE_AND_RELEASE
    + "\nend\n"
    + """
-- WRITE_AND_RELEASE for a tagged entry: its tags admit it first (on one server, in this
-- script; on a cluster ADMIT_TAGS did, and no tag keys are given here), and its tags
-- are kept beside the value. A write the tags refuse releases the lease and wakes the
-- waiters, who load afresh.
-- KEYS[1..4] as WRITE_AND_RELEASE's, KEYS[5] the entry's tags key, then each tag's
-- members key and generation key
-- ARGV[1..5] as WRITE_AND_RELEASE's, ARGV[6] the clock the load read, ARGV[7] the
-- members' life in ms, ARGV[8] the tags' names
-- Returns WRITE_AND_RELEASE's replies (0 also when a tag refused)
if redis.call('GET', KEYS[2]) ~= ARGV[1] then return write_and_release(KEYS, ARGV) end
local tags = {}
for i = 6, #KEYS, 2 do tags[#tags + 1] = {KEYS[i], KEYS[i + 1]} end
if not admitted(tags, ARGV[6]) then
  redis.call('DEL', KEYS[2])
  redis.call('PUBLISH', ARGV[4], '')
  return 0
end
if ARGV[3] == '0' then  -- kept by nobody: checked by the tags, not their member
  redis.call('DEL', KEYS[5])
else
  admit(tags, KEYS[1], tonumber(ARGV[7]))
  redis.call('SET', KEYS[5], ARGV[8], 'PX', ARGV[3])
end
return write_and_release(KEYS, ARGV)
"""
)


def write_tagged_call(
    keys: EntryKeys,
    token: str,
    envelope: bytes,
    ttl_ms: int,
    inline: bool,
    tagged: Tagged,
    with_tags: bool,
) -> Call:
    """``WRITE_TAGGED``'s call. ``with_tags``: the tags admit the entry in this script
    (one server); else ``ADMIT_TAGS`` did (a cluster)."""
    tag_keys = [key for tag in tagged.tags.tags for key in (tag.members, tag.generation)] if with_tags else []
    return Call(
        [keys.value, keys.lock, keys.invalidated, keys.failing, keys.tags, *tag_keys],
        [
            token,
            envelope,
            ttl_ms,
            keys.channel,
            "1" if inline else "0",
            tagged.since,
            ttl_ms + MEMBER_MARGIN_MS,
            tagged.tags.names,
        ],
    )


def admit_tags_call(tags: list[TagKeys], value_key: str, since: int, ttl_ms: int) -> Call:
    """``ADMIT_TAGS``' call for ``tags`` (of one slot)."""
    return Call(
        [key for tag in tags for key in (tag.members, tag.generation)], [since, value_key, ttl_ms + MEMBER_MARGIN_MS]
    )


MARK_TAG = """
-- A tag invalidation's second step, on the tag's server: the tag's generation becomes
-- the clock value drawn (it never goes back), expired members leave, and the live ones
-- are returned, each with its time, for the third step to invalidate, and the last to
-- forget.
-- KEYS[1] members, KEYS[2] generation; ARGV[1] the clock value drawn, ARGV[2] how long the
-- generation is kept (ms)
-- Returns {member, time, member, time, ...}
local last = redis.call('GET', KEYS[2])
if not last or tonumber(last) < tonumber(ARGV[1]) then
  redis.call('SET', KEYS[2], ARGV[1], 'PX', ARGV[2])
end
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + tonumber(clock[2]) / 1000
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', string.format('%.3f', now))
return redis.call('ZRANGE', KEYS[1], 0, -1, 'WITHSCORES')
"""


def mark_tag_call(tag: TagKeys, drawn: int) -> Call:
    return Call([tag.members, tag.generation], [drawn, GENERATION_KEEP_MS])


FORGET_MEMBERS = """
-- A tag invalidation's last step: the members it invalidated leave the tag, unless a
-- write admitted one again since (its time changed: that write's load began after the
-- invalidation did, and its value stays a member).
-- KEYS[1] members; ARGV: member, time, member, time, ... (the times MARK_TAG returned)
-- Returns how many left
local gone = 0
for i = 1, #ARGV, 2 do
  if redis.call('ZSCORE', KEYS[1], ARGV[i]) == ARGV[i + 1] then
    gone = gone + redis.call('ZREM', KEYS[1], ARGV[i])
  end
end
return gone
"""


def forget_members_call(tag: TagKeys, members: list[tuple[bytes, bytes]]) -> Call:
    return Call([tag.members], [part for pair in members for part in pair])


PUT_TAGGED = _put(WRITE_TAGGED)
WRITE_TAGGED_EACH = for_each(WRITE_TAGGED, 5, 8)  # a page's admitted writes: no tag keys
MARK_VERSIONED = """
-- A versioned load marks the entry of its loader without version= (see _core.versions)
-- before its loader reads the database: for at least ARGV[1] ms. KEYS[1] the marker
if redis.call('PTTL', KEYS[1]) < tonumber(ARGV[1]) then redis.call('SET', KEYS[1], '1', 'PX', ARGV[1]) end
return 1
"""
MARK_VERSIONED_EACH = for_each(MARK_VERSIONED, 1, 1)
INVALIDATE_EACH = for_each(INVALIDATE, 6, 1)
EXPIRE_EACH = for_each(EXPIRE, 6, 1)
