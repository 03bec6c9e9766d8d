"""Settings of a layer or of one loader: a frozen dataclass checked when it is built."""

from __future__ import annotations

import dataclasses
import difflib
import math
import re
import warnings
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, TypedDict

from .._errors import ConfigError
from .compression import compressor

Policy = Literal["load", "raise"]
NearMode = bool | Literal["shared"]
Compression = Literal["zlib", "zstd"]

_NAMESPACE = re.compile(r"[A-Za-z0-9_.\-]+(:[A-Za-z0-9_.\-]+)*")

MAX_SECONDS = 1e9
"""The longest duration a setting may give (about 31 years): Redis refuses an expiry
whose milliseconds overflow its clock (``ttl=1e17`` fails every write), and a thread
cannot wait longer than ``threading.TIMEOUT_MAX``. Refused when the setting is given."""


@dataclass(frozen=True)
class Settings:
    """How long values live and how long callers wait. Every duration is in seconds."""

    ttl: float = 300.0
    """Lifetime of a loaded value, before jitter."""
    null_ttl: float = 30.0
    """Lifetime of the null sentinel written when the loader returns None."""
    lock_ttl: float = 10.0
    """Lease of the distributed lock; the watchdog renews it every lock_ttl/3 while the loader runs."""
    wait_timeout: float = 30.0
    """The longest a caller waits for another caller's load before ``on_wait_timeout`` applies."""
    jitter: float = 0.1
    """Each TTL is scaled by a random factor in [1 - jitter, 1 + jitter] so entries loaded together expire apart."""
    on_wait_timeout: Policy = "load"
    """After wait_timeout: "load" calls the loader (value returned, not cached); "raise" raises WaitTimeout."""
    on_backend_error: Policy = "load"
    """When the store fails (Redis, PostgreSQL, a lock service): "load" calls the loader
    (fail open, value not cached); "raise" raises BackendUnavailable. Formerly
    ``on_redis_error``, a name still taken with a DeprecationWarning."""
    recheck_interval: float = 1.0
    """A waiter re-checks at least this often even without a notification, which bounds a lost message."""
    max_key_length: int = 200
    """Longer keys keep a readable prefix and end in a hash of the whole key."""
    inline_value_limit: int = 65536
    """Values up to this many encoded bytes travel inside the wake-up message; larger ones are read back."""
    max_value_bytes: int = 4 * 1024 * 1024
    """A value that encodes to more bytes is not cached: ValueTooLarge is raised instead."""
    breaker_threshold: int = 5
    """After this many failures in a row to reach Redis, the circuit opens (0: never)."""
    breaker_cooldown: float = 5.0
    """While open, the layer does not ask Redis for this long; then one command probes."""
    stale_while_revalidate: float = 0.0
    """For this long past ttl a caller gets the old value at once while one refresh runs in the background."""
    stale_if_error: float = 0.0
    """For this long past ttl a caller gets the old value instead of the loader's error."""
    early_refresh: float = 0.0
    """XFetch's beta: a hit refreshes in the background when now - duration * beta * ln(random()) passes the
    expiry (0: off; 1 is the paper's choice, larger refreshes earlier)."""
    stale_retry_interval: float = 1.0
    """While a stale value stands in for a failing loader, it is retried at most this often per key, across
    processes: the failed holder keeps the lease this long (see docs/freshness.md)."""
    near_cache: NearMode = False
    """Serve fresh values from a copy in this process, kept exact across processes (docs/near-cache.md): True
    decodes each hit into an object of the caller's own; "shared" hands every caller one object."""
    near_ttl: float = 30.0
    """A near-cache copy lives at most this long (and never past its value's freshness) before Redis is read."""
    load_timeout: float = 0.0
    """The longest any caller waits for one load (its own, or another's it joined): then it gets LoadTimeout, or
    its stale value under stale_if_error (0: off). The load goes on and writes when it ends; an async loader is
    cancelled instead, unless cancel_on_timeout is False (see docs/usage.md)."""
    load_soft_timeout: float = 0.0
    """With a stale value in hand (stale_if_error), a caller serves it once a load has run this long, and the
    load goes on to write when it ends (0: off). Shorter than load_timeout."""
    cancel_on_timeout: bool = True
    """An async loader that runs past load_timeout is cancelled (a blocking loader cannot be)."""
    compress_above: int = 0
    """Payloads longer than this many bytes are compressed (0: never); a reader that cannot expand one treats it as
    a miss. Decompression stops at max_value_bytes."""
    compression: Compression = "zlib"
    """"zlib" (the standard library) or "zstd" (the zstd extra): how payloads past compress_above are compressed."""
    max_batch: int = 500
    """A many-key call asks the loader for at most this many ids at once, and the store for as many entries in
    one round trip; a larger request is split (under SQL's IN-list limits: Oracle's 1000, SQLite's old 999)."""
    verify_sample: float = 0.0
    """The fraction of hits (0 to 1) loaded again in the background and compared with the value served, counted
    as consistency checks (docs/operating.md): a measure of how often the cache disagrees with the database. 0:
    off; 0.001 verifies one hit in a thousand."""
    verify_grace: float = 0.5
    """A verification whose value differs waits this long for the entry to change (a writer's invalidation on its
    way) before it counts a mismatch."""
    max_concurrent_loads: int = 0
    """A load budget (docs/budgets.md): at most this many loads at once, counted across every process sharing the
    store (0: no budget). On a layer, one budget for all its loaders; on a loader, a budget of its own, or the one
    load_budget names. A load holds its key's lease, then waits up to wait_timeout for a slot (BudgetTimeout)."""
    load_budget: str = ""
    """The name of a budget several loaders share (each giving the same max_concurrent_loads)."""
    hot_sample: float = 0.0
    """The fraction of calls (0 to 1) recorded in the loader's hot set in the store, the calls made most, which
    Stampede.warm loads first on a cold start (docs/budgets.md). 0: off; 0.01 records one call in a hundred.
    Calls whose arguments are not plain JSON are not recorded."""
    hot_limit: int = 10_000
    """The most calls a loader's hot set keeps per period (the least counted go)."""
    hot_period: float = 3600.0
    """Seconds a hot set counts calls over: it is the current period's counts plus half the last one's, so a
    key not called for two periods has fallen out."""
    trace_keys: bool = False
    """Spans of calls (OpenTelemetry, once the application configures a tracer provider) carry the entry's key as
    stampede.key. Off by default: keys may hold user data, and an attribute of unbounded values (docs/operating.md)."""

    @property
    def stale_window(self) -> float:
        """How long a value stays in the store past its ttl: the longer of the stale windows."""
        return max(self.stale_while_revalidate, self.stale_if_error)

    @property
    def reads_ttl(self) -> bool:
        """Whether a hit must know how long its value has left (any freshness setting on)."""
        return bool(self.stale_while_revalidate or self.stale_if_error or self.early_refresh)

    @property
    def reads_failing(self) -> bool:
        """Whether a hit must know if the loader is failing: a value may be past
        stale_while_revalidate and still within stale_if_error."""
        return self.stale_if_error > self.stale_while_revalidate

    def __post_init__(self) -> None:
        for name in ("ttl", "null_ttl", "lock_ttl", "wait_timeout", "recheck_interval", "breaker_cooldown"):
            _positive(name, getattr(self, name))
        if self.lock_ttl < 0.05:
            raise ConfigError(f"lock_ttl must be at least 0.05 s, got {self.lock_ttl!r}")
        if not _is_number(self.jitter) or not 0 <= self.jitter <= 0.5:
            raise ConfigError(f"jitter must be a number from 0 to 0.5, got {self.jitter!r}")
        for name in ("stale_while_revalidate", "stale_if_error", "load_timeout", "load_soft_timeout"):
            check_seconds(name, getattr(self, name), zero_allowed=True)
        check_seconds("stale_retry_interval", self.stale_retry_interval)
        check_seconds("near_ttl", self.near_ttl)
        check_seconds("verify_grace", self.verify_grace, zero_allowed=True)
        if not _is_number(self.verify_sample) or not 0 <= self.verify_sample <= 1:
            raise ConfigError(f"verify_sample must be a fraction from 0 (off) to 1, got {self.verify_sample!r}")
        if not _is_number(self.hot_sample) or not 0 <= self.hot_sample <= 1:
            raise ConfigError(f"hot_sample must be a fraction from 0 (off) to 1, got {self.hot_sample!r}")
        check_seconds("hot_period", self.hot_period)
        if self.load_soft_timeout and self.load_timeout and self.load_soft_timeout >= self.load_timeout:
            raise ConfigError(
                f"load_soft_timeout ({self.load_soft_timeout}) must be shorter than load_timeout ({self.load_timeout})"
            )
        if self.load_timeout > self.wait_timeout:
            raise ConfigError(
                f"load_timeout ({self.load_timeout}) is longer than wait_timeout ({self.wait_timeout}): a caller "
                "waiting for another's load would give up and load again while that load still runs; give "
                "wait_timeout at least load_timeout"
            )
        compressor(self.compression)  # a ConfigError naming what to install, if it cannot be used
        if not isinstance(self.load_budget, str):
            raise ConfigError(f"load_budget must be a str (a budget's name), got {self.load_budget!r}")
        if not isinstance(self.trace_keys, bool):
            raise ConfigError(f"trace_keys must be True or False, got {self.trace_keys!r}")
        if not isinstance(self.cancel_on_timeout, bool):
            raise ConfigError(f"cancel_on_timeout must be True or False, got {self.cancel_on_timeout!r}")
        if self.near_cache not in (True, False, "shared") or not isinstance(self.near_cache, (bool, str)):
            raise ConfigError(f'near_cache must be True, False or "shared", got {self.near_cache!r}')
        if not _is_number(self.early_refresh) or not 0 <= self.early_refresh <= 100:
            raise ConfigError(f"early_refresh must be a number from 0 (off) to 100, got {self.early_refresh!r}")
        for name in ("on_wait_timeout", "on_backend_error"):
            if getattr(self, name) not in ("load", "raise"):
                raise ConfigError(f'{name} must be "load" or "raise", got {getattr(self, name)!r}')
        for name, low in (("max_key_length", 64), ("inline_value_limit", 0), ("max_value_bytes", 64),
                          ("breaker_threshold", 0), ("max_batch", 1), ("compress_above", 0),
                          ("max_concurrent_loads", 0), ("hot_limit", 1)):  # fmt: skip
            check_count(name, getattr(self, name), low)

    def replace(self, *, stacklevel: int = 2, **changes: Any) -> Settings:
        """A copy with ``changes`` applied (None values ignored), validated like a new one."""
        changes = renamed({name: value for name, value in changes.items() if value is not None}, stacklevel)
        refuse_unknown(changes, SETTING_NAMES)
        return dataclasses.replace(self, **changes) if changes else self


