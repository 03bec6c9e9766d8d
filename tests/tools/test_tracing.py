"""Traces (``stampede.otel.traces``): a span per call with its outcome, the load and the wait
as its children, a background refresh in a trace of its own, and a waiter in another
process linked to the load it waited for. Spans are read back with the OpenTelemetry SDK's
in-memory exporter, from real servers."""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

pytest.importorskip("opentelemetry.sdk")

from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF

from stampede import Stampede
from stampede._core.keys import EntryKeys
from stampede._drivers import tracing

from ..scenarios import LineWorker, WaitsBegun, lead_join_replay, wait_until

HERE = Path(__file__).parent


def app() -> trace.Tracer:
    """The application's tracer, of the provider set now (a module's ProxyTracer would keep
    the first provider it saw, and each test sets its own)."""
    return trace.get_tracer_provider().get_tracer("tests")


def set_global_provider(provider: Any) -> None:
    """Set OpenTelemetry's global tracer provider, which the API lets a process set once:
    the suite sets one per test and takes it back after, as OpenTelemetry's own tests do."""
    trace._TRACER_PROVIDER_SET_ONCE._done = False  # type: ignore[attr-defined]
    trace._TRACER_PROVIDER = None  # type: ignore[attr-defined]
    if provider is not None:
        trace.set_tracer_provider(provider)
    tracing.GLOBAL.forget()  # and stampede asks at its next call


