"""The PostgreSQL store's tables and functions, one constant each, and the one statement
per store method that calls them, shared by the blocking and asyncio stores.

The database lock the design describes is a unique row: ``INSERT ... ON CONFLICT DO
NOTHING`` takes it, ``DELETE`` releases it. On its own it has the textbook failures: no
expiry (a holder that dies holds it for ever), no blocking wait (a refused caller polls),
no reentrancy, no fairness, no fencing. Here each is fixed:

* expiry: a lease row has a deadline by the database's clock (``clock_timestamp()``).
  a lapsed row is taken over by the same ``INSERT ... ON CONFLICT DO UPDATE ... WHERE
  expires_at <= now``, and the watchdog pushes the deadline while the holder loads.
* blocking waits: a release, a write and an invalidation ``NOTIFY`` the entry's channel
  (delivered when they commit), and waiters sleep on ``LISTEN`` (``PostgresListener``).
* fencing: a named lock draws its token from a sequence, which never goes back, even
  after a crash (sequences are logged, unlike these tables).
* fairness: a queue table in arrival order (tickets from a sequence), each waiter's place
  leased as in Redis, every fair take serialised per lock by a transaction-scoped
  advisory lock. Reentrancy is the layer's, over any store (``Lock``).

Each function runs in one statement and one transaction: "check the token, then act"
has no window between the steps, as in a Lua script. Row locks order the races: a write
and an invalidation of the same entry both delete the lease row, and the second to come
finds it gone. Unlike a Lua script, each statement inside a function reads what was
committed when *it* began (READ COMMITTED), so a step that depends on an earlier read
reads again after taking the row lock (see ``stampede_acquire``).

Values and leases live in UNLOGGED tables: a cache, so no WAL is written for them, and a
crash empties them (every lease is then free, which is safe: a holder from before the
crash finds its lease gone and its write refused).
"""

from __future__ import annotations

import base64
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from ..._core.codec import stale_window_of
from ..._core.keys import EntryKeys
from ..._core.store import TRACE_MARK, AcquireReply, LockState
from ..._core.tags import GENERATION_KEEP_MS, MEMBER_MARGIN_MS, Tagged, TagKeys
from ..._errors import BackendUnavailable

NOTIFY_CHANNEL = "stampede"
"""The one channel every store LISTENs on. A payload is ``c<entry's channel>`` (the
entry changed: re-check), or ``v<envelope in base64>\n<entry's channel>`` (a write whose
envelope travels with it), or ``*`` (every waiter re-checks). Whatever would not fit in
NOTIFY's 8000 bytes goes as less (``stampede_wake``): a wake-up never costs a write."""

MAX_KEY_LENGTH = 500
"""The longest ``max_key_length`` over PostgreSQL: a key is a primary key, and a btree
entry holds at most 2704 bytes (500 characters are 2000 bytes of UTF-8 at most, leaving
room for the namespace and the suffix of each key of an entry)."""

INLINE_MAX = 5000  # the largest envelope a wake-up carries (base64 makes it 6668 bytes)

SCHEMA_LOCK = "SELECT pg_advisory_xact_lock(1400136045)"
"""Taken by a store that creates the schema, in the creating transaction: one creator at a
time (concurrent CREATE OR REPLACE of one function fails)."""

SCHEMA_VERSION = "stampede_schema_v8"
"""A function the schema's last statement creates, named after its version (a new version
of the schema gets a new name). A store that finds it creates nothing: DDL under traffic
takes table locks that can deadlock with the functions' row writes, so it runs only where
the schema is missing or older. Version 4 adds ``holder`` to ``stampede_acquire``'s reply
and is otherwise version 3, whose stores read the reply by column name: it marks itself
version 3 as well, so that a version 3 store finds its schema there and creates nothing.
Version 5 fills ``left_ms`` of a value ``stampede_acquire`` returns (the value's own ms
left, which older stores do not read): it marks itself versions 3 and 4 as well. Version
6 adds ``stampede_seize`` (a set's first step in one function), which shares its tail
with ``stampede_invalidate`` (``stampede_invalidated``), and marks itself 3 to 5: older
stores, which seize in two statements, find their functions doing what they did. It
also adds load budgets' slots (``stampede_slots``, ``stampede_take_slot``). Version 7
adds hot sets (``stampede_hot``, ``stampede_note_hot``) and marks itself 3 to 6. Version
8 adds slots granted by an entry's lease (``stampede_slot_leases``,
``stampede_take_slot_for``: ``SlotLeaseStore``), whose ``stampede_release_slot`` passes
over a waiter whose lease is gone and otherwise does what version 7's did: it marks
itself 3 to 7."""

SCHEMA_READY = "SELECT count(*) FROM pg_proc WHERE proname = 'stampede_schema_v8'"

