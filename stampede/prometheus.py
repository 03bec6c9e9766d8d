"""Prometheus metrics of stampede layers (the ``prometheus`` extra: prometheus-client).

One line per process, then every layer reports to it::

    from stampede.prometheus import PrometheusMetrics

    metrics = PrometheusMetrics()  # registers in prometheus_client's default registry
    layer = Stampede.from_url(url, namespace="shop", observers=[metrics])

Every ``stats()`` counter is a counter ``stampede_<name>_total``. Loads and waits are
histograms ``stampede_load_seconds`` and ``stampede_wait_seconds``, and gauges
``stampede_loads_in_progress`` and ``stampede_waits_in_progress`` say how many run now.
``stampede_breakers_open`` how many circuit breakers are open.
``stampede_budget_loads_queued`` and ``stampede_budget_loads_running``, labelled by
``budget`` too (the budget's name: the layer's, a loader's key template, or a shared
name), say how many loads of each load budget wait for a slot and hold one, and the
histogram ``stampede_budget_slot_wait_seconds`` how long they waited for it, per budget
(``stampede_budget_wait_seconds`` says it per namespace). The verifications of
``verify_sample`` are one counter, ``stampede_consistency_checks_total``, labelled by
``result`` (match, mismatch, superseded, error, skipped). Labels: ``namespace`` (the
layer's), and ``outcome`` on the histograms (``stampede.OUTCOMES``). Never a key, so the
number of series stays bounded.

Multiprocess (gunicorn workers, the prometheus-client way): set
``PROMETHEUS_MULTIPROC_DIR`` before prometheus_client is imported in each worker, expose
a registry with ``prometheus_client.multiprocess.MultiProcessCollector``, and call
``multiprocess.mark_process_dead(pid)`` when a worker exits. The gauges here sum over
live processes (``livesum``).
"""

from __future__ import annotations

try:
    from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram
except ImportError as error:  # pragma: no cover - the extra is missing
    needs = "stampede.prometheus needs prometheus-client: pip install 'stampede-guard[prometheus]'"
    raise ImportError(needs) from error

import threading
from typing import Any

from ._core.observer import COUNTERS, DESCRIPTIONS, MEASURES, Measure
from ._core.verify import RESULT_OF
from ._errors import ConfigError
from ._fork import reset_after_fork

__all__ = ["BUCKETS", "PrometheusMetrics"]

BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
"""Seconds: a wait woken by a message takes milliseconds, a load what the database takes."""

_MEASURE_HELP = {
    "load": "Seconds a loader call took, by outcome (value, none, error)",
    "wait": "Seconds a caller waited for another caller's read or load, by outcome "
    "(value, takeover, timeout, error, retry)",
    "budget_wait": "Seconds a load waited for a slot of its load budget (max_concurrent_loads), by outcome "
    "(slot, timeout, error, local, lease_lost)",
    "first_chunk": "Seconds a streamed call waited for its first chunk, by how it came "
    "(led, joined, replayed, uncollapsed) or why none did (empty, error)",
}


