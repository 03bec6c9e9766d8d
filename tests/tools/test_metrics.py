"""Metrics over a real server: a stampede seen by a Prometheus scrape over HTTP (one
process, and prometheus-client's multiprocess mode across two), and by OpenTelemetry's
in-memory reader; breakers and observers that fail."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from stampede import COUNTERS, Stampede
from stampede.testing import free_port

from ..scenarios import wait_until

prometheus_client = pytest.importorskip("prometheus_client")
from prometheus_client import CollectorRegistry, start_http_server  # noqa: E402
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from stampede.prometheus import PrometheusMetrics  # noqa: E402

HERE = Path(__file__).resolve().parents[1]  # tests/, beside its workers
CALLERS = 16


def scrape(port: int) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """Every sample /metrics serves: (name, labels) -> value."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def total(samples: dict[tuple[str, frozenset[tuple[str, str]]], float], name: str, **labels: str) -> float:
    """The sum of ``name``'s samples whose labels include ``labels``."""
    wanted = set(labels.items())
    return sum(value for (sample, have), value in samples.items() if sample == name and wanted <= have)


@pytest.fixture
def metrics_server() -> Iterator[tuple[CollectorRegistry, int]]:
    """A registry served over HTTP on 127.0.0.1, as an app's metrics endpoint is."""
    registry = CollectorRegistry()
    server, thread = start_http_server(0, addr="127.0.0.1", registry=registry)
    yield registry, server.server_port
    server.shutdown()
    server.server_close()
    thread.join(5)


