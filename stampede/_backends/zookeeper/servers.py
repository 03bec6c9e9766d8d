"""ZooKeeper as a lease service, over kazoo: the ``LockServers`` contract for one ensemble
(a "majority" of one: the ensemble replicates itself), and the wake-up of waiters when a
holder's node goes.

A lease is an ephemeral sequential node ``/stampede/<entry's lock key>/lease-<token>-<seq>``
holding the token. The token is in the name because a path alone names no holder: an
invalidation deletes the entry's nodes and then their empty parent, and the next taker's
node, numbered from 0 again under a new parent, has the path the invalidated holder's had.
A late release or renewal by path would then act on the next holder's node.

The lowest node holds the lease (ZooKeeper's lock recipe). Taking it creates a node and,
unless it is the lowest, deletes it again at once: a load's waiters do not queue in
ZooKeeper, they wait for the value on the cache server. A node lives as long as its
holder's session: a holder that dies (or is cut off for longer than the session timeout)
loses it without anyone's help, and the waiters watching it are woken.

A failure to reach the ensemble (connection loss, an expired session, a timeout) is
counted in the ``Round``, not raised, as a lock server's is: ``_core.majority`` turns it
into ``BackendUnavailable``, and the layer's ``on_backend_error`` policy decides.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import quote

from kazoo.client import KazooClient
from kazoo.exceptions import KazooException, NodeExistsError, NoNodeError, NotEmptyError
from kazoo.handlers.threading import KazooTimeoutError
from kazoo.protocol.states import KazooState

from ..._core.keys import EntryKeys
from ..._core.store import Round
from ..._errors import BackendUnavailable

ROOT = "/stampede"
FAILURES = (KazooException, KazooTimeoutError)
SETTLE_POLL = 0.01  # seconds between looks at a reconnecting session's state


def entry_path(keys: EntryKeys) -> str:
    """The parent of an entry's lease nodes (a node name may hold no ``/``)."""
    return f"{ROOT}/{quote(keys.lock, safe='')}"


def _sequence(node: str) -> int:
    return int(node.rsplit("-", 1)[1])


def node_prefix(path: str, kind: str, token: str) -> str:
    """The name, before ZooKeeper's sequence number, of ``token``'s node under ``path``:
    unique to its holder, so that no other node can ever have its path (see the module)."""
    return f"{path}/{kind}-{quote(token, safe='')}-"


class Strays:
    """Nodes of creates given up on before their answer came (a timeout, a lost
    connection): the server may have applied one (or apply it still), and such a node,
    first in its line, would hold a lease or a named lock for as long as the session
    lives, with nobody behind it. Its token is in its name (``node_prefix``): it is looked
    for and deleted at once, and at later calls until the ensemble answers, sparing the
    node ``kept(path, token)`` names (a later call with the same token may hold by one)."""

    def __init__(self, client: KazooClient, timeout: float, kind: str, kept: Callable[[str, str], str | None]) -> None:
        self.client, self.timeout, self.kind, self.kept = client, timeout, kind, kept
        self._lock = threading.Lock()
        self._given_up: set[tuple[str, str]] = set()  # (parent path, token)

    def __bool__(self) -> bool:
        return bool(self._given_up)

    def add(self, path: str, token: str) -> None:
        with self._lock:
            self._given_up.add((path, token))

    def watch(self, created: Any, path: str, token: str) -> None:
        """``created``, given up on, may complete after all (kazoo's thread: no request
        there): its node goes at the next call."""

        def completed(result: Any) -> None:
            if result.successful():
                self.add(path, token)

        created.rawlink(completed)

    def sweep(self) -> None:
        with self._lock:
            given_up = list(self._given_up)
        for path, token in given_up:
            name = node_prefix(path, self.kind, token).rsplit("/", 1)[1]
            try:
                for child in self.client.get_children_async(path).get(timeout=self.timeout):
                    if child.startswith(name) and self.kept(path, token) != f"{path}/{child}":
                        try:
                            self.client.delete_async(f"{path}/{child}").get(timeout=self.timeout)
                        except NoNodeError:
                            pass
            except NoNodeError:
                pass  # gone with its parent
            except FAILURES:
                continue  # the ensemble cannot be asked now: at a later call
            with self._lock:
                self._given_up.discard((path, token))


