"""Cache actions a database transaction asks for, to run once it has committed.

Invalidating inside the transaction lets a reader re-cache the old row between the
invalidation and the commit (its load reads the row as it was before the commit, and
nothing invalidates after it). Invalidating after a rollback drops a good value. So the
framework helpers (``stampede.django.commit``, ``stampede.sqlalchemy``) queue these
actions on the transaction and run them after the outermost commit: a load that began
before the commit and writes after it is then overtaken by the invalidation (the
stale-set guard), and the next caller loads the committed row.

The actions are blocking calls: a commit hook runs in the committing thread, with no
event loop of the layer's. An async loader is refused when the action is queued: a
blocking loader of the same template names the same entry.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from ._acached import AsyncCachedLoader
from ._errors import ConfigError
from ._loader import AsyncBoundLoader

log = logging.getLogger("stampede.commit")

Action = Callable[[], Any]


def _blocking(loader: Any, what: str) -> Any:
    if isinstance(loader, (AsyncCachedLoader, AsyncBoundLoader)):
        raise ConfigError(
            f"{what} runs in the committing thread, which has no event loop of the layer's: "
            "give a blocking loader of the same template (it names the same entries)"
        )
    if not callable(getattr(loader, "invalidate", None)):
        raise ConfigError(f"{what} takes a cached loader, got {loader!r}")
    return loader


def invalidation(loader: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Action:
    """``loader.invalidate(*args, **kwargs)``, its key checked now (a bad argument raises
    in the transaction, not after the commit)."""
    _blocking(loader, "an invalidation after the commit").key(*args, **kwargs)
    return lambda: loader.invalidate(*args, **kwargs)


def write(loader: Any, value: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Action:
    """``loader.set(value, *args, **kwargs)``."""
    _blocking(loader, "a write after the commit").key(*args, **kwargs)
    return lambda: loader.set(value, *args, **kwargs)


def tag_invalidation(layer: Any, tag: str, fields: dict[str, Any]) -> Action:
    """``layer.invalidate_tag(tag, **fields)``."""
    return lambda: layer.invalidate_tag(tag, **fields)


def run_all(actions: list[Action]) -> None:
    """Run every action, even past one that fails, then raise the first failure: the
    commit stands, and a cache that could not be invalidated must not go unnoticed."""
    failure: BaseException | None = None
    for action in actions:
        try:
            action()
        except Exception as error:
            log.error("a cache action after the commit failed: %r", error)
            failure = failure or error
    if failure is not None:
        raise failure


def run_logged(actions: list[Action]) -> None:
    """Run every action; log each failure at ERROR (logger ``stampede.commit``) and raise
    none. For hosts that stop running a transaction's hooks at the first that raises
    (Django's ``on_commit``): one cache that cannot be reached must not cost the other
    invalidations, nor the application's own hooks."""
    for action in actions:
        try:
            action()
        except Exception as error:
            log.error("a cache action after the commit failed, the cache may keep the old value: %r", error)
