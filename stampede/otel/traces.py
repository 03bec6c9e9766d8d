"""OpenTelemetry traces of cached calls: a span per call, its load and its wait, and a link
from a waiter to the load it waited for, in whichever process that load ran.

A layer traces with the tracer provider it is given (``Stampede(tracer_provider=...)``),
else with OpenTelemetry's global one once the application sets it (the API only: the
application brings the SDK). Without opentelemetry-api installed nothing is traced, and
a call costs one attribute read. The spans (``docs/operating.md`` shows them in a trace)::

    stampede.get       a call: stampede.outcome (OUTCOMES), stampede.namespace,
                       stampede.template, and stampede.key only with trace_keys=True
                       (stampede.get_many for a many-key call: how many entries it asked,
                       found and loaded; one load span and one wait span for them all)
      stampede.wait    the caller waited: for a caller in this process (stampede.wait.kind
                       "joined") or for a lease held elsewhere ("lease"), linked then to
                       the holder's stampede.load span, in whichever process it runs
      stampede.load    the loader's call; the loader's own spans are its children
    stampede.refresh   a background refresh: a trace of its own (root), linked to the call
                       that started it, which links to it in turn where the API can
    stampede.stream    a streamed call (cached_stream), from its first iteration to its
                       last: stampede.stream.role (led, joined, replayed, uncollapsed) and
                       stampede.stream.chunks
      stampede.stream.follow   a listener found the run it follows: linked to the leader's
                       stampede.stream span, in whichever process it runs

How the spans are made, and how a waiter in another process finds the load it waits
for, is the drivers' (``stampede._drivers.tracing``): this module is the public face.
"""

from __future__ import annotations

from .._drivers.tracing import OUTCOMES, Tracing, tracer_of

__all__ = ["OUTCOMES", "Tracing", "tracer_of"]