def stampede_in_threads(load: Callable[[str], Any], callers: int = CALLERS) -> list[Any]:
    barrier = threading.Barrier(callers)
    results: list[Any] = []

    def call() -> None:
        barrier.wait()
        results.append(load("s1"))

    threads = [threading.Thread(target=call) for _ in range(callers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    return results


def test_a_stampede_is_seen_by_a_prometheus_scrape(redis_url: str, metrics_server: tuple[Any, int]) -> None:
    registry, port = metrics_server
    namespace = f"metrics-{uuid.uuid4().hex[:8]}"
    layer = Stampede.from_url(redis_url, namespace=namespace, observers=[PrometheusMetrics(registry)])
    waiting = {"namespace": namespace}

    @layer.cached_loader("category-map:{shop}")
    def load(shop: str) -> dict[str, str]:
        # Every other caller is waiting (the gauge says so) before the load ends.
        wait_until(lambda: registry.get_sample_value("stampede_waits_in_progress", waiting) == CALLERS - 1)
        return {"shop": shop}

    try:
        assert stampede_in_threads(load) == [{"shop": "s1"}] * CALLERS
        assert load("s1") == {"shop": "s1"}  # a hit
        samples = scrape(port)
        ns = {"namespace": namespace}
        assert total(samples, "stampede_loads_total", **ns) == 1
        assert total(samples, "stampede_collapsed_total", **ns) == CALLERS - 1
        assert total(samples, "stampede_misses_total", **ns) == 1
        assert total(samples, "stampede_hits_total", **ns) == 1
        assert total(samples, "stampede_wait_seconds_count", outcome="value", **ns) == CALLERS - 1
        assert total(samples, "stampede_wait_seconds_count", **ns) == CALLERS - 1
        assert total(samples, "stampede_load_seconds_count", outcome="value", **ns) == 1
        assert total(samples, "stampede_wait_seconds_sum", **ns) > 0
        assert total(samples, "stampede_waits_in_progress", **ns) == 0
        assert total(samples, "stampede_loads_in_progress", **ns) == 0
        # stats() and the metrics are one set of reports
        for name, count in layer.stats().items():
            assert total(samples, f"stampede_{name}_total", **ns) == count, name
        # labels are bounded: no key, no argument
        labels = {name for (_, have) in samples for name, _ in have}
        assert labels <= {"namespace", "outcome", "le"}
        assert not any("s1" in value for (_, have) in samples for _, value in have)
    finally:
        layer.close()


def waiting(port: int, labels: dict[str, str]) -> float | None:
    """Callers waiting now, by a scrape; None while a worker is creating its metrics file:
    prometheus-client creates it empty, then sizes it, and a scrape in between fails
    (prometheus/client_python#1199), here while the workers start."""
    try:
        return total(scrape(port), "stampede_waits_in_progress", **labels)
    except urllib.error.HTTPError as error:
        error.close()
        assert error.code == 500
        return None


def test_prometheus_multiprocess_mode_adds_up_two_workers(redis_url: str, tmp_path: Path) -> None:
    from prometheus_client import multiprocess

    namespace = f"metrics-{uuid.uuid4().hex[:8]}"
    release = f"{namespace}:release"
    threads = CALLERS // 2
    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry, path=str(tmp_path))
    server, thread = start_http_server(0, addr="127.0.0.1", registry=registry)
    environment = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(tmp_path)}
    command = [sys.executable, "-m", "tests.metrics_worker", "--url", redis_url, "--namespace", namespace]
    command += ["--threads", str(threads), "--release", release]
    workers = [
        subprocess.Popen(command, cwd=HERE.parent, env=environment, stdout=subprocess.PIPE, text=True) for _ in range(2)
    ]
    control = redis.Redis.from_url(redis_url, socket_timeout=5)
    try:
        ns = {"namespace": namespace}
        # One caller leads and loads; the other 15, in both processes, wait.
        wait_until(lambda: waiting(server.server_port, ns) == CALLERS - 1, timeout=20)
        control.rpush(release, "go")
        stats = [json.loads(worker.communicate(timeout=30)[0]) for worker in workers]
        assert all(worker.returncode == 0 for worker in workers)
        samples = scrape(server.server_port)
        assert total(samples, "stampede_loads_total", **ns) == 1 == sum(s["loads"] for s in stats)
        assert total(samples, "stampede_lock_waits_total", **ns) == 1  # the other process's leader
        # A caller that joined its process's leader once the leader was already waiting on
        # the lease (a thread the machine ran late) may not take the value that leader is
        # woken with: nothing proves it was written after the caller began
        # (``_core.flight.starts_over``). It reads the entry itself: a hit, its wait a retry.
        started_over = total(samples, "stampede_hits_total", **ns)
        assert total(samples, "stampede_collapsed_total", **ns) + started_over == CALLERS - 2
        assert total(samples, "stampede_wait_seconds_count", outcome="retry", **ns) == started_over
        assert total(samples, "stampede_wait_seconds_count", outcome="value", **ns) == CALLERS - 1 - started_over
        assert total(samples, "stampede_load_seconds_count", **ns) == 1
        assert total(samples, "stampede_waits_in_progress", **ns) == 0  # the workers marked themselves dead
        for name in COUNTERS:
            assert total(samples, f"stampede_{name}_total", **ns) == sum(s[name] for s in stats), name
    finally:
        for worker in workers:
            if worker.poll() is None:
                worker.kill()
                worker.wait()
        control.close()
        server.shutdown()
        server.server_close()
        thread.join(5)


def test_opentelemetry_collects_the_same_numbers(redis_url: str) -> None:
    pytest.importorskip("opentelemetry.sdk")
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    from stampede.otel import OpenTelemetryMetrics

    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    namespace = f"metrics-{uuid.uuid4().hex[:8]}"
    layer = Stampede.from_url(redis_url, namespace=namespace, observers=[OpenTelemetryMetrics(provider)])
    waiting = threading.Event()
    active: dict[str, float] = {}

    def points() -> dict[str, list[Any]]:
        found: dict[str, list[Any]] = {}
        data = reader.get_metrics_data()
        for resource in data.resource_metrics if data else []:
            for scope in resource.scope_metrics:
                for metric in scope.metrics:
                    found.setdefault(metric.name, []).extend(metric.data.data_points)
        return found

    def waiters() -> float:
        active["wait"] = sum(point.value for point in points().get("stampede.wait.active", []))
        return active["wait"]

    @layer.cached_loader("category-map:{shop}")
    def load(shop: str) -> dict[str, str]:
        wait_until(lambda: waiters() == CALLERS - 1)
        waiting.set()
        return {"shop": shop}

    try:
        assert stampede_in_threads(load) == [{"shop": "s1"}] * CALLERS
        assert waiting.is_set()
        found = points()

        def summed(name: str, **attributes: str) -> float:
            return sum(
                getattr(point, "count", None) or getattr(point, "value", 0)
                for point in found.get(name, [])
                if attributes.items() <= dict(point.attributes).items()
            )

        assert summed("stampede.loads") == 1
        assert summed("stampede.collapsed") == CALLERS - 1
        assert summed("stampede.wait.duration", **{"stampede.outcome": "value"}) == CALLERS - 1
        assert summed("stampede.load.duration", **{"stampede.outcome": "value"}) == 1
        assert summed("stampede.wait.active") == 0
        assert all(dict(point.attributes)["stampede.namespace"] == namespace for p in found.values() for point in p)
    finally:
        layer.close()
        provider.shutdown()


