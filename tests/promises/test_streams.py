"""Streamed loads (``cached_stream``), over real servers: one run per key across threads,
tasks and processes, every caller receiving every chunk as it is made; the whole stream
kept with its boundaries; a leader that raises, leaves, is cancelled or dies; an
invalidation while a run streams; a stream past max_value_bytes; the stores that cannot
relay a stream, refused at decoration.

Liveness is proven without a clock: the generator makes its second chunk only once every
caller has received its first, so a test that passes saw every chunk relayed before the
stream ended.
"""

from __future__ import annotations

import asyncio
import functools
import random
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis

from stampede import STREAM_RESTARTED, ConfigError, Stampede, StreamInterrupted
from stampede._core.keys import EntryKeys
from stampede.backends import Roles, roles_of

from ..scenarios import lead_join_replay, until
from .test_processes import Workers

STREAM_WORKER = str(__import__("pathlib").Path(__file__).resolve().parent.parent / "stream_worker.py")
FAMILIES = ["redis", "memory", "cluster", "sentinel"]


@pytest.fixture(params=FAMILIES)
def stream_layer(
    request: pytest.FixtureRequest, make_layer: Callable[..., Stampede]
) -> Iterator[Callable[..., Stampede]]:
    """Layers of one family that relays streams: one Redis server, the embedded store, a
    Redis Cluster, Sentinel's master (the last two in CI's extended step)."""
    made: list[Stampede] = []
    if request.param in ("cluster", "sentinel"):
        make_family = request.getfixturevalue(f"make_{request.param}_layer")
    elif request.param == "redis":
        make_family = make_layer
    else:

        def make_family(**options: Any) -> Stampede:
            options.setdefault("namespace", "test")
            layer = Stampede(**options)
            made.append(layer)
            return layer

    yield make_family
    for layer in made:
        layer.close()


class Gate:
    """Holds a generator after its first chunk until ``expected`` callers received it."""

    def __init__(self, expected: int) -> None:
        self.expected = expected
        self.received = 0
        self._lock = threading.Lock()
        self.all_in = threading.Event()

    def got_first(self) -> None:
        with self._lock:
            self.received += 1
            if self.received >= self.expected:
                self.all_in.set()

    def wait(self) -> None:
        assert self.all_in.wait(30), f"only {self.received} of {self.expected} callers got the first chunk"


def in_threads(*targets: Callable[[], None], timeout: float = 60) -> None:
    """Run each of ``targets`` in a thread of its own, all at once, and wait for them."""
    threads = [threading.Thread(target=target) for target in targets]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout)
        assert not thread.is_alive(), "a caller never finished"


def lease_left(layer: Stampede, stream: Any, *args: Any) -> str | None:
    return layer.store().holder(EntryKeys.for_value(stream.key(*args)))


def test_concurrent_callers_share_one_run_and_receive_each_chunk_as_it_is_made(
    stream_layer: Callable[..., Stampede],
) -> None:
    layer = stream_layer()
    callers, runs = 12, []
    gate = Gate(callers)

    @layer.cached_stream("report:{n}")
    def report(n: int) -> Iterator[str]:
        runs.append(n)
        yield "page 0"
        gate.wait()  # every caller, in every thread, has page 0 before page 1 exists
        for page in range(1, 5):
            yield f"page {page}"

    received: dict[int, list[str]] = {}

    def caller(slot: int) -> None:
        pages = []
        for page in report(7):
            pages.append(page)
            if len(pages) == 1:
                gate.got_first()
        received[slot] = pages

    in_threads(*(functools.partial(caller, slot) for slot in range(callers)))
    whole = [f"page {page}" for page in range(5)]
    assert runs == [7]
    assert received == dict.fromkeys(range(callers), whole)
    assert list(report(7)) == whole and runs == [7]  # kept: replayed with its boundaries, not run again
    assert lease_left(layer, report, 7) is None
    stats = layer.stats()
    assert (stats["streams_led"], stats["streams_joined"] + stats["streams_led"]) == (1, callers)
    assert stats["stream_chunks"] == 5 and stats["streams_replayed"] >= 1