class ZooKeeperLockServers:
    """The lease service for blocking callers (and, through a thread, asyncio ones)."""

    def __init__(self, client: KazooClient, timeout: float = 2.0) -> None:
        self.client = client
        self.timeout = timeout  # a request the ensemble leaves unanswered fails after this
        self._lock = threading.Lock()
        self._nodes: dict[tuple[str, str], str] = {}  # (entry path, token) -> our node's path
        self._strays = Strays(client, timeout, "lease", self._held_by)

    def _held_by(self, path: str, token: str) -> str | None:
        with self._lock:
            return self._nodes.get((path, token))

    def settled_state(self) -> str:
        """The session's state once a reconnection under way has ended (``self.timeout`` at
        most): SUSPENDED means the connection dropped but the session may live, and kazoo
        is reconnecting. "Cannot ask now" must not be read as "not held" (a blip the
        session survives would refuse a write, and a second load would run)."""
        deadline = time.monotonic() + self.timeout
        state = self.client.state
        while state == KazooState.SUSPENDED and time.monotonic() < deadline:
            time.sleep(SETTLE_POLL)
            state = self.client.state
        return str(state)

    def _lowest(self, path: str) -> str | None:
        children = self.client.get_children_async(path).get(timeout=self.timeout)
        return f"{path}/{min(children, key=_sequence)}" if children else None

    def _delete(self, path: str) -> None:
        self.client.delete_async(path).get(timeout=self.timeout)

    def take(self, keys: EntryKeys, token: str, lease_ms: int) -> Round:
        path = entry_path(keys)
        if self._strays:
            self._strays.sweep()
        try:
            node = self._create_lease(path, token)
            if node is None:
                return Round(0, 1)
            # A node numbered 0 is the first its parent ever had (the number is the
            # parent's count of child changes): the lowest without asking. A cold key's
            # lease is then four requests (parent, node, and their deletes at release).
            if _sequence(node) == 0 or self._lowest(path) == node:
                with self._lock:
                    self._nodes[(path, token)] = node
                return Round(1, 0)
            self._delete(node)
            return Round(0, 0, lease_ms / 1000)
        except FAILURES:  # its node may exist: gone now, or at a later take
            self._strays.add(path, token)
            self._strays.sweep()
            return Round(0, 1)

    def _create_lease(self, path: str, token: str) -> str | None:
        """Our node under ``path``, its parent made first (a released entry's parent is
        deleted when empty, so a taker mostly finds none); ``None`` when takers and
        releasers kept racing on the parent until the request timeout."""
        # A releaser may remove the parent between its create and ours, as often as
        # takers and releasers race: that is contention, not a failure of the ensemble,
        # so try again until the request timeout (three tries were outrun by a burst of
        # takers beside an invalidation's drop).
        deadline = time.monotonic() + self.timeout
        while True:
            self._make_parent(path)
            created = self.client.create_async(
                node_prefix(path, "lease", token), token.encode(), ephemeral=True, sequence=True
            )
            try:
                return str(created.get(timeout=self.timeout))
            except NoNodeError:
                if time.monotonic() >= deadline:
                    return None
            except FAILURES:
                # Unanswered is not undone: the create may be applied (or be still to
                # come), and its node would hold the lease with no load behind it.
                self._strays.watch(created, path, token)
                raise

    def _make_parent(self, path: str) -> None:
        try:
            self.client.create_async(path).get(timeout=self.timeout)
        except NodeExistsError:
            pass
        except NoNodeError:  # the root is missing: a new ensemble
            self.client.ensure_path_async(ROOT).get(timeout=self.timeout)
            self._make_parent(path)

    def release(self, keys: EntryKeys, token: str) -> Round:
        path = entry_path(keys)
        with self._lock:
            node = self._nodes.pop((path, token), None)
        if node is None:
            return Round(0, 0)
        try:
            self._delete(node)
            self._remove_if_empty(path)
            return Round(1, 0)
        except NoNodeError:
            return Round(0, 0)
        except FAILURES:
            return Round(0, 1)

    def renew(self, keys: EntryKeys, token: str, lease_ms: int) -> Round:
        """Still held: our node exists and the session is live (a node has no term)."""
        with self._lock:
            node = self._nodes.get((entry_path(keys), token))
        if node is None:
            return Round(0, 0)
        state = self.settled_state()
        if state == KazooState.LOST:  # the session ended: its nodes went with it
            return Round(0, 0)
        if state != KazooState.CONNECTED:  # still reconnecting: could not ask
            return Round(0, 1)
        try:
            held = self.client.exists_async(node).get(timeout=self.timeout) is not None
            return Round(int(held), 0)
        except FAILURES:
            return Round(0, 1)

    def drop(self, keys: EntryKeys) -> Round:
        """Delete every lease node of the entry (an invalidation), whoever holds it."""
        path = entry_path(keys)
        try:
            for child in self.client.get_children_async(path).get(timeout=self.timeout):
                try:
                    self._delete(f"{path}/{child}")
                except NoNodeError:
                    pass
            self._remove_if_empty(path)
            return Round(1, 0)
        except NoNodeError:
            return Round(1, 0)
        except FAILURES:
            return Round(0, 1)

    def holders(self, keys: EntryKeys) -> list[bytes | None]:
        try:
            lowest = self._lowest(entry_path(keys))
            return [None if lowest is None else self.client.get_async(lowest).get(timeout=self.timeout)[0]]
        except NoNodeError:
            return [None]
        except FAILURES:
            return [None]

    def watch(self, keys: EntryKeys, wake: Callable[[], None]) -> None:
        """Call ``wake`` once when the entry's current holder's node goes (best effort:
        a failure to set the watch only leaves the waiter to its message or timeout)."""
        try:
            lowest = self._lowest(entry_path(keys))
            watched = self.client.exists_async(lowest, watch=lambda _event: wake()) if lowest is not None else None
            if watched is not None and watched.get(timeout=self.timeout) is None:
                wake()
        except (NoNodeError, *FAILURES):
            pass

    def _remove_if_empty(self, path: str) -> None:
        try:
            self._delete(path)
        except (NotEmptyError, NoNodeError):
            pass