def test_opentelemetry_tells_each_budgets_loads_running(redis_url: str) -> None:
    """``stampede.budget.loads.running`` and ``.queued``, by ``stampede.budget``: one load
    of the layer's budget runs while its loader looks, none after; and its wait for the
    slot is one point of ``stampede.budget.slot_wait.duration`` for that budget."""
    pytest.importorskip("opentelemetry.sdk")
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    from stampede.otel import OpenTelemetryMetrics

    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    namespace = f"metrics-{uuid.uuid4().hex[:8]}"
    layer = Stampede.from_url(
        redis_url, namespace=namespace, max_concurrent_loads=1, observers=[OpenTelemetryMetrics(provider)]
    )

    def budgets() -> dict[tuple[str, str], float]:
        found: dict[tuple[str, str], float] = {}
        data = reader.get_metrics_data()
        for resource in data.resource_metrics if data else []:
            for scope in resource.scope_metrics:
                for metric in scope.metrics:
                    for point in metric.data.data_points:
                        attributes = dict(point.attributes)
                        if metric.name.startswith("stampede.budget.loads."):
                            key = (metric.name.rsplit(".", 1)[1], attributes["stampede.budget"])
                            found[key] = point.value
                        elif metric.name == "stampede.budget.slot_wait.duration":
                            key = (attributes["stampede.outcome"], attributes["stampede.budget"])
                            found[key] = point.count
        return found

    seen: list[dict[tuple[str, str], float]] = []

    @layer.cached_loader("item:{key}")
    def load(key: int) -> int:
        seen.append(budgets())
        return key

    try:
        assert load(1) == 1
        assert seen == [{("queued", "~layer"): 0, ("running", "~layer"): 1, ("slot", "~layer"): 1}]  # waited
        assert budgets() == {("queued", "~layer"): 0, ("running", "~layer"): 0, ("slot", "~layer"): 1}
    finally:
        layer.close()
        provider.shutdown()


def test_asyncio_waiters_are_timed_as_threads_are(redis_url: str) -> None:
    asyncio.run(asyncio_stampede(redis_url))


async def asyncio_stampede(redis_url: str) -> None:
    registry = CollectorRegistry()
    namespace = f"metrics-{uuid.uuid4().hex[:8]}"
    layer = Stampede.from_url(redis_url, namespace=namespace, observers=[PrometheusMetrics(registry)])
    ns = {"namespace": namespace}

    @layer.cached_loader("category-map:{shop}")
    async def load(shop: str) -> dict[str, str]:
        while registry.get_sample_value("stampede_waits_in_progress", ns) != 99:
            await asyncio.sleep(0.001)
        return {"shop": shop}

    try:
        results = await asyncio.wait_for(asyncio.gather(*(load("s1") for _ in range(100))), 20)
        assert results == [{"shop": "s1"}] * 100
        assert registry.get_sample_value("stampede_wait_seconds_count", {**ns, "outcome": "value"}) == 99
        assert registry.get_sample_value("stampede_load_seconds_count", {**ns, "outcome": "value"}) == 1
    finally:
        await layer.aclose()