def test_tasks_share_one_run_of_an_async_generator(stream_layer: Callable[..., Stampede]) -> None:
    layer = stream_layer()
    runs: list[str] = []

    async def main() -> list[list[str]]:
        tasks, first = 10, asyncio.Event()
        got_first = 0

        @layer.cached_stream("tokens:{prompt}")
        async def complete(prompt: str) -> Any:
            runs.append(prompt)
            for index, word in enumerate(prompt.split()):
                yield word
                if index == 0:
                    await asyncio.wait_for(first.wait(), 30)

        async def caller() -> list[str]:
            nonlocal got_first
            words = []
            async for word in complete("the quick brown fox"):
                words.append(word)
                if len(words) == 1:
                    got_first += 1
                    if got_first == tasks:
                        first.set()
            return words

        results = await asyncio.gather(*(caller() for _ in range(tasks)))
        results.append([word async for word in complete("the quick brown fox")])
        return results

    results = asyncio.run(main())
    assert runs == ["the quick brown fox"]
    assert all(words == ["the", "quick", "brown", "fox"] for words in results)


def test_chunks_of_bytes_and_of_values_keep_their_kind_and_boundaries(stream_layer: Callable[..., Stampede]) -> None:
    layer = stream_layer()
    runs: list[int] = []
    chunks: list[Any] = [b"\x00\xffraw", {"event": "delta", "text": "hi"}, "", b"", [1, 2], None, 3.5]

    @layer.cached_stream("events:{n}")
    def events(n: int) -> Iterator[Any]:
        runs.append(n)
        yield from chunks

    @layer.cached_stream("empty:{n}")
    def empty(n: int) -> Iterator[Any]:
        runs.append(-n)
        yield from ()

    assert list(events(1)) == chunks
    assert list(events(1)) == chunks  # replayed: bytes stay bytes, each chunk its own
    assert list(empty(2)) == [] and list(empty(2)) == []
    assert runs == [1, -2]


def test_a_leader_that_raises_tells_every_listener_at_once_and_keeps_nothing(
    stream_layer: Callable[..., Stampede],
) -> None:
    layer = stream_layer()
    callers, runs = 6, []
    gate = Gate(callers)

    @layer.cached_stream("failing:{n}")
    def failing(n: int) -> Iterator[str]:
        runs.append(n)
        yield "first"
        if len(runs) == 1:
            gate.wait()
            raise ValueError("the model went away")
        yield "second"

    outcomes: dict[int, Any] = {}

    def caller(slot: int) -> None:
        got: list[str] = []
        try:
            for chunk in failing(1):
                got.append(chunk)
                if len(got) == 1:
                    gate.got_first()
        except (StreamInterrupted, ValueError) as error:
            outcomes[slot] = (got, type(error).__name__, str(error), getattr(error, "received", None))
        else:
            outcomes[slot] = (got, None, "", None)

    in_threads(*(functools.partial(caller, slot) for slot in range(callers)))
    kinds = sorted(outcome[1] for outcome in outcomes.values())
    assert kinds == ["StreamInterrupted"] * (callers - 1) + ["ValueError"]  # the leader's own caller: its error
    for got, kind, message, received in outcomes.values():
        assert got == ["first"]
        if kind == "StreamInterrupted":
            assert received == 1 and "ValueError: the model went away" in message
    assert lease_left(layer, failing, 1) is None
    assert list(failing(1)) == ["first", "second"] and runs == [1, 1]  # nothing was kept: run again
    assert layer.stats()["streams_interrupted"] == 1


