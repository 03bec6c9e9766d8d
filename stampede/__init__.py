"""stampede: one load per cache miss, across threads, processes and machines."""

from ._acached import AsyncCachedLoader, AsyncCachedManyLoader
from ._astream import AsyncCachedStream
from ._cached import CachedLoader, CachedManyLoader
from ._core.codec import JsonSerializer, Serializer, TypedSerializer
from ._core.config import Settings
from ._core.msgspec_serializer import MsgspecSerializer
from ._core.observer import COUNTERS, OUTCOMES, BudgetObserver, Observer
from ._core.pydantic_serializer import PydanticSerializer
from ._core.results import NOT_MODIFIED, Cached, Previous, previous
from ._core.streams import STREAM_RESTARTED
from ._core.verify import verifying
from ._errors import (
    BackendUnavailable,
    BudgetTimeout,
    ConfigError,
    InvalidKey,
    LoadTimeout,
    LockLost,
    LockNotOwned,
    RecursiveLoad,
    SerializationError,
    StampedeError,
    StreamInterrupted,
    ValueTooLarge,
    WaitTimeout,
)
from ._layer import Stampede, cached_loader, cached_loader_many, default_layer
from ._loader import Fetched
from ._lock import Lock
from ._redlock import Redlock, RedlockLock
from ._stream import CachedStream
from ._warming import WarmReport

__version__ = "0.8.0.dev0"

__all__ = [  # grouped, not sorted
    # the layer and its decorator
    "Stampede",
    "CachedLoader",
    "AsyncCachedLoader",
    "Fetched",
    "cached_loader",
    "CachedManyLoader",
    "AsyncCachedManyLoader",
    "cached_loader_many",
    "CachedStream",
    "AsyncCachedStream",
    "STREAM_RESTARTED",
    "default_layer",
    "Settings",
    "WarmReport",
    # observing it
    "Observer",
    "BudgetObserver",
    "COUNTERS",
    "OUTCOMES",
    "verifying",
    # named locks
    "Lock",
    "Redlock",
    "RedlockLock",
    # values
    "Cached",
    "NOT_MODIFIED",
    "Previous",
    "previous",
    "Serializer",
    "JsonSerializer",
    "TypedSerializer",
    "MsgspecSerializer",
    "PydanticSerializer",
    # errors
    "StampedeError",
    "ConfigError",
    "InvalidKey",
    "SerializationError",
    "ValueTooLarge",
    "WaitTimeout",
    "BudgetTimeout",
    "LoadTimeout",
    "RecursiveLoad",
    "StreamInterrupted",
    "BackendUnavailable",
    "LockNotOwned",
    "LockLost",
]
