"""What a layer's rooms share: ``Stampede`` builds one ``LayerParts`` and hands it to
each room (making loaders, locks, invalidation, hot sets), so that no room reads another's
attributes, nor the layer's."""

from __future__ import annotations

from dataclasses import dataclass

from ._core.backend import Backend
from ._core.config import Settings
from ._core.store import AsyncStore, Store
from ._drivers.arunner import AsyncRunner
from ._drivers.near import NearCache
from ._drivers.observe import Events, RateLimitedLog
from ._drivers.runner import Runner
from ._drivers.watchdog import Watchdog
from ._errors import ConfigError


@dataclass(eq=False)
class LayerParts:
    """A layer's backend and what performs on it, made once by ``Stampede.__init__``.
    ``runner`` is None on a layer with no blocking store, ``async_runner`` on one with no
    store for event loops, ``near`` without a near cache."""

    namespace: str
    settings: Settings
    backend: Backend
    runner: Runner | None
    async_runner: AsyncRunner | None
    near: NearCache | None
    events: Events
    warn: RateLimitedLog
    watchdog: Watchdog

    def forget(self, key: str) -> None:
        """After an invalidation: callers of every kind in this process read afresh."""
        if self.near is not None:
            self.near.drop([key])
        if self.runner is not None:
            self.runner.forget(key)
        if self.async_runner is not None:
            self.async_runner.forget(key)

    def blocking_runner(self, method: str, twin: str) -> Runner:
        """The blocking runner, or a ``ConfigError`` naming ``twin``, the method to call."""
        if self.runner is None:
            raise ConfigError(f"{method}() needs a blocking client: use {twin}() in the event loop")
        return self.runner

    def blocking_store(self, method: str, twin: str) -> Store:
        return self.blocking_runner(method, twin).store

    def loop_runner(self, method: str, twin: str) -> AsyncRunner:
        """The runner of event loops, or a ``ConfigError`` naming ``twin``."""
        if self.async_runner is None:
            raise ConfigError(f"{method}() needs an asyncio client: use {twin}()")
        return self.async_runner

    def loop_store(self, method: str, twin: str) -> AsyncStore:
        """The running event loop's store."""
        return self.loop_runner(method, twin).loop_store()
