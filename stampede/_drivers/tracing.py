"""The drivers' tracing hooks: what makes the spans ``stampede.otel.traces`` describes (a
span per call, its load and its wait, and a link from a waiter to the load it waited for,
in whichever process that load ran). A room of the drivers, not of the public
observability wing, so that the drivers depend on no public module.

A layer traces with the tracer provider it is given (``Stampede(tracer_provider=...)``),
else with OpenTelemetry's global one (the API only; the application brings the SDK), as
OpenTelemetry's own instrumentations do, through the API's public names only. Once the
application sets a global provider, calls are traced (within ``ASK_EVERY``). Until then,
or without opentelemetry-api, a call reads one attribute (``Tracing.tracer``), and counts
down while it may still ask (``Tracing``), and goes on as if tracing did not exist.
``loadtest/bench_hit_path.py --tracing`` measures each.

The spans are listed where users read them, in ``stampede.otel.traces``.

How a waiter in another process finds the load it waits for: a traced leader's lease
token ends in ``.`` and its load span's trace and span ids (``lease_token``); a store
that tells a waiter who holds a lease (``AcquireReply.holder``: Redis, Valkey,
PostgreSQL and the in-memory backend; not Redlock's or ZooKeeper's lock servers) hands
that token on, and the waiter's wait span links to it. The load span is started when
the lease is asked for, so that its ids can travel with the request: a caller that
waits instead of loading drops it unended (never exported), and one that takes over
after waiting loads under it (its span begins at its first request).
A caller that joins another's flight in its own process links to the load its leader
ran, or waited for in another process: the flight keeps its leader's trace.

How a call learns what happened in it: the layer's reports (``_core.observer``) reach
the call's ``CallTrace`` through ``FEED``, an observer added to a layer's reports when its
first traced call begins, which hands each report to the call traced in the current
context (a context variable: a thread's, or an asyncio task's). A report made outside
any traced call is dropped. So the flow, the drivers and the performers know nothing of
tracing beyond the token.
"""

from __future__ import annotations

import contextvars
import importlib.metadata
import threading
import time
from collections.abc import Callable, Coroutine
from typing import Any, Protocol, TypeVar

from .._core import world
from .._core.observer import Measure
from .._core.results import Unkept
from .._core.store import TRACE_MARK
from .._errors import ConfigError
from .._fork import reset_after_fork
from .observe import Events

try:
    from opentelemetry import context as otel_context
    from opentelemetry import trace as otel_trace
except ImportError:  # the application traces nothing: nor does stampede
    otel_trace = None  # type: ignore[assignment]

__all__ = [
    "FEED",
    "GLOBAL",
    "OUTCOMES",
    "CallTrace",
    "abackground",
    "background",
    "call_trace",
    "entry_attributes",
    "joining",
    "lease_token",
    "tracer_of",
    "Tracing",
]

T = TypeVar("T")


class HoldsHolder(Protocol):
    """The flow's context (``_core.flow.Context``), as far as traces read it."""

    holder: str  # the token of the last lease the flow found held by another (``AcquireReply.holder``)


OUTCOMES = (
    "near_hit",  # served from the near cache, no I/O
    "hit",  # read from the cache (a value or the null sentinel)
    "stale",  # served a value past its ttl: stale-while-revalidate, stale-if-error
    "refreshing",  # served from the cache, and started a background refresh
    "joined",  # took the value of another caller's read or load in this process
    "waited",  # waited for a load under a lease held by another process
    "loaded",  # called the loader
    "failed",  # raised (the loader's error, the store's, a timeout)
)
"""What a call's span says happened (``stampede.outcome``)."""


# --- whether anything is traced ---------------------------------------------------------

ASK_EVERY = 0.1
"""Seconds between two questions to OpenTelemetry while no global provider is set."""

CALLS_BETWEEN_CLOCKS = 64
"""Calls between two reads of the clock meanwhile: a countdown costs a third of a clock."""


