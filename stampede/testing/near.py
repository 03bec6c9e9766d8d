"""The near caches' agreement in the simulation (``stampede.testing.simulation``): what
Redis and each process's tracker do for ``near_cache=True`` (``_core.near``), played on
the simulated store, in the event loop, with the run's faults.

The layer's own near cache runs as it does anywhere (``_drivers.near``: its lease, its
tickets, its fills and drops, the layer's drops after an invalidation). What Redis does
with ``CLIENT TRACKING``, the registration script and the invalidation scripts, and what
the tracker's thread does with its connection, are played here, as close to the real
ones as one thread on virtual time allows:

* **The server** (``NearServer``): every change of a key of the store (a write, a
  deletion: the embedded store's values watched) is sent to every connected tracker, in
  order on its connection, each message delayed as a wake-up is. The registry holds
  each member's deadline (the server's clock plus its lease). An invalidation, an expiry,
  a ``set`` or a seizure asks the live members to drop the entry's copies and waits for
  their acknowledgements or their deadlines (``AckWait``), in a step of its own after the
  entry's (as on a Redis Cluster, where asking is a second script: the wider window); a
  tag invalidation asks for what ``_core.near.asked_of_a_tag`` says.
* **A process's tracker** (``SimulatedTracker``): connects (the copies flushed), then
  every fifth of its lease registers and sends a PING down its connection: the PONG,
  read after every message sent before it, renews the lease from when the registration
  was sent. A request drops the copies it names, then acknowledges through a command of
  its own (which a fault may lose: the invalidator then waits for the deadline). A
  tracker whose PONG does not come within ``PONG_TIMEOUT``, or whose command fails,
  revokes its lease (every copy dropped) and connects again ``RETRY_INTERVAL`` later.

The faults reach all of it: a paused process reads nothing until its pause ends (its
lease runs out meanwhile), a killed one's tracker stops (the invalidators wait for its
deadline), and a store restarted empty (or failed over) forgets the registry and cuts
every tracking connection, each tracker learning it (and revoking its lease) before the
store answers again, as a restarted server's closed sockets tell a client before it is
back.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Iterable
from typing import Any, Protocol

from cachetools import TLRUCache

from .._core import near as agreement
from .._core.near import RENEWALS_PER_LEASE, AckWait, parse_request, request
from .._errors import BackendUnavailable

PONG_TIMEOUT = 1.0
"""Seconds a tracker waits for its PONG before it takes its connection for lost (the real
one waits for the client's socket timeout)."""

RETRY_INTERVAL = 0.5
"""Seconds between a lost tracking connection and the next attempt (as the real one)."""


class _Process(Protocol):
    name: str
    paused_until: float
    killed: bool


class _Simulated(Protocol):
    """What the near caches' side needs of the simulation."""

    faults: Any
    near: NearServer | None

    async def before(self, process: Any, command: str) -> None: ...

    def after(self, process: Any, command: str) -> None: ...

    def delay(self) -> float: ...


class _Copies(Protocol):
    def drop(self, keys: Iterable[str]) -> None: ...

    def flush(self) -> None: ...

    def renew(self, until: float) -> None: ...

    def revoke(self) -> None: ...


class NearServer:
    """The store's side: the registry, the tracking connections, the acknowledgements."""

    def __init__(self, simulation: _Simulated, loop: asyncio.AbstractEventLoop) -> None:
        self._simulation = simulation
        self._loop = loop
        self.registry: dict[str, float] = {}  # member -> deadline (the server's clock)
        self.connected: dict[str, _Connection] = {}  # member -> its live tracking connection
        self._acks: dict[str, set[str]] = {}  # nonce -> the members that acknowledged
        self._heard: dict[str, asyncio.Event] = {}  # nonce -> set at each acknowledgement
        self._nonces = 0

    def watch(self, store: Any) -> None:
        """Send every change of ``store``'s values to the trackers (called again after a
        restart, whose values are new; a failover's copy of them keeps watching)."""
        assert not store._values, "watched from the start: a store new or restarted empty"
        store._values = _Watched(store._values.maxsize, lambda _key, item, _now: item[1], store._clock, self.changed)

    def changed(self, key: str) -> None:
        """A key of the store changed: every tracker is told (``CLIENT TRACKING BCAST``)."""
        for connection in list(self.connected.values()):
            connection.send(("drop", key))

    def restarted(self) -> None:
        """The store came back empty: the registry is gone, every tracking connection cut."""
        self.registry.clear()
        for connection in list(self.connected.values()):
            connection.cut()

    def live(self) -> list[tuple[str, float]]:
        """The registered members and the seconds left of each registration."""
        now = self._loop.time()
        return [(member, deadline - now) for member, deadline in self.registry.items() if deadline > now]

    async def ask(self, process: _Process, own: str | None, keys: list[str], own_too: bool = False) -> None:
        """An invalidation's second step: ask every live member to drop ``keys``'s copies
        and return once each has acknowledged or its registration ran out. ``own`` (the
        invalidator's member) is not waited for unless ``own_too``."""
        if not keys:
            return
        simulation = self._simulation
        await simulation.before(process, "ask the near caches")
        self._nonces += 1
        nonce = f"n{self._nonces}"
        members = self.live()
        message = request(nonce, *keys).encode()
        for member, _ in members:
            connection = self.connected.get(member)
            if connection is not None:
                connection.send(("request", message))
        simulation.after(process, "ask the near caches")
        wait = AckWait(members, self._loop.time(), None if own_too else own)
        heard = self._heard[nonce] = asyncio.Event()
        try:
            while True:
                for member in self._acks.pop(nonce, ()):
                    wait.acked(member)
                timeout = wait.timeout(self._loop.time())
                if timeout is None:
                    return
                heard.clear()
                try:  # (at least a microsecond: a wait too short to move the clock would never end)
                    await asyncio.wait_for(heard.wait(), max(timeout, 1e-6))
                except asyncio.TimeoutError:
                    pass
        finally:
            del self._heard[nonce]
            self._acks.pop(nonce, None)

    def acknowledged(self, nonce: str, member: str) -> None:
        heard = self._heard.get(nonce)
        if heard is not None:  # nobody waits for a late one
            self._acks.setdefault(nonce, set()).add(member)
            heard.set()


class _Watched(TLRUCache):  # type: ignore[type-arg]
    """The embedded store's values, telling the server of each key written or deleted
    (an expiry is not told: a copy never outlives the value's freshness)."""

    def __init__(self, maxsize: float, ttu: Any, timer: Any, changed: Any) -> None:
        super().__init__(maxsize, ttu, timer)
        self._changed = changed

    def __setitem__(self, key: Any, value: Any, *args: Any) -> None:
        super().__setitem__(key, value, *args)
        self._changed(key)

    def __delitem__(self, key: Any, *args: Any) -> None:
        super().__delitem__(key, *args)
        self._changed(key)


class _Connection:
    """One tracking connection: messages arrive in the order they were sent, each after
    a drawn delay, none while its process is paused, none once it is cut."""

    def __init__(self, tracker: SimulatedTracker) -> None:
        self._tracker = tracker
        self._loop = tracker.loop
        self._queue: deque[tuple[float, tuple[str, Any]]] = deque()
        self._last = 0.0
        self.open = True

    def send(self, message: tuple[str, Any]) -> None:
        if not self.open:
            return
        process = self._tracker.process
        at = max(self._last, self._loop.time() + self._tracker.simulation.delay(), process.paused_until)
        self._last = at
        self._queue.append((at, message))
        self._loop.call_at(at, self._arrive)

    def _arrive(self) -> None:
        now = self._loop.time()
        while self.open and self._queue and self._queue[0][0] <= now:
            if self._tracker.process.paused_until > now:  # paused after the message was sent
                self._loop.call_at(self._tracker.process.paused_until, self._arrive)
                return
            self._tracker.read(self._queue.popleft()[1])

    def cut(self) -> None:
        """The connection is gone: nothing more arrives, and its tracker knows."""
        if self.open:
            self.open = False
            self._queue.clear()
            self._tracker.lost()


class SimulatedTracker:
    """A process's near-cache tracker (the layer's ``Tracking``): one task, started by
    the first near-cache lookup, stopped with the layer."""

    def __init__(
        self, simulation: _Simulated, server: NearServer, process: _Process, copies: _Copies, lease: float
    ) -> None:
        self.simulation = simulation
        self.server = server
        self.process = process
        self.copies = copies
        self.lease = lease
        self.loop = server._loop
        self.member = process.name
        self._connection: _Connection | None = None
        self._task: asyncio.Task[None] | None = None
        self._pong: float | None = None  # when the registration of the PING in flight was sent
        self._woken = asyncio.Event()  # set by a PONG or a lost connection, to wake the task
        self._closed = False

    def start(self) -> None:
        if self._task is None and not self._closed:
            self._task = self.loop.create_task(self._run(), name=f"{self.process.name}.tracker")

    def close(self) -> None:
        self._closed = True
        if self._task is not None:
            self._task.cancel()
        self._disconnect()
        self.server.registry.pop(self.member, None)  # invalidators need not wait for us
        self.copies.revoke()

    async def _run(self) -> None:
        simulation = self.simulation
        while not self._closed:
            try:
                await simulation.before(self.process, "track")
                simulation.after(self.process, "track")
                await self._serve()
            except BackendUnavailable:
                pass
            self._disconnect()
            self.copies.revoke()
            await asyncio.sleep(RETRY_INTERVAL)

    async def _serve(self) -> None:
        """Connected: renew every fifth of the lease until the connection is lost."""
        simulation = self.simulation
        connection = self._connection = _Connection(self)
        self.server.connected[self.member] = connection
        self.copies.flush()  # from here on every change reaches us
        while connection.open:
            registered_at = self.loop.time()
            await simulation.before(self.process, "register")
            self.server.registry[self.member] = self.loop.time() + self.lease
            simulation.after(self.process, "register")
            self._pong = registered_at
            connection.send(("pong", registered_at))
            next_renewal = registered_at + self.lease / RENEWALS_PER_LEASE
            while connection.open and (self._pong is not None or self.loop.time() < next_renewal):
                # the next renewal once this one is answered; none while it is not, up to the timeout
                until = registered_at + PONG_TIMEOUT if self._pong is not None else next_renewal
                if until <= self.loop.time():
                    return  # no PONG within the timeout: the connection is taken for lost
                await self._wake(until)

    async def _wake(self, until: float) -> None:
        """Wait for a PONG, a lost connection, or the loop's clock to reach ``until``."""
        self._woken.clear()
        try:  # (at least a microsecond: a wait too short to move the clock would never end)
            await asyncio.wait_for(self._woken.wait(), max(until - self.loop.time(), 1e-6))
        except asyncio.TimeoutError:
            pass

    def read(self, message: tuple[str, Any]) -> None:
        """One message off the connection."""
        kind, data = message
        if kind == "drop":
            self.copies.drop([data])
        elif kind == "request":
            parsed = parse_request(data)
            if parsed is not None:
                nonce, value_keys = parsed
                self.copies.drop(value_keys)
                self.loop.create_task(self._acknowledge(nonce), name=f"{self.process.name}.ack")
        elif kind == "pong" and data == self._pong:
            self._pong = None
            self._woken.set()
            self.copies.renew(data + self.lease)

    async def _acknowledge(self, nonce: str) -> None:
        try:
            await self.simulation.before(self.process, "acknowledge")
            self.server.acknowledged(nonce, self.member)
            self.simulation.after(self.process, "acknowledge")
        except BackendUnavailable:
            pass  # the invalidator waits for our deadline instead

    def lost(self) -> None:
        """The connection was cut: the lease goes at once, and the task connects again."""
        self.copies.revoke()
        self._pong = None
        self._woken.set()

    def _disconnect(self) -> None:
        connection, self._connection = self._connection, None
        if connection is not None:
            connection.open = False
            if self.server.connected.get(self.member) is connection:
                del self.server.connected[self.member]


def ask_of_a_tag(members: list[str], dropped: list[str], tag_key: str) -> tuple[list[str], bool]:
    """``_core.near.asked_of_a_tag``, looked up at each call (a planted defect replaces it)."""
    return agreement.asked_of_a_tag(members, dropped, tag_key)


__all__ = ["PONG_TIMEOUT", "RETRY_INTERVAL", "NearServer", "SimulatedTracker", "ask_of_a_tag"]
