"""Streamed responses over ``cached_stream``: a FastAPI ``StreamingResponse`` and a
Litestar ``Stream`` whose concurrent requests share one run of the generator, each
response carrying every chunk, and a later request replayed from the cache. (Across
uvicorn workers, live: examples/llm_gateway.py, run by tests/tools/test_examples.py.)"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import pytest

from stampede import Stampede

from ..scenarios import until

try:  # at module level: Litestar reads a handler's annotations from its module
    from litestar.params import FromPath
    from litestar.response import Stream
except ImportError:  # pragma: no cover - the dev extra has it
    FromPath = Stream = None  # type: ignore[assignment,misc]

REQUESTS = 12


def gated_story(layer: Stampede, runs: list[str]) -> Any:
    """A streamed loader that makes its first chunk, then waits until every other request
    follows its run, so that the test proves the collapse rather than hopes for it."""
    everyone_in = asyncio.Event()

    @layer.cached_stream("story:{topic}")
    async def story(topic: str) -> AsyncIterator[bytes]:
        runs.append(topic)
        yield f"once, {topic}\n".encode()
        await asyncio.wait_for(everyone_in.wait(), 30)
        for line in ("upon\n", "a time\n"):
            yield line.encode()

    async def release_when_all_follow() -> None:
        await until(lambda: layer.stats()["streams_joined"] >= REQUESTS - 1, "every request following", 30)
        everyone_in.set()

    return story, release_when_all_follow


async def burst(app: Any, path: str, release: Callable[[], Any]) -> list[httpx.Response]:
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as client:
        releasing = asyncio.ensure_future(release())
        responses = await asyncio.gather(*(client.get(path) for _ in range(REQUESTS)))
        await releasing
        responses.append(await client.get(path))  # later: replayed
        return list(responses)


def test_a_fastapi_streaming_response_over_a_streamed_loader_runs_it_once(make_layer: Callable[..., Stampede]) -> None:
    pytest.importorskip("fastapi", reason="FastAPI is not installed (the dev extra has it)")
    from fastapi import FastAPI
    from fastapi.responses import StreamingResponse

    layer = make_layer()
    runs: list[str] = []

    async def main() -> list[httpx.Response]:
        story, release = gated_story(layer, runs)
        app = FastAPI()

        @app.get("/story/{topic}")
        async def read(topic: str) -> StreamingResponse:
            return StreamingResponse(story(topic), media_type="text/plain")

        return await burst(app, "/story/dragons", release)

    responses = asyncio.run(main())
    assert runs == ["dragons"]
    assert {(response.status_code, response.text) for response in responses} == {(200, "once, dragons\nupon\na time\n")}


def test_a_litestar_stream_over_a_streamed_loader_runs_it_once(make_layer: Callable[..., Stampede]) -> None:
    pytest.importorskip("litestar", reason="Litestar is not installed (the dev extra has it)")
    from litestar import Litestar, get

    layer = make_layer()
    runs: list[str] = []

    async def main() -> list[httpx.Response]:
        story, release = gated_story(layer, runs)

        @get("/story/{topic:str}")
        async def read(topic: FromPath[str]) -> Stream:
            return Stream(story(topic), media_type="text/plain")

        return await burst(Litestar(route_handlers=[read]), "/story/knights", release)

    responses = asyncio.run(main())
    assert runs == ["knights"]
    assert {(response.status_code, response.text) for response in responses} == {(200, "once, knights\nupon\na time\n")}