class Tracing:
    """Which tracer a layer's calls take: that of the provider the layer was given
    (``Stampede(tracer_provider=...)``), else that of OpenTelemetry's global provider, as
    OpenTelemetry's own instrumentations default to. ``tracer`` is None while nothing is
    traced (no provider, or the API's no-op one), and a call then goes on as if tracing did
    not exist.

    The global provider is asked for when a layer is made (``ask_now``: a provider set
    before it traces its first call, and every call of a first burst), then with the
    public ``get_tracer_provider()``, which costs about 1.5 us while none is set (it looks
    the environment up), most of a near hit: so while ``asking``, a call counts down
    ``countdown`` and, every ``CALLS_BETWEEN_CLOCKS`` calls, ``ask()`` reads the clock and
    asks if ``ASK_EVERY`` has passed. A provider set after a layer was made traces its
    calls from at most that many calls and that long later. Callers that reach ``ask()``
    together wait for the one asking (a first burst of threads is traced whole, not only
    the thread that asked). Once set, the global provider never changes (OpenTelemetry
    sets it once), so asking stops: ``tracer`` is set before ``asking`` is cleared, so a
    call that reads ``asking`` cleared finds the tracer."""

    __slots__ = ("__weakref__", "_asking_lock", "asking", "asks_at", "countdown", "tracer")

    def __init__(self, provider: object = None) -> None:
        self.tracer: Any = None
        self.asking = provider is None and otel_trace is not None  # the global provider, not found yet
        self.countdown = 0
        self.asks_at = 0.0
        self._asking_lock = threading.Lock()
        if provider is not None:
            self.tracer = tracer_of(provider)
        reset_after_fork(self)

    def ask(self) -> Any:
        """The global provider's tracer, if one is set now (else None, and ask again later)."""
        with self._asking_lock:
            if not self.asking:
                return self.tracer  # found (or set no-op) by a caller that asked first
            now = world.monotonic()
            if now < self.asks_at:
                self.countdown = CALLS_BETWEEN_CLOCKS
                return None
            return self._asked(now)

    def ask_now(self) -> None:
        """Ask for the global provider at once, whenever it was last asked (a layer is
        being made: its first calls must not wait for the clock to let them ask)."""
        with self._asking_lock:
            if self.asking:
                self._asked(world.monotonic())

    def _asked(self, now: float) -> Any:
        provider = otel_trace.get_tracer_provider()
        if isinstance(provider, otel_trace.ProxyTracerProvider):  # what the API answers while none is set
            self.asks_at = now + ASK_EVERY
            self.countdown = CALLS_BETWEEN_CLOCKS
            return None
        self.tracer = tracer_of(provider)
        self.asking = False
        return self.tracer

    def forget(self) -> None:
        """Ask for the global provider afresh at the next call. The API never unsets it: a
        test that does (as OpenTelemetry's own tests do) calls this after."""
        with self._asking_lock:
            self.tracer, self.asking = None, otel_trace is not None
            self.countdown, self.asks_at = 0, 0.0

    def after_fork_in_child(self) -> None:
        """A thread of the parent may have held the lock as it forked."""
        self._asking_lock = threading.Lock()


def tracer_of(provider: Any) -> Any:
    """stampede's tracer of ``provider``, or None for the API's no-op provider (nothing to
    trace: a call then costs what it costs untraced)."""
    if otel_trace is None:
        raise ConfigError("tracer_provider needs opentelemetry-api: pip install opentelemetry-api")
    if isinstance(provider, otel_trace.NoOpTracerProvider):
        return None
    return provider.get_tracer("stampede", _version())


GLOBAL = Tracing()
"""The tracing of every layer given no provider: one question to OpenTelemetry per
process, whichever layer asks."""


def _version() -> str | None:
    """The installed package's version: the tracer's instrumentation scope names it."""
    try:
        return importlib.metadata.version("stampede-guard")
    except importlib.metadata.PackageNotFoundError:  # run from a source tree
        return None


# --- one call ---------------------------------------------------------------------------

_current: contextvars.ContextVar[CallTrace | None] = contextvars.ContextVar("stampede_call_trace", default=None)


