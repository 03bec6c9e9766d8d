"""What the Redis stores share, blocking and asyncio (``store``, ``astore``): a failure
translated to ``BackendUnavailable`` and told to its server's breaker, which breaker a key
goes to (a cluster's primary, Sentinel's master), the scripts registered on a client, and
the near caches' acknowledgements an invalidation waits for.

Every redis-py failure (connection refused, timeout, an error reply such as OOM or
READONLY) leaves a store as ``BackendUnavailable``, which the flow turns into policy.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import logging
import math
import secrets
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import redis
import redis.asyncio.cluster
import redis.cluster
from redis.exceptions import NoScriptError, RedisError

from ..._core.near import AckWait, NearChannel, members_in, registry_problem
from ..._errors import BackendUnavailable, ConfigError
from ..breaker import CircuitBreaker, NodeBreakers
from . import batches
from . import scripts as _scripts

log = logging.getLogger("stampede.backend")

# What a failing command raises, blocking or asyncio (on Python 3.10 asyncio's timeout
# is not an OSError). Of those, what says the server could not be reached.
FAILURES = (RedisError, OSError, asyncio.TimeoutError)
UNREAD = (None, 0.0, False)  # a read with TTL of a key whose server failed: a miss (see _read_cluster)
T = TypeVar("T")
UNREACHABLE = (redis.ConnectionError, redis.TimeoutError, OSError, asyncio.TimeoutError)


TORN_DOWN = (TypeError, AttributeError, ValueError)
"""What redis-py's parsers raise mid-command when another thread disconnected the
connection under it (a dropped socket or buffer). Through a cluster or Sentinel redis-py
does that itself, re-routing a server's connections after one of its commands failed, so
there it is a failure to reach the server like any other."""


@contextmanager
def translated(
    what: str, key: str, breaker: CircuitBreaker, torn_down: tuple[type[Exception], ...] = ()
) -> Iterator[None]:
    """One command: refused at once while the circuit is open. Its failure (and an error
    of ``torn_down``: see ``TORN_DOWN``) translated to BackendUnavailable and its outcome
    told to the breaker."""
    breaker.check(key)
    try:
        yield
    except FAILURES as error:
        raise failure(breaker, what, key, error) from error
    except torn_down as error:
        raise failure(breaker, what, key, torn_down_error(error)) from error
    breaker.succeeded()


def torn_down_error(error: Exception) -> redis.ConnectionError:
    return redis.ConnectionError(f"connection torn down mid-command ({type(error).__name__}: {error})")


POOL_EXHAUSTED = "No connection available."
"""What redis-py's blocking pools raise (a ``ConnectionError``) when every connection
stayed in use for the pool's timeout: the command never went to the server."""


def failure(breaker: CircuitBreaker, what: str, key: str, error: BaseException) -> BackendUnavailable:
    """Tell the breaker about a failed command (an error reply means the server is
    there), and translate the error. A caller that only waited for a free connection
    tells it nothing: the commands holding the connections report for the server. (A
    burst of threads beyond ``max_connections`` on a busy machine timed out waiting by
    the hundred at once, and opened the circuit of a server answering every command.)"""
    if isinstance(error, redis.ConnectionError) and str(error) == POOL_EXHAUSTED:
        pass
    elif isinstance(error, UNREACHABLE):
        breaker.failed(f"{type(error).__name__}: {error}")
    else:
        breaker.succeeded()
    timed_out = isinstance(error, (redis.TimeoutError, TimeoutError, asyncio.TimeoutError))
    return BackendUnavailable(f"redis failed to {what} {key!r}: {error}", key=key, timed_out=timed_out)


def eviction_risk(config: dict[Any, Any]) -> str | None:
    """What ``CONFIG GET maxmemory*`` says of leases: None if the server never evicts a key
    (noeviction, or no memory limit), else a warning with the fix. Every other policy,
    volatile-* included, may evict a lease (it has an expiry) mid-load, and a second load
    of its key then runs beside the first."""
    text = {as_text(name): as_text(value) for name, value in config.items()}
    policy, limit = text.get("maxmemory-policy"), text.get("maxmemory", "0")
    if policy is None or policy == "noeviction" or limit == "0":
        return None
    return (
        f"the server's maxmemory-policy is {policy} (maxmemory {limit}): it may evict a lease "
        "mid-load, and a second load of the key then runs beside the first. Set "
        "maxmemory-policy noeviction (values still expire by their TTL; writes refused when "
        "full are served uncached), or hold leases on Redlock lock servers that do not evict"
    )


def as_text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


