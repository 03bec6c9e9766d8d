"""Invalidations and write-throughs that wait for the transaction's commit (SQLAlchemy).

Each helper queues its action on the ``Session``: it runs after the session's outermost
transaction commits (``after_commit``; at once if the session has no transaction), and
is dropped if it rolls back (``after_rollback``). A failure to reach the cache raises
into the code that called ``commit()``: the rows are committed, and a cache that kept
the old value must not go unnoticed. See ``stampede._commit`` for why after, not before.

Actions queued inside a savepoint (``begin_nested``) that rolls back still run at the
outer commit: an extra invalidation costs one load, but a ``set_after_commit`` of a
rolled-back value would be wrong, so queue write-throughs outside savepoints.

``invalidate_on_change(Model, loader)`` opts one mapped class in: every flushed insert,
update and delete of an instance queues the invalidation of ``loader(*key(instance))``
(mapper events). ``session.execute(update(...))``, ``delete(...)``, bulk inserts and
Core statements run no mapper event: call ``invalidate_after_commit`` (or
``invalidate_tag_after_commit``) beside them.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from sqlalchemy import event
from sqlalchemy.orm import Session, object_session

from ._commit import Action, invalidation, run_all, tag_invalidation, write

_PENDING = "stampede.after_commit"
_installed = threading.Lock()
_listening = False


def _listen() -> None:
    """Install the session events once per process (on every Session)."""
    global _listening
    with _installed:
        if _listening:
            return
        event.listen(Session, "after_commit", _committed)
        event.listen(Session, "after_rollback", _rolled_back)
        _listening = True


def _committed(session: Session) -> None:
    actions = session.info.pop(_PENDING, None)
    if actions:
        run_all(actions)


def _rolled_back(session: Session) -> None:
    session.info.pop(_PENDING, None)


def _queue(session: Session, action: Action) -> None:
    if not session.in_transaction():
        run_all([action])
        return
    _listen()
    session.info.setdefault(_PENDING, []).append(action)


def invalidate_after_commit(session: Session, loader: Any, *args: Any, **kwargs: Any) -> None:
    """``loader.invalidate(*args, **kwargs)`` once ``session`` commits."""
    _queue(session, invalidation(loader, args, kwargs))


def set_after_commit(session: Session, loader: Any, value: Any, *args: Any, **kwargs: Any) -> None:
    """``loader.set(value, *args, **kwargs)`` once ``session`` commits."""
    _queue(session, write(loader, value, args, kwargs))


def invalidate_tag_after_commit(session: Session, layer: Any, tag: str, **fields: Any) -> None:
    """``layer.invalidate_tag(tag, **fields)`` once ``session`` commits."""
    _queue(session, tag_invalidation(layer, tag, fields))


def invalidate_on_change(
    mapped: type[Any], loader: Any, key: Callable[[Any], tuple[Any, ...]] = lambda instance: (instance.id,)
) -> Callable[[], None]:
    """Invalidate ``loader(*key(instance))`` after the commit of every flushed insert,
    update and delete of a ``mapped`` instance. Returns the function that stops it."""

    def changed(mapper: Any, connection: Any, instance: Any) -> None:
        session = object_session(instance)
        action = invalidation(loader, key(instance), {})
        if session is None:  # flushed by no session: nothing to wait for
            run_all([action])
        else:
            _queue(session, action)

    names = ("after_insert", "after_update", "after_delete")
    for name in names:
        event.listen(mapped, name, changed)

    def stop() -> None:
        for name in names:
            event.remove(mapped, name, changed)

    return stop