class PrometheusMetrics:
    """An observer (``stampede.Observer``) that records what layers do as Prometheus
    metrics in ``registry``. Make one per registry and give it to every layer: the
    metrics can be registered only once."""

    def __init__(self, registry: CollectorRegistry | None = REGISTRY, buckets: tuple[float, ...] = BUCKETS) -> None:
        try:
            self._counters = {
                name: Counter(f"stampede_{name}", DESCRIPTIONS[name], ["namespace"], registry=registry)
                for name in COUNTERS
                if name not in RESULT_OF
            }
            self._checks = Counter(
                "stampede_consistency_checks",
                "Verifications of sampled hits (verify_sample), by result: match, mismatch, superseded (the entry "
                "changed meanwhile: no verdict), error, skipped",
                ["namespace", "result"],
                registry=registry,
            )
            self._seconds = {
                measure: Histogram(
                    f"stampede_{measure}_seconds",
                    _MEASURE_HELP[measure],
                    ["namespace", "outcome"],
                    buckets=buckets,
                    registry=registry,
                )
                for measure in MEASURES
            }
            self._in_progress = {
                measure: Gauge(
                    f"stampede_{measure}s_in_progress",
                    f"{measure.capitalize()}s under way now",
                    ["namespace"],
                    registry=registry,
                    multiprocess_mode="livesum",
                )
                for measure in MEASURES
            }
            self._breakers_open = Gauge(
                "stampede_breakers_open",
                "Circuit breakers open now (one per server)",
                ["namespace"],
                registry=registry,
                multiprocess_mode="livesum",
            )
            self._slot_waits = Histogram(
                "stampede_budget_slot_wait_seconds",
                "Seconds a load waited for a slot of each load budget (max_concurrent_loads), by outcome "
                "(slot, timeout, error, local, lease_lost)",
                ["namespace", "budget", "outcome"],
                buckets=buckets,
                registry=registry,
            )
            self._budget_loads = [
                Gauge(
                    f"stampede_budget_loads_{state}",
                    f"Loads of a load budget (max_concurrent_loads) {help_text} now, in this process: summed "
                    "over the fleet, the budget's",
                    ["namespace", "budget"],
                    registry=registry,
                    multiprocess_mode="livesum",
                )
                for state, help_text in (("queued", "waiting for a slot"), ("running", "holding a slot"))
            ]
        except ValueError as error:  # Duplicated timeseries in CollectorRegistry
            raise ConfigError(
                f"stampede's metrics are already registered in this registry ({error}): make one "
                "PrometheusMetrics per registry and pass it to every layer"
            ) from None
        # Children by labels, made once: labels() costs more than the increment.
        self._counted: dict[tuple[str, str], Any] = {}
        self._timed: dict[tuple[str, Measure, str], Any] = {}
        self._running: dict[tuple[str, Measure], Any] = {}
        reset_after_fork(self)

    def after_fork_in_child(self) -> None:
        """prometheus_client guards each metric and each value with a lock of its own, and
        a parent's thread may have held one at the fork (every call reports): the child's
        first report would wait forever. Each metric here and its values get new ones."""
        metrics = [
            *self._counters.values(),
            self._checks,
            *self._seconds.values(),
            *self._in_progress.values(),
            self._breakers_open,
            self._slot_waits,
            *self._budget_loads,
        ]
        for metric in metrics:
            for part in (metric, *getattr(metric, "_metrics", {}).values()):
                _new_locks(part)

    def count(self, namespace: str, event: str, n: int) -> None:
        child = self._counted.get((namespace, event))
        if child is None:
            result = RESULT_OF.get(event)
            counter = (
                self._counters[event].labels(namespace) if result is None else self._checks.labels(namespace, result)
            )
            child = self._counted[namespace, event] = counter
        child.inc(n)
        if event == "breaker_opened":
            self._breakers_open.labels(namespace).inc()
        elif event == "breaker_closed":
            self._breakers_open.labels(namespace).dec()

    def began(self, namespace: str, measure: Measure) -> None:
        self._running_child(namespace, measure).inc()

    def ended(self, namespace: str, measure: Measure, outcome: str, seconds: float) -> None:
        self._running_child(namespace, measure).dec()
        child = self._timed.get((namespace, measure, outcome))
        if child is None:
            child = self._timed[namespace, measure, outcome] = self._seconds[measure].labels(namespace, outcome)
        child.observe(seconds)

    def budget(self, namespace: str, budget: str, queued: int, running: int) -> None:
        for gauge, change in zip(self._budget_loads, (queued, running), strict=True):
            if change:
                gauge.labels(namespace, budget).inc(change)

    def budget_waited(self, namespace: str, budget: str, outcome: str, seconds: float) -> None:
        self._slot_waits.labels(namespace, budget, outcome).observe(seconds)

    def _running_child(self, namespace: str, measure: Measure) -> Any:
        child = self._running.get((namespace, measure))
        if child is None:
            child = self._running[namespace, measure] = self._in_progress[measure].labels(namespace)
        return child


def _new_locks(metric: Any) -> None:
    """Replace the locks of a prometheus_client metric (or labelled child) and its values."""
    values = [metric, getattr(metric, "_value", None), getattr(metric, "_sum", None), *getattr(metric, "_buckets", ())]
    for value in values:
        if value is not None and isinstance(getattr(value, "_lock", None), type(threading.Lock())):
            value._lock = threading.Lock()
