"""The store contract (``stampede.testing.contract``, shipped for third-party backends) over
every backend of this suite (``BACKENDS`` in conftest.py), blocking and asyncio. On Redlock
and ZooKeeper layers, it is the cache server's store seen through the layer's lease policy
(``tests/leased.py``): the promises hold whatever holds the lease."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from stampede import Stampede
from stampede._core.leases import ONE_SERVER
from stampede.testing.contract import *  # noqa: F403  (the contract's fixtures and tests)

from ..aleased import AsyncLeasedStore
from ..leased import LeasedStore

pytestmark = pytest.mark.timeout(30)


@pytest.fixture
def contract_layer(layer_of_each_backend: Callable[..., Stampede]) -> Callable[..., Stampede]:
    return layer_of_each_backend


@pytest.fixture
def contract_view() -> Callable[[Stampede, Any], Any]:
    def view(layer: Stampede, store: Any) -> Any:
        runner = layer._runner
        if runner is None or runner.leases.policy is ONE_SERVER:
            return store
        if store is runner.store:
            return LeasedStore(runner.leases)
        assert layer._async_runner is not None
        return AsyncLeasedStore(layer._async_runner._state().leases)

    return view