@pytest.fixture
def exporter() -> Iterator[InMemorySpanExporter]:
    """The global provider is the SDK's, exporting to memory, for this test only."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    set_global_provider(provider)
    try:
        yield exporter
    finally:
        set_global_provider(None)
        provider.shutdown()


def named(exporter: InMemorySpanExporter, name: str) -> list[ReadableSpan]:
    return [span for span in exporter.get_finished_spans() if span.name == name]


def outcomes(exporter: InMemorySpanExporter) -> list[str]:
    return [str(span.attributes["stampede.outcome"]) for span in named(exporter, "stampede.get")]  # type: ignore[index]


def test_nothing_is_traced_without_a_provider_nor_with_the_no_op_one(make_layer: Callable[..., Stampede]) -> None:
    set_global_provider(None)
    assert tracing.GLOBAL.ask() is None and tracing.GLOBAL.asking  # none set yet: it asks again later
    set_global_provider(trace.NoOpTracerProvider())
    try:
        assert tracing.GLOBAL.ask() is None and not tracing.GLOBAL.asking  # set for good, and no-op
        load = make_layer().cached_loader("item:{n}")(lambda n: {"n": n})
        assert load(1) == {"n": 1}
    finally:
        set_global_provider(None)


def test_a_layer_given_a_tracer_provider_traces_with_it_and_no_other(make_layer: Callable[..., Stampede]) -> None:
    """``tracer_provider=``, as OpenTelemetry's own instrumentations take it: the layer's
    calls are spans of that provider with no global one set, and a layer without it
    traces nothing meanwhile."""
    set_global_provider(None)
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    try:
        traced = make_layer(tracer_provider=provider).cached_loader("item:{n}")(lambda n: {"n": n})
        untraced = make_layer().cached_loader("other:{n}")(lambda n: {"n": n})
        assert traced(1) == untraced(1) == {"n": 1}
        assert traced(1) == untraced(1) == {"n": 1}
        assert outcomes(exporter) == ["loaded", "hit"]
        assert {span.attributes["stampede.template"] for span in named(exporter, "stampede.get")} == {"item:{n}"}  # type: ignore[index]
    finally:
        provider.shutdown()


def test_a_global_provider_set_after_the_first_calls_traces_the_next_ones_soon(
    make_layer: Callable[..., Stampede],
) -> None:
    """An application that sets its provider after the layer has served (an import-time
    layer): calls are traced from at most ``CALLS_BETWEEN_CLOCKS`` calls and ``ASK_EVERY``
    seconds later, without asking OpenTelemetry at every call meanwhile."""
    set_global_provider(None)
    load = make_layer().cached_loader("item:{n}")(lambda n: {"n": n})
    assert load(1) == {"n": 1}  # it asked: none set
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace._TRACER_PROVIDER_SET_ONCE._done = False  # type: ignore[attr-defined]
    trace.set_tracer_provider(provider)  # as the application does: stampede is not told
    try:
        began = time.monotonic()
        wait_until(lambda: load(1) == {"n": 1} and bool(named(exporter, "stampede.get")), "a traced call")
        assert time.monotonic() - began < tracing.ASK_EVERY + 2.0
        assert not tracing.GLOBAL.asking  # found: no more questions
    finally:
        set_global_provider(None)
        provider.shutdown()


def test_every_call_of_a_first_cold_burst_is_traced_when_the_provider_came_first(
    exporter: InMemorySpanExporter, make_layer: Callable[..., Stampede]
) -> None:
    """The SDK set as the global provider before the layer is made (the exporter fixture
    sets it): 20 threads calling one cold key at once left 1 ``stampede.get``, 1 wait and
    no load (the first call asked for the provider, and the others, counting down, did
    not wait for its answer). The layer asks when it is made, and every call is a span."""
    layer = make_layer()
    waits = WaitsBegun()
    layer.observe(waits)
    release = threading.Event()

    @layer.cached_loader("burst:{n}")
    def load(n: int) -> int:
        assert release.wait(10)
        return n

    barrier = threading.Barrier(20)

    def call() -> None:
        barrier.wait(10)
        assert load(1) == 1

    callers = [threading.Thread(target=call) for _ in range(20)]
    for caller in callers:
        caller.start()
    wait_until(lambda: waits.begun == 19, "19 callers waiting on the load", timeout=10)
    release.set()
    for caller in callers:
        caller.join(10)
    assert sorted(outcomes(exporter)) == ["joined"] * 19 + ["loaded"]
    assert (len(named(exporter, "stampede.wait")), len(named(exporter, "stampede.load"))) == (19, 1)


def test_callers_that_ask_for_the_provider_together_all_take_its_answer() -> None:
    """Threads that reach ``ask()`` at once wait for the one asking: each gets the tracer,
    none goes untraced for having asked a moment too late."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    set_global_provider(provider)
    try:
        asking = tracing.Tracing()
        barrier = threading.Barrier(16)
        got: list[Any] = []

        def ask() -> None:
            barrier.wait(10)
            got.append(asking.ask())

        threads = [threading.Thread(target=ask) for _ in range(16)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(10)
        assert len(got) == 16 and all(tracer is not None for tracer in got) and not asking.asking
    finally:
        set_global_provider(None)
        provider.shutdown()


def test_stampede_reads_no_private_name_of_opentelemetry() -> None:
    """Only the API's public names: a private one (``trace._TRACER_PROVIDER``) may change
    or go in any release of the API."""
    package = Path(tracing.__file__).parent.parent
    otel = r"\b(?:otel_trace|otel_context|metrics|opentelemetry(?:\.\w+)*)\._[A-Za-z]\w*"  # as stampede names them
    private = re.compile(rf"{otel}|(?<![A-Za-z0-9_])_(?:TRACER|METER)_PROVIDER")
    found = [
        f"{path.relative_to(package.parent)}:{number}: {line.strip()}"
        for path in sorted(package.rglob("*.py"))
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if private.search(line)
    ]
    assert found == []


def test_a_layer_given_a_meter_provider_records_its_metrics_there(make_layer: Callable[..., Stampede]) -> None:
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    reader = InMemoryMetricReader()
    layer = make_layer(meter_provider=MeterProvider(metric_readers=[reader]))
    load = layer.cached_loader("item:{n}")(lambda n: {"n": n})
    assert load(1) == load(1) == {"n": 1}
    data = reader.get_metrics_data()
    points = {
        metric.name: sum(point.value for point in metric.data.data_points)  # type: ignore[union-attr]
        for resource in (data.resource_metrics if data else [])
        for scope in resource.scope_metrics
        for metric in scope.metrics
        if metric.name in ("stampede.loads", "stampede.hits")
    }
    assert points == {"stampede.loads": 1, "stampede.hits": 1}


def test_a_load_is_a_child_of_its_call_and_the_loaders_spans_of_the_load(
    exporter: InMemorySpanExporter, make_layer: Callable[..., Stampede]
) -> None:
    layer = make_layer()

    @layer.cached_loader("item:{n}")
    def load(n: int) -> dict[str, int]:
        with app().start_as_current_span("db.query"):
            return {"n": n}

    with app().start_as_current_span("request") as request:
        assert load(1) == {"n": 1}
    assert load(1) == {"n": 1}
    assert outcomes(exporter) == ["loaded", "hit"]
    call, hit = named(exporter, "stampede.get")
    (loaded,) = named(exporter, "stampede.load")
    (query,) = named(exporter, "db.query")
    assert call.parent is not None and call.parent.span_id == request.get_span_context().span_id
    assert loaded.parent is not None and loaded.parent.span_id == call.context.span_id  # type: ignore[union-attr]
    assert query.parent is not None and query.parent.span_id == loaded.context.span_id  # type: ignore[union-attr]
    assert loaded.attributes is not None and loaded.attributes["stampede.load.outcome"] == "value"
    for span in (call, hit, loaded):
        assert span.attributes is not None
        assert span.attributes["stampede.namespace"] == layer.namespace
        assert span.attributes["stampede.template"] == "item:{n}"
        assert "stampede.key" not in span.attributes  # never, unless asked
    assert hit.parent is None  # no request around it: a root of its own


def test_the_key_is_an_attribute_only_when_asked(
    exporter: InMemorySpanExporter, make_layer: Callable[..., Stampede]
) -> None:
    load = make_layer(trace_keys=True).cached_loader("item:{n}")(lambda n: n)
    load(7)
    (call,) = named(exporter, "stampede.get")
    assert call.attributes is not None and call.attributes["stampede.key"] == load.key(7)


def test_without_trace_keys_a_failed_calls_exception_does_not_name_the_key(
    exporter: InMemorySpanExporter, make_layer: Callable[..., Stampede]
) -> None:
    """Stampede's errors name the key, and so does a loader's that formats its argument:
    the exception event keeps its type only, unless ``trace_keys`` asks for the key."""
    for keys_traced in (False, True):
        layer = make_layer(trace_keys=keys_traced)

        @layer.cached_loader(f"secret-{keys_traced}:{{email}}")
        def account(email: str) -> Any:
            raise LookupError(f"no account for {email}")

        with pytest.raises(LookupError):
            account("someone@example.com")
        (call,) = named(exporter, "stampede.get")
        exporter.clear()
        (event,) = [event for event in call.events if event.name == "exception"]
        assert event.attributes is not None and event.attributes["exception.type"] == "LookupError"
        shown = json.dumps(dict(event.attributes)) + json.dumps(dict(call.attributes or {}))
        assert ("someone@example.com" in shown) is keys_traced, shown


def test_joiners_wait_as_children_of_their_calls(
    exporter: InMemorySpanExporter, make_layer: Callable[..., Stampede]
) -> None:
    layer = make_layer()
    waits = WaitsBegun()
    layer.observe(waits)
    started, release = threading.Event(), threading.Event()

    @layer.cached_loader("item:{n}")
    def load(n: int) -> int:
        started.set()
        assert release.wait(10)
        return n

    callers = [threading.Thread(target=load, args=(1,))]
    callers[0].start()
    assert started.wait(10)
    callers += [threading.Thread(target=load, args=(1,)) for _ in range(3)]
    for caller in callers[1:]:
        caller.start()
    wait_until(lambda: waits.begun == 3, "three joiners waiting", timeout=10)
    release.set()
    for caller in callers:
        caller.join(10)
    assert sorted(outcomes(exporter)) == ["joined"] * 3 + ["loaded"]
    calls = {span.context.span_id: span for span in named(exporter, "stampede.get")}  # type: ignore[union-attr]
    (load,) = named(exporter, "stampede.load")
    waits = named(exporter, "stampede.wait")
    assert len(waits) == 3
    for wait in waits:
        assert wait.attributes is not None
        assert wait.attributes["stampede.wait.kind"] == "joined"
        assert wait.attributes["stampede.wait.outcome"] == "value"
        assert wait.parent is not None
        assert calls[wait.parent.span_id].attributes["stampede.outcome"] == "joined"  # type: ignore[index]
        # Linked to the leader's load, in the leader's trace.
        assert [(link.context.span_id, dict(link.attributes or {})) for link in wait.links] == [
            (load.context.span_id, {"stampede.link": "leader_load"})  # type: ignore[union-attr]
        ]


def test_near_hits_stale_values_and_a_refresh_in_a_trace_of_its_own(
    exporter: InMemorySpanExporter, make_layer: Callable[..., Stampede]
) -> None:
    layer = make_layer()
    refreshed = threading.Event()
    generation = iter(range(100))

    @layer.cached_loader("item:{n}", ttl=0.2, stale_while_revalidate=30)
    def load(n: int) -> int:
        value = next(generation)
        if value:
            refreshed.set()
        return value

    assert load(1) == 0
    time.sleep(0.25)  # past ttl, within stale_while_revalidate
    with app().start_as_current_span("request"):
        assert load(1) == 0  # stale at once; one refresh starts
    assert refreshed.wait(10)
    wait_until(lambda: named(exporter, "stampede.refresh"), "the refresh's span", timeout=10)
    assert outcomes(exporter) == ["loaded", "refreshing"]
    stale_call = named(exporter, "stampede.get")[1]
    (refresh,) = named(exporter, "stampede.refresh")
    assert refresh.parent is None  # a root: its own trace
    assert refresh.context.trace_id != stale_call.context.trace_id  # type: ignore[union-attr]
    assert [link.context.span_id for link in refresh.links] == [stale_call.context.span_id]  # type: ignore[union-attr]
    assert [link.context.span_id for link in stale_call.links] == [refresh.context.span_id]  # type: ignore[union-attr]
    assert refresh.attributes is not None and refresh.attributes["stampede.outcome"] == "loaded"
    refresh_loads = [
        span for span in named(exporter, "stampede.load") if span.context.trace_id == refresh.context.trace_id
    ]  # type: ignore[union-attr]
    assert len(refresh_loads) == 1


def test_a_near_hit_and_a_failure_say_so(exporter: InMemorySpanExporter, make_layer: Callable[..., Stampede]) -> None:
    layer = make_layer(near_cache=True)
    load = layer.cached_loader("item:{n}")(lambda n: n)
    load(1)
    # Copies are kept once the near cache's lease is up (docs/near-cache.md): a few reads.
    wait_until(lambda: load(1) == 1 and layer.stats()["near_hits"] == 1, "a near hit", timeout=10)

    @layer.cached_loader("broken:{n}")
    def broken(n: int) -> int:
        raise ValueError("the database is down")

    with pytest.raises(ValueError):
        broken(1)
    assert outcomes(exporter)[0] == "loaded" and outcomes(exporter)[-2:] == ["near_hit", "failed"]
    failed = named(exporter, "stampede.get")[-1]
    assert failed.status.status_code is trace.StatusCode.ERROR
    assert [event.name for event in failed.events] == ["exception"]
    (failed_load,) = [
        span for span in named(exporter, "stampede.load") if span.parent.span_id == failed.context.span_id
    ]  # type: ignore[union-attr]
    assert failed_load.attributes is not None and failed_load.attributes["stampede.load.outcome"] == "error"


def test_an_answer_for_its_caller_alone_is_no_error(
    exporter: InMemorySpanExporter, make_layer: Callable[..., Stampede]
) -> None:
    """A loader raising ``Unkept`` (the HTTP cache's response that may not be shared): its
    call's span and its load's do not end in ERROR, and no loader error is counted."""
    from stampede._core.results import Unkept

    layer = make_layer()

    @layer.cached_loader("page:{n}", stale_if_error=60)
    def page(n: int) -> int:
        raise Unkept("a response for its own request")

    with pytest.raises(Unkept):
        page(1)
    call = named(exporter, "stampede.get")[-1]
    assert call.status.status_code is not trace.StatusCode.ERROR and outcomes(exporter)[-1] == "loaded"
    (load,) = named(exporter, "stampede.load")
    assert load.status.status_code is not trace.StatusCode.ERROR
    assert load.attributes is not None and load.attributes["stampede.load.outcome"] == "value"
    stats = layer.stats()
    assert stats["loader_errors"] == 0 and stats["uncached_results"] == 1


def test_a_sampled_out_call_puts_nothing_in_its_lease(
    make_layer: Callable[..., Stampede], redis_client: redis.Redis
) -> None:
    provider = TracerProvider(sampler=ALWAYS_OFF)
    set_global_provider(provider)
    try:
        layer = make_layer()
        tokens = []

        @layer.cached_loader("item:{n}")
        def load(n: int) -> int:
            tokens.append(redis_client.get(EntryKeys.for_value(load.key(n)).lock))
            return n

        assert load(1) == 1
    finally:
        set_global_provider(None)
    assert len(tokens) == 1 and tokens[0] is not None and b"." not in tokens[0]


def expect(worker: LineWorker, start: str) -> str:
    """The next line of ``worker`` that begins with ``start`` (others are its other callers')."""
    for _ in range(10):
        line = worker.line()
        if line.startswith(start):
            return line
    raise AssertionError(f"no line beginning {start!r}")


@pytest.mark.timeout(60)
@pytest.mark.parametrize(("store", "mode"), [("redis", "threads"), ("redis", "asyncio"), ("postgres", "threads")])
def test_a_waiter_in_another_process_links_to_the_leaders_load_span(
    redis_url: str, request: pytest.FixtureRequest, store: str, mode: str
) -> None:
    namespace, release = f"trace-{uuid.uuid4().hex[:8]}", f"release-{uuid.uuid4().hex}"
    url = redis_url if store == "redis" else request.getfixturevalue("postgres_url")
    command = [str(HERE.parent / "trace_worker.py"), "--url", url, "--namespace", namespace, "--release", release]
    command += ["--control", redis_url] + (["--asyncio"] if mode == "asyncio" else [])
    control = redis.Redis.from_url(redis_url, socket_timeout=5)
    leader = waiter = None
    try:
        leader = LineWorker(*command)
        waiter = LineWorker(*command)
        leader.send("call")
        expect(leader, "loading")  # its loader runs, under its lease
        waiter.send("call")
        expect(waiter, "started")
        deadline = time.monotonic() + 20
        while waiter.ask("waiting") != "1 1":  # on the lease
            assert time.monotonic() < deadline, "the waiter never waited on the lease"
            time.sleep(0.01)
        waiter.send("call")  # a second caller in the waiter's process joins the first
        expect(waiter, "started")
        while waiter.ask("waiting") != "1 2":
            assert time.monotonic() < deadline, "the second caller never joined the first"
            time.sleep(0.01)
        control.rpush(release, "go")
        assert expect(leader, "done") == 'done {"day": "monday"}'
        assert expect(waiter, "done") == expect(waiter, "done") == 'done {"day": "monday"}'
        leader_spans = json.loads(leader.ask("spans"))
        waiter_spans = json.loads(waiter.ask("spans"))
    finally:
        for worker in (leader, waiter):
            if worker is not None:
                worker.stop()
        control.close()
    by_name = lambda spans, name: [span for span in spans if span["name"] == name]  # noqa: E731
    (leader_call,) = by_name(leader_spans, "stampede.get")
    (load,) = by_name(leader_spans, "stampede.load")
    (query,) = by_name(leader_spans, "db.query")
    assert leader_call["attributes"]["stampede.outcome"] == "loaded"
    assert load["parent"] == leader_call["span_id"] and query["parent"] == load["span_id"]
    # The second caller joined the first after it had subscribed. If the first got the value
    # in a message, the second is not handed it (it may predate an invalidation:
    # _core.flight): it starts over and reads the entry itself, a hit. If the first read the
    # entry after its wake-up (a wake-up without the value, or a poll that came first: the
    # PostgreSQL listener's), that read was sent after the second joined, which shares it.
    calls = {span["attributes"]["stampede.outcome"]: span for span in by_name(waiter_spans, "stampede.get")}
    assert sorted(calls) in (["hit", "waited"], ["joined", "waited"])
    second = "hit" if "hit" in calls else "joined"
    waits = {span["attributes"]["stampede.wait.kind"]: span for span in by_name(waiter_spans, "stampede.wait")}
    assert sorted(waits) == ["joined", "lease"]
    assert waits["lease"]["parent"] == calls["waited"]["span_id"]
    assert waits["joined"]["parent"] == calls[second]["span_id"]
    assert waits["lease"]["attributes"]["stampede.wait.outcome"] == "value"
    assert waits["joined"]["attributes"]["stampede.wait.outcome"] == ("retry" if second == "hit" else "value")
    assert waits["lease"]["trace_id"] != load["trace_id"]  # two requests, two traces: a link between them
    # Both link to the load in the leader's process: the one waiting on its lease, and
    # the one that joined that waiter (through its leader's link).
    for kind, link in (("lease", "holder_load"), ("joined", "leader_load")):
        assert waits[kind]["links"] == [
            {"trace_id": load["trace_id"], "span_id": load["span_id"], "attributes": {"stampede.link": link}}
        ]
    assert by_name(waiter_spans, "stampede.load") == []  # the waiter's process loaded nothing


def test_a_many_key_call_is_one_span_with_one_load_for_its_misses(
    exporter: InMemorySpanExporter, make_layer: Callable[..., Stampede]
) -> None:
    layer = make_layer()
    asked: list[list[int]] = []

    @layer.cached_loader_many("product:{product_id}")
    def products(product_ids: list[int]) -> dict[int, dict[str, int]]:
        asked.append(list(product_ids))
        with app().start_as_current_span("db.query"):
            return {product_id: {"id": product_id} for product_id in product_ids}

    products([1])
    exporter.clear()
    assert products([1, 2, 3]) == {n: {"id": n} for n in (1, 2, 3)}
    assert asked == [[1], [2, 3]]
    (call,) = named(exporter, "stampede.get_many")
    (load,) = named(exporter, "stampede.load")
    (query,) = named(exporter, "db.query")
    assert call.attributes is not None
    assert call.attributes["stampede.outcome"] == "loaded"
    assert call.attributes["stampede.entries"] == 3
    assert call.attributes["stampede.entries.loaded"] == 2
    assert call.attributes["stampede.entries.found"] == 1
    assert call.attributes["stampede.template"] == "product:{product_id}"
    assert load.parent is not None and load.parent.span_id == call.context.span_id  # type: ignore[union-attr]
    assert query.parent is not None and query.parent.span_id == load.context.span_id  # type: ignore[union-attr]


def test_without_opentelemetry_installed_nothing_is_traced_and_calls_work() -> None:
    """opentelemetry-api is not a dependency: with it missing (an import hook refuses it,
    in a process of its own), stampede imports and serves as always."""
    script = """
import sys

class Refuse:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "opentelemetry":
            raise ImportError("not installed")

sys.meta_path.insert(0, Refuse())
from stampede import Stampede
from stampede._drivers import tracing as traces

assert traces.otel_trace is None and traces.GLOBAL.tracer is None and not traces.GLOBAL.asking
layer = Stampede(namespace="untraced")
load = layer.cached_loader("item:{n}")(lambda n: {"n": n})
many = layer.cached_loader_many("many:{n}")(lambda ns: {n: n for n in ns})
assert load(1) == load(1) == {"n": 1} and many([1, 2]) == {1: 1, 2: 2}
assert layer.stats()["loads"] == 3
print("ok")
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"


def test_an_async_refresh_is_a_trace_of_its_own_too(
    exporter: InMemorySpanExporter, make_layer: Callable[..., Stampede]
) -> None:
    layer = make_layer()
    generation = iter(range(100))

    @layer.cached_loader("item:{n}", ttl=0.2, stale_while_revalidate=30)
    async def load(n: int) -> int:
        return next(generation)

    async def scenario() -> None:
        assert await load(1) == 0
        await asyncio.sleep(0.25)  # past ttl, within stale_while_revalidate
        assert await load(1) == 0  # stale at once; one refresh starts in a task
        for _ in range(1000):
            if named(exporter, "stampede.refresh"):
                break
            await asyncio.sleep(0.01)
        await layer.aclose()

    asyncio.run(scenario())
    assert outcomes(exporter) == ["loaded", "refreshing"]
    stale_call = named(exporter, "stampede.get")[1]
    (refresh,) = named(exporter, "stampede.refresh")
    assert refresh.parent is None
    assert [link.context.span_id for link in refresh.links] == [stale_call.context.span_id]  # type: ignore[union-attr]
    assert refresh.attributes is not None and refresh.attributes["stampede.outcome"] == "loaded"


@pytest.mark.timeout(60)
def test_over_every_backend_a_wait_on_another_layers_lease_links_to_its_load(
    exporter: InMemorySpanExporter, layer_of_each_backend: Callable[..., Stampede], request: pytest.FixtureRequest
) -> None:
    """Two layers over one store stand for two processes: the second waits on the first's
    lease. Its wait links to the first's load wherever the store says whose a held lease
    is; Redlock's and ZooKeeper's lock servers refuse a lease without saying so."""
    backend = request.node.callspec.params["layer_of_each_backend"]
    if backend == "embedded":
        pytest.skip("two embedded layers share no store")
    leader_layer, waiter_layer = layer_of_each_backend(), layer_of_each_backend()
    started, release = threading.Event(), threading.Event()
    waits = WaitsBegun()
    waiter_layer.observe(waits)

    def slow(n: int) -> int:
        started.set()
        assert release.wait(20)
        return n

    leader = leader_layer.cached_loader("item:{n}", lock_ttl=30)(slow)
    waiter = waiter_layer.cached_loader("item:{n}", lock_ttl=30)(slow)
    first = threading.Thread(target=leader, args=(1,))
    first.start()
    assert started.wait(20)
    second = threading.Thread(target=waiter, args=(1,))
    second.start()
    wait_until(lambda: waits.begun == 1, "the second layer waiting on the lease", timeout=20)
    release.set()
    first.join(20)
    second.join(20)
    (load,) = named(exporter, "stampede.load")
    (wait,) = named(exporter, "stampede.wait")
    assert wait.attributes is not None and wait.attributes["stampede.wait.kind"] == "lease"
    links = [(link.context.trace_id, link.context.span_id) for link in wait.links]
    expected = [(load.context.trace_id, load.context.span_id)]  # type: ignore[union-attr]
    assert links == ([] if backend in ("redlock", "zookeeper") else expected), backend


def test_a_streamed_calls_span_says_how_its_chunks_came_and_a_listener_links_to_its_leader(
    exporter: InMemorySpanExporter, make_layer: Callable[..., Stampede]
) -> None:
    """``stampede.stream``: one per streamed call, its role and chunks; a listener's
    ``stampede.stream.follow`` links to the leader's stream span through the lease token."""
    lead_join_replay(make_layer(), "story:{n}")
    streams = named(exporter, "stampede.stream")
    roles = sorted((str(span.attributes["stampede.stream.role"]), span.attributes["stampede.stream.chunks"])  # type: ignore[index]
                   for span in streams)  # fmt: skip
    assert roles == [("joined", 2), ("led", 2), ("replayed", 2)]
    led = next(span for span in streams if span.attributes["stampede.stream.role"] == "led")  # type: ignore[index]
    (follow,) = named(exporter, "stampede.stream.follow")
    assert [link.context.span_id for link in follow.links] == [led.context.span_id]  # type: ignore[union-attr]
