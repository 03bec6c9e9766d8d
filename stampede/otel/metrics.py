"""OpenTelemetry metrics of stampede layers (the ``otel`` extra: opentelemetry-api).

The same measures as ``stampede.prometheus``, as OpenTelemetry instruments, for a
pipeline with no Prometheus::

    from stampede.otel import OpenTelemetryMetrics

    layer = Stampede.from_url(url, namespace="shop", observers=[OpenTelemetryMetrics()])

Instruments (meter ``stampede``): a counter ``stampede.<name>`` per ``stats()`` counter
(``stampede.hits``, ``stampede.loads``, ...), histograms ``stampede.load.duration`` and
``stampede.wait.duration`` in seconds, up-down counters ``stampede.load.active`` and
``stampede.wait.active``, ``stampede.breakers.open``, ``stampede.budget.loads.queued``
and ``stampede.budget.loads.running`` (by ``stampede.budget``, the load budget's name),
the histogram ``stampede.budget.slot_wait.duration`` (a load's wait for a slot, by
``stampede.budget`` and ``stampede.outcome``), and
``stampede.consistency.checks`` (the verifications of ``verify_sample``, by
``stampede.result``). Attributes: ``stampede.namespace``, and ``stampede.outcome`` on
the histograms. Never a key. With no
SDK configured, the API's no-op meter records nothing.

After a fork the histograms go quiet in the child: the SDK's instruments keep locks of
their own that a thread of the parent (its collection, its exporting reader) may have
held at the fork, never to be released in the child (opentelemetry-python #3307,
#4345), and a call that recorded a duration would wait for them forever. The counters
stay: they are kept here and read by the SDK's collection, off the callers' path. Set
the meter provider up in each process after the fork (gunicorn's ``post_fork``) and
give the child's layers an observer of its own.
"""

from __future__ import annotations

try:
    from opentelemetry import metrics
except ImportError as error:  # pragma: no cover - the extra is missing
    raise ImportError("stampede.otel needs opentelemetry-api: pip install 'stampede-guard[otel]'") from error

import logging
import threading
from collections.abc import Callable, Iterable
from typing import Any

from .._core.observer import COUNTERS, DESCRIPTIONS, MEASURES, Measure
from .._core.verify import RESULT_OF
from .._fork import reset_after_fork

__all__ = ["OpenTelemetryMetrics"]

NAMESPACE = "stampede.namespace"
OUTCOME = "stampede.outcome"
BUDGET = "stampede.budget"
RESULT = "stampede.result"

log = logging.getLogger("stampede.cache")


