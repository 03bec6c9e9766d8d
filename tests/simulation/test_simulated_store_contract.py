"""The simulator's store (``stampede.testing.simulation.SimulatedStore``) passes the store
contract like any backend: what the simulation proves of the layer, it proves over a
store that keeps every promise a real one keeps. Its blocking side is the embedded store
it wraps; its asyncio side is the simulated one, without faults, on a real event loop."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from stampede import Stampede
from stampede.testing.contract import *  # noqa: F403  (the contract's fixtures and tests)
from stampede.testing.simulation import Faults, Simulation, simulated_backend

pytestmark = pytest.mark.timeout(30)


@pytest.fixture
def contract_layer() -> Iterator[Callable[..., Stampede]]:
    made: list[Stampede] = []

    def make(**options: Any) -> Stampede:
        layer = Stampede(backend=simulated_backend(Simulation(faults=Faults.none())), **options)
        made.append(layer)
        return layer

    yield make
    for layer in made:
        layer.close()
