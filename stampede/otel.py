"""OpenTelemetry metrics of stampede layers (the ``otel`` extra: opentelemetry-api).

The same measures as ``stampede.prometheus``, as OpenTelemetry instruments, for a
pipeline with no Prometheus::

    from stampede.otel import OpenTelemetryMetrics

    layer = Stampede.from_url(url, namespace="shop", observers=[OpenTelemetryMetrics()])

Instruments (meter ``stampede``): a counter ``stampede.<name>`` per ``stats()`` counter
(``stampede.hits``, ``stampede.loads``, ...), histograms ``stampede.load.duration`` and
``stampede.wait.duration`` in seconds, up-down counters ``stampede.load.active`` and
``stampede.wait.active``, and ``stampede.breakers.open``. Attributes:
``stampede.namespace``, and ``stampede.outcome`` on the histograms; never a key. With no
SDK configured, the API's no-op meter makes them cost next to nothing.
"""

from __future__ import annotations

try:
    from opentelemetry import metrics
except ImportError as error:  # pragma: no cover - the extra is missing
    raise ImportError("stampede.otel needs opentelemetry-api: pip install 'stampede[otel]'") from error

from typing import Any

from ._core.observer import COUNTERS, DESCRIPTIONS, MEASURES, Measure

__all__ = ["OpenTelemetryMetrics"]

NAMESPACE = "stampede.namespace"
OUTCOME = "stampede.outcome"


class OpenTelemetryMetrics:
    """An observer (``stampede.Observer``) recording what layers do with instruments of
    ``meter_provider`` (the global one by default). One can serve every layer."""

    def __init__(self, meter_provider: metrics.MeterProvider | None = None) -> None:
        from . import __version__

        meter = metrics.get_meter("stampede", __version__, meter_provider=meter_provider)
        self._counters = {
            name: meter.create_counter(f"stampede.{name}", unit="{event}", description=DESCRIPTIONS[name])
            for name in COUNTERS
        }
        self._durations = {
            measure: meter.create_histogram(
                f"stampede.{measure}.duration",
                unit="s",
                description=f"Seconds a {measure} took, by outcome (stampede.OUTCOMES)",
            )
            for measure in MEASURES
        }
        self._active = {
            measure: meter.create_up_down_counter(
                f"stampede.{measure}.active", unit="{" + measure + "}", description=f"{measure.capitalize()}s under way"
            )
            for measure in MEASURES
        }
        self._breakers = meter.create_up_down_counter(
            "stampede.breakers.open", unit="{breaker}", description="Circuit breakers open now"
        )
        # Attribute dicts made once per namespace (and outcome): the SDK keys points by them.
        self._attributes: dict[str, dict[str, Any]] = {}
        self._with_outcome: dict[tuple[str, str], dict[str, Any]] = {}

    def _of(self, namespace: str) -> dict[str, Any]:
        found = self._attributes.get(namespace)
        if found is None:
            found = self._attributes[namespace] = {NAMESPACE: namespace}
        return found

    def count(self, namespace: str, event: str, n: int) -> None:
        attributes = self._of(namespace)
        self._counters[event].add(n, attributes)
        if event == "breaker_opened":
            self._breakers.add(1, attributes)
        elif event == "breaker_closed":
            self._breakers.add(-1, attributes)

    def began(self, namespace: str, measure: Measure) -> None:
        self._active[measure].add(1, self._of(namespace))

    def ended(self, namespace: str, measure: Measure, outcome: str, seconds: float) -> None:
        self._active[measure].add(-1, self._of(namespace))
        attributes = self._with_outcome.get((namespace, outcome))
        if attributes is None:
            attributes = self._with_outcome[namespace, outcome] = {NAMESPACE: namespace, OUTCOME: outcome}
        self._durations[measure].record(seconds, attributes)
