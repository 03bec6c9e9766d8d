"""What a layer tells about itself: the one seam that ``stats()``, the Prometheus and the
OpenTelemetry exporters (``stampede.prometheus``, ``stampede.otel``) and any observer of
your own are built on.

Three kinds of report, all made inline on the calling thread (or task), so an observer
must be quick, thread-safe, and must not block. An exception it raises is logged (rate
limited) and dropped, never handed to the caller:

* ``count(namespace, event, n)``: one of ``COUNTERS`` went up by ``n`` (what ``stats()``
  returns is the sum of these).
* ``began(namespace, measure)``: a load or a wait started (``MEASURES``).
* ``ended(namespace, measure, outcome, seconds)``: it ended, how (``OUTCOMES``), and how
  long it took. Every ``began`` has exactly one ``ended``.

And two an observer may have or not (``BudgetObserver``, each method on its own):
``budget(namespace, budget, queued, running)``, the loads of the load budget named
``budget`` in this process that wait for a slot (``queued``) and that hold one
(``running``) went up by these (down, if negative); summed over a fleet's processes,
they are the budget's queue and its loads. And ``budget_waited(namespace, budget,
outcome, seconds)``: a load's wait for a slot of that budget ended, how (the
``budget_wait`` outcomes) and after how long, told beside ``ended`` of ``budget_wait``,
which says it per namespace.

A load is one call of the loader, leased or not. A wait is a caller that did not load
but took the value of another caller's read or load: a caller in this process joining
the one that leads for the key (``collapsed``), or the leader waiting on another
process's lease (``lock_waits``). It ends with the value, with a takeover (the lease
came free with nothing written: this caller loads), at the wait timeout, with an error
(the leader's error, a failed server), or with a retry (the value it waited for
predated an invalidation: the caller reads again). So in a stampede of N callers of one
cold key, anywhere, there is one load and N-1 waits.

No report carries a key: labels of metrics built on this stay bounded.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Literal, Protocol

DESCRIPTIONS: dict[str, str] = {  # what each counter counts (the help text of exported metrics)
    "hits": "A read found a value",
    "null_hits": "A read found the null sentinel: the loader had returned None",
    "misses": "A read found nothing usable",
    "loads": "The loader was called",
    "batch_reads": "A many-key call read the entries it leads together (hits and misses count each entry)",
    "batch_loads": "A many-key loader was called (loads counts each id it was asked for)",
    "collapsed": "A caller shared another caller's read or load in this process instead of its own",
    "lock_waits": "A caller found the distributed lock held by another process and waited",
    "takeovers": "A waiter took the lock after the holder's lease ran out",
    "wait_timeouts": "A wait exceeded wait_timeout",
    "redis_errors": "Redis failed to answer a command",
    "loader_errors": "The loader raised",
    "stale_writes_prevented": "A load finished after its lease was lost; its value was not written",
    "evicted_leases": "A prevented write whose lease the server dropped within its term, with no invalidation",
    "corrupt_values": "Bytes at a key were not a readable envelope; treated as a miss",
    "stale_hits": "A read returned a value past its ttl at once, within stale_while_revalidate",
    "stale_on_error": "A value past its ttl was returned instead of the loader's error (stale_if_error)",
    "refreshes": "A background refresh took the lease and loaded",
    "early_refreshes": "A hit started a background refresh before ttl (early_refresh)",
    "refresh_errors": "A background refresh's loader raised; its stale value stays",
    "refreshes_skipped": "A background refresh was not started: the limit of refreshes at once was reached",
    "near_hits": "A call was served from the near cache, with no I/O",
    "near_fills": "A value read from Redis was copied into the near cache",
    "near_invalidations": "A near-cache copy was dropped because its key changed or was invalidated",
    "near_flushes": "Every near-cache copy was dropped: the stream (re)connected, or the database was flushed",
    "near_lease_lapses": "The near cache's lease ran out or was revoked: calls read Redis until it is renewed",
    "sets": "set() wrote a value over the entry, overtaking any load in flight",
    "sets_overtaken": "set() wrote nothing: a load begun after it, or a tag invalidation, came first",
    "refresh_calls": "refresh() was called: one load now, shared with every refresh and miss at the same moment",
    "not_modified": "A refreshing loader returned NOT_MODIFIED: the value was kept, fresh again, not rewritten",
    "uncached_results": "A loader returned Cached(store=False): its callers got the value, nothing was kept",
    "load_timeouts": "A caller gave up on a load past load_timeout (LoadTimeout, or its stale value)",
    "soft_timeouts": "A caller served its stale value once a load ran past load_soft_timeout",
    "compressed_bytes_saved": "Bytes that compression (compress_above) saved on values written",
    "tag_invalidations": "invalidate_tag() or expire_tag() completed",
    "tag_entries_dropped": "An entry was invalidated (or expired) by a tag invalidation",
    "breaker_opened": "The circuit breaker opened: commands to a server fail at once for breaker_cooldown",
    "breaker_closed": "An open circuit breaker closed: the server answered a probe",
    "budget_timeouts": "A load waited wait_timeout for a slot of its load budget and did not run (BudgetTimeout)",
    "budget_unreachable": "A load could not reach its budget's store: it took a slot of this process's own count",
    "hot_set_errors": "Adding sampled calls to a hot set (hot_sample) failed: that sample was lost",
    "warm_cached": "A warm start found a hot call's value cached: not called",
    "warm_loaded": "A warm start called a hot call's loader (loaded here, or by another process at once)",
    "warm_failed": "A warm start's call of a loader raised",
    "budget_leases_lost": "A load that waited for a budget slot found its lease taken (invalidated): it did not run",
    "consistency_match": "A sampled hit (verify_sample) was loaded again: the loader returned the value served",
    "consistency_mismatch": "A sampled hit was loaded again: another value, while the entry still held the one served",
    "consistency_superseded": "A sampled hit was loaded again, and the entry changed meanwhile: no verdict",
    "consistency_error": "A sampled hit's verification failed (the loader raised, or its value did not encode)",
    "consistency_skipped": "A sampled hit was not verified: the limit of verifications at once was reached",
    "streams_led": "A streamed load ran its generator, relaying each chunk to its listeners",
    "streams_joined": "A streamed call followed another caller's run, receiving its chunks as they were made",
    "streams_replayed": "A streamed call found the whole stream kept and replayed it",
    "streams_interrupted": "A streamed load stopped before its end (raised, cancelled, or left): nothing was kept",
    "streams_restarted": 'A streamed call\'s run stopped short and it began another (on_leader_failure="restart")',
    "streams_not_kept": "A streamed load grew past max_value_bytes: relayed to its listeners, not kept",
    "stream_chunks": "A chunk a streamed load made was relayed",
    "stream_bytes": "Bytes of the chunks streamed loads relayed",
}
COUNTERS = tuple(DESCRIPTIONS)

Measure = Literal["load", "wait", "budget_wait", "first_chunk"]
MEASURES: tuple[Measure, ...] = ("load", "wait", "budget_wait", "first_chunk")

OUTCOMES: dict[Measure, tuple[str, ...]] = {
    # the loader returned a value, returned None (the null sentinel is cached), or raised
    "load": ("value", "none", "error"),
    # see the module's docstring
    "wait": ("value", "takeover", "timeout", "error", "retry"),
    # a load waited for a slot of its budget (max_concurrent_loads): it took one, gave up
    # at wait_timeout, failed on the store, took one of its process's own (store down),
    # or was told with its turn that an invalidation had taken its entry's lease
    "budget_wait": ("slot", "timeout", "error", "local", "lease_lost"),
    # a streamed call's first chunk: the call ran the stream, followed another's run,
    # replayed the kept stream, ran it alone (the store down), or none came (an empty
    # stream, an error, or the caller stopped before it)
    "first_chunk": ("led", "joined", "replayed", "uncollapsed", "empty", "error"),
}


class Observer(Protocol):
    """Told what a layer does (``Stampede(observers=[...])`` or ``layer.observe()``)."""

    def count(self, namespace: str, event: str, n: int) -> None: ...

    def began(self, namespace: str, measure: Measure) -> None: ...

    def ended(self, namespace: str, measure: Measure, outcome: str, seconds: float) -> None: ...


class BudgetObserver(Protocol):
    """An observer that also hears of load budgets (see the module's docstring). Each
    method is called only if the observer has it."""

    def budget(self, namespace: str, budget: str, queued: int, running: int) -> None: ...

    def budget_waited(self, namespace: str, budget: str, outcome: str, seconds: float) -> None: ...


class Reporter(Protocol):
    """What the flow and the drivers report to: one layer's observers, its namespace
    already bound (``_drivers.observe.Events``)."""

    def incr(self, name: str, n: int = 1) -> None: ...

    def began(self, measure: Measure) -> None: ...

    def ended(self, measure: Measure, outcome: str, seconds: float) -> None: ...

    def budget(self, name: str, queued: int, running: int) -> None: ...

    def budget_waited(self, name: str, outcome: str, seconds: float) -> None: ...


class Wait:
    """One caller's wait, reported when it begins and once when it ends. ``end`` after
    the first (or before ``begin``) does nothing, so every way out of a wait may call it."""

    __slots__ = ("_clock", "_events", "_since")

    def __init__(self, events: Reporter, clock: Callable[[], float]) -> None:
        self._events = events
        self._clock = clock
        self._since: float | None = None

    def begin(self) -> None:
        if self._since is None:
            self._since = self._clock()
            self._events.began("wait")

    def end(self, outcome: str) -> None:
        if self._since is not None:
            self._events.ended("wait", outcome, self._clock() - self._since)
            self._since = None


class _Unobserved(Wait):
    """The wait of a caller no observer hears of: nothing to report and no state to
    keep, so one serves every caller (a thousand callers joining one load need not
    make a thousand objects)."""

    __slots__ = ()

    def __init__(self) -> None:
        pass

    def begin(self) -> None:
        pass

    def end(self, outcome: str) -> None:
        pass


UNOBSERVED: Wait = _Unobserved()


LOGGERS = {
    "stampede": "configuration of a layer",
    "stampede.cache": "what calls did: loads, waits, takeovers, stale values, unreadable values, observers",
    "stampede.backend": "the server: failed commands, the circuit breaker",
    "stampede.wakeups": "the subscriber connections that wake waiters",
    "stampede.lock": "named locks and the lease watchdog",
    "stampede.near": "the near cache's tracking connection and lease",
}
"""One logger per concern; all below ``stampede``, so configuring that one configures all."""


def log_extra(key: str, outcome: str, namespace: str = "") -> dict[str, str]:
    """Structured fields for a log record about one entry, for JSON log handlers:
    ``stampede_namespace``, ``stampede_key_hash`` (16 hex digits of the key's SHA-256: a
    stable handle to group by, without the key's text, which may hold user data) and
    ``stampede_outcome`` (what happened, in a word: ``wait_timeout``, ``takeover``...)."""
    if key and not namespace:
        namespace = key.partition(":{")[0]
    return {
        "stampede_namespace": namespace,
        "stampede_key_hash": hashlib.sha256(key.encode(errors="surrogatepass")).hexdigest()[:16] if key else "",
        "stampede_outcome": outcome,
    }