SCHEMA = r"""

CREATE UNLOGGED TABLE IF NOT EXISTS stampede_values (
    key text PRIMARY KEY,
    value bytea NOT NULL,
    expires_at timestamptz NOT NULL,
    stale_ms bigint NOT NULL DEFAULT 0  -- the stale window the envelope was written with
);
CREATE INDEX IF NOT EXISTS stampede_values_expiry ON stampede_values (expires_at);

CREATE UNLOGGED TABLE IF NOT EXISTS stampede_leases (
    key text PRIMARY KEY,
    token text NOT NULL,  -- a holder's token, or '!failed' (a failed load's hold)
    expires_at timestamptz NOT NULL
);
CREATE INDEX IF NOT EXISTS stampede_leases_expiry ON stampede_leases (expires_at);

CREATE UNLOGGED TABLE IF NOT EXISTS stampede_queue (
    key text NOT NULL,  -- a fair lock's lease key
    token text NOT NULL,
    ticket bigint NOT NULL,  -- arrival order
    expires_at timestamptz NOT NULL,  -- the waiter's place, renewed on every try
    PRIMARY KEY (key, token)
);

CREATE UNLOGGED TABLE IF NOT EXISTS stampede_slots (
    key text NOT NULL,  -- a load budget's key
    token text NOT NULL,  -- a holder of one of its slots
    expires_at timestamptz NOT NULL,  -- the slot's lease, renewed while its load runs
    PRIMARY KEY (key, token)
);

-- The lease each waiter of a load budget would load under (stampede_take_slot_for): a
-- freed slot is handed to it only while that lease is still its own.
CREATE UNLOGGED TABLE IF NOT EXISTS stampede_slot_leases (
    key text NOT NULL,  -- a load budget's key
    token text NOT NULL,  -- a waiter in its queue
    lease_key text NOT NULL,  -- the lock of the entry it would load
    lease_token text NOT NULL,  -- its token on that lock
    expires_at timestamptz NOT NULL,  -- its place's, renewed on every try
    PRIMARY KEY (key, token)
);

-- Hot sets (see stampede/_core/hotset.py): a loader's calls of one period, each counted.
CREATE UNLOGGED TABLE IF NOT EXISTS stampede_hot (
    key text NOT NULL,  -- the set: a loader's and a period's
    member bytea NOT NULL,  -- a call's arguments
    score double precision NOT NULL,
    expires_at timestamptz NOT NULL,  -- the set's, renewed by every addition
    PRIMARY KEY (key, member)
);

CREATE SEQUENCE IF NOT EXISTS stampede_fences;
CREATE SEQUENCE IF NOT EXISTS stampede_tickets;

-- Tags (see stampede/_core/tags.py): each tag's members, each for as long as its value
-- may live; each tag's generation, the tag clock's value at its last invalidation; the
-- clock, a sequence (it never goes back). An entry's tags' names are a value row of
-- their own (ns:{entry}:tags), beside the entry's value and for as long.
CREATE UNLOGGED TABLE IF NOT EXISTS stampede_tag_members (
    tag text NOT NULL,  -- the tag's members key, ns:tag:{name}
    key text NOT NULL,  -- an entry's value key
    expires_at timestamptz NOT NULL,
    PRIMARY KEY (tag, key)
);
CREATE INDEX IF NOT EXISTS stampede_tag_members_expiry ON stampede_tag_members (expires_at);

CREATE UNLOGGED TABLE IF NOT EXISTS stampede_tag_generations (
    tag text PRIMARY KEY,  -- the tag's generation key, ns:tag:{name}:gen
    generation bigint NOT NULL,
    expires_at timestamptz NOT NULL
);

CREATE SEQUENCE IF NOT EXISTS stampede_tag_clock;

-- Wake the waiters of p_channel with p_payload, or with less where NOTIFY's 8000-byte
-- limit would refuse it (and with it the write or release that sends it): a bare "re-check"
-- of the channel, or, where even that is too long, "*": every waiter re-checks.
CREATE OR REPLACE FUNCTION stampede_wake(p_channel text, p_payload text)
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    IF octet_length(p_payload) < 8000 THEN
        PERFORM pg_notify('stampede', p_payload);
    ELSIF octet_length(p_channel) < 7999 THEN
        PERFORM pg_notify('stampede', 'c' || p_channel);
    ELSE
        PERFORM pg_notify('stampede', '*');
    END IF;
END $$;

-- The unique-row lock with an expiry: take the lease row at p_lock if it is free or its
-- deadline has passed (a dead holder's). True if it is now p_token's.
CREATE OR REPLACE FUNCTION stampede_take_lease(p_lock text, p_token text, p_lease_ms bigint, p_now timestamptz)
RETURNS boolean LANGUAGE plpgsql AS $$
DECLARE
    holder text;
BEGIN
    INSERT INTO stampede_leases AS l (key, token, expires_at)
        VALUES (p_lock, p_token, p_now + p_lease_ms * interval '1 millisecond')
        ON CONFLICT (key) DO UPDATE SET token = EXCLUDED.token, expires_at = EXCLUDED.expires_at
        WHERE l.expires_at <= p_now
        RETURNING l.token INTO holder;
    RETURN holder IS NOT NULL;
END $$;

-- Milliseconds from p_now to p_deadline, never below 0.
CREATE OR REPLACE FUNCTION stampede_ms_left(p_deadline timestamptz, p_now timestamptz)
RETURNS bigint LANGUAGE sql IMMUTABLE AS
    'SELECT GREATEST(0, ceil(extract(epoch FROM p_deadline - p_now) * 1000))::bigint';

-- The value at p_value, unless it is missing, expired, or the caller's stale one (its
-- first bytes are p_stale). VOLATILE, so that each call reads what is committed now.
CREATE OR REPLACE FUNCTION stampede_fresh_value(p_value text, p_stale bytea, p_now timestamptz)
RETURNS bytea LANGUAGE sql VOLATILE AS $$
    SELECT v.value FROM stampede_values v
    WHERE v.key = p_value AND v.expires_at > p_now
      AND (length(p_stale) = 0 OR substring(v.value FROM 1 FOR length(p_stale)) <> p_stale)
$$;

-- Double-check the value and take the lease, in one step (the Redis ACQUIRE script).
-- state 1: the value (not the caller's stale one) is there, for left_ms more (version 5;
-- 0 before); 2: the lease is ours;
-- 3: another holder has it for left_ms more (failed: a failed load's hold; holder: its
-- token if the token carries a trace, holds _core.store.TRACE_MARK, else '').
-- Version 3's function replied without holder: a reply's columns cannot change in place.
DROP FUNCTION IF EXISTS stampede_acquire(text, text, text, bigint, boolean, bytea);
CREATE OR REPLACE FUNCTION stampede_acquire(
    p_value text, p_lock text, p_token text, p_lease_ms bigint, p_check boolean, p_stale bytea,
    OUT state int, OUT raw bytea, OUT left_ms bigint, OUT failed boolean, OUT holder text)
LANGUAGE plpgsql AS $$
DECLARE
    now_ timestamptz := clock_timestamp();
    current_token text;
    deadline timestamptz;
BEGIN
    left_ms := 0; failed := false; holder := '';
    IF p_check THEN
        SELECT v.value, stampede_ms_left(v.expires_at, now_) INTO raw, left_ms FROM stampede_values v
        WHERE v.key = p_value AND v.expires_at > now_
          AND (length(p_stale) = 0 OR substring(v.value FROM 1 FOR length(p_stale)) <> p_stale);
        IF raw IS NOT NULL THEN state := 1; RETURN; END IF;
        left_ms := 0;
    END IF;
    IF stampede_take_lease(p_lock, p_token, p_lease_ms, now_) THEN
        IF p_check THEN
            -- Each statement here reads what was committed when it began: a holder may have
            -- written (and released) between the first read and the insert. Read again,
            -- now that the lease is ours: a value there is returned, the lease given back.
            SELECT v.value, stampede_ms_left(v.expires_at, now_) INTO raw, left_ms FROM stampede_values v
            WHERE v.key = p_value AND v.expires_at > now_
              AND (length(p_stale) = 0 OR substring(v.value FROM 1 FOR length(p_stale)) <> p_stale);
            IF raw IS NULL THEN left_ms := 0; END IF;
            IF raw IS NOT NULL THEN
                DELETE FROM stampede_leases WHERE key = p_lock AND token = p_token;
                state := 1; RETURN;
            END IF;
        END IF;
        state := 2; RETURN;
    END IF;
    SELECT l.token, l.expires_at INTO current_token, deadline FROM stampede_leases l WHERE l.key = p_lock;
    state := 3;
    left_ms := stampede_ms_left(deadline, now_);
    failed := current_token = '!failed';
    IF strpos(current_token, '@TRACE_MARK@') > 0 THEN holder := current_token; END IF;
END $$;

-- Write, release and wake, if our lease still holds (the Redis WRITE_AND_RELEASE script).
-- Returns 1: written; 0: refused, an invalidation dropped the lease; -1: the lease was gone.
CREATE OR REPLACE FUNCTION stampede_write_release(
    p_value text, p_lock text, p_invalidated text, p_failing text, p_token text,
    p_envelope bytea, p_ttl_ms bigint, p_stale_ms bigint, p_channel text, p_inline boolean)
RETURNS int LANGUAGE plpgsql AS $$
DECLARE
    now_ timestamptz := clock_timestamp();
BEGIN
    DELETE FROM stampede_leases WHERE key = p_lock AND token = p_token AND expires_at > now_;
    IF NOT FOUND THEN
        IF EXISTS (SELECT 1 FROM stampede_values WHERE key = p_invalidated AND expires_at > now_) THEN
            RETURN 0;
        END IF;
        RETURN -1;
    END IF;
    INSERT INTO stampede_values (key, value, expires_at, stale_ms)
        VALUES (p_value, p_envelope, now_ + p_ttl_ms * interval '1 millisecond', p_stale_ms)
        ON CONFLICT (key) DO UPDATE
        SET value = EXCLUDED.value, expires_at = EXCLUDED.expires_at, stale_ms = EXCLUDED.stale_ms;
    DELETE FROM stampede_values WHERE key = p_failing;
    IF p_inline AND length(p_envelope) <= 5000 THEN
        PERFORM stampede_wake(
            p_channel, 'v' || translate(encode(p_envelope, 'base64'), E'\n', '') || E'\n' || p_channel);
    ELSE
        PERFORM stampede_wake(p_channel, 'c' || p_channel);
    END IF;
    RETURN 1;
END $$;

-- A tagged write (the Redis WRITE_TAGGED script): each tag admits it, unless the tag was
-- invalidated after the load began (its generation is newer than p_since); then the entry
-- joins each tag's members and its tags' names are kept beside it, and it is written as
-- stampede_write_release writes. A write the tags refuse releases the lease and wakes the
-- waiters. The tags' advisory locks, shared here and exclusive in stampede_invalidate_tag,
-- order a write against an invalidation of one of its tags: whichever comes second sees
-- what the first committed (each statement here reads anew, READ COMMITTED).
CREATE OR REPLACE FUNCTION stampede_write_tagged(
    p_value text, p_lock text, p_invalidated text, p_failing text, p_token text,
    p_envelope bytea, p_ttl_ms bigint, p_stale_ms bigint, p_channel text, p_inline boolean,
    p_tags_key text, p_names text, p_members text[], p_generations text[], p_since bigint, p_life_ms bigint)
RETURNS int LANGUAGE plpgsql AS $$
DECLARE
    member text;
    now_ timestamptz;
BEGIN
    FOREACH member IN ARRAY p_members LOOP
        PERFORM pg_advisory_xact_lock_shared(hashtextextended(member, 0));
    END LOOP;
    now_ := clock_timestamp();
    IF NOT EXISTS (SELECT 1 FROM stampede_leases WHERE key = p_lock AND token = p_token AND expires_at > now_) THEN
        IF EXISTS (SELECT 1 FROM stampede_values WHERE key = p_invalidated AND expires_at > now_) THEN
            RETURN 0;
        END IF;
        RETURN -1;
    END IF;
    IF EXISTS (SELECT 1 FROM stampede_tag_generations
               WHERE tag = ANY (p_generations) AND generation > p_since AND expires_at > now_) THEN
        PERFORM stampede_release(p_lock, p_token, p_channel);
        RETURN 0;
    END IF;
    INSERT INTO stampede_tag_members (tag, key, expires_at)
        SELECT tag, p_value, now_ + p_life_ms * interval '1 millisecond' FROM unnest(p_members) AS tag
        ON CONFLICT (tag, key) DO UPDATE SET expires_at = EXCLUDED.expires_at;
    INSERT INTO stampede_values (key, value, expires_at)
        VALUES (p_tags_key, convert_to(p_names, 'UTF8'), now_ + p_ttl_ms * interval '1 millisecond')
        ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value, expires_at = EXCLUDED.expires_at;
    RETURN stampede_write_release(
        p_value, p_lock, p_invalidated, p_failing, p_token, p_envelope, p_ttl_ms, p_stale_ms, p_channel, p_inline);
END $$;

-- A tag invalidation, in one transaction under the tag's exclusive advisory lock: draw
-- the tag clock, set the tag's generation, and invalidate (p_keep: expire) each live
-- member as stampede_invalidate does, in key order (two invalidations of tags sharing
-- entries lock their rows in one order). The members are forgotten unless p_keep: a
-- stale value stays a member while it lives. An entry's other keys are its value key
-- plus the suffixes EntryKeys gives them. Returns the members that held a value or a
-- lease.
CREATE OR REPLACE FUNCTION stampede_invalidate_tag(
    p_members text, p_generation text, p_keep boolean, p_generation_ms bigint)
RETURNS SETOF text LANGUAGE plpgsql AS $$
DECLARE
    now_ timestamptz;
    drawn bigint;
    members text[];
    member text;
BEGIN
    PERFORM pg_advisory_xact_lock(hashtextextended(p_members, 0));
    drawn := nextval('stampede_tag_clock');
    now_ := clock_timestamp();
    INSERT INTO stampede_tag_generations (tag, generation, expires_at)
        VALUES (p_generation, drawn, now_ + p_generation_ms * interval '1 millisecond')
        ON CONFLICT (tag) DO UPDATE
        SET generation = GREATEST(stampede_tag_generations.generation, EXCLUDED.generation),
            expires_at = EXCLUDED.expires_at;
    DELETE FROM stampede_tag_members WHERE tag = p_members AND expires_at <= now_;
    members := ARRAY(SELECT key FROM stampede_tag_members WHERE tag = p_members ORDER BY key);
    RETURN QUERY
        SELECT v.key FROM stampede_values v WHERE v.key = ANY (members) AND v.expires_at > now_
        UNION
        SELECT left(l.key, -5) FROM stampede_leases l
        WHERE l.key = ANY (ARRAY(SELECT m || ':lock' FROM unnest(members) AS m)) AND l.expires_at > now_;
    FOREACH member IN ARRAY members LOOP
        PERFORM stampede_invalidate(
            member, member || ':lock', member || ':lock:invalidated', member || ':lock:failing',
            member || ':notify', p_keep);
        IF NOT p_keep THEN
            DELETE FROM stampede_values WHERE key = member || ':tags';
        END IF;
    END LOOP;
    IF NOT p_keep THEN
        DELETE FROM stampede_tag_members WHERE tag = p_members AND key = ANY (members);
    END IF;
END $$;

-- Release our lease without writing, and wake the waiters to take it.
CREATE OR REPLACE FUNCTION stampede_release(p_lock text, p_token text, p_channel text)
RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM stampede_leases WHERE key = p_lock AND token = p_token AND expires_at > clock_timestamp();
    IF NOT FOUND THEN RETURN false; END IF;
    PERFORM stampede_wake(p_channel, 'c' || p_channel);
    RETURN true;
END $$;

-- A failed load's lease becomes a hold no token owns, the entry is marked failing, and
-- the waiters are woken to be served stale (the Redis HOLD_AFTER_FAILURE script).
CREATE OR REPLACE FUNCTION stampede_hold(
    p_lock text, p_failing text, p_token text, p_hold_ms bigint, p_failing_ms bigint, p_channel text)
RETURNS boolean LANGUAGE plpgsql AS $$
DECLARE
    now_ timestamptz := clock_timestamp();
BEGIN
    UPDATE stampede_leases SET token = '!failed', expires_at = now_ + p_hold_ms * interval '1 millisecond'
        WHERE key = p_lock AND token = p_token AND expires_at > now_;
    IF NOT FOUND THEN RETURN false; END IF;
    INSERT INTO stampede_values (key, value, expires_at)
        VALUES (p_failing, '\x31', now_ + p_failing_ms * interval '1 millisecond')
        ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value, expires_at = EXCLUDED.expires_at;
    PERFORM stampede_wake(p_channel, 'c' || p_channel);
    RETURN true;
END $$;

-- What an invalidation leaves once the lease and value rows are dealt with: no failing
-- marker, the invalidated marker for as long as the dropped lease (p_deadline) had left,
-- so that its holder's write is refused, and the waiters woken.
CREATE OR REPLACE FUNCTION stampede_invalidated(
    p_invalidated text, p_failing text, p_channel text, p_deadline timestamptz, p_now timestamptz)
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM stampede_values WHERE key = p_failing;
    IF p_deadline > p_now THEN
        INSERT INTO stampede_values (key, value, expires_at) VALUES (p_invalidated, '\x31', p_deadline)
            ON CONFLICT (key) DO UPDATE SET expires_at = EXCLUDED.expires_at;
    END IF;
    PERFORM stampede_wake(p_channel, 'c' || p_channel);
END $$;

-- Drop (p_keep false) or make stale (p_keep true: kept for its stale window) the value,
-- drop any lease, leave the invalidation marker for what the lease had left, remove the
-- failing marker and wake the waiters (the Redis INVALIDATE and EXPIRE scripts).
CREATE OR REPLACE FUNCTION stampede_invalidate(
    p_value text, p_lock text, p_invalidated text, p_failing text, p_channel text, p_keep boolean)
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    now_ timestamptz := clock_timestamp();
    deadline timestamptz;
BEGIN
    DELETE FROM stampede_leases WHERE key = p_lock RETURNING expires_at INTO deadline;
    IF p_keep THEN
        DELETE FROM stampede_values WHERE key = p_value AND stale_ms < 1;
        UPDATE stampede_values SET expires_at = LEAST(expires_at, now_ + stale_ms * interval '1 millisecond')
            WHERE key = p_value;
    ELSE
        DELETE FROM stampede_values WHERE key = p_value;
    END IF;
    PERFORM stampede_invalidated(p_invalidated, p_failing, p_channel, deadline, now_);
END $$;

-- A set's first step (the Redis SEIZE script): the entry invalidated and its lease taken
-- for p_token, whoever held it. The lease row first, as every other writer of the entry
-- takes it (write_release, invalidate), then the value rows: two transactions meeting on
-- one entry lock its rows in the same order and cannot deadlock. (Version 5 ran
-- stampede_invalidate, then stampede_acquire: a caller could take the lease between the
-- two and then wait on the rows the first had deleted, while the second waited on its
-- lease.) A holder's deadline is kept as the invalidated marker, so that its write is
-- refused as an invalidated one.
CREATE OR REPLACE FUNCTION stampede_seize(
    p_value text, p_lock text, p_invalidated text, p_failing text, p_channel text,
    p_token text, p_lease_ms bigint)
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    now_ timestamptz := clock_timestamp();
    deadline timestamptz;
BEGIN
    SELECT l.expires_at INTO deadline FROM stampede_leases l WHERE l.key = p_lock FOR UPDATE;
    INSERT INTO stampede_leases (key, token, expires_at)
        VALUES (p_lock, p_token, now_ + p_lease_ms * interval '1 millisecond')
        ON CONFLICT (key) DO UPDATE SET token = EXCLUDED.token, expires_at = EXCLUDED.expires_at;
    DELETE FROM stampede_values WHERE key = p_value;
    PERFORM stampede_invalidated(p_invalidated, p_failing, p_channel, deadline, now_);
END $$;

-- Take a named lock, in arrival order if p_queue_ms > 0, and draw its fencing token
-- (the Redis TAKE_LOCK and TAKE_LOCK_FAIRLY scripts). state 2: taken, with fence;
-- 3: not yet, the holder has left_ms more (-2: free, but another waiter is first in line).
CREATE OR REPLACE FUNCTION stampede_take_lock(
    p_lock text, p_token text, p_lease_ms bigint, p_queue_ms bigint,
    OUT state int, OUT fence bigint, OUT left_ms bigint)
LANGUAGE plpgsql AS $$
DECLARE
    now_ timestamptz := clock_timestamp();
    head text;
    head_expiry timestamptz;
    deadline timestamptz;
BEGIN
    fence := 0; left_ms := 0;
    IF p_queue_ms > 0 THEN
        PERFORM pg_advisory_xact_lock(hashtextextended(p_lock, 0));
        LOOP  -- a waiter at the head whose place ran out (it died, or stopped trying) goes
            SELECT q.token, q.expires_at INTO head, head_expiry FROM stampede_queue q
                WHERE q.key = p_lock ORDER BY q.ticket LIMIT 1;
            EXIT WHEN head IS NULL OR head = p_token OR head_expiry > now_;
            DELETE FROM stampede_queue WHERE key = p_lock AND token = head;
        END LOOP;
        INSERT INTO stampede_queue AS q (key, token, ticket, expires_at)
            VALUES (p_lock, p_token, nextval('stampede_tickets'), now_ + p_queue_ms * interval '1 millisecond')
            ON CONFLICT (key, token) DO UPDATE SET expires_at = EXCLUDED.expires_at;
        SELECT q.token INTO head FROM stampede_queue q WHERE q.key = p_lock ORDER BY q.ticket LIMIT 1;
    END IF;
    IF p_queue_ms <= 0 OR head = p_token THEN  -- (nested: SQL does not promise to short-circuit AND)
        IF stampede_take_lease(p_lock, p_token, p_lease_ms, now_) THEN
            DELETE FROM stampede_queue WHERE key = p_lock AND token = p_token;
            state := 2; fence := nextval('stampede_fences'); RETURN;
        END IF;
    END IF;
    state := 3;
    SELECT l.expires_at INTO deadline FROM stampede_leases l WHERE l.key = p_lock AND l.expires_at > now_;
    IF deadline IS NULL THEN
        left_ms := -2;
    ELSE
        left_ms := stampede_ms_left(deadline, now_);
    END IF;
END $$;

-- Give up a place in a fair lock's queue; wake the others (it may have been first).
CREATE OR REPLACE FUNCTION stampede_leave_queue(p_lock text, p_token text, p_channel text)
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM stampede_queue WHERE key = p_lock AND token = p_token;
    IF FOUND THEN PERFORM stampede_wake(p_channel, 'c' || p_channel); END IF;
END $$;

-- Take a slot of a load budget of p_slots (the Redis TAKE_SLOT script): a holder whose
-- lease ran out has lost its slot; the first (free slots) live waiters may take one.
-- state 2: taken (or held already); 3: not yet, the earliest holder's lease has left_ms
-- more (-2: a slot is free, but other waiters are first in line).
CREATE OR REPLACE FUNCTION stampede_take_slot(
    p_budget text, p_token text, p_lease_ms bigint, p_queue_ms bigint, p_slots int,
    OUT state int, OUT left_ms bigint)
LANGUAGE plpgsql AS $$
DECLARE
    now_ timestamptz := clock_timestamp();
    lease timestamptz := now_ + p_lease_ms * interval '1 millisecond';
    free int;
    ahead int := 0;
    waiter record;
    deadline timestamptz;
BEGIN
    left_ms := 0;
    PERFORM pg_advisory_xact_lock(hashtextextended(p_budget, 0));
    DELETE FROM stampede_slots WHERE key = p_budget AND expires_at <= now_;
    UPDATE stampede_slots SET expires_at = lease WHERE key = p_budget AND token = p_token;
    IF FOUND THEN state := 2; RETURN; END IF;
    INSERT INTO stampede_queue AS q (key, token, ticket, expires_at)
        VALUES (p_budget, p_token, nextval('stampede_tickets'), now_ + p_queue_ms * interval '1 millisecond')
        ON CONFLICT (key, token) DO UPDATE SET expires_at = EXCLUDED.expires_at;
    SELECT p_slots - count(*) INTO free FROM stampede_slots WHERE key = p_budget;
    FOR waiter IN SELECT q.token, q.expires_at FROM stampede_queue q WHERE q.key = p_budget ORDER BY q.ticket LOOP
        EXIT WHEN ahead >= free;
        IF waiter.token = p_token THEN
            DELETE FROM stampede_queue WHERE key = p_budget AND token = p_token;
            INSERT INTO stampede_slots (key, token, expires_at) VALUES (p_budget, p_token, lease);
            state := 2; RETURN;
        ELSIF waiter.expires_at > now_ THEN
            ahead := ahead + 1;
        ELSE
            DELETE FROM stampede_queue WHERE key = p_budget AND token = waiter.token;
        END IF;
    END LOOP;
    state := 3;
    IF free > 0 THEN left_ms := -2; RETURN; END IF;
    SELECT min(s.expires_at) INTO deadline FROM stampede_slots s WHERE s.key = p_budget;
    left_ms := stampede_ms_left(deadline, now_);
END $$;

-- stampede_take_slot for a load holding p_lock's lease as p_lease (SlotLeaseStore):
-- state 4, and out of the queue, once that lease is not p_lease. Its place in the queue
-- carries the lease, so that stampede_release_slot hands it a slot only while it holds.
CREATE OR REPLACE FUNCTION stampede_take_slot_for(
    p_budget text, p_token text, p_lease_ms bigint, p_queue_ms bigint, p_slots int, p_lock text, p_lease text,
    OUT state int, OUT left_ms bigint)
LANGUAGE plpgsql AS $$
DECLARE
    now_ timestamptz := clock_timestamp();
BEGIN
    PERFORM pg_advisory_xact_lock(hashtextextended(p_budget, 0));
    IF NOT EXISTS (SELECT 1 FROM stampede_leases l
            WHERE l.key = p_lock AND l.token = p_lease AND l.expires_at > now_) THEN
        DELETE FROM stampede_queue WHERE key = p_budget AND token = p_token;
        DELETE FROM stampede_slot_leases WHERE key = p_budget AND token = p_token;
        state := 4; left_ms := 0; RETURN;
    END IF;
    SELECT t.state, t.left_ms INTO state, left_ms
        FROM stampede_take_slot(p_budget, p_token, p_lease_ms, p_queue_ms, p_slots) t;
    IF state = 2 THEN
        DELETE FROM stampede_slot_leases WHERE key = p_budget AND token = p_token;
    ELSE
        INSERT INTO stampede_slot_leases AS s (key, token, lease_key, lease_token, expires_at)
            VALUES (p_budget, p_token, p_lock, p_lease, now_ + p_queue_ms * interval '1 millisecond')
            ON CONFLICT (key, token) DO UPDATE SET expires_at = EXCLUDED.expires_at;
    END IF;
END $$;

-- Extend a slot's lease while p_token holds it; false once it is lost.
CREATE OR REPLACE FUNCTION stampede_renew_slot(p_budget text, p_token text, p_lease_ms bigint)
RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN
    UPDATE stampede_slots SET expires_at = clock_timestamp() + p_lease_ms * interval '1 millisecond'
        WHERE key = p_budget AND token = p_token AND expires_at > clock_timestamp();
    RETURN FOUND;
END $$;

-- Give a slot, or a place in the queue, back (the Redis RELEASE_SLOT script), and hand
-- each free slot of p_slots to the first live waiter in line, telling it on its own
-- channel ('g', base64 Zw==); false if p_token held no slot. A waiter whose place
-- carries a lease (stampede_take_slot_for) that is no longer its own is told 'l'
-- (base64 bA==) and leaves the queue, and the slot goes on down the line.
CREATE OR REPLACE FUNCTION stampede_release_slot(
    p_budget text, p_token text, p_channel text, p_slots int, p_lease_ms bigint)
RETURNS boolean LANGUAGE plpgsql AS $$
DECLARE
    now_ timestamptz := clock_timestamp();
    released boolean;
    free int;
    passed int := 0;
    waiter record;
BEGIN
    PERFORM pg_advisory_xact_lock(hashtextextended(p_budget, 0));
    DELETE FROM stampede_slots WHERE key = p_budget AND token = p_token;
    released := FOUND;
    DELETE FROM stampede_queue WHERE key = p_budget AND token = p_token;
    DELETE FROM stampede_slot_leases WHERE key = p_budget AND token = p_token;
    DELETE FROM stampede_slots WHERE key = p_budget AND expires_at <= now_;
    SELECT p_slots - count(*) INTO free FROM stampede_slots WHERE key = p_budget;
    FOR waiter IN SELECT q.token, s.lease_key, s.lease_token FROM stampede_queue q
            LEFT JOIN stampede_slot_leases s ON s.key = q.key AND s.token = q.token
            WHERE q.key = p_budget AND q.expires_at > now_ ORDER BY q.ticket LOOP
        EXIT WHEN free <= 0 OR passed >= 64;
        DELETE FROM stampede_queue WHERE key = p_budget AND token = waiter.token;
        DELETE FROM stampede_slot_leases WHERE key = p_budget AND token = waiter.token;
        IF waiter.lease_key IS NOT NULL AND NOT EXISTS (SELECT 1 FROM stampede_leases l
                WHERE l.key = waiter.lease_key AND l.token = waiter.lease_token AND l.expires_at > now_) THEN
            PERFORM stampede_wake(p_channel || ':' || waiter.token,
                'vbA==' || chr(10) || p_channel || ':' || waiter.token);  -- its load could not be written
            passed := passed + 1;
        ELSE
            INSERT INTO stampede_slots (key, token, expires_at)
                VALUES (p_budget, waiter.token, now_ + p_lease_ms * interval '1 millisecond');
            PERFORM stampede_wake(p_channel || ':' || waiter.token,
                'vZw==' || chr(10) || p_channel || ':' || waiter.token);
            free := free - 1;
        END IF;
    END LOOP;
    RETURN released;
END $$;

-- Add each member's count to the hot set p_key, keep its p_limit most counted members (the
-- least counted go, ties by member), and let it live p_ttl_ms from now (NOTE_HOT's rules).
CREATE OR REPLACE FUNCTION stampede_note_hot(
    p_key text, p_members bytea[], p_counts bigint[], p_limit int, p_ttl_ms bigint)
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    now_ timestamptz := clock_timestamp();
    ends timestamptz := now_ + p_ttl_ms * interval '1 millisecond';
BEGIN
    PERFORM pg_advisory_xact_lock(hashtextextended(p_key, 0));
    DELETE FROM stampede_hot WHERE key = p_key AND expires_at <= now_;
    INSERT INTO stampede_hot AS h (key, member, score, expires_at)
        SELECT p_key, u.member, u.count, ends FROM unnest(p_members, p_counts) AS u(member, count)
        ON CONFLICT (key, member) DO UPDATE SET score = h.score + EXCLUDED.score;
    UPDATE stampede_hot SET expires_at = ends WHERE key = p_key;
    DELETE FROM stampede_hot WHERE key = p_key AND member NOT IN (
        SELECT member FROM stampede_hot WHERE key = p_key ORDER BY score DESC, member DESC LIMIT p_limit);
END $$;

-- Delete up to p_batch expired rows of each table; return how many went. Expired rows
-- are already ignored by every read: this only keeps the tables small.
CREATE OR REPLACE FUNCTION stampede_sweep(p_batch int)
RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
    now_ timestamptz := clock_timestamp();
    gone bigint := 0;
    n bigint;
BEGIN
    DELETE FROM stampede_values WHERE ctid = ANY (ARRAY(
        SELECT ctid FROM stampede_values WHERE expires_at <= now_ LIMIT p_batch));
    GET DIAGNOSTICS n = ROW_COUNT; gone := gone + n;
    DELETE FROM stampede_leases WHERE ctid = ANY (ARRAY(
        SELECT ctid FROM stampede_leases WHERE expires_at <= now_ LIMIT p_batch));
    GET DIAGNOSTICS n = ROW_COUNT; gone := gone + n;
    DELETE FROM stampede_queue WHERE ctid = ANY (ARRAY(
        SELECT ctid FROM stampede_queue WHERE expires_at <= now_ LIMIT p_batch));
    GET DIAGNOSTICS n = ROW_COUNT; gone := gone + n;
    DELETE FROM stampede_slots WHERE ctid = ANY (ARRAY(
        SELECT ctid FROM stampede_slots WHERE expires_at <= now_ LIMIT p_batch));
    GET DIAGNOSTICS n = ROW_COUNT; gone := gone + n;
    DELETE FROM stampede_tag_members WHERE ctid = ANY (ARRAY(
        SELECT ctid FROM stampede_tag_members WHERE expires_at <= now_ LIMIT p_batch));
    GET DIAGNOSTICS n = ROW_COUNT; gone := gone + n;
    DELETE FROM stampede_tag_generations WHERE ctid = ANY (ARRAY(
        SELECT ctid FROM stampede_tag_generations WHERE expires_at <= now_ LIMIT p_batch));
    GET DIAGNOSTICS n = ROW_COUNT; gone := gone + n;
    DELETE FROM stampede_hot WHERE ctid = ANY (ARRAY(
        SELECT ctid FROM stampede_hot WHERE expires_at <= now_ LIMIT p_batch));
    GET DIAGNOSTICS n = ROW_COUNT; gone := gone + n;
    DELETE FROM stampede_slot_leases WHERE ctid = ANY (ARRAY(
        SELECT ctid FROM stampede_slot_leases WHERE expires_at <= now_ LIMIT p_batch));
    GET DIAGNOSTICS n = ROW_COUNT; gone := gone + n;
    RETURN gone;
END $$;

CREATE OR REPLACE FUNCTION stampede_schema_v3() RETURNS int LANGUAGE sql IMMUTABLE AS 'SELECT 1';
CREATE OR REPLACE FUNCTION stampede_schema_v4() RETURNS int LANGUAGE sql IMMUTABLE AS 'SELECT 1';
CREATE OR REPLACE FUNCTION stampede_schema_v5() RETURNS int LANGUAGE sql IMMUTABLE AS 'SELECT 1';
CREATE OR REPLACE FUNCTION stampede_schema_v6() RETURNS int LANGUAGE sql IMMUTABLE AS 'SELECT 1';
CREATE OR REPLACE FUNCTION stampede_schema_v7() RETURNS int LANGUAGE sql IMMUTABLE AS 'SELECT 1';
CREATE OR REPLACE FUNCTION stampede_schema_v8() RETURNS int LANGUAGE sql IMMUTABLE AS 'SELECT 1';
""".replace("@TRACE_MARK@", TRACE_MARK)  # the same text as before it was handed in: no new version