class CallTrace:
    """One traced call (or background refresh): its span, made current while it runs,
    and what the layer reported meanwhile. A context manager; the same for a blocking
    call and an awaited one (a context variable is a task's own)."""

    __slots__ = (
        "_attributes",
        "_context_token",
        "_counts",
        "_keys_shown",
        "_load",
        "_load_context",
        "_load_token",
        "_loads_open",
        "_name",
        "_pending_load",
        "_trace_token",
        "_wait_kind",
        "_wait_started",
        "_waits_open",
        "flow",
        "joined",
        "links",
        "refreshing",
        "root",
        "span",
        "tracer",
    )

    def __init__(
        self,
        tracer: Any,
        name: str,
        attributes: dict[str, Any],
        links: list[Any] | None = None,
        root: bool = False,
        keys_shown: bool = True,
    ) -> None:
        self.tracer = tracer
        self._name = name
        self._attributes = attributes
        self._keys_shown = keys_shown  # trace_keys: else no text of the call's may reach the span
        self.links = links or []
        self.root = root  # a trace of its own (a background refresh), not the caller's
        self._counts: dict[str, int] = {}
        self._load: Any = None
        self._pending_load: Any = None  # begun with the lease request (``lease_token``)
        self._loads_open = 0  # a many-key call reports a load per entry: one span for them,
        self._waits_open = 0  # and a wait per entry: one span for those at once
        self._wait_started = 0
        self._wait_kind = "joined"
        self.flow: HoldsHolder | None = None  # the context of the call's flow (``lease_token``)
        self.joined: CallTrace | None = None  # the leader of the flight it waits for (``joining``)
        self._load_context: Any = None  # its load span's, once begun
        self.refreshing = False
        self.span: Any = None

    def start(self) -> None:
        """Begin the span (now, unless ``__enter__`` does it)."""
        parent = otel_context.Context() if self.root else None
        self.span = self.tracer.start_span(self._name, context=parent, attributes=self._attributes, links=self.links)

    def __enter__(self) -> CallTrace:
        if self.span is None:
            self.start()
        # Current even when sampled out: the loader's own spans follow its decision.
        self._context_token = otel_context.attach(otel_trace.set_span_in_context(self.span))
        # A span that records nothing needs no report: such a call costs the SDK's
        # sampling and the context, no more.
        self._trace_token = _current.set(self) if self.span.is_recording() else None
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, traceback: object) -> None:
        otel_context.detach(self._context_token)
        if self._trace_token is None:
            return
        _current.reset(self._trace_token)
        span = self.span
        span.set_attribute("stampede.outcome", self.outcome(error))
        if self._name == "stampede.get_many":
            counts = self._counts
            found = sum(counts.get(name, 0) for name in ("hits", "null_hits", "stale_hits", "near_hits"))
            span.set_attribute("stampede.entries.loaded", counts.get("loads", 0))
            span.set_attribute("stampede.entries.found", found)
        if error is not None and not isinstance(error, Unkept):
            span.set_status(otel_trace.Status(otel_trace.StatusCode.ERROR, type(error).__name__))
            if isinstance(error, Exception):
                if self._keys_shown:
                    span.record_exception(error)
                else:  # its message and traceback name the key: only its type goes
                    hidden = f"{type(error).__qualname__} (its text is not traced: trace_keys=False)"
                    span.record_exception(error, {"exception.message": hidden, "exception.stacktrace": hidden})
        span.end()

    def outcome(self, error: BaseException | None) -> str:
        """What happened in the call (``OUTCOMES``), from what the layer reported in it."""
        counts = self._counts
        if error is not None and not isinstance(error, Unkept):
            return "failed"
        if "stale_on_error" in counts or "soft_timeouts" in counts:
            return "stale"
        if "loads" in counts:
            return "loaded"
        if "lock_waits" in counts:
            return "waited"
        if "collapsed" in counts:
            return "joined"
        if self.refreshing:
            return "refreshing"
        if "stale_hits" in counts:
            return "stale"
        if "near_hits" in counts:
            return "near_hit"
        return "hit"

    # What the layer reports during the call (through ``FEED``).

    def count(self, event: str, n: int) -> None:
        self._counts[event] = self._counts.get(event, 0) + n
        if event == "lock_waits":
            self._wait_kind = "lease"

    def began(self, measure: Measure) -> None:
        if measure in ("budget_wait", "first_chunk"):  # inside the load's span, or a stream's own
            return
        if measure == "wait":
            self._waits_open += 1
            if self._waits_open == 1:
                self._wait_started = time.time_ns()
            return
        self._loads_open += 1
        if self._loads_open > 1:
            return
        load, self._pending_load = self._pending_load, None
        if load is None:
            load = self.tracer.start_span("stampede.load", context=self._here(), attributes=self._attributes)
        self._load = load
        self._load_context = load.get_span_context()
        self._load_token = otel_context.attach(otel_trace.set_span_in_context(load))

    def ended(self, measure: Measure, outcome: str, seconds: float) -> None:
        if measure in ("budget_wait", "first_chunk"):
            return
        if measure == "wait":
            self._waits_open -= 1
            if self._waits_open <= 0:
                self._waits_open = 0
                self._waited(outcome)
            return
        self._loads_open -= 1
        if self._loads_open or self._load is None:
            return
        load, self._load = self._load, None
        otel_context.detach(self._load_token)
        load.set_attribute("stampede.load.outcome", outcome)
        if outcome == "error":
            load.set_status(otel_trace.Status(otel_trace.StatusCode.ERROR))
        load.end()

    def _waited(self, outcome: str) -> None:
        """A wait ended: its span, made now with the time it began, so that it can carry
        the link to the load it waited for, learnt meanwhile: a lease's holder's, or the
        load the leader it joined in this process ran (or waited for in turn)."""
        started = self._wait_started or time.time_ns()
        links = []
        if self._wait_kind == "lease":
            holder = self.holder_load()
            if holder is not None:
                links.append(otel_trace.Link(holder, {"stampede.link": "holder_load"}))
        elif self.joined is not None:
            load = self.joined.load_context()
            if load is not None:
                links.append(otel_trace.Link(load, {"stampede.link": "leader_load"}))
            self.joined = None
        attributes = {**self._attributes, "stampede.wait.kind": self._wait_kind, "stampede.wait.outcome": outcome}
        span = self.tracer.start_span(
            "stampede.wait", context=self._here(), attributes=attributes, links=links, start_time=started
        )
        span.end()
        self._wait_started, self._wait_kind = 0, "joined"

    def _here(self) -> Any:
        return otel_trace.set_span_in_context(self.span)

    def holder_load(self) -> Any:
        """The load span of the holder of the last lease this call's flow found held, as
        its token names it, or None."""
        flow = self.flow
        return None if flow is None else held_by(flow.holder)

    def load_context(self) -> Any:
        """The span of the load this call ran, or else of the load it waited for in
        another process: what a caller who joined it waited for. None if neither."""
        if self._load_context is not None:
            return self._load_context
        return self.holder_load()

    # The lease's token, and the load span it names.

    def lease_suffix(self) -> str:
        """``.`` and the ids of the load span the call's leases name (sampled in), begun
        now unless an earlier lease of the call began it (a many-key call's leases share
        one); "" for a call whose span records nothing (sampled out)."""
        if not self.span.is_recording():
            return ""
        if self._pending_load is None:
            self._pending_load = self.tracer.start_span(
                "stampede.load", context=self._here(), attributes=self._attributes
            )
        span_context = self._pending_load.get_span_context()
        return f"{TRACE_MARK}{span_context.trace_id:032x}{span_context.span_id:016x}{int(span_context.trace_flags):02x}"


