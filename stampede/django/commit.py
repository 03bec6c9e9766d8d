"""Invalidations and write-throughs that wait for the transaction's commit (Django).

Each helper queues its action with ``transaction.on_commit``: it runs after the outermost
``atomic`` block commits (at once in autocommit), and is dropped if that block, or the
savepoint it was queued in, rolls back. If the cache cannot be reached, the failure is
logged at ERROR on the ``stampede.commit`` logger and raised into nothing: Django stops
running a transaction's hooks at the first that raises, so a failed invalidation would
cost every hook after it, other invalidations and the application's own. The row is
committed either way. See ``stampede._commit`` for why after, not before.

``invalidate_on_change(Model, loader)`` opts one model in: every ``save()`` and
``delete()`` of an instance queues the invalidation of ``loader(*key(instance))``.
``QuerySet.update()``, ``bulk_create``, ``bulk_update`` and raw SQL send no signal: call
``invalidate_on_commit`` (or ``invalidate_tag_on_commit``) beside them.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from django.db import transaction
from django.db.models.signals import post_delete, post_save

from .._commit import invalidation, run_logged, tag_invalidation, write
from .._errors import ConfigError

_connecting = threading.Lock()
_connected: set[str] = set()  # the dispatch_uid of each invalidate_on_change in place


def invalidate_on_commit(loader: Any, *args: Any, using: str | None = None, **kwargs: Any) -> None:
    """``loader.invalidate(*args, **kwargs)`` once the transaction on database ``using``
    commits."""
    action = invalidation(loader, args, kwargs)
    transaction.on_commit(lambda: run_logged([action]), using=using)


def set_on_commit(loader: Any, value: Any, *args: Any, using: str | None = None, **kwargs: Any) -> None:
    """``loader.set(value, *args, **kwargs)`` once the transaction commits: the committed
    row's value is written through, overtaking any load of the entry in flight."""
    action = write(loader, value, args, kwargs)
    transaction.on_commit(lambda: run_logged([action]), using=using)


def invalidate_tag_on_commit(layer: Any, tag: str, *, using: str | None = None, **fields: Any) -> None:
    """``layer.invalidate_tag(tag, **fields)`` once the transaction commits."""
    action = tag_invalidation(layer, tag, fields)
    transaction.on_commit(lambda: run_logged([action]), using=using)


def invalidate_on_change(
    model: type[Any], loader: Any, key: Callable[[Any], tuple[Any, ...]] = lambda instance: (instance.pk,)
) -> Callable[[], None]:
    """Invalidate ``loader(*key(instance))`` after the commit of every save or delete of a
    ``model`` instance (its post_save and post_delete signals). Returns the function that
    disconnects it."""

    def changed(sender: Any, instance: Any, using: str, **_: Any) -> None:
        invalidate_on_commit(loader, *key(instance), using=using)

    uid = f"stampede-invalidate-{id(loader)}-{id(model)}"
    with _connecting:
        if uid in _connected:
            raise ConfigError(
                f"invalidate_on_change({model.__qualname__}, {getattr(loader, '__qualname__', loader)!r}) is in "
                "place already (with the key function of its first call): call the function it returned to "
                "disconnect it first"
            )
        _connected.add(uid)
    post_save.connect(changed, sender=model, weak=False, dispatch_uid=uid)
    post_delete.connect(changed, sender=model, weak=False, dispatch_uid=uid)

    def disconnect() -> None:
        post_save.disconnect(sender=model, dispatch_uid=uid)
        post_delete.disconnect(sender=model, dispatch_uid=uid)
        with _connecting:
            _connected.discard(uid)

    return disconnect