class Statement(NamedTuple):
    """One statement and its parameters, as ``cursor.execute`` takes them."""

    query: str
    params: tuple[object, ...]


GET = "SELECT value FROM stampede_values WHERE key = %s AND expires_at > clock_timestamp()"

GET_MANY = "SELECT key, value FROM stampede_values WHERE key = ANY(%s) AND expires_at > clock_timestamp()"
"""Many entries' values in one statement (a many-key call's first read): the rows found."""

GET_WITH_TTL = (
    "SELECT v.value, extract(epoch FROM v.expires_at - clock_timestamp())::float8,"
    " EXISTS (SELECT 1 FROM stampede_values f WHERE f.key = %s AND f.expires_at > clock_timestamp())"
    " FROM stampede_values v WHERE v.key = %s AND v.expires_at > clock_timestamp()"
)

HOLDER = "SELECT token FROM stampede_leases WHERE key = %s AND expires_at > clock_timestamp()"

RENEW = (
    "UPDATE stampede_leases SET expires_at = clock_timestamp() + %s * interval '1 millisecond'"
    " WHERE key = %s AND token = %s AND expires_at > clock_timestamp()"
)

SCAN = (
    "SELECT key FROM stampede_values WHERE key LIKE %s AND expires_at > clock_timestamp()"
    " UNION SELECT key FROM stampede_leases WHERE key LIKE %s AND expires_at > clock_timestamp()"
)