def lease_token(ctx: HoldsHolder, flight: Any = None) -> str:
    """A new lease's token: random, and if a traced call asks for the lease, the ids of its
    load span after ``TRACE_MARK`` (``CallTrace.lease_suffix``), which waiters link to.
    The call's trace keeps ``ctx``, the flow's context, to learn whose lease it waited on,
    and the ``flight`` it leads (``_core.flight.Flight``), if any, keeps the trace for the
    callers who join it (``joining``)."""
    token = world.token(16)
    trace = _current.get()
    if trace is None:
        return token
    trace.flow = ctx
    if flight is not None:
        flight.trace = trace
    return token + trace.lease_suffix()


def joining(flight: Any) -> None:
    """The current call's wait for ``flight`` (another caller's, in this process) is about
    to end: its wait span links to the load that leader ran or waited for, if traced."""
    trace = _current.get()
    if trace is not None:
        trace.joined = flight.trace


def held_by(token: str) -> Any:
    """The span a lease ``token`` names (``lease_token``), as a remote SpanContext, or None."""
    _, mark, ids = token.partition(TRACE_MARK)
    if not mark or len(ids) != 50:
        return None
    try:
        trace_id, span_id, flags = int(ids[:32], 16), int(ids[32:48], 16), int(ids[48:], 16)
    except ValueError:
        return None
    span_context = otel_trace.SpanContext(trace_id, span_id, is_remote=True, trace_flags=otel_trace.TraceFlags(flags))
    return span_context if span_context.is_valid else None


# --- what feeds the call: the layer's reports -------------------------------------------


class _Feed:
    """The observer that hands a layer's reports to the call traced in this context."""

    def count(self, namespace: str, event: str, n: int) -> None:
        trace = _current.get()
        if trace is not None:
            trace.count(event, n)

    def began(self, namespace: str, measure: Measure) -> None:
        trace = _current.get()
        if trace is not None:
            trace.began(measure)

    def ended(self, namespace: str, measure: Measure, outcome: str, seconds: float) -> None:
        trace = _current.get()
        if trace is not None:
            trace.ended(measure, outcome, seconds)

    def __repr__(self) -> str:
        return "<stampede traces>"


FEED = _Feed()


def entry_attributes(namespace: str, template: str) -> dict[str, Any]:
    """The attributes of every span of a loader's calls (made once per loader)."""
    return {"stampede.namespace": namespace, "stampede.template": template}


