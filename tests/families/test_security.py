"""Servers that ask who is calling: a password (AUTH), and an ACL user confined to its
namespace's keys and channels. Every connection stampede opens (commands, the lock
scripts, the subscriber) must authenticate; what the user may not touch fails as a
Redis error under the layer's policy, never as a hang."""

from __future__ import annotations

import re
import subprocess
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from stampede import BackendUnavailable, Stampede
from stampede.testing import RedisServer, find_server_binary

from ..scenarios import one_load_and_a_wake_up, wait_until
from .test_near_cache import copied, held, tracked

PASSWORD = "default-user-secret"
# How the server words a command the ACL refuses: "No permissions ..." (Valkey, Redis 7.2+),
# or, inside a script on Redis 7.0, "The user executing the script can't run this command".
REFUSED = "(?i)permission|can.t run this command"
# The least an ACL user needs for a layer of namespace "app" (as the README states it).
APP_COMMANDS = "+get +evalsha +eval +script|load +subscribe +unsubscribe +ping +client|setinfo +blmpop"
SCRIPT_COMMANDS = "+set +del +pexpire +pttl +publish +time +zrangebyscore"  # what the Lua scripts call
APP_USER = ["--user", "app", "on", ">app-secret", "~app:*", "&app:*", *APP_COMMANDS.split(), *SCRIPT_COMMANDS.split()]
# A user of an older README: its invalidations cannot read the near caches' registry.
OLD_USER = ["--user", "old", "on", ">old-secret", "~app:*", "&app:*", *APP_COMMANDS.split(),
            *SCRIPT_COMMANDS.replace("+time +zrangebyscore", "").split()]  # fmt: skip
# What a near cache adds: its tracking connection and invalidation channel, its
# registration, its acknowledgements.
NEAR_COMMANDS = "+client|id +client|tracking +zadd +zremrangebyscore +zrem +rpush"
NEAR_USER = ["--user", "near", "on", ">near-secret", "~app:*", "&app:*", "&__redis__:invalidate",
             *APP_COMMANDS.split(), *SCRIPT_COMMANDS.split(), *NEAR_COMMANDS.split()]  # fmt: skip
# What named locks add: the fencing counter, and a fair lock's queue (server time, a
# sorted set of waiters, a hash of their places' expiry).
LOCK_COMMANDS = "+incr +time +zadd +zrange +zrem +zscore +hget +hset +hdel"
LOCK_USER = ["--user", "locker", "on", ">locker-secret", "~app:*", "&app:*", *APP_COMMANDS.split(),
             *SCRIPT_COMMANDS.split(), *LOCK_COMMANDS.split()]  # fmt: skip


@pytest.fixture
def secured_server() -> Iterator[RedisServer]:
    binary = find_server_binary()
    if binary is None:
        pytest.skip("no server binary to start")
    args = APP_USER + LOCK_USER + OLD_USER + NEAR_USER
    if server_version(binary) < (7, 2):  # no CLIENT SETINFO: a rule naming it stops the server from starting
        args = [arg for arg in args if arg != "+client|setinfo"]
    with RedisServer(password=PASSWORD, args=args) as server:
        yield server


def server_version(binary: str) -> tuple[int, int]:
    """The server's version as (major, minor): ``redis-server --version`` says ``v=7.0.15``."""
    said = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=10).stdout
    found = re.search(r"v=(\d+)\.(\d+)", said)
    return (int(found[1]), int(found[2])) if found else (99, 0)


def app_url(server: RedisServer, user: str = "app") -> str:
    return f"redis://{user}:{user}-secret@127.0.0.1:{server.port}/0"


def test_a_password_protected_server_is_used_by_every_connection(
    secured_server: RedisServer, make_layer: Callable[..., Stampede]
) -> None:
    options = dict(namespace="auth", lock_ttl=20, recheck_interval=20, on_backend_error="raise")
    url = secured_server.url
    loads, lag = one_load_and_a_wake_up(make_layer(url, **options), make_layer(url, **options))
    assert loads == 1
    assert lag < 1.0


def test_a_wrong_password_is_a_redis_error_under_the_policy_not_a_hang(
    secured_server: RedisServer, make_layer: Callable[..., Stampede]
) -> None:
    wrong = f"redis://:not-the-password@127.0.0.1:{secured_server.port}/0"
    strict = make_layer(wrong, namespace="auth", on_backend_error="raise")
    started = time.monotonic()
    with pytest.raises(BackendUnavailable, match="(?i)password|auth"):
        strict.cached_loader("item:{key}")(lambda key: key)(1)
    lenient = make_layer(wrong, namespace="auth", on_backend_error="load")
    calls: list[int] = []
    load = lenient.cached_loader("item:{key}")(lambda key: calls.append(key) or key)
    assert load(1) == 1 and load(1) == 1 and calls == [1, 1]  # served, never cached
    assert time.monotonic() - started < 5


