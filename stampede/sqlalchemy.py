"""Invalidations and write-throughs that wait for the transaction's commit (SQLAlchemy).

Each helper queues its action on the ``Session``: it runs after the session's outermost
transaction commits (at once if the session has no transaction), and is dropped if that
transaction ends any other way (a rollback, or ``close()`` without a commit). A failure
to reach the cache raises into the code that called ``commit()``: the rows are
committed, and a cache that kept the old value must not go unnoticed. See
``stampede._commit`` for why after, not before.

Savepoints (``begin_nested``): SQLAlchemy sends ``after_commit`` when a savepoint is
released too, long before the rows are committed, so an action is owned by the
innermost savepoint open when it was queued. Releasing that savepoint hands its actions
to the enclosing one (or to the transaction); rolling it back drops them, and only
them: the change they were queued for never happened. The outermost commit runs what is
left, in the order it was queued.

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
        event.listen(Session, "after_transaction_end", _ended)
        _listening = True


Queued = list[tuple[Any, Action]]  # (the savepoint that owns it, or None: the transaction; the action)


def _committed(session: Session) -> None:
    """A savepoint was released (its actions pass to the enclosing one), or the outermost
    transaction committed: run every action left."""
    queued: Queued | None = session.info.get(_PENDING)
    if not queued:
        return
    released = session.get_nested_transaction()
    if released is not None:
        enclosing = _enclosing_savepoint(released)
        session.info[_PENDING] = [(enclosing if owner is released else owner, action) for owner, action in queued]
        return
    del session.info[_PENDING]
    run_all([action for _, action in queued])


def _ended(session: Session, transaction: Any) -> None:
    """A transaction ended. What it still owns was not committed: drop it (a rolled-back
    savepoint's own actions; everything, for the outermost transaction)."""
    queued: Queued | None = session.info.get(_PENDING)
    if not queued:
        return
    if transaction.parent is None:
        del session.info[_PENDING]
    elif transaction.nested:
        session.info[_PENDING] = [(owner, action) for owner, action in queued if not _within(owner, transaction)]


def _enclosing_savepoint(savepoint: Any) -> Any:
    """The nearest savepoint around ``savepoint``, or None (the transaction itself)."""
    parent = savepoint.parent
    while parent is not None and not parent.nested:
        parent = parent.parent
    return parent


def _within(owner: Any, transaction: Any) -> bool:
    """Whether the savepoint ``owner`` is ``transaction`` or one inside it."""
    while owner is not None:
        if owner is transaction:
            return True
        owner = owner.parent
    return False


def _queue(session: Session, action: Action) -> None:
    if not session.in_transaction():
        run_all([action])
        return
    _listen()
    session.info.setdefault(_PENDING, []).append((session.get_nested_transaction(), action))


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
