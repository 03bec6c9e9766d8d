"""What the streamed loaders of both kinds share (``_astream`` and its blocking twin
``_stream``): a stream's parts, fixed at decoration, and the few decisions a run makes.

Theory of operation. One caller per key holds the entry's lease and runs the generator:
the leader. Each chunk it makes goes to the run's relay (``StreamStore``, one per lease
token) before its own caller gets it, and every other caller, in any process, follows
that relay: it reads the holder's token, then the records from the first on, each as it
comes. So a listener never receives two runs' chunks (a relay is one run's), nor a run
begun after an invalidation it saw return (that run's lease is gone: it reads another
holder, or takes the lease itself). The whole stream is written with the lease's token
once the generator ends, as a value is: an invalidation meanwhile refuses the write.

A listener learns of a leader's end from its relay: ``END``, or ``FAILED`` with why. A
leader that died writes nothing: its lease lapses (no watchdog renews it), and a
listener that reads another holder (or none) after a silence reads the relay once more
and raises ``StreamInterrupted`` if the end is not there (or, as ``on_leader_failure``
says, begins another run). The listeners of a run in one process read its relay
together (``_atap``).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncGenerator, Callable, Coroutine, Generator
from dataclasses import dataclass, field
from typing import Any, Literal

from ._core import world
from ._core.codec import Codec, Serializer
from ._core.config import Settings
from ._core.effects import milliseconds
from ._core.keys import KeyBuilder
from ._core.store import FAILED_HOLD
from ._core.streams import FramedChunks
from ._drivers.observe import Events, RateLimitedLog
from ._drivers.tracing import Tracing

OnLeave = Literal["finish", "stop"]
OnLeaderFailure = Literal["raise", "restart"]

MAX_RESTARTS = 3
"""The most runs a call starts over on (``on_leader_failure="restart"``): a generator that
fails every time is told to its callers, not retried for ever."""
AsyncChunks = AsyncGenerator[Any, None]  # a streamed call's chunks, closed when its caller leaves
Chunks = Generator[Any, None, None]

RELAY_WAIT = 0.25
"""The longest one read of a relay blocks (seconds), under the client's socket timeout: a
listener that hears nothing for this long checks the run's lease is still held."""

_BACKGROUND: set[asyncio.Task[None]] = set()  # runs finished for callers who left, held until done


@dataclass(frozen=True)
class StreamSpec:
    """A streamed loader's parts, fixed when it is decorated."""

    func: Callable[..., Any]  # the generator function
    keys: KeyBuilder
    settings: Settings
    chunks: Serializer  # each chunk's, in the relay and in the entry
    whole: Codec  # the entry's: every record, framed (``FramedChunks``)
    events: Events
    warn: RateLimitedLog
    on_leave: OnLeave  # what a run does when its own caller stops iterating
    on_leader_failure: OnLeaderFailure  # what a listener does when the run it follows stops short
    tracing: Tracing  # the layer's: a ``stampede.stream`` span per call, once a provider is set
    attributes: dict[str, Any]  # its spans' (``entry_attributes``)
    static: bool = False

    @property
    def lease_ms(self) -> int:
        return milliseconds(self.settings.lock_ttl)

    @property
    def running_linger_ms(self) -> int:
        """How long a relay outlives its last record while its run goes on: past the lease,
        so that a relay a listener reads never loses its first records to an expiry."""
        return milliseconds(max(3 * self.settings.lock_ttl, 30.0))

    @property
    def ended_linger_ms(self) -> int:
        """How long a relay is kept once its run ended, for the listeners still reading it."""
        return milliseconds(self.settings.lock_ttl)


class FirstChunk:
    """A streamed call's wait for its first chunk, reported as the ``first_chunk`` measure
    (``_core.observer``): begun with the call's iteration, ended once, by the way its first
    chunk came (``way``: led, joined, replayed, uncollapsed), or by none (empty, error)."""

    __slots__ = ("_began", "_events", "_open", "way")

    def __init__(self, events: Events) -> None:
        self._events = events
        self._began = world.monotonic()
        self._open = True
        self.way = "led"
        events.began("first_chunk")

    def got(self) -> None:
        """A chunk reached the caller: the first ends the wait."""
        if self._open:
            self.ended(self.way)

    def ended(self, outcome: str) -> None:
        if self._open:
            self._open = False
            self._events.ended("first_chunk", outcome, world.monotonic() - self._began)


def whole_codec(codec: Codec) -> Codec:
    """The codec of a whole stream: ``codec``'s settings, its payload the framed records."""
    return codec.with_serializer(FramedChunks())


@dataclass(eq=False)
class Listening:
    """What one caller has received of a stream, and how the run it followed ended."""

    received: int = 0  # chunks given to the caller
    ended: Literal["", "end", "failed", "lost"] = ""
    why: str = ""  # a failed run's reason, from its relay


@dataclass(eq=False)
class Kept:
    """The records a leader keeps for the entry, until the stream outgrows the value limit."""

    limit: int
    records: list[bytes] | None = field(default_factory=list)  # None: too large, not kept
    size: int = 0

    def add(self, record: bytes) -> bool:
        """Keep ``record``, or say False the first time the stream grows past ``limit``."""
        if self.records is None:
            return True
        self.size += len(record) + 4
        if self.size > self.limit:
            self.records = None
            return False
        self.records.append(record)
        return True


def is_run(holder: str | None) -> bool:
    """Whether a lock's holder is a load's token, whose relay a listener can follow (not
    a failed load's hold, nor nothing)."""
    return bool(holder) and holder != FAILED_HOLD


def in_background(coroutine: Coroutine[Any, Any, None]) -> None:
    """Run ``coroutine`` on this loop to its end, for a caller who left a run it leads."""
    task = asyncio.get_running_loop().create_task(coroutine)
    _BACKGROUND.add(task)
    task.add_done_callback(_BACKGROUND.discard)


def in_background_thread(finish: Callable[..., None], *args: Any) -> None:
    """Run ``finish(*args)`` in a thread of its own to its end (the blocking twin)."""
    threading.Thread(target=finish, args=args, name="stampede-stream", daemon=True).start()
