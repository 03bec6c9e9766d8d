"""A layer's options, declared once for ``Stampede(...)`` and ``Stampede.from_url(...)``.

``LayerOptions`` is what a type checker reads: the options every layer takes, then every
setting (``LayerSettings``). ``Options`` holds the options' defaults and checks them
(the settings are ``Settings``'s). ``tests/tools/test_settings.py`` keeps the two alike,
as it keeps the settings' two faces alike, so that an option added to one and not the
other fails the suite rather than a user's type check.
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Iterable, Mapping
from typing import Any

from ._core.codec import Serializer
from ._core.config import SETTING_NAMES, LayerSettings, check_count, check_namespace, check_seconds
from ._core.near import NEAR_LEASE
from ._core.observer import Observer
from ._errors import ConfigError
from ._redlock import Redlock

if typing.TYPE_CHECKING:
    from kazoo.client import KazooClient
    from opentelemetry.metrics import MeterProvider
    from opentelemetry.trace import TracerProvider


class LayerOptions(LayerSettings, total=False):
    """The keyword arguments of ``Stampede(...)`` and ``Stampede.from_url(...)``, typed
    for a type checker (PEP 692): the options below, then every setting. What each
    option means, and its default, is ``Options``'s."""

    namespace: str
    serializer: Serializer | None
    redlock: Redlock | None
    zookeeper: KazooClient | str | None
    max_entries: int
    background_refreshes: int
    near_cache_entries: int
    near_cache_bytes: int
    near_lease: float
    observers: Iterable[Observer]
    tracer_provider: TracerProvider | None
    meter_provider: MeterProvider | None


@dataclasses.dataclass(frozen=True)
class Options:
    """A layer's options, checked. Every setting is ``Settings``'s."""

    namespace: str = "stampede"  # the prefix of every key the layer writes
    serializer: Serializer | None = None  # values' encoding (None: JSON, by orjson)
    redlock: Redlock | None = None  # every load's lease on a majority of these servers too
    zookeeper: KazooClient | str | None = None  # every load's lease as a ZooKeeper node too
    max_entries: int = 10_000  # the embedded store's bound
    background_refreshes: int = 8  # refreshes under way at once, per process (or loop)
    near_cache_entries: int = 10_000  # the near cache's copies, at most
    near_cache_bytes: int = 64 * 1024 * 1024  # and their encoded bytes, at most
    near_lease: float = NEAR_LEASE  # seconds a near cache's lease lasts unrenewed
    observers: Iterable[Observer] = ()  # told what the layer does, beside its counters
    tracer_provider: TracerProvider | None = None  # OpenTelemetry's, for the layer's spans
    meter_provider: MeterProvider | None = None  # OpenTelemetry's, for the layer's metrics

    def __post_init__(self) -> None:
        object.__setattr__(self, "namespace", check_namespace(self.namespace))
        check_count("max_entries", self.max_entries)
        check_count("background_refreshes", self.background_refreshes)
        check_count("near_cache_entries", self.near_cache_entries)
        check_count("near_cache_bytes", self.near_cache_bytes, 1024)
        if check_seconds("near_lease", self.near_lease) < 0.01:
            raise ConfigError(f"near_lease must be at least 0.01 s, got {self.near_lease!r}")

    @classmethod
    def apart(cls, given: Mapping[str, Any]) -> tuple[Options, dict[str, Any]]:
        """``given`` keywords as the options they name and the settings left (unknown
        names are the settings' to refuse, naming the closest of either)."""
        options = {name: value for name, value in given.items() if name in OPTION_NAMES}
        return cls(**options), {name: value for name, value in given.items() if name not in OPTION_NAMES}


OPTION_NAMES = frozenset(field.name for field in dataclasses.fields(Options))
LAYER_KEYWORDS = OPTION_NAMES | SETTING_NAMES