class OpenTelemetryMetrics:
    """An observer (``stampede.Observer``) recording what layers do with instruments of
    ``meter_provider`` (the global one by default). One can serve every layer.

    Counts are kept here and reported by observable (asynchronous) counters when the
    SDK collects: a hit then costs a locked dict increment, where a synchronous
    ``Counter.add`` costs the SDK's attribute handling on every call (about 6 us here,
    a tenth of a hit). Loads and waits, far fewer, are recorded as they end."""

    def __init__(self, meter_provider: metrics.MeterProvider | None = None) -> None:
        from .. import __version__

        self._lock = threading.Lock()
        self._forked = False  # a child of the process that made it: no durations (``_record``)
        self._told_forked = False
        reset_after_fork(self)
        self._counts: dict[str, dict[str, int]] = {name: {} for name in COUNTERS}  # event -> namespace -> n
        self._running: dict[str, dict[str, int]] = {
            "load": {},
            "wait": {},
            "budget_wait": {},
            "first_chunk": {},
            "breakers": {},
        }  # -> namespace -> now
        meter = metrics.get_meter("stampede", __version__, meter_provider=meter_provider)
        for name in COUNTERS:
            if name in RESULT_OF:
                continue
            meter.create_observable_counter(
                f"stampede.{name}",
                callbacks=[self._observe(self._counts[name])],
                unit="{event}",
                description=DESCRIPTIONS[name],
            )
        meter.create_observable_counter(
            "stampede.consistency.checks",
            callbacks=[self._observe_checks],
            unit="{check}",
            description="Verifications of sampled hits (verify_sample), by result (stampede.result)",
        )
        self._durations = {
            measure: meter.create_histogram(
                f"stampede.{measure}.duration",
                unit="s",
                description=f"Seconds a {measure} took, by outcome (stampede.OUTCOMES)",
            )
            for measure in MEASURES
        }
        for measure in MEASURES:
            meter.create_observable_up_down_counter(
                f"stampede.{measure}.active",
                callbacks=[self._observe(self._running[measure])],
                unit="{" + measure + "}",
                description=f"{measure.capitalize()}s under way",
            )
        self._budgets: dict[tuple[str, str], list[int]] = {}  # (namespace, budget) -> queued, running
        self._slot_waits = meter.create_histogram(
            "stampede.budget.slot_wait.duration",
            unit="s",
            description="Seconds a load waited for a slot of each load budget (stampede.budget: its name), by "
            "outcome (stampede.OUTCOMES['budget_wait'])",
        )
        for index, state in enumerate(("queued", "running")):
            meter.create_observable_up_down_counter(
                f"stampede.budget.loads.{state}",
                callbacks=[self._observe_budgets(index)],
                unit="{load}",
                description=f"Loads of a load budget {'waiting for' if index == 0 else 'holding'} a slot "
                "(stampede.budget: its name)",
            )
        meter.create_observable_up_down_counter(
            "stampede.breakers.open",
            callbacks=[self._observe(self._running["breakers"])],
            unit="{breaker}",
            description="Circuit breakers open now",
        )
        self._with_outcome: dict[tuple[str, str], dict[str, Any]] = {}  # made once: the SDK keys points by them

    def _observe(self, counts: dict[str, int]) -> Callable[[metrics.CallbackOptions], Iterable[metrics.Observation]]:
        def callback(options: metrics.CallbackOptions) -> Iterable[metrics.Observation]:
            with self._lock:
                current = list(counts.items())
            return [metrics.Observation(n, {NAMESPACE: namespace}) for namespace, n in current]

        return callback

    def _observe_budgets(self, index: int) -> Callable[[metrics.CallbackOptions], Iterable[metrics.Observation]]:
        def callback(options: metrics.CallbackOptions) -> Iterable[metrics.Observation]:
            with self._lock:
                current = [(key, now[index]) for key, now in self._budgets.items()]
            return [
                metrics.Observation(n, {NAMESPACE: namespace, BUDGET: budget}) for (namespace, budget), n in current
            ]

        return callback

    def _observe_checks(self, options: metrics.CallbackOptions) -> Iterable[metrics.Observation]:
        with self._lock:
            current = [(event, list(self._counts[event].items())) for event in RESULT_OF]
        return [
            metrics.Observation(n, {NAMESPACE: namespace, RESULT: RESULT_OF[event]})
            for event, counts in current
            for namespace, n in counts
        ]

    def after_fork_in_child(self) -> None:
        """A parent's thread may have held the lock at the fork (every call reports): the
        child gets a new one, or its first call would wait forever. The SDK's
        histograms may be held the same way, out of reach: the child records none (see
        the module's docstring), and says so once, at its first duration."""
        self._lock = threading.Lock()
        self._forked = True

    def _record(self, histogram: Any, seconds: float, attributes: dict[str, Any]) -> None:
        """Record a duration, unless this is a forked child (``after_fork_in_child``)."""
        if not self._forked:
            histogram.record(seconds, attributes)
        elif not self._told_forked:
            self._told_forked = True
            log.warning(
                "stampede: OpenTelemetryMetrics in a forked child records no durations (the SDK's "
                "instruments may hold locks of the parent's threads); set the meter provider up after the "
                "fork and give this process's layers an observer of its own"
            )

    def count(self, namespace: str, event: str, n: int) -> None:
        with self._lock:
            counts = self._counts[event]
            counts[namespace] = counts.get(namespace, 0) + n
            if event in ("breaker_opened", "breaker_closed"):
                breakers = self._running["breakers"]
                breakers[namespace] = breakers.get(namespace, 0) + (1 if event == "breaker_opened" else -1)

    def budget(self, namespace: str, budget: str, queued: int, running: int) -> None:
        with self._lock:
            now = self._budgets.setdefault((namespace, budget), [0, 0])
            now[0] += queued
            now[1] += running

    def began(self, namespace: str, measure: Measure) -> None:
        with self._lock:
            running = self._running[measure]
            running[namespace] = running.get(namespace, 0) + 1

    def budget_waited(self, namespace: str, budget: str, outcome: str, seconds: float) -> None:
        self._record(self._slot_waits, seconds, {NAMESPACE: namespace, BUDGET: budget, OUTCOME: outcome})

    def ended(self, namespace: str, measure: Measure, outcome: str, seconds: float) -> None:
        with self._lock:
            running = self._running[measure]
            running[namespace] = running.get(namespace, 0) - 1
        attributes = self._with_outcome.get((namespace, outcome))
        if attributes is None:
            attributes = self._with_outcome[namespace, outcome] = {NAMESPACE: namespace, OUTCOME: outcome}
        self._record(self._durations[measure], seconds, attributes)