class EvictionCheck:
    """Asks the server for its eviction policy once per layer, at its first lease (the
    first moment the server is known to answer), and warns if leases may be evicted."""

    def __init__(self) -> None:
        self.pending = True

    def found(self, config: Any) -> None:
        warning = eviction_risk(config) if isinstance(config, dict) else None
        if warning:
            log.warning("stampede: %s", warning)


def is_cluster(client: Any) -> bool:
    """Whether ``client`` is a Redis Cluster client, blocking or asyncio."""
    return _is_cluster_type(client.__class__)


@functools.cache
def _is_cluster_type(kind: type) -> bool:
    """Asked once per client class: both cluster clients derive from a ``typing.Protocol``,
    whose ``isinstance`` costs 2.5 us, 1% of a warm page's MGET."""
    return issubclass(kind, (redis.cluster.RedisCluster, redis.asyncio.cluster.RedisCluster))


def follows_master(client: Any) -> bool:
    """Whether ``client`` reaches its server through Sentinel (blocking or asyncio)."""
    pool = getattr(client, "connection_pool", None)
    return callable(getattr(pool, "get_master_address", None))


def node_of(client: Any, key: str) -> str | None:
    """The server a command on ``key`` goes to now, as the client knows it: the primary of
    the key's slot on a cluster, the master through Sentinel. None while not known yet."""
    if is_cluster(client):
        try:
            return str(client.get_node_from_key(key).name)
        except Exception:  # slots not learned yet, or not covered
            return None
    address = client.connection_pool.master_address
    return None if address is None else f"{address[0]}:{address[1]}"


def breaker_for(client: Any, nodes: NodeBreakers | None, whole: CircuitBreaker, key: str) -> CircuitBreaker:
    """The breaker that guards commands on ``key``: with ``nodes`` (a cluster, or Sentinel),
    that of the server the command goes to. Else, or while that is not known, ``whole``."""
    if nodes is None:
        return whole
    node = node_of(client, key)
    return whole if node is None else nodes.of(node)


def refresh_route(client: Any) -> Any:
    """Ask where commands go now: the cluster's slots (CLUSTER SLOTS) or Sentinel's master
    (which also drops idle connections to a master that moved). An awaitable for an
    asyncio client."""
    if is_cluster(client):
        return client.nodes_manager.initialize()
    return client.connection_pool.get_master_address()


class SlotScript:
    """A script on a Redis Cluster: EVALSHA to the primary of its keys' slot, and on
    NOSCRIPT an EVAL there, which also caches it on that node. redis-py's own scripts
    load themselves with SCRIPT LOAD on every primary, which fails everywhere while any
    one primary is down."""

    def __init__(self, client: Any, script: str) -> None:
        self._client = client
        self.script = script
        self._sha = hashlib.sha1(script.encode()).hexdigest()  # Redis names scripts by their SHA-1

    def __call__(self, keys: list[str], args: list[Any]) -> Any:
        try:
            return self._client.evalsha(self._sha, len(keys), *keys, *args)
        except NoScriptError:
            return self._client.eval(self.script, len(keys), *keys, *args)


class AsyncSlotScript(SlotScript):
    """``SlotScript`` for the asyncio cluster client."""

    async def __call__(self, keys: list[str], args: list[Any]) -> Any:
        try:
            return await self._client.evalsha(self._sha, len(keys), *keys, *args)
        except NoScriptError:
            return await self._client.eval(self.script, len(keys), *keys, *args)