DESCRIBE = (  # an entry's value, lease and failing marker, for the command line
    "SELECT (SELECT value FROM stampede_values WHERE key = %s AND expires_at > clock_timestamp()),"
    " (SELECT (extract(epoch FROM expires_at - clock_timestamp()) * 1000)::bigint FROM stampede_values"
    "  WHERE key = %s AND expires_at > clock_timestamp()),"
    " (SELECT token FROM stampede_leases WHERE key = %s AND expires_at > clock_timestamp()),"
    " (SELECT (extract(epoch FROM expires_at - clock_timestamp()) * 1000)::bigint FROM stampede_leases"
    "  WHERE key = %s AND expires_at > clock_timestamp()),"
    " EXISTS (SELECT 1 FROM stampede_values WHERE key = %s AND expires_at > clock_timestamp())"
)

LEASES = (  # every lease in flight in a namespace, with a fair lock's waiters in line
    "SELECT l.key, l.token, (extract(epoch FROM l.expires_at - clock_timestamp()) * 1000)::bigint,"
    " (SELECT count(*) FROM stampede_queue q WHERE q.key = l.key AND q.expires_at > clock_timestamp())"
    " FROM stampede_leases l WHERE l.key LIKE %s AND l.expires_at > clock_timestamp()"
)

SWEEP = "SELECT stampede_sweep(%s)"

