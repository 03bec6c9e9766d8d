"""A layer's hot sets: what each loader's sampled calls (``hot_sample``) are recorded
into, and the warm starts, exports and imports that read them (``_warming``,
docs/budgets.md). Hot sets are read and recorded through the blocking store, and only a
store with the ``HotSetStore`` role keeps them: refused at decoration otherwise."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ._awarm import awarm
from ._core.hotset import HotSet
from ._core.store import HotSetStore, Roles, roles_of
from ._drivers.hotset import HotSampler, HotSetRecorder
from ._drivers.runner import Runner
from ._errors import ConfigError
from ._parts import LayerParts
from ._warm import warm
from ._warming import Progress, WarmReport, export_hot_sets, import_hot_sets


class HotSets:
    """``Stampede``'s hot sets and warm starts (the facade documents each)."""

    def __init__(self, parts: LayerParts) -> None:
        self._parts = parts
        blocking = parts.runner  # not the parts: the recorder's thread outlives no layer
        self.recorder = HotSetRecorder(lambda: _store_of(blocking), parts.events, parts.warn)

    def attach(self, loader: Any, template: str, many: bool) -> None:
        """Give ``loader`` its hot set (``_core.hotset``), and its sampling of calls into
        it under ``hot_sample``: refused at decoration where the store keeps none."""
        parts, settings = self._parts, loader.settings
        loader.hot_set = HotSet.of(
            parts.namespace, template, settings.hot_limit, settings.hot_period, settings.max_key_length, many
        )
        if not settings.hot_sample:
            return
        self.store("hot_sample")  # refused at decoration, not at the first sampled call
        loader._hot = HotSampler(loader.hot_set, settings.hot_sample, self.recorder)

    def warm(self, loaders: Sequence[Any], count: int, concurrency: int, on_progress: Progress | None) -> WarmReport:
        return warm(self.store("warm()"), self._parts.events, loaders, count, concurrency, on_progress)

    async def awarm(
        self, loaders: Sequence[Any], count: int, concurrency: int, on_progress: Progress | None
    ) -> WarmReport:
        return await awarm(self.store("awarm()"), self._parts.events, loaders, count, concurrency, on_progress)

    def export(self, loaders: Sequence[Any], count: int | None) -> dict[str, Any]:
        return export_hot_sets(self.store("export_hot_sets()"), loaders, count)

    def import_(self, snapshot: dict[str, Any], loaders: Sequence[Any]) -> int:
        return import_hot_sets(self.store("import_hot_sets()"), loaders, snapshot)

    def store(self, what: str) -> HotSetStore:
        """The store that keeps the hot sets, or a ``ConfigError`` saying what ``what``
        (a setting, or a method) needs."""
        parts = self._parts
        store = parts.runner.store if parts.runner is not None else None
        if store is None or Roles.HOT_SETS not in roles_of(store):
            raise ConfigError(
                f"{what} needs a blocking client (Stampede.from_url gives one; hot sets are read and "
                f"recorded through it) and a store that keeps hot sets; {parts.backend.name} has none"
            )
        return store


def _store_of(runner: Runner | None) -> Any:
    """The blocking store of a layer's hot sets (refused at decoration without one)."""
    if runner is None:
        raise ConfigError("hot sets need a blocking client")
    return runner.store