def test_an_acl_user_works_inside_its_namespace(
    secured_server: RedisServer, make_layer: Callable[..., Stampede]
) -> None:
    options = dict(namespace="app", lock_ttl=20, recheck_interval=20, on_backend_error="raise")
    url = app_url(secured_server)
    loads, lag = one_load_and_a_wake_up(make_layer(url, **options), make_layer(url, **options))
    assert loads == 1
    assert lag < 1.0


def test_an_acl_user_outside_its_namespace_gets_a_clear_error(
    secured_server: RedisServer, make_layer: Callable[..., Stampede]
) -> None:
    outside = make_layer(app_url(secured_server), namespace="other", on_backend_error="raise")
    load = outside.cached_loader("item:{key}")(lambda key: key)
    with pytest.raises(BackendUnavailable, match=REFUSED):
        load(1)
    with pytest.raises(BackendUnavailable, match=REFUSED):
        load.invalidate(1)


@pytest.mark.timing
def test_an_acl_user_renews_leases_and_invalidates_inside_its_namespace(
    secured_server: RedisServer, make_layer: Callable[..., Stampede]
) -> None:
    layer = make_layer(app_url(secured_server), namespace="app", lock_ttl=0.3, on_backend_error="raise")
    calls: list[int] = []

    @layer.cached_loader("slow:{key}")
    def slow(key: int) -> int:
        calls.append(key)
        time.sleep(0.5)  # longer than the lease: the watchdog must renew it (PEXPIRE in a script)
        return key

    assert slow(1) == 1 and slow(1) == 1 and calls == [1]
    assert layer.stats()["stale_writes_prevented"] == 0 and layer.stats()["redis_errors"] == 0
    slow.invalidate(1)
    assert slow(1) == 1 and calls == [1, 1]


def test_named_locks_need_the_fence_and_queue_commands_and_work_with_them(
    secured_server: RedisServer, make_layer: Callable[..., Stampede]
) -> None:
    cache_only = make_layer(app_url(secured_server), namespace="app")
    with pytest.raises(BackendUnavailable, match=REFUSED):
        cache_only.lock("job").acquire()  # INCR (the fence) is not granted to it
    locker = make_layer(f"redis://locker:locker-secret@127.0.0.1:{secured_server.port}/0", namespace="app")
    for fair in (False, True):
        with locker.lock("job", fair=fair) as lock:
            assert lock.owned() and lock.fence is not None
            assert locker.lock("job", fair=fair, timeout=0.1).acquire() is False


@pytest.mark.timing
def test_a_near_cache_needs_its_commands_and_works_with_them(
    secured_server: RedisServer, make_layer: Callable[..., Stampede]
) -> None:
    holder = make_layer(app_url(secured_server, "near"), namespace="app", near_cache=True)
    load = holder.cached_loader("item:{key}")(lambda key: {"key": key})
    writer = make_layer(app_url(secured_server), namespace="app", on_backend_error="raise")
    tracked(holder)
    copied(holder, load, 1)
    started = time.monotonic()
    writer.cached_loader("item:{key}")(lambda key: None).invalidate(1)
    assert time.monotonic() - started < 0.04  # acknowledged, not waited out
    assert not held(holder, load.key(1))
    without = make_layer(app_url(secured_server), namespace="app", near_cache=True)
    assert without._near is not None
    without.cached_loader("item:{key}")(lambda key: key)(1)  # starts its tracker, which is refused
    tracker: Any = without._backend.tracker
    wait_until(lambda: tracker._lost_since is not None, "the tracker refused")
    assert without._near.lease_until == 0 and without.stats()["near_hits"] == 0


def test_an_acl_user_without_the_registry_commands_still_invalidates_and_is_warned(
    secured_server: RedisServer, make_layer: Callable[..., Stampede], caplog: pytest.LogCaptureFixture
) -> None:
    from stampede._backends.redis import commands as redis_backend

    redis_backend._near_warned_at.clear()
    layer = make_layer(app_url(secured_server, "old"), namespace="app", on_backend_error="raise")
    calls: list[int] = []
    load = layer.cached_loader("item:{key}")(lambda key: calls.append(key) or key)
    load(1)
    load.invalidate(1)
    load(1)
    assert calls == [1, 1]
    assert "near caches" in caplog.text and "+time +zrangebyscore" in caplog.text
