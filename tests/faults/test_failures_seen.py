"""``FailuresSeen``: the moments a layer found its server failing, as spans for the
history checker, beside the faults a nemesis struck."""

from __future__ import annotations

import time

from stampede import Stampede
from stampede.testing import free_port
from stampede.testing.nemesis import FailuresSeen


def test_the_moments_a_layer_finds_its_server_failing_become_spans(redis_url: str) -> None:
    seen = FailuresSeen(aftermath=0.5)
    down = Stampede.from_url(f"redis://127.0.0.1:{free_port()}/0", namespace="seen", socket_connect_timeout=0.2,
                             observers=[seen])  # fmt: skip
    try:
        before = time.monotonic_ns()
        assert down.cached_loader("k:{n}")(lambda n: n * 2)(1) == 2  # served without the cache
        after = time.monotonic_ns()
    finally:
        down.close()
    assert seen.moments and all(before <= moment <= after for moment in seen.moments)
    assert seen.spans == [(moment, moment + 500_000_000) for moment in seen.moments]

    answering = FailuresSeen()
    up = Stampede.from_url(redis_url, namespace="seen", observers=[answering])
    try:
        assert up.cached_loader("k:{n}")(lambda n: n * 2)(1) == 2
    finally:
        up.close()
    assert answering.moments == [] and answering.spans == []
