"""PostgreSQL's own session lock, for a layer whose store is PostgreSQL (extra ``postgres``).

``layer.lock(name)`` on such a layer is a lease row: it survives the pooled connection
that took it, has a fencing token, can be fair, and frees itself when its holder stops
renewing it. ``AdvisoryLock`` is the database's ``pg_advisory_lock`` instead, right for a
job that keeps one connection for as long as it holds the lock (a migration, a nightly
job): the cheapest lock there is (one statement to take, one to release), waiting in the
database's own lock queue (first come, first served, woken at once), and freed by the
database the moment the holder's session ends, with no lease to renew. What it lacks:
a fencing token (a holder cut off from the database keeps running after the server has
freed its lock), a timeout of its own (the server's ``lock_timeout`` is set for the wait),
and it pins a connection of the pool while held. See docs/lock-services.md.

    with layer.advisory_lock("nightly-report", timeout=10):   # WaitTimeout after 10 s
        ...
"""

from __future__ import annotations

from ._backends.postgres.advisory import AdvisoryLock, advisory_key

__all__ = ["AdvisoryLock", "advisory_key"]