def test_with_restart_a_listener_takes_over_a_failed_run_and_says_so_before_the_new_one(
    stream_layer: Callable[..., Stampede],
) -> None:
    layer = stream_layer()
    callers, runs = 5, []
    gate = Gate(callers)

    @layer.cached_stream("restarted:{n}", on_leader_failure="restart")
    def flaky(n: int) -> Iterator[str]:
        runs.append(n)
        run = len(runs)
        yield f"run {run} first"
        if run == 1:
            gate.wait()
            raise ValueError("the model went away")
        yield f"run {run} second"

    outcomes: dict[int, Any] = {}

    def caller(slot: int) -> None:
        got: list[Any] = []
        try:
            for chunk in flaky(1):
                got.append(chunk)
                if len(got) == 1:
                    gate.got_first()
        except ValueError as error:
            got.append(str(error))
        outcomes[slot] = got

    in_threads(*(functools.partial(caller, slot) for slot in range(callers)))
    restarted = ["run 1 first", STREAM_RESTARTED, "run 2 first", "run 2 second"]
    assert sorted(map(str, outcomes.values())) == sorted(
        [str(["run 1 first", "the model went away"])] + [str(restarted)] * (callers - 1)
    )
    assert runs == [1, 1]  # one listener took over: the rest followed its run
    assert list(flaky(1)) == ["run 2 first", "run 2 second"] and runs == [1, 1]
    assert layer.stats()["streams_restarted"] == callers - 1


def test_a_leaders_caller_that_leaves_lets_the_run_finish_for_its_listeners(
    stream_layer: Callable[..., Stampede],
) -> None:
    layer = stream_layer()
    runs: list[int] = []
    listening, leader_left = threading.Event(), threading.Event()

    @layer.cached_stream("left:{n}")
    def story(n: int) -> Iterator[str]:
        runs.append(n)
        yield "once"
        assert listening.wait(30) and leader_left.wait(30)
        yield "upon"
        yield "a time"

    leader = story(1)
    assert next(leader) == "once"
    received: list[str] = []

    def listener() -> None:
        for chunk in story(1):
            received.append(chunk)
            listening.set()

    thread = threading.Thread(target=listener)
    thread.start()
    assert listening.wait(30)
    leader.close()  # the leader's caller stops iterating: the run goes on for its listener
    leader_left.set()
    thread.join(60)
    assert received == ["once", "upon", "a time"]
    deadline = time.monotonic() + 30
    while lease_left(layer, story, 1) is not None:  # the rest runs in a thread of its own
        assert time.monotonic() < deadline, "the run never ended"
        time.sleep(0.01)
    assert list(story(1)) == ["once", "upon", "a time"] and runs == [1]  # and it was kept


def test_on_leave_stop_stops_the_run_and_its_listeners_learn_it(stream_layer: Callable[..., Stampede]) -> None:
    layer = stream_layer()
    listening = threading.Event()

    @layer.cached_stream("stopped:{n}", on_leave="stop")
    def story(n: int) -> Iterator[str]:
        yield "once"
        assert listening.wait(30)
        yield "upon"

    leader = story(1)
    assert next(leader) == "once"
    outcome: list[Any] = []

    def listener() -> None:
        got = []
        try:
            for chunk in story(1):
                got.append(chunk)
                listening.set()
        except StreamInterrupted as error:
            outcome.append((got, error.received, str(error)))

    thread = threading.Thread(target=listener)
    thread.start()
    assert listening.wait(30)
    leader.close()
    thread.join(60)
    assert outcome and outcome[0][:2] == (["once"], 1) and "stopped iterating" in outcome[0][2]
    assert lease_left(layer, story, 1) is None


def test_a_cancelled_async_leader_tells_its_listeners_and_gives_its_lease_back(
    stream_layer: Callable[..., Stampede],
) -> None:
    layer = stream_layer()

    async def main() -> tuple[Any, Any]:
        first, forever = asyncio.Event(), asyncio.Event()

        @layer.cached_stream("cancelled:{n}")
        async def story(n: int) -> Any:
            yield "once"
            await forever.wait()
            yield "never"

        async def lead() -> None:
            async for _ in story(1):
                first.set()

        async def listen() -> Any:
            got = []
            try:
                async for chunk in story(1):
                    got.append(chunk)
                    if len(got) == 1:
                        leading.cancel()
            except StreamInterrupted as error:
                return got, error.received
            return got, None

        leading = asyncio.ensure_future(lead())
        await asyncio.wait_for(first.wait(), 30)
        heard = await asyncio.wait_for(listen(), 30)
        with pytest.raises(asyncio.CancelledError):
            await leading
        return heard, await layer.loop_store().holder(EntryKeys.for_value(story.key(1)))

    heard, holder = asyncio.run(main())
    assert heard == (["once"], 1) and holder is None