CHECK = (
    "INSERT INTO stampede_values (key, value, expires_at) VALUES (%s, '\\x31', clock_timestamp() + interval '1 s')"
    " ON CONFLICT (key) DO UPDATE SET expires_at = EXCLUDED.expires_at"
)
CHECK_DELETE = "DELETE FROM stampede_values WHERE key = %s"


def get_with_ttl(key: str, failing_key: str) -> Statement:
    return Statement(GET_WITH_TTL, (failing_key, key))


def acquire(
    keys: EntryKeys, token: str, lease_ms: int, check_value: bool, stale: bytes, clock: bool = False
) -> Statement:
    """``clock``: a tagged load's, which reads the tag clock in the same statement (its
    last column, see ``TAG_CLOCK``), as the lease is taken: before the load begins."""
    read_clock = f", ({TAG_CLOCK})" if clock else ""
    return Statement(
        f"SELECT state, raw, left_ms, failed, holder{read_clock} FROM stampede_acquire(%s, %s, %s, %s, %s, %s)",
        (keys.value, keys.lock, token, lease_ms, check_value, stale),
    )


def write_release(keys: EntryKeys, token: str, envelope: bytes, ttl_ms: int, inline: bool) -> Statement:
    stale_ms = int(stale_window_of(envelope) * 1000)
    markers = (keys.invalidated, keys.failing)
    return Statement(
        "SELECT stampede_write_release(%s, %s, %s, %s, %s, %s, %s, %s, %s, %s)",
        (keys.value, keys.lock, *markers, token, envelope, ttl_ms, stale_ms, keys.channel, inline),
    )