SETTING_NAMES = frozenset(field.name for field in dataclasses.fields(Settings))


class LoaderSettings(TypedDict, total=False):
    """The settings one loader may give for itself (``cached_loader(...)``), as keyword
    arguments typed for a type checker (PEP 692). What each means, and its default, is
    ``Settings``'s. ``tests/tools/test_settings.py`` keeps the two alike."""

    ttl: float
    null_ttl: float
    lock_ttl: float
    wait_timeout: float
    on_wait_timeout: Policy
    on_backend_error: Policy
    on_redis_error: Policy  # the old name of on_backend_error: taken, with a DeprecationWarning
    max_value_bytes: int
    stale_while_revalidate: float
    stale_if_error: float
    early_refresh: float
    stale_retry_interval: float
    near_cache: NearMode
    near_ttl: float
    load_timeout: float
    load_soft_timeout: float
    cancel_on_timeout: bool
    compress_above: int
    compression: Compression
    verify_sample: float
    verify_grace: float
    max_concurrent_loads: int
    load_budget: str
    hot_sample: float
    hot_limit: int
    hot_period: float


class ManyLoaderSettings(LoaderSettings, total=False):
    """The settings a loader of many ids may give for itself (``cached_loader_many(...)``)."""

    max_batch: int


class LayerSettings(ManyLoaderSettings, total=False):
    """Every setting: a layer's defaults (``Stampede(...)``, ``Stampede.from_url(...)``)."""

    jitter: float
    recheck_interval: float
    max_key_length: int
    inline_value_limit: int
    breaker_threshold: int
    breaker_cooldown: float
    trace_keys: bool