def test_an_invalidated_run_is_not_kept_and_later_callers_never_receive_it(
    stream_layer: Callable[..., Stampede],
) -> None:
    layer = stream_layer()
    runs: list[int] = []
    first_heard, finish_first = threading.Event(), threading.Event()

    @layer.cached_stream("page:{n}")
    def page(n: int) -> Iterator[str]:
        runs.append(n)
        run = len(runs)
        yield f"run {run} part 0"
        if run == 1:
            assert finish_first.wait(30)
        yield f"run {run} part 1"

    old: list[str] = []

    def early_listener() -> None:
        for chunk in page(1):
            old.append(chunk)
            first_heard.set()

    leader = page(1)
    assert next(leader) == "run 1 part 0"
    thread = threading.Thread(target=early_listener)
    thread.start()
    assert first_heard.wait(30)
    page.invalidate(1)  # returns: every call from now on must see a run begun after it
    assert list(page(1)) == ["run 2 part 0", "run 2 part 1"]
    finish_first.set()
    assert list(leader) == ["run 1 part 1"]
    thread.join(30)
    assert old == ["run 1 part 0", "run 1 part 1"]  # began before the invalidation: its run, whole
    assert list(page(1)) == ["run 2 part 0", "run 2 part 1"] and len(runs) == 2  # run 1's write was refused
    assert layer.stats()["stale_writes_prevented"] == 1


def test_a_stream_past_max_value_bytes_is_relayed_whole_but_not_kept(stream_layer: Callable[..., Stampede]) -> None:
    layer = stream_layer()
    runs: list[int] = []
    gate = Gate(2)

    @layer.cached_stream("export:{n}", max_value_bytes=1000)
    def export(n: int) -> Iterator[bytes]:
        runs.append(n)
        yield b"x" * 100
        gate.wait()
        for _ in range(20):
            yield b"y" * 100

    received: list[list[bytes]] = []

    def caller() -> None:
        chunks = []
        for chunk in export(1):
            chunks.append(chunk)
            if len(chunks) == 1:
                gate.got_first()
        received.append(chunks)

    in_threads(caller, caller)
    whole = [b"x" * 100] + [b"y" * 100] * 20
    assert received == [whole, whole] and runs == [1]
    assert lease_left(layer, export, 1) is None
    assert list(export(1)) == whole and runs == [1, 1]  # not kept: streamed again
    assert layer.stats()["streams_not_kept"] == 2


def test_a_corrupt_entry_is_a_miss_streamed_over(
    make_layer: Callable[..., Stampede], redis_client: redis.Redis
) -> None:
    layer = make_layer()
    runs: list[int] = []

    @layer.cached_stream("corrupt:{n}")
    def story(n: int) -> Iterator[str]:
        runs.append(n)
        yield "fine"

    redis_client.set(story.key(1), b"\x00not an envelope")
    assert list(story(1)) == ["fine"] and list(story(1)) == ["fine"] and runs == [1]
    assert layer.stats()["corrupt_values"] == 1


def test_callers_across_processes_share_one_run(redis_url: str, redis_client: redis.Redis) -> None:
    workers = Workers()
    try:
        processes = [
            workers.start(redis_url, "--threads", "4", "--chunks", "20", script=STREAM_WORKER) for _ in range(4)
        ]
        for process in processes:
            workers.expect(process, "ready")
        workers.go(processes)
        results = [workers.result(process, timeout=60) for process in processes]
    finally:
        workers.stop_all()
    assert redis_client.get("runs:prompt") == b"1"
    whole = [f"1:{index}" for index in range(20)]
    assert all(received == whole for result in results for received in result["received"])
    led = sum(result["stats"]["streams_led"] for result in results)
    joined = sum(result["stats"]["streams_joined"] for result in results)
    replayed = sum(result["stats"]["streams_replayed"] for result in results)
    assert led == 1 and led + joined + replayed == 16