def write_tagged(keys: EntryKeys, token: str, envelope: bytes, ttl_ms: int, inline: bool, tagged: Tagged) -> Statement:
    stale_ms = int(stale_window_of(envelope) * 1000)
    markers = (keys.invalidated, keys.failing)
    tags = tagged.tags.tags
    return Statement(
        "SELECT stampede_write_tagged(%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)",
        (
            keys.value, keys.lock, *markers, token, envelope, ttl_ms, stale_ms, keys.channel, inline,
            keys.tags, tagged.tags.names, [tag.members for tag in tags], [tag.generation for tag in tags],
            tagged.since, ttl_ms + MEMBER_MARGIN_MS,
        ),
    )  # fmt: skip


TAG_CLOCK = "SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM stampede_tag_clock"
"""The tag clock a tagged load reads before it begins: the last value drawn (0: none yet)."""


def invalidate_tag(tag: TagKeys, keep_stale: bool) -> Statement:
    return Statement(
        "SELECT * FROM stampede_invalidate_tag(%s, %s, %s, %s)",
        (tag.members, tag.generation, keep_stale, GENERATION_KEEP_MS),
    )


TAGGED = (  # how many live entries carry a tag, for the command line
    "SELECT count(*) FROM stampede_tag_members m JOIN stampede_values v ON v.key = m.key"
    " WHERE m.tag = %s AND m.expires_at > clock_timestamp() AND v.expires_at > clock_timestamp()"
)


