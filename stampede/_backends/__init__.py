"""The backend families, one folder each, and the parts they share.

* ``redis/``: one server, Sentinel's master, a Cluster. Lua, pub/sub, tracking, clients.
* ``postgres/``: stores, schema and wake-ups, the advisory lock.
* ``zookeeper/``: session leases and named locks' fair line, beside Redis.
* ``memory/``: the embedded store.

Each family has a ``backend.py`` building a ``Backend`` (``_core/backend.py``), except
ZooKeeper's, composed on Redis by ``stampede._backend``. Shared here: the circuit
breaker, who waits on which channel, a waiter's mailbox.

Rules of the imports (``tests/tools/test_layout.py``): a family imports the core, the shared
parts and itself, never another family, a driver or a public module.
"""