def test_a_leader_whose_process_dies_is_noticed_within_its_lease(redis_url: str, redis_client: redis.Redis) -> None:
    """Its listeners raise StreamInterrupted once its lease lapses (nothing renews it), and
    the next caller runs the stream again."""
    workers = Workers()
    layer = Stampede.from_url(redis_url, namespace="streams", lock_ttl=1.0)
    try:
        process = workers.start(redis_url, "--threads", "1", "--hang", "--lock-ttl", "1", script=STREAM_WORKER)
        workers.expect(process, "ready")
        workers.go([process])
        workers.expect(process, "streaming")

        @layer.cached_stream("completion:{prompt}")
        def complete(prompt: str) -> Iterator[str]:
            run = redis_client.incr(f"runs:{prompt}")
            yield f"{run}:0"

        got: list[str] = []
        listener = complete("prompt")
        got.append(next(listener))  # the dead-to-be leader's first chunk, relayed
        process.kill()
        process.wait(10)
        with pytest.raises(StreamInterrupted) as raised:
            got.extend(listener)
        assert got == ["1:0"] and raised.value.received == 1
        assert list(complete("prompt")) == ["2:0"]  # the lease lapsed: a new run
    finally:
        workers.stop_all()
        layer.close()


def test_histories_of_streams_and_invalidations_hold_the_promise(stream_layer: Callable[..., Stampede]) -> None:
    """Readers and invalidators at random: every reader receives one run whole (never two
    runs mixed, never part of one), and never a run begun before an invalidation that
    returned before the reader began."""
    layer = stream_layer(lock_ttl=5.0)
    clock = threading.Lock()
    began: dict[int, float] = {}  # run -> when its generator began
    invalidations: list[tuple[float, float]] = []  # (invoked, returned)
    history: list[tuple[float, list[str]]] = []  # (reader began, chunks)

    @layer.cached_stream("history:{n}")
    def story(n: int) -> Iterator[str]:
        with clock:
            run = len(began) + 1
            began[run] = time.monotonic()
        for index in range(4):
            yield f"{run}:{index}"
            time.sleep(random.random() * 0.002)

    def reader() -> None:
        for _ in range(25):
            start = time.monotonic()
            chunks = list(story(1))
            with clock:
                history.append((start, chunks))

    def invalidator() -> None:
        for _ in range(15):
            time.sleep(random.random() * 0.01)
            invoked = time.monotonic()
            story.invalidate(1)
            with clock:
                invalidations.append((invoked, time.monotonic()))

    in_threads(*[reader] * 6, invalidator, timeout=120)
    assert len(history) == 150
    for start, chunks in history:
        runs = {chunk.split(":")[0] for chunk in chunks}
        assert len(runs) == 1, f"a reader received two runs mixed: {chunks}"
        run = int(runs.pop())
        assert chunks == [f"{run}:{index}" for index in range(4)], f"a reader received part of a run: {chunks}"
        for invoked, returned in invalidations:
            assert not (returned < start and began[run] < invoked), (
                f"a reader that began after an invalidation returned received run {run}, begun before it"
            )
    assert lease_left(layer, story, 1) is None


@pytest.mark.extended
@pytest.mark.parametrize("family", ["postgres", "redlock", "zookeeper"])
def test_a_layer_that_cannot_relay_a_stream_refuses_it_at_decoration(
    family: str, request: pytest.FixtureRequest, make_layer: Callable[..., Stampede]
) -> None:
    if family == "redlock":
        layer = make_layer(redlock=request.getfixturevalue("make_redlock")())
    else:
        layer = request.getfixturevalue(f"make_{family}_layer")()
    with pytest.raises(ConfigError, match="cached_stream"):

        @layer.cached_stream("never:{n}")
        def story(n: int) -> Iterator[str]:
            yield "x"


