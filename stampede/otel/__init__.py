"""OpenTelemetry: stampede's traces and metrics, in one place, through the public API only.

- ``stampede.otel.traces``: a span per call, its load and its wait. A layer traces with
  the tracer provider it is given (``Stampede(tracer_provider=...)``), else with
  OpenTelemetry's global one once the application sets it. It needs opentelemetry-api
  installed and nothing else; the layer's hot path imports it, so it imports without.
- ``stampede.otel.metrics``: ``OpenTelemetryMetrics``, an observer recording the layer's
  counts and durations as instruments of a meter provider
  (``Stampede(meter_provider=...)`` adds one). It needs the ``otel`` extra.

``from stampede.otel import OpenTelemetryMetrics`` works as it did when this was one
module: the name is looked up when asked for, so that importing the traces never needs
the metrics' dependencies.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .metrics import OpenTelemetryMetrics

__all__ = ["OpenTelemetryMetrics"]


def __getattr__(name: str) -> Any:
    if name == "OpenTelemetryMetrics":
        from .metrics import OpenTelemetryMetrics

        return OpenTelemetryMetrics
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
