# Generated from _astream.py by .ci/unasync.py: do not edit.
# Edit the asyncio source, then run `python .ci/unasync.py`.
"""The streamed loaders applications call: what ``@cached_stream`` turns a generator
function into. How a run is led and followed, and why no listener can receive two runs'
chunks, is ``_streaming``'s docstring. This module performs it.

A call returns an iterator at once (a key that cannot be built is refused then). The
store is first asked when the caller begins to iterate.
"""

from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import Callable, Iterator
from contextlib import closing
from typing import Any, Generic, TypeVar, cast

from ._core import world
from ._core.codec import NOT_A_VALUE, identity
from ._core.effects import milliseconds
from ._core.keys import EntryKeys
from ._core.store import TRACE_MARK, LockState, Roles, Store, StreamStore, Written, roles_of
from ._core.streams import CHUNK, END, STREAM_RESTARTED, chunk_of, chunk_record, failed_record
from ._drivers.tracing import StreamTrace, stream_trace
from ._errors import BackendUnavailable, ConfigError, SerializationError, StreamInterrupted, WaitTimeout
from ._streaming import (
    MAX_RESTARTS,
    RELAY_WAIT,
    Chunks,
    FirstChunk,
    Kept,
    Listening,
    StreamSpec,
    in_background_thread,
    is_run,
)
from ._tap import Taps

C = TypeVar("C")