class StreamSettings(TypedDict, total=False):
    """The settings a streamed loader may give for itself (``cached_stream(...)``): those
    a run reads. Its freshness, near cache, budgets and load timeouts are not a stream's."""

    ttl: float
    lock_ttl: float
    wait_timeout: float
    on_backend_error: Policy
    max_value_bytes: int
    compress_above: int
    compression: Compression


LOADER_SETTING_NAMES = frozenset(LoaderSettings.__optional_keys__)
STREAM_SETTING_NAMES = frozenset(StreamSettings.__optional_keys__)
MANY_LOADER_SETTING_NAMES = frozenset(ManyLoaderSettings.__optional_keys__)


def refuse_unknown(given: Iterable[str], known: Iterable[str]) -> None:
    """Raise ``ConfigError`` for the names in ``given`` that are not ``known`` settings,
    naming the closest known one of each (a typo must not pass as a default)."""
    known = sorted(set(known) | set(RENAMED))
    unknown = sorted(set(given) - set(known))
    if not unknown:
        return
    hints = []
    for name in unknown:
        close = difflib.get_close_matches(name, known, n=1)
        hints.append(f"{name!r} (did you mean {close[0]!r}?)" if close else repr(name))
    raise ConfigError(f"unknown setting(s): {', '.join(hints)}")


