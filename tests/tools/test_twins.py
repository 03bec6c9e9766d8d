"""Twins that must not drift: every blocking method and its asyncio twin take the same
parameters (names, kinds, defaults) and answer the same type, and every store
implements the store contract's methods with the contract's signatures.

redis-py's hand-kept sync and async ``Lock`` drifted apart (a fix landed in one of
them only); the decisions here are written once, but these thin twins are kept by hand.
"""

from __future__ import annotations

import importlib.util
import inspect
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from stampede import Lock, RedlockLock, Stampede
from stampede._backends.memory.store import AsyncMemoryStore, MemoryStore
from stampede._backends.redis.alock_servers import AsyncRedisLockServers
from stampede._backends.redis.astore import AsyncRedisStore
from stampede._backends.redis.lock_servers import RedisLockServers
from stampede._backends.redis.store import RedisStore
from stampede._backends.zookeeper.alocks import AsyncZooKeeperLockStore
from stampede._backends.zookeeper.locks import ZooKeeperLockStore
from stampede._core.store import AsyncLockServers, AsyncStore, LockServers, Store

UNASYNC = Path(__file__).resolve().parents[2] / ".ci" / "unasync.py"

# Names that differ between the two worlds only by being blocking or asyncio.
_ASYNC_WORDS = re.compile(r"\bAsync")


def _shape(method: Callable[..., Any]) -> tuple[list[tuple[str, Any, Any]], str]:
    signature = inspect.signature(method)
    parameters = [(p.name, p.kind, p.default) for p in signature.parameters.values() if p.name not in ("self", "cls")]
    return parameters, _ASYNC_WORDS.sub("", str(signature.return_annotation))


def _public_methods(cls: type) -> set[str]:
    return {name for name, value in vars(cls).items() if callable(value) and not name.startswith("_")}


STORE_PAIRS = [
    (Store, AsyncStore),
    (RedisStore, AsyncRedisStore),
    (MemoryStore, AsyncMemoryStore),
    (LockServers, AsyncLockServers),
    (RedisLockServers, AsyncRedisLockServers),
]
# The optional extras' backends, where they are installed (the dev extra has them).
if importlib.util.find_spec("psycopg") and importlib.util.find_spec("psycopg_pool"):
    from stampede._backends.postgres.astore import AsyncPostgresStore
    from stampede._backends.postgres.store import PostgresStore

    STORE_PAIRS.append((PostgresStore, AsyncPostgresStore))
if importlib.util.find_spec("kazoo"):
    from stampede._backends.zookeeper.servers import AsyncZooKeeperLockServers, ZooKeeperLockServers

    STORE_PAIRS.append((ZooKeeperLockServers, AsyncZooKeeperLockServers))


from stampede._backends.redis.notify import Subscriber  # noqa: E402
from stampede._backends.redis.notify_async import AsyncSubscriber  # noqa: E402
from stampede._backends.redis.shards import ShardedSubscriber  # noqa: E402
from stampede._backends.redis.shards_async import AsyncShardedSubscriber  # noqa: E402
from stampede._drivers.singleflight import AsyncFlightTable, FlightTable  # noqa: E402

from ..twin_bodies import current, recorded, recorded_on, this_python  # noqa: E402


def generated(cls: type) -> bool:
    """Whether ``cls`` is in a module the converter writes (its "Generated from" header)."""
    return Path(inspect.getfile(cls)).read_text().startswith("# Generated from ")


# The hand-written pairs, written line for line alike. Not here: the generated ones
# (test_the_blocking_modules_are_what_their_asyncio_sources_make checks them), the
# contracts (protocols, bodies empty), and the embedded store's asyncio view, which
# calls the blocking one.
BODY_PAIRS = [
    *(pair for pair in STORE_PAIRS if pair[0] not in (Store, LockServers, MemoryStore) and not generated(pair[0])),
    (Subscriber, AsyncSubscriber),
    (ShardedSubscriber, AsyncShardedSubscriber),
    (FlightTable, AsyncFlightTable),
]


def test_the_blocking_modules_are_what_their_asyncio_sources_make() -> None:
    """Each generated blocking module is the converter's output for its asyncio source
    (``.ci/unasync.py``), and every substitution of the converter is used: a fix made in
    a generated module, or in a source without regenerating, fails here."""
    if not UNASYNC.exists() or importlib.util.find_spec("ruff") is None:
        pytest.skip("no sources or no ruff beside these tests (a wheel's run): .ci/run checks them first")
    done = subprocess.run(
        [sys.executable, str(UNASYNC), "--check"], capture_output=True, text=True, check=False, timeout=60
    )
    assert done.returncode == 0, done.stdout + done.stderr


def _converter() -> Any:
    if not UNASYNC.exists():
        pytest.skip("no converter beside these tests (a wheel's run)")
    spec = importlib.util.spec_from_file_location("unasync", UNASYNC)
    assert spec is not None and spec.loader is not None
    unasync = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(unasync)
    return unasync