FENCE = "f"
"""A payload ``f<fence>`` confirms the mailbox that waits for it (``PostgresListener``).
Every listener hears it; those of other processes, and of older versions, find nobody."""


def fence(name: str) -> Statement:
    return Statement("SELECT pg_notify(%s, %s)", (NOTIFY_CHANNEL, FENCE + name))


def wake_up(payload: str) -> tuple[str, bytes]:
    """A NOTIFY payload as (the entry's channel, the message for its waiters). The
    channel is ``*`` when every waiter is to re-check."""
    if payload.startswith("v"):
        encoded, _, channel = payload[1:].partition("\n")
        try:
            return channel, base64.b64decode(encoded, validate=True)
        except ValueError:  # not ours, or cut: the waiters re-check
            return channel, b""
    return payload[1:], b""


def release(keys: EntryKeys, token: str) -> Statement:
    return Statement("SELECT stampede_release(%s, %s, %s)", (keys.lock, token, keys.channel))


def renew(keys: EntryKeys, token: str, lease_ms: int) -> Statement:
    return Statement(RENEW, (lease_ms, keys.lock, token))


def hold(keys: EntryKeys, token: str, hold_ms: int, failing_ms: int) -> Statement:
    return Statement(
        "SELECT stampede_hold(%s, %s, %s, %s, %s, %s)",
        (keys.lock, keys.failing, token, hold_ms, failing_ms, keys.channel),
    )


_VERSIONED = "EXISTS (SELECT 1 FROM stampede_values WHERE key = %s AND expires_at > clock_timestamp())"
"""Whether a versioned loader marked the entry (``_core.versions``): the second column of
an invalidation's, an expiry's and a seizure's row, read in the same statement."""