def test_an_open_breaker_is_counted_and_shown_open(caplog: pytest.LogCaptureFixture) -> None:
    registry = CollectorRegistry()
    layer = Stampede.from_url(
        f"redis://127.0.0.1:{free_port()}/0",
        namespace="metrics-breaker",
        observers=[PrometheusMetrics(registry)],
        breaker_threshold=2,
        breaker_cooldown=60,
    )

    @layer.cached_loader("item:{n}")
    def load(n: int) -> int:
        return n

    try:
        assert [load(n) for n in range(5)] == list(range(5))  # served by the loader (on_backend_error="load")
        assert layer.stats()["breaker_opened"] == 1
        assert registry.get_sample_value("stampede_breakers_open", {"namespace": "metrics-breaker"}) == 1
        assert registry.get_sample_value("stampede_breaker_opened_total", {"namespace": "metrics-breaker"}) == 1
        assert [r.name for r in caplog.records if "circuit open" in r.getMessage()] == ["stampede.backend"]
    finally:
        layer.close()


def test_one_registry_takes_the_metrics_once() -> None:
    from stampede import ConfigError

    registry = CollectorRegistry()
    PrometheusMetrics(registry)
    with pytest.raises(ConfigError, match="one PrometheusMetrics per registry"):
        PrometheusMetrics(registry)


def test_warnings_carry_structured_fields_and_are_rate_limited(
    redis_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    import hashlib
    import logging

    namespace = f"metrics-{uuid.uuid4().hex[:8]}"
    layer = Stampede.from_url(redis_url, namespace=namespace)
    client = redis.Redis.from_url(redis_url, socket_timeout=5)

    @layer.cached_loader("item:{n}")
    def load(n: int) -> int:
        return n

    try:
        key = load.key(1)
        with caplog.at_level(logging.WARNING, logger="stampede"):
            for _ in range(3):
                client.set(key, b"not an envelope")
                assert load(1) == 1
        [record] = [r for r in caplog.records if "unreadable value" in r.getMessage()]  # one per 10 s
        assert record.name == "stampede.cache"
        assert record.stampede_namespace == namespace  # type: ignore[attr-defined]
        assert record.stampede_key_hash == hashlib.sha256(key.encode()).hexdigest()[:16]  # type: ignore[attr-defined]
        assert record.stampede_outcome == "corrupt_value"  # type: ignore[attr-defined]
        assert layer.stats()["corrupt_values"] == 3
    finally:
        client.close()
        layer.close()


def test_consistency_checks_are_one_metric_by_result_in_prometheus_and_opentelemetry(redis_url: str) -> None:
    """``verify_sample``'s checks: ``stampede_consistency_checks_total{result}`` and
    ``stampede.consistency.checks`` with ``stampede.result``, where the nines come from."""
    pytest.importorskip("opentelemetry.sdk")
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    from stampede.otel import OpenTelemetryMetrics

    registry = CollectorRegistry()
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    namespace = f"metrics-{uuid.uuid4().hex[:8]}"
    layer = Stampede.from_url(
        redis_url,
        namespace=namespace,
        observers=[PrometheusMetrics(registry), OpenTelemetryMetrics(provider)],
        verify_sample=1.0,
        verify_grace=0.01,
    )
    rows = {1: "one", 2: "two"}
    done = threading.Semaphore(0)

    class Counted:
        def count(self, namespace: str, event: str, n: int) -> None:
            if event.startswith("consistency_"):
                done.release()

        def began(self, namespace: str, measure: str) -> None:
            pass

        def ended(self, namespace: str, measure: str, outcome: str, seconds: float) -> None:
            pass

    layer.observe(Counted())
    load = layer.cached_loader("row:{key}")(rows.get)
    try:
        load(1), load(2)
        rows[2] = "changed without an invalidation"
        for key in (1, 2):
            load(key)
            assert done.acquire(timeout=10)
        labels = {"namespace": namespace}
        assert registry.get_sample_value("stampede_consistency_checks_total", {**labels, "result": "match"}) == 1
        assert registry.get_sample_value("stampede_consistency_checks_total", {**labels, "result": "mismatch"}) == 1
        assert registry.get_sample_value("stampede_consistency_match_total", labels) is None  # one metric, labelled
        data = reader.get_metrics_data()
        points = [
            point
            for resource in data.resource_metrics
            for scope in resource.scope_metrics
            for metric in scope.metrics
            if metric.name == "stampede.consistency.checks"
            for point in metric.data.data_points
        ]
        by_result = {dict(point.attributes)["stampede.result"]: point.value for point in points}
        assert {result: n for result, n in by_result.items() if n} == {"match": 1, "mismatch": 1}
    finally:
        layer.close()
        provider.shutdown()