def call_trace(
    tracer: Any,
    events: Events,
    name: str,
    attributes: dict[str, Any],
    own: dict[str, Any] | None = None,
    keys_shown: bool = True,
) -> CallTrace:
    """A call's trace, to enter around it, fed by its layer's reports (``events``):
    ``attributes`` are the loader's (``entry_attributes``), ``own`` the call's (its key,
    with ``trace_keys``). ``keys_shown``: ``trace_keys``; without it an exception is
    recorded by its type only (its text names the key)."""
    events.feed(FEED)
    return CallTrace(tracer, name, {**attributes, **own} if own else attributes, keys_shown=keys_shown)


# --- streamed calls ---------------------------------------------------------------------


class StreamTrace:
    """One streamed call's span, ``stampede.stream``: begun when the caller begins to
    iterate, ended when it stops, with how its chunks came (``stampede.stream.role``: led,
    joined, replayed, uncollapsed) and how many (``stampede.stream.chunks``). Never made
    current: a generator's context is its consumer's between chunks. A leader's lease
    token carries the span's ids (``token``), and a listener's ``stampede.stream.follow``
    span, begun when it finds the run, links to the leader's, in whichever process."""

    __slots__ = ("_tracer", "span")

    def __init__(self, tracer: Any, attributes: dict[str, Any]) -> None:
        self._tracer = tracer
        self.span = tracer.start_span("stampede.stream", attributes=attributes)

    def token(self, token: str) -> str:
        """A leader's lease ``token``, naming this span to its listeners if it is sampled in
        (and carrying ``TRACE_MARK`` either way: a store names it to its listeners)."""
        if not self.span.is_recording():
            return token + TRACE_MARK
        ids = self.span.get_span_context()
        return f"{token}{TRACE_MARK}{ids.trace_id:032x}{ids.span_id:016x}{int(ids.trace_flags):02x}"

    def follows(self, holder: str) -> None:
        """The call follows the run that holds the lease as ``holder``: a span of the
        follow, linked to the leader's stream span when the token names it."""
        leader = held_by(holder)
        links = [otel_trace.Link(leader)] if leader is not None else None
        context = otel_trace.set_span_in_context(self.span)
        self._tracer.start_span("stampede.stream.follow", context=context, links=links).end()

    def ended(self, role: str, chunks: int, error: BaseException | None) -> None:
        span = self.span
        span.set_attribute("stampede.stream.role", role)
        span.set_attribute("stampede.stream.chunks", chunks)
        if error is not None and not isinstance(error, GeneratorExit):
            span.set_status(otel_trace.Status(otel_trace.StatusCode.ERROR, type(error).__name__))
        span.end()


def stream_trace(tracing: Tracing, attributes: dict[str, Any]) -> StreamTrace | None:
    """A streamed call's trace, or None while nothing is traced."""
    tracer = tracing.tracer
    if tracer is None and tracing.asking:
        tracer = tracing.ask()
    return None if tracer is None else StreamTrace(tracer, attributes)


# --- background refreshes ---------------------------------------------------------------


def _refresh_trace() -> CallTrace | None:
    """The trace of a refresh the current call starts, begun now: a root span linked to the
    call, which links to it in turn (where the API has ``Span.add_link``: 1.23 and later).
    None if the current call is not traced."""
    trace = _current.get()
    if trace is None:
        return None
    trace.refreshing = True
    caller = trace.span.get_span_context()
    links = [otel_trace.Link(caller, {"stampede.link": "triggered_by"})] if caller.is_valid else []
    refresh = CallTrace(
        trace.tracer, "stampede.refresh", dict(trace._attributes), links, root=True, keys_shown=trace._keys_shown
    )
    refresh.start()
    add_link = getattr(trace.span, "add_link", None)
    if add_link is not None and refresh.span.get_span_context().is_valid:
        add_link(refresh.span.get_span_context(), {"stampede.link": "refresh"})
    return refresh


def background(work: Callable[[], object]) -> Callable[[], object]:
    """``work`` (a blocking refresh, about to be handed to a worker) to run under a trace
    of its own if the current call is traced; else ``work`` itself."""
    refresh = _refresh_trace()
    if refresh is None:
        return work

    def traced() -> object:
        with refresh:
            return work()

    return traced


def abackground(work: Coroutine[Any, Any, T]) -> Coroutine[Any, Any, T]:
    """``background`` for a refresh awaited in a task of its own."""
    refresh = _refresh_trace()
    if refresh is None:
        return work

    async def traced() -> T:
        with refresh:
            return await work

    return traced()
