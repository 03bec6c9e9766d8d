"""The FastAPI and Litestar integrations' promise, in 4 worker processes: a cold URL's 64
concurrent requests run its handler once, and each gets that one response."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from ..scenarios import LineWorker

ASGI_WORKER = str(Path(__file__).parent.parent / "asgi_worker.py")


@pytest.mark.timeout(60)
@pytest.mark.parametrize("app", ["fastapi", "litestar"])
def test_a_cold_url_runs_its_handler_once_for_64_requests_in_4_processes(
    app: str, redis_url: str, redis_client: Any, line_workers: Callable[..., LineWorker]
) -> None:
    pytest.importorskip(app, reason=f"{app} is not installed (the dev extra has it)")
    namespace = f"{app}-{uuid.uuid4().hex[:8]}"
    arguments = ["--app", app, "--url", redis_url, "--namespace", namespace]
    workers = [line_workers(ASGI_WORKER, *arguments) for _ in range(4)]
    for worker in workers:
        worker.send("go")
    outcomes = [worker.outcome() for worker in workers]
    got = [tuple(each) for outcome in outcomes for each in outcome["got"]]
    assert int(redis_client.get(f"{namespace}:calls")) == 1
    assert len(got) == 64 and len(set(got)) == 1, set(got)
    status, body, etag = got[0]
    assert status == 200 and body == '{"id":7,"rendered_by_call":1}'
    if app == "fastapi":  # stampede.fastapi sends one; Litestar's response cache sends none
        assert etag.startswith('"')
    assert sum(outcome["stats"]["loads"] for outcome in outcomes) == 1