class Scripts:
    """The backend's scripts registered on a client, blocking or asyncio (both clients
    call them by EVALSHA and load them again after NOSCRIPT). On a cluster each goes to the
    primary of its keys' slot (``SlotScript``), and its wake-ups are sharded
    (``scripts.sharded``)."""

    def __init__(self, client: Any) -> None:
        def register(script: str) -> Any:
            if isinstance(client, redis.asyncio.cluster.RedisCluster):
                return AsyncSlotScript(client, _scripts.sharded(script))
            if isinstance(client, redis.cluster.RedisCluster):
                return SlotScript(client, _scripts.sharded(script))
            return client.register_script(script)

        self.acquire = register(_scripts.ACQUIRE)
        self.acquire_reading_clock = register(_scripts.ACQUIRE_READING_CLOCK)  # one server's
        self.write_release = register(_scripts.WRITE_AND_RELEASE)
        self.touch = register(_scripts.TOUCH)
        self.acquires = batches.Pair(self.acquire, register(_scripts.ACQUIRE_EACH))  # many entries' (batches)
        self.writes = batches.Pair(self.write_release, register(_scripts.WRITE_AND_RELEASE_EACH))
        self.renew = register(_scripts.RENEW)
        self.release = register(_scripts.RELEASE)
        self.invalidate = register(_scripts.INVALIDATE)
        self.seize = register(_scripts.SEIZE)
        self.put = register(_scripts.PUT)
        self.put_tagged = register(_scripts.PUT_TAGGED)
        self.hold = register(_scripts.HOLD_AFTER_FAILURE)
        self.expire = register(_scripts.EXPIRE)
        self.request_near = register(_scripts.REQUEST_NEAR)
        self.take_lock = register(_scripts.TAKE_LOCK)
        self.take_lock_fairly = register(_scripts.TAKE_LOCK_FAIRLY)
        self.leave_queue = register(_scripts.LEAVE_QUEUE)
        self.take_slot = register(_scripts.TAKE_SLOT)
        self.renew_slot = register(_scripts.RENEW_SLOT)
        self.release_slot = register(_scripts.RELEASE_SLOT)
        self.note_hot = register(_scripts.NOTE_HOT)
        self.read_tag_clock = register(_scripts.READ_TAG_CLOCK)
        self.draw_tag_clock = register(_scripts.DRAW_TAG_CLOCK)
        self.write_tagged = register(_scripts.WRITE_TAGGED)
        self.admit_tags = register(_scripts.ADMIT_TAGS)
        self.mark_tag = register(_scripts.MARK_TAG)
        self.forget_members = register(_scripts.FORGET_MEMBERS)
        self.marks = batches.Pair(register(_scripts.MARK_VERSIONED), register(_scripts.MARK_VERSIONED_EACH))
        self.invalidates = batches.Pair(self.invalidate, register(_scripts.INVALIDATE_EACH))
        self.expires = batches.Pair(self.expire, register(_scripts.EXPIRE_EACH))
        self.admissions = batches.Pair(self.admit_tags, self.admit_tags)  # one call each: their keys vary
        self.tagged_writes = batches.Pair(self.write_tagged, register(_scripts.WRITE_TAGGED_EACH))


_near_warned_at: dict[str, float] = {}


def warn_near(message: str, problem: object) -> None:
    """Warn of an invalidation that could not work with the near caches, once a minute
    per kind: a process without near caches of its own may run with an ACL user that
    predates them."""
    now = time.monotonic()
    if now - _near_warned_at.get(message, -math.inf) > 60:
        _near_warned_at[message] = now
        log.warning(message, problem)


def near_wait(reply: Any, near: NearChannel | None, own_too: bool = False) -> AckWait | None:
    """What an invalidation's reply says to wait for: the near caches it named (see
    ``_core.near``), or None. ``own_too``: this process's as well, which an invalidator
    leaves out where the layer drops its copies itself. A reply that could not read their
    registry is warned of: near caches of other processes were not asked to drop their
    copies."""
    problem = registry_problem(reply)
    if problem is not None:
        warn_near(
            "stampede: an invalidation could not ask near caches to drop their copies (%s); the ACL "
            "user needs +time +zrangebyscore if any process uses near_cache (docs/near-cache.md)",
            problem,
        )
        return None
    members = members_in(reply)
    if not members or near is None:
        return None
    return AckWait(members, time.monotonic(), None if own_too else near.own)


NOT_HEARD = (
    "stampede: an invalidation could not hear the near caches' acknowledgements (%s), and waited "
    "out their lease instead; the ACL user needs +blmpop or +blpop (docs/near-cache.md)"
)


def without_blmpop(error: Exception, command: tuple[Any, ...]) -> bool:
    """Whether ``error`` is the server refusing BLMPOP (Redis before 7 has none, an ACL
    user may lack it): wait with BLPOP from then on."""
    return command[0] == "BLMPOP" and isinstance(error, redis.ResponseError)


def ack_route(client: Any, ack_key: str) -> dict[str, Any]:
    """Where a command on ``ack_key`` goes: on a cluster, to its slot's primary (named, so
    that redis-py need not ask the server where BLMPOP's keys are)."""
    return {"target_nodes": client.get_node_from_key(ack_key)} if is_cluster(client) else {}


def new_nonce(near: NearChannel | None) -> str:
    """The name of one invalidation's acknowledgements (none without near caches)."""
    return secrets.token_hex(8) if near is not None else ""


def check_client(client: Any) -> None:
    if client.get_connection_kwargs().get("decode_responses"):
        raise ConfigError("the redis client must not use decode_responses=True: values are bytes")