class CachedStream(Generic[C]):
    """A generator function whose concurrent calls for one key, in any process, share one
    run: ``for chunk in stream(*args)``. One caller runs the generator, every other
    receives its chunks as they are made, and the whole stream is kept (same chunks, same
    boundaries) for later callers. ``invalidate(*args)`` drops the entry: a run in flight
    for it is then not kept."""

    def __init__(self, spec: StreamSpec, store_of: Callable[[], Store], watchdog: Any) -> None:
        functools.update_wrapper(self, spec.func)
        self._spec = spec
        self._store_of = store_of
        self._watchdog = watchdog  # renews a leader's lease while its run goes on
        self._taps = Taps()  # the runs this process's callers follow
        self.settings = spec.settings

    def __get__(self, instance: object, owner: type | None = None) -> Any:
        """Looked up on an instance, a stream decorated as a method binds it (``self`` is
        not part of the key). One over ``@staticmethod`` is never bound."""
        return self if instance is None or self._spec.static else functools.partial(self, instance)

    def __repr__(self) -> str:
        func = self._spec.func
        return f"<stampede.{type(self).__name__} {func.__module__}.{func.__qualname__}>"

    def key(self, *args: Any, **kwargs: Any) -> str:
        """The key of the entry these arguments stream (for inspection and tooling)."""
        return self._spec.keys.value_key(args, kwargs)

    def __call__(self, *args: Any, **kwargs: Any) -> Iterator[C]:
        return self._stream(self._spec.keys.keys(args, kwargs), args, kwargs)

    def invalidate(self, *args: Any, **kwargs: Any) -> None:
        """Drop the entry these arguments stream. A run in flight for it is not kept, and
        a call begun after this returns never receives that run's chunks."""
        self._store().invalidate(self._spec.keys.keys(args, kwargs))

    def _store(self) -> Store:
        store = self._store_of()
        if Roles.STREAMS not in roles_of(store):
            raise ConfigError(f"{type(store).__name__} cannot relay a stream (it declares no Roles.STREAMS)")
        return store

    def _stream(self, keys: EntryKeys, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Chunks:
        spec = self._spec
        first = FirstChunk(spec.events)
        trace = stream_trace(spec.tracing, spec.attributes)
        received = 0
        try:
            with closing(self._chunks(keys, args, kwargs, first, trace)) as chunks:
                for chunk in chunks:
                    first.got()
                    received += chunk is not STREAM_RESTARTED
                    yield chunk
        except BaseException as error:
            first.ended("error")
            if trace is not None:
                trace.ended(first.way, received, error)
            raise
        first.ended("empty")
        if trace is not None:
            trace.ended(first.way, received, None)

    def _chunks(
        self,
        keys: EntryKeys,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        first: FirstChunk,
        trace: StreamTrace | None,
    ) -> Chunks:
        spec = self._spec
        store = self._store()
        deadline = world.monotonic() + spec.settings.wait_timeout
        stale, pause, restarts, failed = b"", 0.002, 0, ""
        while True:
            # The mark tells a store to name this run's token to a caller it refuses (as a
            # traced load's): a listener learns whose relay to follow with its refusal.
            token = world.token(16) + TRACE_MARK if trace is None else trace.token(world.token(16))
            try:
                raw = store.get(keys.value) if not stale else None
                reply = None if raw is not None else store.acquire(keys, token, spec.lease_ms, True, stale)
            except BackendUnavailable:
                if spec.settings.on_backend_error == "raise":
                    raise
                spec.warn.warning("the store failed: %s streams uncollapsed, nothing kept", keys.value, key=keys.value)
                first.way = "uncollapsed"
                with closing(spec.func(*args, **kwargs)) as produced:
                    for chunk in produced:
                        yield chunk
                return
            if reply is not None and reply.state is LockState.VALUE:
                raw = reply.raw
            if raw is not None:
                records = spec.whole.decode_hit(raw)
                if records is NOT_A_VALUE:  # corrupt, or another kind of value: a miss, loaded over
                    spec.events.incr("corrupt_values")
                    stale = identity(raw)
                    continue
                spec.events.incr("streams_replayed")
                first.way = "replayed"
                for record in records:
                    yield chunk_of(record, spec.chunks)
                return
            assert reply is not None
            if reply.state is LockState.LOCKED:
                first.way = "led"
                with closing(self._lead(store, keys, token, args, kwargs)) as led:
                    for chunk in led:
                        yield chunk
                return
            holder = reply.holder or store.holder(keys)
            if holder is not None and is_run(holder) and holder != failed:
                listening = Listening()
                first.way = "joined"
                if trace is not None:
                    trace.follows(holder)
                with closing(self._follow(store, keys, holder, listening)) as followed:
                    for chunk in followed:
                        yield chunk
                if listening.ended == "end":
                    return
                if spec.on_leader_failure == "raise" or restarts == MAX_RESTARTS:
                    raise _interrupted(keys, listening)
                # A new run: this caller leads it, or follows another's (not the one that
                # stopped, whose lease may be given back a moment after its relay ended).
                restarts, failed = restarts + 1, holder
                spec.events.incr("streams_restarted")
                if listening.received:
                    yield STREAM_RESTARTED
                deadline = world.monotonic() + spec.settings.wait_timeout
                continue
            if world.monotonic() >= deadline:
                raise WaitTimeout(
                    f"waited {spec.settings.wait_timeout}s for the stream of {keys.value!r}", key=keys.value
                )
            time.sleep(pause)
            pause = min(pause * 2, spec.settings.recheck_interval)

    def _lead(self, store: Store, keys: EntryKeys, token: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Chunks:
        spec = self._spec
        spec.events.incr("streams_led")
        run = _Run(spec, store, keys, token, self._watchdog.watch(store, keys, token, spec.lease_ms))
        produced = spec.func(*args, **kwargs)
        try:
            for chunk in produced:
                run.add(chunk)
                yield chunk
        except GeneratorExit:  # the caller stopped iterating: its listeners have not
            if spec.on_leave == "stop":
                run.fail(StreamInterrupted("the leader's caller stopped iterating", key=keys.value))
                produced.close()
                raise
            in_background_thread(run.drain, produced)
            raise
        except BaseException as error:
            run.fail(error)
            with contextlib.suppress(Exception):  # a chunk the store failed to relay: stop the generator
                produced.aclose()
            raise
        run.finish()

    def _follow(self, store: Store, keys: EntryKeys, holder: str, listening: Listening) -> Chunks:
        """The chunks of the run that holds the lease as ``holder``, from its first, as its
        relay gets them, until its end (``listening`` says which). This process's
        listeners of the run read its relay together (``Tap``)."""
        spec = self._spec
        spec.events.incr("streams_joined")
        tap = self._taps.join(store, cast(StreamStore, store), keys, holder)
        try:
            after, heard = 0, world.monotonic()
            while True:
                records = tap.after(after, RELAY_WAIT)
                if not records:
                    if tap.lost:  # the run ended short, or its leader is gone
                        listening.ended = "lost"
                        return
                    if world.monotonic() - heard > spec.settings.wait_timeout:
                        waited = spec.settings.wait_timeout
                        raise WaitTimeout(f"the stream of {keys.value!r} sent nothing for {waited}s", key=keys.value)
                    continue
                heard = world.monotonic()
                for record in records:
                    after += 1
                    kind = record[:1]
                    if kind == CHUNK:
                        listening.received += 1
                        yield chunk_of(record[1:], spec.chunks)
                    elif kind == END:
                        listening.ended = "end"
                        return
                    else:
                        listening.ended, listening.why = "failed", record[1:].decode(errors="replace")
                        return
        finally:
            self._taps.leave(tap, keys, holder)


class _Run:
    """One run a leader leads: its relay, the records it keeps, its lease."""

    def __init__(self, spec: StreamSpec, store: Store, keys: EntryKeys, token: str, watch: Any) -> None:
        self._spec = spec
        self._store = store
        self._relay = cast(StreamStore, store)
        self._keys = keys
        self._token = token
        self._watch = watch  # the lease's renewal, stopped when the run ends
        self._kept = Kept(spec.settings.max_value_bytes)
        self._places = 0  # records relayed (or lost to a failed relay)
        self._relaying = True
        self._began = world.monotonic()
        self._loaded_at = world.wall()

    def add(self, chunk: Any) -> None:
        spec = self._spec
        try:
            record = chunk_record(chunk, spec.chunks)
        except Exception as error:
            raise SerializationError(
                f"cannot relay a chunk of {self._keys.value!r}: {type(chunk).__qualname__} is not bytes and the "
                f"serializer cannot write it ({error})",
                key=self._keys.value,
            ) from error
        self._send([record], spec.running_linger_ms)
        if not self._kept.add(record[1:]):
            spec.events.incr("streams_not_kept")
            spec.warn.warning(
                "the stream of %s grew past max_value_bytes (%d): relayed to its listeners, not kept",
                self._keys.value,
                spec.settings.max_value_bytes,
                key=self._keys.value,
            )
        spec.events.incr("stream_chunks")
        spec.events.incr("stream_bytes", len(record) - 2)

    def drain(self, produced: Any) -> None:
        """The rest of the run, for a caller who left it: its listeners still get every
        chunk, and the stream is kept."""
        try:
            for chunk in produced:
                self.add(chunk)
        except BaseException as error:
            self.fail(error)
            if not isinstance(error, Exception):
                raise
            return
        self.finish()

    def finish(self) -> None:
        """The generator ended: tell the listeners, then keep the stream, if the lease is
        still the run's and the stream within max_value_bytes."""
        spec, keys = self._spec, self._keys
        self._watch.stop()
        try:
            self._send([END], spec.ended_linger_ms)
            records = self._kept.records
            if records is None:
                self._store.release(keys, self._token)
                return
            took = world.monotonic() - self._began
            envelope = spec.whole.encode(records, self._loaded_at, took, key=keys.value)
            ttl, jitter = spec.settings.ttl, spec.settings.jitter
            ttl_ms = milliseconds(ttl * world.uniform(1.0 - jitter, 1.0 + jitter) if jitter else ttl)
            written = self._store.write_release(keys, self._token, envelope, ttl_ms, False)
        except BackendUnavailable as error:
            spec.warn.warning("the stream of %s was not kept: %s", keys.value, error, key=keys.value)
            return
        if written is not Written.YES:
            spec.events.incr("stale_writes_prevented")

    def fail(self, error: BaseException) -> None:
        """The run stopped: tell the listeners why, keep nothing, give the lease back."""
        self._watch.stop()
        self._spec.events.incr("streams_interrupted")
        try:
            self._send([failed_record(error)], self._spec.ended_linger_ms)
            self._store.release(self._keys, self._token)
        except BackendUnavailable:
            pass  # the lease lapses by itself, and its listeners learn it then

    def _send(self, records: list[bytes], linger_ms: int) -> None:
        first, self._places = self._places, self._places + len(records)
        if not self._relaying:
            return
        try:
            self._relay.relay_add(self._keys, self._token, records, first, linger_ms)
        except BackendUnavailable as error:
            # The caller still gets the stream. Its listeners learn the run is lost when
            # its lease goes (the relay stays short of its end).
            self._relaying = False
            self._spec.warn.warning(
                "the stream of %s stopped relaying: %s", self._keys.value, error, key=self._keys.value
            )


def _interrupted(keys: EntryKeys, listening: Listening) -> StreamInterrupted:
    why = listening.why or "its leader stopped (its lease lapsed) before the end"
    return StreamInterrupted(
        f"the stream of {keys.value!r} stopped after {listening.received} chunks: {why}",
        key=keys.value,
        received=listening.received,
    )