def seize(keys: EntryKeys, token: str, lease_ms: int) -> Statement:
    return Statement(
        f"SELECT stampede_seize(%s, %s, %s, %s, %s, %s, %s), {_VERSIONED}",
        (keys.value, keys.lock, keys.invalidated, keys.failing, keys.channel, token, lease_ms, keys.versioned),
    )


def invalidate(keys: EntryKeys, keep_stale: bool) -> Statement:
    return Statement(
        f"SELECT stampede_invalidate(%s, %s, %s, %s, %s, %s), {_VERSIONED}",
        (keys.value, keys.lock, keys.invalidated, keys.failing, keys.channel, keep_stale, keys.versioned),
    )


def mark_versioned(keys: Sequence[EntryKeys], marker_ms: int) -> Statement:
    """A versioned load's marks (``_core.versions``), each lasting at least ``marker_ms``."""
    return Statement(
        "INSERT INTO stampede_values (key, value, expires_at) "
        "SELECT key, '\\x31', clock_timestamp() + %s * interval '1 millisecond' FROM unnest(%s::text[]) AS key "
        "ON CONFLICT (key) DO UPDATE SET expires_at = GREATEST(stampede_values.expires_at, EXCLUDED.expires_at)",
        (marker_ms, sorted({entry.versioned for entry in keys})),
    )


def keep(keys: EntryKeys, identity: bytes, ttl_ms: int) -> Statement:
    """A not-modified refresh's value, still the one of ``identity``, lives ``ttl_ms``
    from now (after ``release`` in the same transaction: see ``PostgresStore.touch``)."""
    return Statement(
        "UPDATE stampede_values SET expires_at = clock_timestamp() + %s * interval '1 millisecond' "
        "WHERE key = %s AND expires_at > clock_timestamp() AND substring(value from 1 for %s) = %s",
        (ttl_ms, keys.value, len(identity), identity),
    )


def forget_failing(keys: EntryKeys) -> Statement:
    return Statement("DELETE FROM stampede_values WHERE key = %s", (keys.failing,))


def take_lock(keys: EntryKeys, token: str, lease_ms: int, queue_ms: int) -> Statement:
    return Statement(
        "SELECT state, fence, left_ms FROM stampede_take_lock(%s, %s, %s, %s)",
        (keys.lock, token, lease_ms, queue_ms),
    )


def note_hot(key: str, counts: Mapping[bytes, int], limit: int, ttl_ms: int) -> Statement:
    return Statement(
        "SELECT stampede_note_hot(%s, %s, %s, %s, %s)", (key, list(counts), list(counts.values()), limit, ttl_ms)
    )


HOT_MEMBERS = (
    "SELECT member, score FROM stampede_hot WHERE key = %s AND expires_at > clock_timestamp() "
    "ORDER BY score DESC, member DESC LIMIT %s"
)


def take_slot(keys: EntryKeys, token: str, lease_ms: int, queue_ms: int, slots: int) -> Statement:
    return Statement(
        "SELECT state, left_ms FROM stampede_take_slot(%s, %s, %s, %s, %s)",
        (keys.lock, token, lease_ms, queue_ms, slots),
    )


def take_slot_for(
    keys: EntryKeys, token: str, lease_ms: int, queue_ms: int, slots: int, entry: EntryKeys, lease: str
) -> Statement:
    return Statement(
        "SELECT state, left_ms FROM stampede_take_slot_for(%s, %s, %s, %s, %s, %s, %s)",
        (keys.lock, token, lease_ms, queue_ms, slots, entry.lock, lease),
    )


def take_slot_reply(row: tuple[Any, ...] | None) -> AcquireReply:
    """``stampede_take_slot``'s (or ``stampede_take_slot_for``'s) row as the store
    contract's reply."""
    if row is None:
        raise BackendUnavailable("postgresql returned no row to take a slot")
    state, left_ms = row
    if state == 2:
        return AcquireReply(LockState.LOCKED)
    if state == 4:
        return AcquireReply(LockState.LEASE_GONE)
    return AcquireReply(LockState.HELD, lease_left=left_ms / 1000)


def renew_slot(keys: EntryKeys, token: str, lease_ms: int) -> Statement:
    return Statement("SELECT stampede_renew_slot(%s, %s, %s)", (keys.lock, token, lease_ms))


def release_slot(keys: EntryKeys, token: str, slots: int, lease_ms: int) -> Statement:
    return Statement(
        "SELECT stampede_release_slot(%s, %s, %s, %s, %s)", (keys.lock, token, keys.channel, slots, lease_ms)
    )


def leave_queue(keys: EntryKeys, token: str) -> Statement:
    return Statement("SELECT stampede_leave_queue(%s, %s, %s)", (keys.lock, token, keys.channel))


def holder(keys: EntryKeys) -> Statement:
    return Statement(HOLDER, (keys.lock,))


def describe(keys: EntryKeys) -> Statement:
    return Statement(DESCRIBE, (keys.value, keys.value, keys.lock, keys.lock, keys.failing))


def leases(namespace: str) -> Statement:
    return Statement(LEASES, (_like_escape(f"{namespace}:{{") + "%}:lock",))


def scan(namespace: str, match: str) -> Statement:
    """Every key of the namespace whose entry starts with the glob's literal prefix.
    callers test each entry against the whole pattern."""
    literal = ""
    for char in match:
        if char in "*?[\\":
            break
        literal += char
    like = _like_escape(f"{namespace}:{{{literal}") + "%"
    return Statement(SCAN, (like, like))


def _like_escape(text: str) -> str:
    return text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


def acquire_reply(row: tuple[Any, ...] | None) -> AcquireReply:
    """``stampede_acquire``'s row as the store contract's reply."""
    if row is None:
        raise BackendUnavailable("postgresql returned no row to take a lease")
    state, raw, left_ms, failed, holder = row[:5]
    if state == 1:  # left_ms: the value's (schema version 5; 0 from an older one: not told)
        return AcquireReply(LockState.VALUE, bytes(raw), ttl_left=left_ms / 1000 if left_ms > 0 else -1.0)
    if state == 2:  # a sixth column: the tag clock, read with the lease (``acquire(clock=True)``)
        return AcquireReply(LockState.LOCKED, since=int(row[5]) if len(row) > 5 else None)
    return AcquireReply(LockState.HELD, lease_left=left_ms / 1000, failed=bool(failed), holder=holder or "")


def take_lock_reply(row: tuple[Any, ...] | None) -> AcquireReply:
    """``stampede_take_lock``'s row as the store contract's reply."""
    if row is None:
        raise BackendUnavailable("postgresql returned no row to take a lock")
    state, fence, left_ms = row
    if state == 2:
        return AcquireReply(LockState.LOCKED, fence=int(fence))
    return AcquireReply(LockState.HELD, lease_left=left_ms / 1000)