def test_a_module_declares_the_call_it_unwraps_and_the_converter_unwraps_it_whatever_its_arguments() -> None:
    """The Redis store declares ``self._send(key, command, args)`` (the asyncio store's
    connection slots) unwrapped: ``command(args)`` in the blocking store, no call of the
    store's own on the hit path. The converter knows no store: the module says it."""
    source = (
        "# UNASYNC: unwrap self._send 1\n"
        "raw = await self._send(key, self.client.get, key)\n"
        "done = await self._send(keys[0], pipeline.execute)\n"
        "reply = await self._send(f(a, b), self._scripts.hold, *call, raise_on_error=g(c, [d, e]))\n"
    )
    assert _converter().convert(source) == (
        "raw = self.client.get(key)\n"
        "done = pipeline.execute()\n"
        "reply = self._scripts.hold(*call, raise_on_error=g(c, [d, e]))\n"
    )


def test_a_declared_rewrite_that_rewrites_nothing_is_reported_and_the_declarations_are_left_out() -> None:
    unused: list[str] = []
    source = "# UNASYNC: self._state() -> self.state\n# UNASYNC: self._none() -> self.none\nx = self._state()\n"
    assert _converter().convert(source, None, "m.py", unused) == "x = self.state\n"
    assert unused == ["m.py: # UNASYNC: self._none() -> self.none"]


def test_twin_bodies_differ_only_as_recorded() -> None:
    """Each asyncio twin, read as blocking, differs from its blocking twin only as
    ``tests/twins.txt`` records (see ``tests/twin_bodies.py``): a fix in one twin only
    shows up here."""
    if this_python() != recorded_on():
        pytest.skip(f"the fingerprints are of Python {recorded_on()}'s ast.unparse (CI runs that one)")
    now, then = current(BODY_PAIRS), recorded()
    changed = {name: difference for name, (mark, difference) in now.items() if then.get(name) != mark}
    report = "\n\n".join(f"{name} (recorded {then.get(name, 'nothing')}):\n{diff or '(now the same)'}"
                          for name, diff in sorted(changed.items()))  # fmt: skip
    assert not changed, (
        "twins changed apart: make the same change in the other twin, or record the difference "
        "(python tests/twin_bodies.py --record) and say why in the commit\n\n" + report
    )
    assert set(then) <= set(now), f"recorded twins that are gone: {sorted(set(then) - set(now))}"


def test_the_zookeeper_named_lock_twins_have_the_same_methods_and_signatures() -> None:
    names = _public_methods(ZooKeeperLockStore)  # the rest is the cache server's (__getattr__)
    assert names == _public_methods(AsyncZooKeeperLockStore)
    for name in sorted(names):
        assert inspect.iscoroutinefunction(getattr(AsyncZooKeeperLockStore, name)), name
        assert _shape(getattr(ZooKeeperLockStore, name)) == _shape(getattr(AsyncZooKeeperLockStore, name)), name


@pytest.mark.parametrize(("blocking", "asyncio_twin"), STORE_PAIRS, ids=lambda cls: cls.__name__)
def test_store_twins_have_the_same_methods_and_signatures(blocking: type, asyncio_twin: type) -> None:
    contract = Store if "Store" in blocking.__name__ else LockServers
    names = _public_methods(contract) - {"close"}
    for name in sorted(names):
        assert hasattr(blocking, name) and hasattr(asyncio_twin, name), f"{name} missing"
        assert inspect.iscoroutinefunction(getattr(asyncio_twin, name)), f"{asyncio_twin.__name__}.{name} is not async"
        assert _shape(getattr(blocking, name)) == _shape(getattr(asyncio_twin, name)), name


@pytest.mark.parametrize("implementation", [RedisStore, MemoryStore], ids=lambda cls: cls.__name__)
def test_every_store_implements_the_contract_with_its_signatures(implementation: type) -> None:
    for name in sorted(_public_methods(Store)):
        assert _shape(getattr(implementation, name)) == _shape(getattr(Store, name)), name


PUBLIC_TWINS = [
    (Lock, [("acquire", "aacquire"), ("release", "arelease"), ("extend", "aextend"),
            ("locked", "alocked"), ("owned", "aowned")]),
    (RedlockLock, [("acquire", "aacquire"), ("release", "arelease"), ("extend", "aextend"),
                   ("locked", "alocked"), ("owned", "aowned")]),
    (Stampede, [("check", "acheck"), ("clear", "aclear"), ("close", "aclose"), ("matching", "amatching"),
                ("invalidate_matching", "ainvalidate_matching")]),
]  # fmt: skip


@pytest.mark.parametrize(("cls", "pairs"), PUBLIC_TWINS, ids=lambda value: getattr(value, "__name__", ""))
def test_public_blocking_and_asyncio_methods_have_the_same_signatures(cls: type, pairs: list[tuple[str, str]]) -> None:
    for blocking, asyncio_twin in pairs:
        assert inspect.iscoroutinefunction(getattr(cls, asyncio_twin)), asyncio_twin
        assert _shape(getattr(cls, blocking)) == _shape(getattr(cls, asyncio_twin)), (blocking, asyncio_twin)