def test_decoration_refuses_what_is_no_generator_and_points_generators_to_it(
    make_layer: Callable[..., Stampede],
) -> None:
    layer = make_layer()
    with pytest.raises(ConfigError, match="generator function"):

        @layer.cached_stream("plain:{n}")
        def plain(n: int) -> list[str]:
            return ["x"]

    with pytest.raises(ConfigError, match="cached_stream"):

        @layer.cached_loader("gen:{n}")
        def gen(n: int) -> Iterator[str]:
            yield "x"

    with pytest.raises(ConfigError, match="on_leave"):
        layer.cached_stream("x:{n}", on_leave="later")  # type: ignore[arg-type]
    with pytest.raises(ConfigError):
        layer.cached_stream("x:{n}", stale_while_revalidate=1.0)  # type: ignore[call-arg]
    assert Roles.STREAMS in roles_of(layer.store())


def test_with_the_store_down_a_stream_runs_uncollapsed_or_raises_as_asked(make_layer: Callable[..., Stampede]) -> None:
    from stampede.testing import free_port

    down = f"redis://127.0.0.1:{free_port()}/0"
    layer = make_layer(url_=down, on_backend_error="load", breaker_threshold=0)
    strict = make_layer(url_=down, on_backend_error="raise", breaker_threshold=0)
    for each, expect in ((layer, ["a", "b"]), (strict, None)):

        @each.cached_stream("down:{n}")
        def story(n: int) -> Iterator[str]:
            yield from ["a", "b"]

        if expect is None:
            with pytest.raises(Exception, match="(?i)connect|unavailable|refused"):
                list(story(1))
        else:
            assert list(story(1)) == expect


def test_each_callers_wait_for_its_first_chunk_is_reported_by_how_it_came(make_layer: Callable[..., Stampede]) -> None:
    reports: list[tuple[str, str]] = []
    begun: list[str] = []

    class Observer:
        def count(self, namespace: str, event: str, n: int) -> None:
            pass

        def began(self, namespace: str, measure: str) -> None:
            begun.append(measure)

        def ended(self, namespace: str, measure: str, outcome: str, seconds: float) -> None:
            reports.append((measure, outcome))

    layer = make_layer()
    layer.observe(Observer())
    lead_join_replay(layer, "observed:{n}")

    @layer.cached_stream("nothing:{n}")
    def nothing(n: int) -> Iterator[str]:
        yield from ()

    assert list(nothing(1)) == []
    firsts = [outcome for measure, outcome in reports if measure == "first_chunk"]
    assert sorted(firsts) == ["empty", "joined", "led", "replayed"] and begun.count("first_chunk") == 4


def test_a_listener_cancelled_while_it_reads_for_its_process_costs_the_others_nothing(
    stream_layer: Callable[..., Stampede],
) -> None:
    """A process's listeners share one reader of the run's relay (``_atap``): cancelling
    listeners one by one, whichever reads at the time, leaves the rest every chunk."""
    layer = stream_layer()

    async def main() -> list[list[str]]:
        step = asyncio.Event()

        @layer.cached_stream("shared:{n}")
        async def story(n: int) -> Any:
            for index in range(6):
                if index:  # each part after the first once the test lets it go
                    await asyncio.wait_for(step.wait(), 30)
                    step.clear()
                yield f"part {index}"

        async def listen() -> list[str]:
            return [chunk async for chunk in story(1)]

        leader = story(1)
        assert await leader.__anext__() == "part 0"
        listeners = [asyncio.ensure_future(listen()) for _ in range(8)]
        await until(lambda: layer.stats()["streams_joined"] >= 8, "every listener following", 30)
        rest: list[str] = []
        for doomed in listeners[:4]:
            await asyncio.sleep(0.01)  # most listeners waiting on a read when one goes (whichever: the same outcome)
            doomed.cancel()
            step.set()
            rest.append(await leader.__anext__())
        step.set()
        rest.extend([chunk async for chunk in leader])
        assert rest == [f"part {index}" for index in range(1, 6)]
        for doomed in listeners[:4]:
            with pytest.raises(asyncio.CancelledError):
                await doomed
        return list(await asyncio.gather(*listeners[4:]))

    heard = asyncio.run(main())
    assert heard == [[f"part {index}" for index in range(6)]] * 4
