"""Histories of a cache's operations, checked against stampede's promises.

A scenario test proves one interleaving; a history proves the thousands a stress run
makes. Every process of a run keeps a ``Recorder``: each operation (a cached call, a
load, a database write, a ``set``, an invalidation, an expiry) is recorded with its
invocation and completion on ``time.monotonic_ns()``, one clock for every process of a
Linux machine, its key(s), and the database version it read or was made for. The
parent merges the recorders (``History.load`` reads those saved by other processes) and
``History.check`` tells whether any reader got a value it must not get:

* ``wrong key``: a value that came from another key's row (one caller's value handed
  to another);
* ``unwritten``: a version no database write had begun by the time the call returned;
* ``stale``: a call that began after an ``invalidate`` or ``set`` of its key returned,
  given a version older than the one that operation was made for (an invalidation's
  version, when not given, is the newest database write that returned before it began);
* ``stale window``: the same after an ``expire``, once the call began later than
  ``stale_window`` seconds after the expiry returned;
* ``extra load``: two successful loads of a key with nothing between them to explain
  the second: no invalidation, ``set`` or expiry of the key overlapping the span from
  the earlier of the calls the two loads ran for (a load is in flight from its call's
  lease, and one in flight at an invalidation is voided) to the second load, no failed
  load, and the second begun within ``ttl`` seconds of the first one's end (an entry
  lives at least ``ttl``);
* ``slow``: a call that took longer than ``wait_bound`` seconds;
* ``gave up``, asked for with ``gave_up=True``: a call that raised ``WaitTimeout`` or
  ``BudgetTimeout`` (it waited its ``wait_timeout`` for another's load or a budget's
  slot). On real servers a busy machine may make one; on the simulator's virtual time,
  with loads of milliseconds, only a fault can, or a lease or slot that is never given
  back (a defect the other rules cannot see: the values stay right, the calls fail).

Where the documentation says a promise weakens (a failover may cost an extra load, or
undo an invalidation acknowledged within the replication lag), pass the fault's time
spans as ``weakened`` and the rules it weakens as ``weakens`` (extra loads unless told):
a violation of one of them whose later operation began in a span is counted apart, not
with the others. A violation names the operations involved, with their processes,
threads and times from the history's start, so a failing run explains itself.

Recording costs one list append per operation and key (about a microsecond with the
context manager), small beside a round trip to a server, so it can stay on in stress
runs. A row that does not exist yet is version 0, and every other version must have a
recorded write: a read of version 3 of a key no write was recorded for is ``unwritten``
(record the rows a run starts with as writes that ended before it).
"""

from __future__ import annotations

import asyncio
import bisect
import itertools
import os
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, NamedTuple

import orjson

KINDS = ("read", "load", "write", "set", "invalidate", "expire", "verify")
# "verify": a verification's call of the loader (``stampede.verifying()``): it reads the
# database and writes nothing, so no rule counts it as a load.
GIVING_UP = ("WaitTimeout", "BudgetTimeout")  # the outcomes of a call that waited its wait_timeout out
HARD = ("invalidate", "set")  # after these return, no older version is served
BOUNDARIES = ("invalidate", "set", "expire")  # a load after one of these is of a new entry


class Record(NamedTuple):
    """One key of one operation. ``completed`` is None for an operation that never
    returned (its process was killed); ``outcome`` is "ok" or the exception's name, and
    ``detail`` its message (so that a run that failed says why)."""

    kind: str
    key: Any
    version: int | None
    source: Any
    invoked: int
    completed: int | None
    outcome: str
    process: str
    thread: str
    op: int  # the operation's number in its process: the keys of one many-key call share it
    detail: str = ""

    def describe(self, start: int) -> str:
        ended = "never returned" if self.completed is None else f"{(self.completed - start) / 1e9:.6f}"
        version = "" if self.version is None else f", version {self.version}"
        source = "" if self.source in (None, self.key) else f" (a value of {self.source!r})"
        outcome = "" if self.outcome == "ok" else f", raised {self.outcome}"
        if self.detail:
            outcome += f" ({self.detail})"
        return (
            f"{self.kind} of {self.key!r}{version}{source}{outcome} by {self.process}/{self.thread}, "
            f"{(self.invoked - start) / 1e9:.6f} s to {ended}"
        )


