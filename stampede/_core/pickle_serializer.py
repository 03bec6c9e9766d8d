"""``PickleSerializer``: any picklable value, for the integrations whose host caches pickle
(Django's cache API, SQLAlchemy's query results). Whoever can write to the cache server
can run code in every process that reads it: the server must be trusted as the database
is. ``cached_loader`` keeps JSON unless given it."""

from __future__ import annotations

import pickle
from typing import Any


class PickleSerializer:
    """pickle at the highest protocol."""

    def dumps(self, value: Any) -> bytes:
        return pickle.dumps(value, pickle.HIGHEST_PROTOCOL)

    loads = staticmethod(pickle.loads)
