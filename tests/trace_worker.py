"""A worker process for the cross-process trace test: the OpenTelemetry SDK with an
in-memory exporter, one layer, and one cold key called on a line's command. It prints
"ready", then answers:

* ``call``: calls the key in a thread (or a task of its own loop, with ``--asyncio``) and
  answers "started". A load it leads prints "loading" and blocks until the parent pushes
  to ``--release`` (on ``--control``, a Redis); the call's end prints "done <value>".
* ``waiting``: answers how many callers wait on a lease held elsewhere (``lock_waits``),
  and how many waits began in all (those and the callers who joined one in this process).
* ``spans``: answers the spans finished so far, as one JSON list.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import threading
from typing import Any

import redis
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from scenarios import WaitsBegun  # tests/, this script's folder

from stampede import Stampede

exporter = InMemorySpanExporter()
provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(exporter))
trace.set_tracer_provider(provider)
app = trace.get_tracer("trace_worker")
printing = threading.Lock()


def say(line: str) -> None:
    with printing:
        print(line, flush=True)


def spans() -> list[dict[str, Any]]:
    """The finished spans, with the ids as hex, as the test compares them."""
    return [
        {
            "name": span.name,
            "trace_id": f"{span.context.trace_id:032x}",
            "span_id": f"{span.context.span_id:016x}",
            "parent": f"{span.parent.span_id:016x}" if span.parent else None,
            "attributes": dict(span.attributes or {}),
            "links": [
                {
                    "trace_id": f"{link.context.trace_id:032x}",
                    "span_id": f"{link.context.span_id:016x}",
                    "attributes": dict(link.attributes or {}),
                }
                for link in span.links
            ],
        }
        for span in exporter.get_finished_spans()
    ]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", required=True)
    parser.add_argument("--namespace", required=True)
    parser.add_argument("--release", required=True)
    parser.add_argument("--control", help="the Redis the parent releases the load through (default: --url)")
    parser.add_argument("--asyncio", action="store_true")
    options = parser.parse_args()
    control = redis.Redis.from_url(options.control or options.url, socket_timeout=30)
    waits = WaitsBegun()
    layer = Stampede.from_url(options.url, namespace=options.namespace, observers=[waits])

    def release() -> None:
        say("loading")
        assert control.blpop([options.release], timeout=20) is not None, "never released"

    if options.asyncio:
        loop = asyncio.new_event_loop()
        threading.Thread(target=loop.run_forever, daemon=True).start()

        @layer.cached_loader("report:{day}", lock_ttl=30, wait_timeout=30)
        async def aload(day: str) -> dict[str, str]:
            with app.start_as_current_span("db.query"):
                await asyncio.to_thread(release)
            return {"day": day}

        async def acall() -> None:
            say(f"done {json.dumps(await aload('monday'))}")

        def call() -> None:
            asyncio.run_coroutine_threadsafe(acall(), loop)

    else:

        @layer.cached_loader("report:{day}", lock_ttl=30, wait_timeout=30)
        def load(day: str) -> dict[str, str]:
            with app.start_as_current_span("db.query"):
                release()
            return {"day": day}

        def call() -> None:
            threading.Thread(target=lambda: say(f"done {json.dumps(load('monday'))}")).start()

    say("ready")
    for line in sys.stdin:
        command = line.strip()
        if command == "call":
            call()
            say("started")
        elif command == "waiting":
            say(f"{layer.stats()['lock_waits']} {waits.begun}")
        elif command == "spans":
            say(json.dumps(spans()))
        elif command == "quit":
            break
    layer.close()
    control.close()


if __name__ == "__main__":
    main()