class Recorder:
    """What one process did. Thread-safe: each operation is one ``list.append``.

    ``with recorder.op("read", key) as op: op.saw(version_of(cached(key)))`` records a
    cached call; ``op("read", *keys)`` a many-key call (``op.saw(version, key=...)`` per
    id); ``op("load", key)`` a run of the loader; ``op("write", key, version=7)`` the
    database write of version 7; ``op("invalidate", *keys)``, ``op("expire", *keys)``
    (a tag's keys at once) and ``op("set", key, version=7)`` the cache's own;
    ``op("verify", key)`` a verification's loader call (``verify_sample``).
    """

    def __init__(
        self,
        process: str | None = None,
        *,
        stream: str | os.PathLike[str] | None = None,
        clock: Callable[[], int] = time.monotonic_ns,
    ) -> None:
        """``stream``: a file each operation is also appended to as it begins and as it
        ends (a line of JSON each time, in one ``write``), so that what a process did
        survives its being killed (``History.load`` reads it; an operation it began and
        never ended is one that never returned). ``clock``: nanoseconds, the same for
        every recorder of a history (a simulation's virtual time)."""
        self.process = process or str(os.getpid())
        self.clock = clock
        self.records: list[Record] = []
        self._numbers = itertools.count().__next__  # atomic under the GIL
        self._stream: int | None = None
        if stream is not None:
            self._stream = os.open(stream, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def close(self) -> None:
        """Close the stream (the records stay)."""
        if self._stream is not None:
            os.close(self._stream)
            self._stream = None

    def op(self, kind: str, *keys: Any, version: int | Mapping[Any, int] | None = None) -> Operation:
        if kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, not {kind!r}")
        if not keys:
            raise ValueError("an operation has at least one key")
        return Operation(self, kind, keys, version)

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the records (JSON) for ``History.load`` in another process."""
        Path(path).write_bytes(orjson.dumps([list(record) for record in self.records]))

    def _add(self, records: Iterable[Record]) -> None:
        if self._stream is None:
            self.records.extend(records)
            return
        ended = list(records)
        self.records.extend(ended)
        self._write(ended)

    def _write(self, records: list[Record]) -> None:
        """One line, appended to a file opened for appending: whole, whatever becomes of
        the process after it returns (a write cut short by a signal is finished; one cut
        by the process's death leaves a last line ``History.load`` leaves out)."""
        if self._stream is not None:
            line = memoryview(orjson.dumps([list(record) for record in records]) + b"\n")
            while line:
                line = line[os.write(self._stream, line) :]


class Operation:
    """An operation under way: its invocation time is taken on entry, its completion on
    exit, with the exception's name as the outcome if one escaped (it is re-raised)."""

    __slots__ = ("_invoked", "_keys", "_kind", "_number", "_recorder", "_sources", "_versions")

    def __init__(self, recorder: Recorder, kind: str, keys: tuple[Any, ...], version: Any) -> None:
        self._recorder, self._kind, self._keys = recorder, kind, keys
        if isinstance(version, Mapping):
            self._versions: dict[Any, int | None] = dict(version)
        else:
            self._versions = dict.fromkeys(keys, version)
        self._sources: dict[Any, Any] = {}
        self._invoked = 0
        self._number = recorder._numbers()

    def saw(self, version: int, key: Any = None, source: Any = None) -> None:
        """What the operation read for ``key`` (the operation's one key if not given):
        the version of the row its value came from, and that row's key (``source``) if
        the value says it."""
        key = self._keys[0] if key is None else key
        self._versions[key] = version
        if source is not None:
            self._sources[key] = source

    def __enter__(self) -> Operation:
        self._invoked = self._recorder.clock()
        recorder = self._recorder
        if recorder._stream is not None:  # begun: a record that never returned, until it does
            recorder._write(
                [Record(self._kind, key, self._versions.get(key), None, self._invoked, None, "never returned",
                        recorder.process, _caller_name(), self._number) for key in self._keys]
            )  # fmt: skip
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        completed = self._recorder.clock()
        outcome = "ok" if kind is None else kind.__name__
        detail = "" if error is None else str(error)[:300]
        thread = _caller_name()
        recorder = self._recorder
        recorder._add(
            Record(self._kind, key, self._versions.get(key), self._sources.get(key), self._invoked, completed,
                   outcome, recorder.process, thread, self._number, detail)
            for key in self._keys
        )  # fmt: skip


def _caller_name() -> str:
    """The task's name in an event loop, else the thread's: one caller's operations follow
    one another."""
    if asyncio._get_running_loop() is not None:
        task = asyncio.current_task()
        if task is not None:
            return task.get_name()
    return threading.current_thread().name


@dataclass
class Violation:
    """A broken promise: which, on which key, and the operations that show it (the one
    that broke it last)."""

    rule: str
    key: Any
    why: str
    records: list[Record]
    nearby: list[Record] = field(default_factory=list)
    """The key's other operations around these, in the order they began."""

    def describe(self, start: int) -> str:
        lines = [f"{self.rule} on {self.key!r}: {self.why}"]
        lines += [f"    {record.describe(start)}" for record in self.records]
        if self.nearby:
            lines.append("  around them:")
            lines += [f"    {record.describe(start)}" for record in self.nearby]
        return "\n".join(lines)


@dataclass
class Report:
    """What ``History.check`` found. ``violations`` break a promise; ``weakened`` broke
    one inside a span the caller said weakens it (a fault's)."""

    start: int
    operations: int
    reads: int
    loads: int
    epochs: int
    most_loads_per_epoch: int
    slowest_call: float
    violations: list[Violation] = field(default_factory=list)
    weakened: list[Violation] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.violations

    def counts(self) -> dict[str, int]:
        """Violations per rule."""
        return dict(Counter(violation.rule for violation in self.violations))

    def summary(self) -> str:
        return (
            f"{self.operations} operations ({self.reads} reads, {self.loads} loads), {len(self.violations)} "
            f"violations {self.counts() or ''}, {len(self.weakened)} in weakened spans; most loads of one "
            f"key's entry: {self.most_loads_per_epoch}; slowest call {self.slowest_call * 1000:.1f} ms"
        )

    def __str__(self) -> str:
        shown = [violation.describe(self.start) for violation in self.violations[:20]]
        more = len(self.violations) - len(shown)
        return "\n".join([self.summary(), *shown] + ([f"... and {more} more"] if more > 0 else []))


class History:
    """Every record of a run, from any number of recorders and saved files."""

    def __init__(self, records: Iterable[Record] = ()) -> None:
        self.records = list(records)

    @classmethod
    def of(cls, *recorders: Recorder) -> History:
        return cls(record for recorder in recorders for record in recorder.records)

    @classmethod
    def load(cls, *paths: str | os.PathLike[str]) -> History:
        """The records ``Recorder.save`` wrote, or a ``Recorder``'s stream: there, an
        operation's end replaces its beginning, and one with no end never returned. A
        stream's last line cut short (its process killed in that ``write``) is left out:
        an end lost leaves its operation one that never returned, a beginning lost the
        operation unrecorded, as if the kill had come a moment earlier."""
        records: dict[tuple[str, int, Any], Record] = {}
        for path in paths:
            text = Path(path).read_bytes()
            if not text:  # a stream nothing was recorded to
                continue
            if b"\n" not in text:  # saved: one document
                rows = orjson.loads(text)
            else:  # a stream: a line per operation begun or ended
                lines = text.split(b"\n")
                if lines[-1]:  # cut short: the process was killed while writing its last line
                    lines.pop()
                rows = [row for line in lines if line for row in orjson.loads(line)]
            for row in rows:
                record = Record(*row)
                record = record._replace(key=_hashable(record.key), source=_hashable(record.source))
                records[(record.process, record.op, record.key)] = record
        return cls(records.values())

    def extend(self, other: History | Recorder) -> None:
        self.records.extend(other.records)

    def check(
        self,
        *,
        ttl: float | None = None,
        stale_window: float = 0.0,
        wait_bound: float | None = None,
        weakened: Sequence[tuple[int, int]] = (),
        weakens: Collection[str] = ("extra load",),
        gave_up: bool = False,
    ) -> Report:
        """Check every key's records (see the module's docstring for the rules).
        ``ttl``: the shortest life of an entry, in seconds (None: entries outlive the run);
        ``stale_window``: how long after an ``expire`` an older version may be served;
        ``wait_bound``: the longest a call may take (None: not checked); ``weakened``:
        spans of ``time.monotonic_ns()`` in which a violation of the rules ``weakens``
        is counted apart (a fault may cost an extra load; a failover may also undo an
        invalidation: add "stale"); ``gave_up``: a call that gave up waiting is a
        violation."""
        done = [record for record in self.records if record.completed is not None]
        start = min((record.invoked for record in self.records), default=0)
        by_key: dict[Any, list[Record]] = defaultdict(list)
        for record in done:
            by_key[record.key].append(record)
        unended: dict[Any, list[Record]] = defaultdict(list)  # what may have happened, or not
        for record in self.records:
            if record.completed is None:
                unended[record.key].append(record)
        report = Report(start, len({(r.process, r.op) for r in self.records}), 0, 0, 0, 0, 0.0)
        spans = _merged(weakened)
        for key, records in by_key.items():
            records.sort(key=lambda record: record.invoked)
            invoked = [record.invoked for record in records]
            checked = _check_key(key, records, unended[key], report, ttl, stale_window, wait_bound, gave_up)
            for violation in checked:
                violation.nearby = _nearby(records, invoked, violation.records)
                last = max(violation.records, key=lambda record: record.invoked).invoked
                apart = violation.rule in weakens and _within(spans, last)
                (report.weakened if apart else report.violations).append(violation)
        report.violations.sort(key=lambda violation: max(record.invoked for record in violation.records))
        return report


def _hashable(key: Any) -> Any:
    """A key read back from JSON (a list where a tuple was recorded) as a dict key."""
    return tuple(_hashable(part) for part in key) if isinstance(key, list) else key


def _nearby(records: list[Record], invoked: list[int], involved: list[Record], most: int = 12) -> list[Record]:
    """The operations of ``records`` (sorted by invocation, ``invoked`` their times) under
    way between the first of ``involved`` beginning and the last ending, the closest
    ``most``. Looked for backwards from the last to begin before that end, among at most
    ``NEARBY_SCAN`` records: a history of a million operations with many violations (a
    broken writer's) is explained in seconds, not hours."""
    first = min(record.invoked for record in involved)
    last = max(record.completed or record.invoked for record in involved)
    found: list[Record] = []
    index = bisect.bisect_right(invoked, last) - 1
    stop = max(-1, index - NEARBY_SCAN)
    while index > stop and len(found) < most:
        record = records[index]
        if record not in involved and (record.completed or last) >= first:
            found.append(record)
        index -= 1
    found.reverse()
    return found


NEARBY_SCAN = 5000


def _merged(spans: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    """``spans`` sorted, overlapping ones joined: each moment is in at most one."""
    merged: list[tuple[int, int]] = []
    for start, end in sorted(spans):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def _within(spans: list[tuple[int, int]], moment: int) -> bool:
    """Whether ``moment`` is in one of ``spans`` (merged)."""
    index = bisect.bisect_right(spans, (moment, 1 << 63)) - 1
    return index >= 0 and spans[index][0] <= moment <= spans[index][1]


class _Newest:
    """The newest version among operations that returned by a moment: their completion
    times, sorted, with the running maximum of their versions."""

    def __init__(self, operations: Iterable[Record], version_of: Callable[[Record], int]) -> None:
        ordered = sorted(operations, key=lambda record: record.completed or 0)
        self.times = [record.completed or 0 for record in ordered]
        self.newest: list[tuple[int, Record | None]] = []
        best: tuple[int, Record | None] = (0, None)
        for record in ordered:
            version = version_of(record)
            if version > best[0]:
                best = (version, record)
            self.newest.append(best)

    def by(self, moment: float) -> tuple[int, Record | None]:
        """The newest version of an operation completed strictly before ``moment``."""
        index = bisect.bisect_left(self.times, moment) - 1
        return self.newest[index] if index >= 0 else (0, None)


def _check_key(
    key: Any,
    records: list[Record],
    unended: list[Record],
    report: Report,
    ttl: float | None,
    stale_window: float,
    wait_bound: float | None,
    gave_up: bool = False,
) -> Iterator[Violation]:
    """The violations of one key's ``records``, sorted by invocation (so is each kind's
    list); ``unended``: operations begun that never returned (their process was killed),
    which may have taken effect at any moment since they began, or never."""
    kinds: dict[str, list[Record]] = defaultdict(list)
    for record in records:
        kinds[record.kind].append(record)
    writes = sorted((r for r in kinds["write"] + kinds["set"] if r.version is not None), key=lambda r: r.invoked)
    written = _Newest(writes, lambda record: record.version or 0)  # indexed by completion
    unended_writes = [r for r in unended if r.kind in ("write", "set") and r.version is not None]
    begun = sorted(writes + unended_writes, key=lambda r: r.invoked)
    began = [record.invoked for record in begun]
    newest_began = list(_running_max(record.version for record in begun))

    def made_for(record: Record) -> int:
        """The version an invalidation or expiry was made for."""
        if record.version is not None:
            return record.version
        return written.by(record.invoked)[0]

    hard = _Newest((r for kind in HARD for r in kinds[kind] if r.outcome == "ok"), made_for)
    soft = _Newest((r for r in kinds["expire"] if r.outcome == "ok"), made_for)
    window = stale_window * 1e9
    expired = _Expired(kinds["expire"], kinds["load"], [r for kind in HARD for r in kinds[kind]]) if window else None
    # when each read served an older version than the database had began, or an expired value
    served_stale: list[int] = []
    for read in kinds["read"]:
        if read.outcome != "ok":
            if gave_up and read.outcome in GIVING_UP:
                yield Violation("gave up", key, f"the call raised {read.outcome}: {read.detail}", [read])
            continue
        report.reads += 1
        took = (read.completed - read.invoked) / 1e9  # type: ignore[operator]
        report.slowest_call = max(report.slowest_call, took)
        if wait_bound is not None and took > wait_bound:
            yield Violation("slow", key, f"the call took {took:.3f} s, more than {wait_bound} s", [read])
        if read.version is None:
            continue
        if read.version < written.by(read.invoked)[0] or (expired is not None and expired.found_by(read)):
            served_stale.append(read.invoked)
        if read.source is not None and read.source != key:
            yield Violation("wrong key", key, f"the value came from {read.source!r}", [read])
        index = bisect.bisect_left(began, read.completed + 1) - 1  # type: ignore[operator]
        possible = newest_began[index] if index >= 0 else 0
        if read.version > possible:  # a key no write was recorded for has only version 0
            yield Violation("unwritten", key, f"version {read.version}: no write of it had begun", [read])
        required, by = hard.by(read.invoked)
        if read.version < required and by is not None:
            why = f"version {read.version} served after the {by.kind} made for version {required} returned"
            yield Violation("stale", key, why, [by, read])
            continue
        required, by = soft.by(read.invoked - window)
        if read.version < required and by is not None:
            why = f"version {read.version} served {stale_window} s past the expire made for version {required}"
            yield Violation("stale window", key, why, [by, read])
    yield from _check_loads(key, kinds, [r for r in unended if r.kind in BOUNDARIES], report, ttl, served_stale)


def _running_max(versions: Iterable[int | None]) -> Iterator[int]:
    best = 0
    for version in versions:
        best = max(best, version or 0)
        yield best


def _check_loads(
    key: Any,
    kinds: Mapping[str, list[Record]],
    unended: list[Record],
    report: Report,
    ttl: float | None,
    served_stale: list[int],
) -> Iterator[Violation]:
    """The extra loads; ``unended``: invalidations, sets and expiries that never returned
    (they may have ended the entry at any moment since they began)."""
    loads = kinds["load"]
    ended = [r for kind in BOUNDARIES for r in kinds[kind]]
    boundaries = sorted(ended + unended, key=lambda record: record.invoked)
    ends = _Ends(boundaries)
    callers = _Callers(kinds["read"], ends, served_stale, loads)
    report.loads += sum(1 for load in loads if load.outcome == "ok")
    previous: Record | None = None
    epoch_loads = 0
    for load in loads:
        if load.outcome != "ok":
            previous = None  # a failed load leaves the entry unwritten: the next one is due
            continue
        if previous is None or _explained(previous, load, callers, ends, ttl):
            report.epochs += 1
            epoch_loads = 1
        else:
            epoch_loads += 1
            why = "a second load of one entry, with no invalidation, set, expiry, failure or TTL between"
            yield Violation("extra load", key, why, [previous, load])
        report.most_loads_per_epoch = max(report.most_loads_per_epoch, epoch_loads)
        previous = load


class _Ends:
    """The operations that end an entry (invalidations, sets, expiries), by invocation,
    with the latest completion among those begun by each moment."""

    def __init__(self, boundaries: list[Record]) -> None:
        self.began = [record.invoked for record in boundaries]
        never = 1 << 63  # one that never returned may take effect at any later moment
        self.latest_end = list(_running_max(record.completed or never for record in boundaries))

    def last_begun(self, moment: int) -> int | None:
        """When the last one begun by ``moment`` began."""
        index = bisect.bisect_right(self.began, moment) - 1
        return self.began[index] if index >= 0 else None

    def overlap(self, start: int, moment: int) -> bool:
        """Whether one begun by ``moment`` returned at or after ``start``."""
        index = bisect.bisect_right(self.began, moment) - 1
        return index >= 0 and self.latest_end[index] >= start


class _Expired:
    """Under a stale window: whether a read may have found its entry expired and kept
    (``expire``), so served at once, stale, asking for a background refresh. Its version
    is the database's own, so only the times tell: an expiry begun before the read
    ended that may have taken effect after the last load ended (a fresh value) or
    invalidation or set began (no value) before the read began: one that returned after
    it (an expiry takes effect at some moment between its call and its return)."""

    def __init__(self, expiries: list[Record], loads: list[Record], hard: list[Record]) -> None:
        ordered = sorted(expiries, key=lambda record: record.invoked)
        self.began = [record.invoked for record in ordered]
        never = 1 << 63  # one that never returned may take effect at any later moment
        self.latest_end = list(_running_max(record.completed or never for record in ordered))
        ended = [load.completed for load in loads if load.outcome == "ok" and load.completed is not None]
        self.resets = sorted(ended + [record.invoked for record in hard])

    def found_by(self, read: Record) -> bool:
        index = bisect.bisect_right(self.began, read.completed or read.invoked) - 1
        if index < 0:
            return False
        reset = bisect.bisect_left(self.resets, read.invoked) - 1  # the last before the read began
        return reset < 0 or self.resets[reset] < self.latest_end[index]


class _Callers:
    """The call each load ran for, from which it was in flight: a load takes its call's
    lease, which may come before the loader runs, and an invalidation in between voids
    it. A load in a thread of calls ran for the read of its key that encloses it (a
    thread's calls follow one another). A load no call of its thread encloses is a
    background refresh, asked for by a read of the key: it is taken to be in flight from
    the first read served a stale value since the key's last load ended (a refresh may
    wait for a worker, and is asked for once while it is pending), or
    the earliest read still under way when the last operation ending the entry before it
    began, whichever is earlier."""

    def __init__(self, reads: list[Record], ends: _Ends, served_stale: list[int], loads: list[Record]) -> None:
        """``reads`` and ``served_stale`` sorted by invocation; ``loads`` of the key."""
        self.reads: dict[tuple[str, str], list[Record]] = defaultdict(list)
        for read in reads:
            self.reads[(read.process, read.thread)].append(read)
        self.starts = {thread: [read.invoked for read in found] for thread, found in self.reads.items()}
        self.all = reads
        self.all_starts = [read.invoked for read in reads]
        self.longest = max(((read.completed or read.invoked) - read.invoked for read in reads), default=0)
        self.ends = ends
        self.served_stale = served_stale
        # When the load before each one ended: the stale reads since asked for its refresh.
        self.previous_end: dict[int, int] = {}
        last = -1
        for load in sorted(loads, key=lambda record: record.invoked):
            self.previous_end[id(load)] = last
            if load.outcome == "ok" and load.completed is not None:
                last = max(last, load.completed)

    def began(self, load: Record) -> int:
        thread = (load.process, load.thread)
        index = bisect.bisect_right(self.starts.get(thread, []), load.invoked) - 1
        if index >= 0:
            read = self.reads[thread][index]
            if (read.completed or 0) >= (load.completed or 0):
                return read.invoked
        earliest = load.invoked
        index = bisect.bisect_right(self.served_stale, load.invoked) - 1
        if index >= 0:
            # A call served a stale value asked for a refresh. Asked again while it was
            # pending, a refresh is not started twice: the pending one is the first call's
            # since the key's last load ended, which may precede an expiry its loader then
            # ran after (its lease dropped, nothing written: the next refresh is due).
            first = bisect.bisect_left(self.served_stale, self.previous_end.get(id(load), -1))
            earliest = self.served_stale[min(first, index)]
        boundary = self.ends.last_begun(load.invoked)
        if boundary is None:
            return earliest
        index = bisect.bisect_right(self.all_starts, load.invoked) - 1
        while index >= 0 and self.all[index].invoked >= boundary - self.longest:
            if (self.all[index].completed or 0) >= boundary:
                earliest = min(earliest, self.all[index].invoked)
            index -= 1
        return earliest


def _explained(first: Record, second: Record, callers: _Callers, ends: _Ends, ttl: float | None) -> bool:
    """Whether ``second`` may load an entry ``first`` already loaded: the entry lived its
    ``ttl`` out, or an operation that ends it overlaps the span from the earlier of the
    two loads' calls to the later load: a load in flight then was voided."""
    if ttl is not None and second.invoked - first.completed > ttl * 1e9:  # type: ignore[operator]
        return True
    return ends.overlap(min(callers.began(first), callers.began(second)), second.invoked)


__all__ = ["History", "Operation", "Record", "Recorder", "Report", "Violation"]
