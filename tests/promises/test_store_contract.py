"""The store contract (``stampede.testing.contract``, shipped for third-party backends) over
every backend of this suite (``BACKENDS`` in conftest.py), blocking and asyncio."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from stampede import Stampede
from stampede.testing.contract import *  # noqa: F403  (the contract's fixtures and tests)

pytestmark = pytest.mark.timeout(30)


@pytest.fixture
def contract_layer(layer_of_each_backend: Callable[..., Stampede]) -> Callable[..., Stampede]:
    return layer_of_each_backend
