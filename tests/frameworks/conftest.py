"""Fixtures of the framework tests."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from ..scenarios import LineWorker


@pytest.fixture
def line_workers() -> Iterator[Callable[..., LineWorker]]:
    """Starts a worker script (``line_workers(script, *args)``: it prints "ready", then
    answers lines) and ends each still running after the test, by its PID."""
    started: list[LineWorker] = []

    def start(script: str, *args: str) -> LineWorker:
        worker = LineWorker(script, *args)
        started.append(worker)
        return worker

    yield start
    for worker in started:
        worker.stop()
