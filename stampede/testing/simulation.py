"""Deterministic simulation: the package's own asyncio layer, for several simulated
processes at once, in one thread, on virtual time, with faults drawn from a seed.

    result = Simulation(seed=7).run()
    assert result.ok, result.explain()

A run is a function of its seed. Every simulated process is a real ``Stampede`` layer
(its runner, flight tables, budgets, watchdog, refreshes and subscribers: the code users
run), and all of them share one store that lives in the event loop: the embedded store
behind a ``SimulatedStore`` that charges each command a latency, and may lose its reply
after it acted, cut it before it reached the store, and delay, drop or repeat a
wake-up, as the seed decides. A nemesis task pauses processes (their commands wait, as
a stopped process's would), kills them (nothing of theirs reaches the store again, and
what their callers had under way is recorded as never returned) and restarts the store
empty. The event loop's clock is virtual: a wait advances it at once, so a run of
minutes of simulated time takes a second of one core.

What the layer reads of time and chance it reads from ``stampede._core.world``: for a
run, the loop's clock (each process's wall clock skewed by its own offset) and one
``random.Random`` of the seed. The workload (``stampede.testing.workload``) draws from
the seed too, and one ``Recorder`` on the loop's clock records it; ``History.check``
judges it, with each fault's span weakening what the documentation says it may
(docs/failures.md): a lost reply, a pause, a kill or an empty restart may cost an extra
load and a slow call, never a stale or a wrong value.

``digest`` is a hash of the whole history: the same seed gives the same digest on any
machine. A failed run says its seed and the command that replays it::

    python -m stampede.testing.simulation --seed 7 --until 1.234567 [--settings JSON] ...

which runs it to the moment its first violation could be seen, and prints that
violation and the operations around it. ``settings={"near_cache": True}`` gives every
process a near cache, Redis's part of their agreement played by ``stampede.testing.near``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextvars
import copy
import dataclasses
import hashlib
import logging
import math
import random
import selectors
import sys
import time
import weakref
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from .. import Stampede
from .._backend import AsyncMemoryStore, LoopMailbox, MemoryStore
from .._core import world
from .._core.backend import Backend, BackendOptions
from .._core.keys import EntryKeys
from .._core.store import AcquireReply, LockState
from .._core.tags import TagKeys
from .._errors import BackendUnavailable
from .history import History, Record, Recorder, Report, Violation
from .locks import Hold, LockViolation, check_holds
from .near import NearServer, SimulatedTracker, ask_of_a_tag
from .workload import Mix, Rows, Subject, _caller, _Plan, layer_subject

EPOCH = 1_800_000_000.0  # the wall clock of virtual time 0 (2027), before each process's skew
NS = 1_000_000_000


class Killed(BaseException):
    """Raised by every store command of a killed process: nothing of it reaches the store
    again, and whatever it had under way ends at its next command (a ``BaseException``,
    as a dead process's code stops without handling anything)."""


class Stuck(RuntimeError):
    """The simulated run waits for something no time and no event can bring: a hang."""


class _JumpingSelector(selectors.DefaultSelector):
    """A selector that never blocks and never asks the kernel: a wait of ``timeout``
    seconds moves the loop's virtual clock on by that much instead. Nothing outside the
    loop can happen meanwhile: the simulation has no sockets and no threads (a thread's
    ``call_soon_threadsafe`` still lands in the loop's queue, and is run next)."""

    loop: VirtualLoop

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        if timeout is None:
            waiting = "\n".join(_where(task) for task in asyncio.all_tasks(self.loop))
            raise Stuck(f"every task of the simulation waits, and none with a timeout:\n{waiting}")
        self.loop.now += timeout
        return []


def _where(task: asyncio.Task[Any]) -> str:
    """A task's name and the line it waits at."""
    frames = task.get_stack()
    where = f"{frames[-1].f_code.co_filename}:{frames[-1].f_lineno}" if frames else "?"
    return f"  {task.get_name()} at {where}"


class VirtualLoop(asyncio.SelectorEventLoop):
    """An event loop on virtual time (``time()``), naming its tasks in the order they
    are made (``sim-1``, ...), so that two runs of a seed name them alike."""

    def __init__(self) -> None:
        selector = _JumpingSelector()
        super().__init__(selector)
        selector.loop = self
        self.now = 0.0
        self._named = 0
        self.made: weakref.WeakKeyDictionary[asyncio.Task[Any], int] = weakref.WeakKeyDictionary()  # the order made
        self.set_task_factory(self._task)

    def time(self) -> float:
        return self.now

    def _write_to_self(self) -> None:
        """Nothing to wake: the loop never sleeps in the kernel."""

    def _task(self, loop: asyncio.AbstractEventLoop, coro: Any, **options: Any) -> asyncio.Task[Any]:
        self._named += 1
        if options.get("name") is None:  # (a newer Python passes the name asked for here)
            options["name"] = f"sim-{self._named}"
        task = asyncio.Task(coro, loop=loop, **options)
        self.made[task] = self._named
        return task


@dataclass(frozen=True)
class Faults:
    """What may go wrong in a run, and how often. Each chance is per store command (or
    per wake-up message); the process faults strike at random moments, one at a time,
    ``nemesis_interval`` seconds apart on average. ``Faults.none()``: only latency."""

    latency: float = 0.0003
    """Mean seconds of a store command's round trip (exponentially distributed)."""
    slow: float = 0.01
    """The chance a command takes 20 to 200 times the mean (a busy server)."""
    lost_reply: float = 0.002
    """The chance a command acts and its reply never comes (``BackendUnavailable``)."""
    cut: float = 0.002
    """The chance a command is cut before it reaches the store (``BackendUnavailable``)."""
    crash: float = 0.0001
    """The chance a process dies at a store command, before the command acts or just
    after it did (mid-load, mid-write, holding a lease or a budget's slot: wherever its
    commands are), never the last one alive."""
    message_delay: float = 0.001
    """Mean seconds a wake-up takes to arrive (exponential: wake-ups are reordered)."""
    message_drop: float = 0.02
    message_duplicate: float = 0.02
    nemesis_interval: float = 0.5
    """Mean seconds between two process faults (``math.inf``: none)."""
    pause: float = 0.6
    """Of the process faults: the share that pauses a process (for up to twice its leases)."""
    kill: float = 0.2
    """... that kills one (never the last one alive)."""
    restart: float = 0.2
    """... that restarts the store empty."""
    failover: float = 0.0
    """... that fails the store over to its replica, which lost the last writes: what it
    held up to ``replication_lag`` seconds before (the documented weakening, and only
    there: an invalidation or ``set`` acknowledged in that window may be undone)."""
    replication_lag: float = 0.05
    """How far behind the replica is: it copies the store every so many seconds."""
    skew: float = 0.5
    """The largest offset of a process's wall clock, in seconds, either way."""

    @classmethod
    def none(cls) -> Faults:
        """Latency alone: no command fails, no message is lost, no process stops."""
        return cls(slow=0.0, lost_reply=0.0, cut=0.0, crash=0.0, message_drop=0.0, message_duplicate=0.0,
                   nemesis_interval=math.inf, skew=0.0)  # fmt: skip


ASKS_NEAR_CACHES = ("invalidate", "expire", "seize", "put")
"""The store commands after which the near caches are asked to drop the entry's copies
(with ``near_cache``: ``stampede.testing.near``). A tag's invalidation asks too."""

WEAKENS = ("extra load", "slow", "gave up")
"""What a fault may cost (docs/failures.md): a second load of an entry, a call that
outlasts its bound or waits its wait_timeout out. Never a stale, unwritten or wrong
value."""


@dataclass
class _Process:
    name: str
    skew: float
    layer: Stampede | None = None
    subject: Subject | None = None
    paused_until: float = 0.0
    killed: bool = False
    callers: list[asyncio.Task[None]] = field(default_factory=list)


class SimulatedStore:
    """One simulated process's view of the shared store: each command of the embedded
    store's asyncio view (the store contract), after a drawn latency, perhaps cut before
    it acts or with its reply lost after; wake-ups relayed with the drawn delays, drops
    and repeats. A paused process's commands wait for the pause to end; a killed one's
    raise ``Killed``."""

    def __init__(self, simulation: Simulation, process: _Process) -> None:
        self._simulation = simulation
        self._process = process
        self._inner = AsyncMemoryStore(simulation.shared)

    def __getattr__(self, name: str) -> Any:
        found = getattr(self._inner, name)
        if not callable(found) or name.startswith("_") or name == "aclose":
            return found

        async def command(*args: Any, **options: Any) -> Any:
            simulation, process = self._simulation, self._process
            await simulation.before(process, name)
            outcome = found(*args, **options)
            if asyncio.iscoroutine(outcome):
                outcome = await outcome
            simulation.after(process, name)
            if name in ASKS_NEAR_CACHES and simulation.near is not None:
                await simulation.near.ask(process, process.name, [args[0].value])
            return outcome

        setattr(self, name, command)  # found here from now on, not through __getattr__
        return command

    async def acquire(
        self, keys: EntryKeys, token: str, lease_ms: int, check_value: bool, stale: bytes = b"", clock: str = ""
    ) -> AcquireReply:
        """The lease, and a tagged load's tag clock read in the same step once it is taken
        (as Redis's ``ACQUIRE_READING_CLOCK``: no round trip between them, in which an
        invalidation could void the lease before the load begins unseen)."""
        simulation, process = self._simulation, self._process
        await simulation.before(process, "acquire")
        reply = simulation.shared.acquire(keys, token, lease_ms, check_value, stale, clock)
        if clock and reply.state is LockState.LOCKED:
            reply = dataclasses.replace(reply, since=simulation.shared.tag_clock(clock))
        simulation.after(process, "acquire")
        return reply

    async def invalidate_tag(self, clock: str, tag: TagKeys, soft: bool) -> list[str]:
        """The tag's step, then (with near caches) asking them to drop its members."""
        simulation, process = self._simulation, self._process
        await simulation.before(process, "invalidate_tag")
        members, dropped = simulation.shared.invalidate_tagged(clock, tag, soft)
        simulation.after(process, "invalidate_tag")
        if simulation.near is not None:
            asked, own_too = ask_of_a_tag(members, dropped, tag.members)
            await simulation.near.ask(process, process.name, asked, own_too)
        return dropped

    async def subscribe(self, keys: EntryKeys) -> LoopMailbox:
        simulation, process = self._simulation, self._process
        await simulation.before(process, "subscribe")
        shared = simulation.shared
        relay: _Relay
        mailbox = LoopMailbox(keys.channel, asyncio.get_running_loop(), lambda _: shared.detach(relay))
        relay = _Relay(simulation, process, mailbox)
        shared.attach(relay)
        simulation.after(process, "subscribe")
        return mailbox

    async def aclose(self) -> None:
        pass


class _Relay:
    """A wake-up's way from the store to one waiter's mailbox, through the faults."""

    __slots__ = ("_mailbox", "_process", "_simulation", "channel")

    def __init__(self, simulation: Simulation, process: _Process, mailbox: LoopMailbox) -> None:
        self._simulation, self._process, self._mailbox = simulation, process, mailbox
        self.channel = mailbox.channel

    def deliver(self, message: bytes) -> None:
        self._simulation.relay(self._process, self._mailbox, message)

    def confirm(self, ok: bool) -> None:
        self._mailbox.confirm(ok)


@dataclass
class Result:
    """What one run did and what the checker found."""

    seed: int
    report: Report
    digest: str  # of the history, record by record: the same for the same seed
    operations: int  # the workload's operations that ran
    virtual_seconds: float
    cpu_seconds: float
    faults: dict[str, int]
    replay: str  # the command that runs this seed again (to its first violation, if it has one)
    errors: list[str]  # exceptions in tasks nobody awaited (each a failure)
    first: Violation | None = None  # the violation seen first in virtual time
    locks: list[LockViolation] = field(default_factory=list)  # of the named lock's holds (``lockers``)
    holds: int = 0  # the named lock's acquisitions asked for

    @property
    def ok(self) -> bool:
        """No violation (of the cache's promise or the named lock's), and no task failed unseen."""
        return self.report.ok and not self.locks and not self.errors

    def explain(self) -> str:
        """The first violation (the operations around it), the errors, and how to replay."""
        lines = [f"seed {self.seed}: {self.report.summary()}"]
        if self.first is not None:
            lines += ["first violation:", self.first.describe(self.report.start)]
        if self.locks:
            lines.append(f"named lock: {len(self.locks)} violations; the first:")
            lines.append(self.locks[0].describe(self.report.start))
        lines += [f"error in a task: {error}" for error in self.errors]
        if not self.ok:
            lines.append(f"replay: {self.replay}")
        return "\n".join(lines)


@dataclass
class Simulation:
    """``processes`` layers x ``callers`` tasks each, running ``operations`` of the
    workload (``stampede.testing.workload``) over ``keys`` keys, with ``faults``, on
    ``seed``. ``settings`` are each process's layer's (``Stampede``'s keywords);
    ``prepare(layer)``, if given, is called on each simulated process's layer before
    the run (a place to plant a fault of one's own, or observe it)."""

    seed: int = 0
    processes: int = 3
    callers: int = 4
    operations: int = 2_000
    keys: int = 4
    faults: Faults = Faults()
    mix: Mix = field(default_factory=Mix)
    query: float = 0.002  # seconds a loader's database read takes
    failures: float = 0.02  # the chance a loader's database read fails
    horizon: float = 600.0  # simulated seconds after which a run that has not ended is stuck
    wait_bound: float | None = None
    """The longest a call may take (the checker's ``slow``): by default ``wait_timeout``
    plus a lease (and ``stale_if_error``) and a second. Without faults a call waits for
    no lease to run out, and a bound under ``recheck_interval`` says that no wake-up was
    missed (a waiter that missed one waits a re-check out)."""
    lockers: int = 0
    """Tasks per process that take the named lock ``"job"`` in turn (``layer.lock``), hold
    it for a load's time and release it, each acquisition recorded and every history
    checked by ``stampede.testing.locks.check_holds`` (two holders at once, a fence
    that went back)."""
    until: float | None = None
    """Stop at this moment of virtual time (seconds): a replay ends at its first violation
    (the calls then under way end there, cancelled)."""
    settings: dict[str, Any] = field(default_factory=dict)
    prepare: Callable[[Stampede], None] | None = None

    def __post_init__(self) -> None:
        self.given = dict(self.settings)  # what the replay command passes on
        self.processes_of: list[_Process] = []
        self.settings = {"lock_ttl": 1.0, "wait_timeout": 5.0, "recheck_interval": 0.2, **self.settings}
        self.loop: VirtualLoop | None = None
        self.near: NearServer | None = None  # with near_cache: the store's side of their agreement
        self.shared = MemoryStore(100_000)
        self.spans: list[tuple[int, int]] = []
        self.pauses: dict[str, list[tuple[int, int]]] = {}  # process -> the spans it was paused
        self.lost_writes: list[tuple[int, int]] = []  # the spans of writes a failover lost
        self._replica: tuple[float, dict[str, Any]] = (0.0, {})
        self.counts: dict[str, int] = {}
        self.errors: list[str] = []  # what went wrong in tasks nobody awaited
        self._plan: _Plan | None = None
        self.holds: list[Hold] = []  # the named lock's acquisitions, with ``lockers``
        self._draw = random.Random(f"faults:{self.seed}")
        self._skew: contextvars.ContextVar[float] = contextvars.ContextVar("skew", default=0.0)

    # --- the run -----------------------------------------------------------------------

    def run(self) -> Result:
        started = time.process_time()
        loop = self.loop = VirtualLoop()
        loop.set_exception_handler(self._failed)
        self.shared = MemoryStore(100_000, clock=loop.time, wall=lambda: EPOCH + loop.time())
        if self.settings.get("near_cache"):
            self.near = NearServer(self, loop)
            self.near.watch(self.shared)
        chance = random.Random(f"layer:{self.seed}")
        try:
            with world.installed(
                monotonic=loop.time,
                wall=lambda: EPOCH + loop.time() + self._skew.get(),
                random=chance.random,
                uniform=chance.uniform,
                token=lambda nbytes: f"{chance.getrandbits(8 * nbytes):0{2 * nbytes}x}",
            ):
                recorder = Recorder("sim", clock=_ticking(loop))
                try:
                    ran = loop.run_until_complete(self._run(recorder))
                except Stuck as stuck:  # a hang is a failure of the run, with its seed and replay
                    self.errors.append(f"stuck: {stuck}")
                    ran = self._ran()
                    loop.run_until_complete(self._ended())
        finally:
            loop.close()
        self._unreturned(recorder)
        ttl = self.settings.get("ttl", 300.0) * (1 - self.settings.get("jitter", 0.1))  # the shortest life
        report = History.of(recorder).check(
            ttl=ttl,
            stale_window=self.settings.get("stale_while_revalidate", 0.0),
            wait_bound=self._wait_bound(),
            weakened=self.spans,
            weakens=WEAKENS,
            gave_up=True,  # with loads of milliseconds, only a fault makes a call wait its wait_timeout out
        )
        apart = [violation for violation in report.violations if self._stalled(violation) or self._undone(violation)]
        report.weakened += apart  # what the simulation's faults may cost, by what they struck
        report.violations[:] = [violation for violation in report.violations if violation not in apart]
        first = min(report.violations, key=_seen_at, default=None)
        locks = check_holds(self.holds)
        seen = [_seen_at(first)] if first is not None else []
        seen += [max(hold.acquired or hold.asked for hold in violation.holds) for violation in locks[:1]]
        stop = None if not seen or self.until is not None else math.ceil(min(seen) / 1000) / 1e6 + 1e-6
        return Result(
            self.seed, report, digest(recorder.records, self.holds), ran, loop.now, time.process_time() - started,
            dict(sorted(self.counts.items())), self.replay(stop), self.errors, first, locks, len(self.holds),
        )  # fmt: skip

    def replay(self, until: float | None = None) -> str:
        """The command that runs this simulation again: its seed and every option given
        that is not the default (a ``prepare`` hook cannot be said on a command line),
        stopping at ``until`` (virtual seconds) if given."""
        words = [f"--seed {self.seed}"]
        names = ("processes", "callers", "lockers", "operations", "keys", "query", "failures", "horizon")
        for name in (*names, "wait_bound"):
            if getattr(self, name) != getattr(Simulation, name):
                words.append(f"--{name.replace('_', '-')} {getattr(self, name)}")
        stop = self.until if until is None else until
        if stop is not None:
            words.append(f"--until {stop:.6f}")
        if self.given:
            words.append(f"--settings '{orjson.dumps(self.given).decode()}'")
        if self.faults == Faults.none():
            words.append("--no-faults")
        elif self.faults != Faults():
            faults = {
                name: None if math.isinf(value) else value for name, value in dataclasses.asdict(self.faults).items()
            }
            words.append(f"--faults '{orjson.dumps(faults).decode()}'")  # null: never
        if self.mix != Mix():
            words.append(f"--mix '{orjson.dumps(dataclasses.asdict(self.mix)).decode()}'")
        if self.prepare is not None:
            words.append("# and the prepare hook the run was given")
        return "python -m stampede.testing.simulation " + " ".join(words)

    async def _run(self, recorder: Recorder) -> int:
        failing = random.Random(f"database:{self.seed}")
        rows = Rows(recorder, delay=self.query, fails=lambda: failing.random() < self.failures)
        draw = random.Random(f"processes:{self.seed}")
        processes = [_Process(f"p{number}", draw.uniform(-self.faults.skew, self.faults.skew))
                     for number in range(self.processes)]  # fmt: skip
        for process in processes:
            self._skew.set(process.skew)  # its tasks (and theirs) read their wall clock skewed
            process.layer = Stampede(backend=self._backend(process), namespace="sim", **self.settings)
            if self.prepare is not None:
                self.prepare(process.layer)
            process.subject = layer_subject(process.layer, rows, asynchronous=True)
        self._skew.set(0.0)
        self.processes_of = processes
        plan = self._plan = _Plan(
            self._routed(processes), list(range(self.keys)), self.operations, None, self.mix, asyncio.Lock
        )
        for number in range(self.processes * self.callers):
            process = processes[number % self.processes]
            self._skew.set(process.skew)
            rng = random.Random(self.seed * 1000 + number)
            name = f"{process.name}.c{number // self.processes}"
            process.callers.append(asyncio.get_running_loop().create_task(_caller(plan, recorder, rng), name=name))
        for number in range(self.processes * self.lockers):
            process = processes[number % self.processes]
            self._skew.set(process.skew)
            rng = random.Random(f"locker:{self.seed}:{number}")
            locker = self._locker(process, plan, recorder.clock, rng)
            name = f"{process.name}.l{number // self.processes}"
            process.callers.append(asyncio.get_running_loop().create_task(locker, name=name))
        self._skew.set(0.0)
        nemesis = asyncio.get_running_loop().create_task(self._nemesis(processes, plan), name="nemesis")
        if self.faults.failover and not math.isinf(self.faults.nemesis_interval):
            asyncio.get_running_loop().create_task(self._replicate(), name="replica")
        alive = [task for process in processes for task in process.callers]
        loop = asyncio.get_running_loop()
        while alive:
            if self.until is not None and loop.time() >= self.until:
                break
            left = self.horizon - loop.time()
            if left <= 0:
                waiting = "\n".join(_where(task) for task in alive)
                raise Stuck(f"the workload's callers still run after {self.horizon} s of simulated time:\n{waiting}")
            if self.until is not None:
                left = min(left, max(self.until - loop.time(), 1e-6))
            await asyncio.wait(alive, timeout=left, return_when=asyncio.FIRST_COMPLETED)
            alive = [task for process in processes if not process.killed for task in process.callers if not task.done()]
        nemesis.cancel()
        for process in processes:  # what a killed process had under way stays so
            for task in process.callers:
                task.cancel()
        for process in processes:
            if not process.killed and process.layer is not None:
                await _closed(process.layer)
        await self._ended()
        return self._ran()

    def _ran(self) -> int:
        """How many of the workload's operations were taken."""
        plan = self._plan
        return 0 if plan is None else plan.operations - max(plan.left, 0)

    async def _locker(self, process: _Process, plan: _Plan, clock: Callable[[], int], rng: random.Random) -> None:
        """Take the named lock, hold it for a load's time, release it; again until the
        workload has no operation left. Each acquisition is a ``Hold``."""
        assert process.layer is not None
        task = asyncio.current_task()
        holder = task.get_name() if task is not None else process.name
        while plan.left > 0:
            lock = process.layer.lock("job", ttl=self.settings["lock_ttl"], timeout=self.settings["wait_timeout"])
            hold = Hold(holder, clock())
            self.holds.append(hold)
            try:
                if not await lock.aacquire():
                    hold.outcome = "not acquired"
                    continue
                hold.acquired, hold.fence = clock(), lock.fence
                await asyncio.sleep(rng.expovariate(1 / self.query))  # the work it guards
                hold.releasing = clock()
                await lock.arelease()
                hold.released, hold.outcome = clock(), "ok"
            except Exception as error:  # recorded: a release that failed is no clean hold
                hold.released = None if hold.releasing is None else clock()
                hold.outcome = type(error).__name__
            await asyncio.sleep(rng.expovariate(1 / self.query))

    async def _ended(self) -> None:
        """Every task left (a killed process's, the nemesis) cancelled, in the order they
        were made, and waited for."""
        made = self.loop.made if self.loop is not None else {}
        left = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
        left.sort(key=lambda task: made.get(task, 0))
        for task in left:
            task.cancel()
        if left:
            await asyncio.wait(left, timeout=self.horizon)
        for task in left:
            if task.done() and not task.cancelled():
                task.exception()  # retrieved: a Killed one's is expected, others were reported

    def _failed(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        """The loop's exception handler: an error in a task nobody awaited is a failure of
        the run (``Result.errors``), unless it is a killed process's ``Killed``."""
        if not isinstance(context.get("exception"), Killed):
            self.errors.append(str(context.get("message")) + ": " + repr(context.get("exception")))

    def _routed(self, processes: list[_Process]) -> Subject:
        """One subject whose calls go to the layer of the calling task's process."""
        by_name = {process.name: process for process in processes}

        def route(name: str) -> Callable[..., Any]:
            async def call(*args: Any) -> Any:
                task = asyncio.current_task()
                process = by_name[task.get_name().split(".")[0]] if task is not None else processes[0]
                return await getattr(process.subject, name)(*args)

            return call

        names = ("read", "update", "read_many", "expire", "set", "update_tag", "expire_tag")
        return Subject(**{name: route(name) for name in names})

    def _backend(self, process: _Process) -> Callable[[BackendOptions], Backend]:
        near = self.near

        def build(options: BackendOptions) -> Backend:
            return Backend(
                name="simulated",
                store=None,
                make_async_store=lambda: SimulatedStore(self, process),
                make_tracker=(lambda copies, lease: SimulatedTracker(self, near, process, copies, lease))
                if near is not None
                else None,
            )

        return build

    def _wait_bound(self) -> float:
        if self.wait_bound is not None:
            return self.wait_bound
        settings = self.settings
        return float(settings["wait_timeout"] + settings["lock_ttl"] + settings.get("stale_if_error", 0.0) + 1.0)

    def _unreturned(self, recorder: Recorder) -> None:
        """What a killed process's callers had under way never returned (they were
        cancelled when it died): recorded so. (What callers had under way at ``until``
        ended there, cancelled, as it would look had it failed at that moment.)"""
        killed = {process.name for process in self.processes_of if process.killed}
        recorder.records[:] = [
            record._replace(completed=None, outcome="never returned")
            if record.outcome in ("CancelledError", "Killed") and record.thread.split(".")[0] in killed
            else record
            for record in recorder.records
        ]

    # --- faults ------------------------------------------------------------------------

    def _count(self, fault: str) -> None:
        self.counts[fault] = self.counts.get(fault, 0) + 1

    def _weaken(self, seconds: float, paused: _Process | None = None) -> None:
        """A fault now may cost an extra load or a slow call until ``seconds`` from now,
        and a lease it upset lapses within ``lock_ttl`` more. A pause of ``paused`` for
        those seconds may also make slow a call of its own already under way."""
        now = self._now()
        self.spans.append((round(now * NS), round((now + seconds + self.settings["lock_ttl"] + 1.0) * NS)))
        if paused is not None:
            self.pauses.setdefault(paused.name, []).append((round(now * NS), round((now + seconds) * NS)))

    def _stalled(self, violation: Violation) -> bool:
        """A ``slow`` or ``gave up`` call whose own process was paused while it ran: the
        pause's cost, though the call began before the pause did."""
        return violation.rule in ("slow", "gave up") and any(
            start <= (record.completed or record.invoked) and record.invoked <= end
            for record in violation.records
            for start, end in self.pauses.get(record.thread.split(".")[0], ())
        )

    def _now(self) -> float:
        return asyncio.get_running_loop().time()

    async def before(self, process: _Process, command: str) -> None:
        """A command's way to the store and back (its round trip is waited before it
        acts: one timer a command), unless it is cut on the way."""
        faults, draw = self.faults, self._draw
        latency = draw.expovariate(1 / faults.latency) if faults.latency else 0.0
        if draw.random() < faults.slow:
            latency *= draw.uniform(20, 200)
        await asyncio.sleep(latency)
        if process.paused_until or process.killed:
            await self._alive(process)
        if faults.crash and draw.random() < faults.crash and self._dies(process):
            raise Killed(f"{process.name}, before {command}")
        if draw.random() < faults.cut:
            self._count("cut")
            self._weaken(0.0)
            raise BackendUnavailable(f"simulated: the connection was cut before {command}")

    def after(self, process: _Process, command: str) -> None:
        """A command's reply, perhaps lost after the command acted (or its process dead)."""
        if self.faults.crash and self._draw.random() < self.faults.crash and self._dies(process):
            raise Killed(f"{process.name}, after {command}")
        if self._draw.random() < self.faults.lost_reply:
            self._count("lost reply")
            self._weaken(0.0)
            raise BackendUnavailable(f"simulated: {command} acted, and its reply was lost")

    def delay(self) -> float:
        """A message's drawn delay on its way (a wake-up's, a near cache's)."""
        mean = self.faults.message_delay
        return self._draw.expovariate(1 / mean) if mean else 0.0

    def _dies(self, process: _Process) -> bool:
        """Kill ``process`` at one of its commands, unless it is the last one alive (or
        no process of the run: the store contract's)."""
        if process not in self.processes_of or sum(not other.killed for other in self.processes_of) < 2:
            return False
        self._kill(process)
        self._count("process killed at a command")
        return True

    def _kill(self, process: _Process) -> None:
        """Nothing of ``process`` reaches the store again; its callers are cancelled."""
        process.killed = True
        for task in process.callers:
            task.cancel()
        self._weaken(self.settings["lock_ttl"])

    async def _alive(self, process: _Process) -> None:
        """Return once the process may act: after its pause; ``Killed`` once it is dead."""
        loop = asyncio.get_running_loop()
        while process.paused_until > loop.time():
            await asyncio.sleep(max(process.paused_until - loop.time(), 1e-6))  # (a wait that moves the clock)
        if process.killed:
            raise Killed(process.name)

    def relay(self, process: _Process, mailbox: LoopMailbox, message: bytes) -> None:
        """A wake-up on its way to ``process``: delayed, perhaps dropped or repeated."""
        faults, draw = self.faults, self._draw
        if process.killed:
            return
        if draw.random() < faults.message_drop:
            self._count("wake-up dropped")
            return
        times = 2 if draw.random() < faults.message_duplicate else 1
        if times == 2:
            self._count("wake-up repeated")
        loop = mailbox._loop  # the waiter's: the store's publish runs in a command on it
        for _ in range(times):
            delay = max(self.delay(), process.paused_until - loop.time())
            loop.call_later(delay, mailbox._fire, message)

    async def _nemesis(self, processes: list[_Process], plan: _Plan) -> None:
        """One process fault at a time (a pause lasts before the next is drawn), while the
        workload has operations left to take."""
        faults, draw = self.faults, self._draw
        if math.isinf(faults.nemesis_interval):
            return
        lease = self.settings["lock_ttl"]
        while True:
            await asyncio.sleep(draw.expovariate(1 / faults.nemesis_interval))
            if plan.left <= 0:
                return
            living = [process for process in processes if not process.killed]
            weights = (faults.pause, faults.kill, faults.restart, faults.failover)
            choice = draw.choices(("pause", "kill", "restart", "failover"), weights)[0]
            if choice == "kill" and len(living) < 2:
                choice = "pause"
            if choice == "pause":
                process = draw.choice(living)
                seconds = draw.uniform(0.05, 2 * lease)
                process.paused_until = self._now() + seconds
                self._count("process paused")
                self._weaken(seconds, paused=process)
                await asyncio.sleep(seconds)
            elif choice == "kill":
                self._kill(draw.choice(living))
                self._count("process killed")
            elif choice == "restart":
                self._restart_store()
                self._count("store restarted empty")
                self._weaken(lease)
            else:
                self._fail_over()
                self._count("failover lost the last writes")
                self._weaken(lease)

    async def _replicate(self) -> None:
        """The replica: a copy of the store every ``replication_lag`` seconds."""
        while True:
            self._replica = (self._now(), self._copy_of_store())
            await asyncio.sleep(self.faults.replication_lag)

    def _copy_of_store(self) -> dict[str, Any]:
        """What the store holds, copied (not its lock, nor who listens to it)."""
        shared = self.shared
        kept = {name: value for name, value in vars(shared).items() if name not in ("_lock", "_waiting")}
        return copy.deepcopy(kept, self._same())

    def _same(self) -> dict[int, Any]:
        """What a copy of the store refers to and shares with it (deepcopy's memo)."""
        return {id(self.shared): self.shared, id(self.near): self.near, id(self.loop): self.loop}

    def _fail_over(self) -> None:
        """The replica takes over, without the writes since its last copy: the store as
        it was then (a copy of it: the replica goes on copying), every tracking connection
        cut. The writes lost, and when, are kept to judge what they undo."""
        copied_at, state = self._replica
        vars(self.shared).update(copy.deepcopy(state, self._same()))
        self.lost_writes.append((round(copied_at * NS), round(self._now() * NS)))
        if self.near is not None:
            self.near.restarted()

    def _undone(self, violation: Violation) -> bool:
        """A stale value served because a failover undid the invalidation or ``set`` that
        had dropped it (the store acted on it within the replication lag before the
        failover: sometime while the call ran, which may return after the failover, as
        one that waited for the near caches does): the documented weakening."""
        return violation.rule in ("stale", "stale window") and any(
            record.kind in ("invalidate", "set", "expire")
            and record.completed is not None
            and any(record.invoked <= end and start <= record.completed for start, end in self.lost_writes)
            for record in violation.records
        )

    def _restart_store(self) -> None:
        """The store comes back empty: values, leases, tags, budgets and marks gone. Its
        subscribers keep their subscriptions (their clients subscribe again at once)."""
        assert self.loop is not None
        loop = self.loop
        waiting = self.shared._waiting
        MemoryStore.__init__(self.shared, 100_000, clock=loop.time, wall=lambda: EPOCH + loop.time())
        self.shared._waiting = waiting
        if self.near is not None:
            self.near.watch(self.shared)
            self.near.restarted()


def _seen_at(violation: Violation) -> int:
    """When a violation could first be seen: the end of the last of its operations (its
    start if it never ended), in the recorder's nanoseconds."""
    return max(record.invoked if record.completed is None else record.completed for record in violation.records)


def _ticking(loop: VirtualLoop) -> Callable[[], int]:
    """The recorder's clock: the loop's, in nanoseconds, a nanosecond on at each reading
    within one instant of virtual time. Many steps run at one instant (virtual time moves
    only when every task waits), and the checker's rules ask whether one operation began
    after another returned: the order they ran in says so, as a real clock would."""
    last = -1

    def clock() -> int:
        nonlocal last
        last = max(last + 1, round(loop.time() * NS))
        return last

    return clock


def simulated_backend(
    simulation: Simulation, process: str = "p0", *, blocking: bool = True
) -> Callable[[BackendOptions], Backend]:
    """A backend of ``simulation``'s store as one simulated process sees it, for
    ``Stampede(backend=...)`` on any event loop (the store contract runs over it, see
    tests/promises/test_store_contract.py). ``blocking``: give the layer the shared
    embedded store itself as its blocking store (no faults there)."""
    seen = _Process(process, 0.0)

    def build(options: BackendOptions) -> Backend:
        return Backend(
            name="simulated",
            store=simulation.shared if blocking else None,
            make_async_store=lambda: SimulatedStore(simulation, seen),
        )

    return build


async def _closed(layer: Stampede) -> None:
    """``layer.aclose()`` without its thread (nothing here blocks: the store is in the loop)."""
    if layer._async_runner is not None:
        await layer._async_runner.aclose()
    layer.close()


def digest(records: Sequence[Record], holds: Sequence[Hold] = ()) -> str:
    """A hash of a history, record by record in the order they were made, then the named
    lock's holds."""
    hashed = hashlib.sha256()
    for record in records:
        hashed.update(orjson.dumps(list(record), option=orjson.OPT_NON_STR_KEYS))
    for hold in holds:
        hashed.update(orjson.dumps(dataclasses.astuple(hold)))
    return hashed.hexdigest()


def seeds(first: int, count: int, **options: Any) -> Iterator[Result]:
    """The runs of ``count`` seeds from ``first``, each a ``Simulation(seed, **options)``."""
    for seed in range(first, first + count):
        yield Simulation(seed=seed, **options).run()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m stampede.testing.simulation", description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=0, help="the first seed")
    parser.add_argument("--seeds", type=int, default=1, help="how many seeds, from --seed")
    parser.add_argument("--processes", type=int, default=Simulation.processes)
    parser.add_argument("--callers", type=int, default=Simulation.callers, help="tasks per process")
    parser.add_argument("--lockers", type=int, default=Simulation.lockers, help="named-lock tasks per process")
    parser.add_argument("--operations", type=int, default=Simulation.operations, help="per seed")
    parser.add_argument("--keys", type=int, default=Simulation.keys)
    parser.add_argument("--query", type=float, default=Simulation.query, help="seconds of a loader's read")
    parser.add_argument("--failures", type=float, default=Simulation.failures, help="the chance a load fails")
    parser.add_argument("--horizon", type=float, default=Simulation.horizon)
    parser.add_argument("--until", type=float, default=None, help="stop at this virtual second (a replay's end)")
    parser.add_argument("--wait-bound", type=float, default=None, help="the longest a call may take, in seconds")
    parser.add_argument("--settings", type=orjson.loads, default={}, help="the layers' settings, as JSON")
    parser.add_argument("--faults", type=orjson.loads, default=None, help="Faults' fields, as JSON")
    parser.add_argument("--no-faults", action="store_true", help="latency alone")
    parser.add_argument("--mix", type=orjson.loads, default={}, help="the workload's Mix fields, as JSON")
    options = parser.parse_args(argv)
    asked = {name: math.inf if value is None else value for name, value in (options.faults or {}).items()}
    faults = Faults.none() if options.no_faults else Faults(**asked)
    total, cpu = 0, 0.0
    names = ["processes", "callers", "lockers", "operations", "keys", "query", "failures", "horizon", "until"]
    names += ["wait_bound", "settings"]
    given = {name: getattr(options, name) for name in names}
    for result in seeds(options.seed, options.seeds, faults=faults, mix=Mix(**options.mix), **given):
        total, cpu = total + result.operations, cpu + result.cpu_seconds
        if not result.ok:
            print(result.explain())
            return 1
        print(f"seed {result.seed}: {result.operations} operations, {result.virtual_seconds:.1f} s simulated, "
              f"{result.cpu_seconds:.2f} s, faults {result.faults}, digest {result.digest[:16]}")  # fmt: skip
    print(f"{total} operations checked in {cpu:.1f} s of CPU: {total / max(cpu, 1e-9):,.0f} per second")
    return 0


__all__ = ["EPOCH", "WEAKENS", "Faults", "Killed", "Result", "SimulatedStore", "Simulation", "Stuck",
           "VirtualLoop", "digest", "seeds", "simulated_backend"]  # fmt: skip

if __name__ == "__main__":
    # The faults' warnings are expected. Here, not in main(): a test that calls main()
    # would silence the rest of its process.
    logging.getLogger("stampede").setLevel(logging.ERROR)
    sys.exit(main())