class AsyncZooKeeperLockServers:
    """``ZooKeeperLockServers`` for the tasks of one event loop: kazoo's calls are blocking,
    so each runs in a worker thread. The client is the layer's (not closed here)."""

    def __init__(self, servers: ZooKeeperLockServers) -> None:
        self.servers = servers

    async def take(self, keys: EntryKeys, token: str, lease_ms: int) -> Round:
        return await asyncio.to_thread(self.servers.take, keys, token, lease_ms)

    async def release(self, keys: EntryKeys, token: str) -> Round:
        return await asyncio.to_thread(self.servers.release, keys, token)

    async def renew(self, keys: EntryKeys, token: str, lease_ms: int) -> Round:
        return await asyncio.to_thread(self.servers.renew, keys, token, lease_ms)

    async def drop(self, keys: EntryKeys) -> Round:
        return await asyncio.to_thread(self.servers.drop, keys)

    async def holders(self, keys: EntryKeys) -> list[bytes | None]:
        return await asyncio.to_thread(self.servers.holders, keys)

    async def watch(self, keys: EntryKeys, wake: Callable[[], None]) -> None:
        await asyncio.to_thread(self.servers.watch, keys, wake)

    async def aclose(self) -> None:
        pass


def start_client(hosts: str, session_timeout: float, connect_timeout: float) -> KazooClient:
    """A started kazoo client for ``hosts`` (``host:port,...``). It keeps reconnecting by
    itself. A command while it cannot reach the ensemble fails at once."""
    client = KazooClient(hosts=hosts, timeout=session_timeout, connection_retry={"max_tries": -1, "max_delay": 1})
    client.start(timeout=connect_timeout)
    return client