RENAMED = {"on_redis_error": "on_backend_error"}
"""Settings under an old name: taken, with a DeprecationWarning naming the new one."""


def renamed(settings: Mapping[str, Any], stacklevel: int) -> dict[str, Any]:
    """``settings`` with old names replaced by new ones, warning once per old name given.
    ``stacklevel`` counts as ``warnings.warn``'s does, from the function calling this one."""
    named = dict(settings)
    for old, new in RENAMED.items():
        if old in named:
            if new in named:
                raise ConfigError(f"{old} is the old name of {new}: give {new} only")
            warnings.warn(f"{old} is deprecated: use {new}", DeprecationWarning, stacklevel=stacklevel + 1)
            named[new] = named.pop(old)
    return named


def check_namespace(namespace: str) -> str:
    """Return ``namespace`` if it can prefix keys safely: no braces, spaces or empty parts."""
    if not isinstance(namespace, str) or not _NAMESPACE.fullmatch(namespace):
        raise ConfigError(f"namespace must be letters, digits, '_', '.', '-' in ':'-separated parts, got {namespace!r}")
    return namespace


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _positive(name: str, value: object) -> None:
    check_seconds(name, value)


def check_seconds(name: str, value: object, zero_allowed: bool = False) -> float:
    """``value`` if it is a usable duration: a positive number of seconds (or 0, if
    ``zero_allowed``: off), at most MAX_SECONDS."""
    usable = _is_number(value) and (0 <= value if zero_allowed else 0 < value) and value <= MAX_SECONDS  # type: ignore[operator]
    if not usable:
        kind = "a number of seconds from 0 (off)" if zero_allowed else "a positive number of seconds"
        raise ConfigError(f"{name} must be {kind}, at most {MAX_SECONDS:g}, got {value!r}")
    return float(value)  # type: ignore[arg-type]


def check_count(name: str, value: object, low: int = 1) -> int:
    """``value`` if it is an int (not a bool) of at least ``low``."""
    if not isinstance(value, int) or isinstance(value, bool) or value < low:
        raise ConfigError(f"{name} must be an integer >= {low}, got {value!r}")
    return value