def client_of(zookeeper: Any, session_timeout: float, connect_timeout: float) -> tuple[KazooClient, bool]:
    """The kazoo client for ``zookeeper=`` (hosts, or a client) and whether the layer owns it."""
    if isinstance(zookeeper, KazooClient):
        return zookeeper, False
    return start_client(str(zookeeper), session_timeout, connect_timeout), True


class ZooKeeperQueue:
    """Named locks' places in line: one ephemeral sequential node per waiter or holder,
    kept until it leaves (ZooKeeper's fair lock recipe). The first in line holds the lock.
    each waiter watches the node just before its own, so a release (or a holder's session
    ending) wakes only the next in line. A node's creation zxid is its fencing token: it
    grows across the whole ensemble, for ever."""

    def __init__(self, servers: ZooKeeperLockServers) -> None:
        self.client = servers.client
        self.timeout = servers.timeout
        self._servers = servers
        self._lock = threading.Lock()
        self._places: dict[tuple[str, str], tuple[str, int]] = {}  # (path, token) -> (node, czxid)
        self._strays = Strays(self.client, self.timeout, "lock", self._queued_by)

    def _queued_by(self, path: str, token: str) -> str | None:
        with self._lock:
            place = self._places.get((path, token))
        return None if place is None else place[0]

    def enqueue(self, keys: EntryKeys, token: str) -> tuple[int, str | None]:
        """Join the line (once per token) and return our fencing token and the node just
        before ours (None: we are first). Raises ``BackendUnavailable``."""
        path = entry_path(keys)
        if self._strays:
            self._strays.sweep()
        try:
            with self._lock:
                place = self._places.get((path, token))
            if place is None:
                created = self.client.create_async(
                    node_prefix(path, "lock", token),
                    token.encode(),
                    ephemeral=True,
                    sequence=True,
                    makepath=True,
                    include_data=True,
                )
                try:
                    node, stat = created.get(timeout=self.timeout)
                except FAILURES:  # unanswered is not undone: its node would be first in line for ever
                    self._strays.watch(created, path, token)
                    self._strays.add(path, token)
                    self._strays.sweep()
                    raise
                place = (node, stat.czxid)
                with self._lock:
                    self._places[(path, token)] = place
            children = sorted(self.client.get_children_async(path).get(timeout=self.timeout), key=_sequence)
        except FAILURES as error:
            failed = f"ZooKeeper failed to queue for {keys.value!r}: {error}"
            raise BackendUnavailable(failed, key=keys.value) from error
        name = place[0].rsplit("/", 1)[1]
        if name not in children:  # our session ended: the node went with it
            with self._lock:
                self._places.pop((path, token), None)
            raise BackendUnavailable(f"the ZooKeeper session that queued for {keys.value!r} ended", key=keys.value)
        index = children.index(name)
        return place[1], None if index == 0 else f"{path}/{children[index - 1]}"

    def leave(self, keys: EntryKeys, token: str) -> None:
        path = entry_path(keys)
        with self._lock:
            place = self._places.pop((path, token), None)
        if place is None:
            return
        try:
            self.client.delete_async(place[0]).get(timeout=self.timeout)
        except NoNodeError:
            pass
        except FAILURES as error:
            raise BackendUnavailable(f"ZooKeeper failed to leave {keys.value!r}: {error}", key=keys.value) from error
        try:
            self.client.delete_async(path).get(timeout=self.timeout)
        except (NotEmptyError, NoNodeError, *FAILURES):
            pass

    def holds(self, keys: EntryKeys, token: str) -> bool:
        """Our node is still there (our session lives)."""
        with self._lock:
            place = self._places.get((entry_path(keys), token))
        if place is None or self._servers.settled_state() != KazooState.CONNECTED:
            return False
        try:
            return self.client.exists_async(place[0]).get(timeout=self.timeout) is not None
        except FAILURES:
            return False

    def watch(self, node: str, wake: Callable[[], None]) -> None:
        """Call ``wake`` once when ``node`` goes (at once if it is gone already)."""
        try:
            if self.client.exists_async(node, watch=lambda _event: wake()).get(timeout=self.timeout) is None:
                wake()
        except FAILURES:
            wake()  # the waiter re-checks, and meets the failure itself
