"""An LLM gateway: an OpenAI-compatible streaming endpoint in front of a model, whose
identical concurrent prompts share one upstream completion, token by token.

    python examples/llm_gateway.py            # a throwaway Redis server, a fake model, 4 gateway workers, 64 clients
    uvicorn --app-dir examples --factory llm_gateway:gateway_app --workers 4   # STAMPEDE_URL, UPSTREAM_URL

The model (``model_app``, a fake one here) streams a completion as server-sent events,
``TOKENS`` tokens ``TOKEN_PAUSE`` seconds apart, and counts its calls on the Redis server
(``INCR model:calls``). The gateway (``gateway_app``) answers ``POST /v1/chat/completions``
with ``"stream": true`` from ``complete``, a ``cached_stream`` keyed by a digest of the
request: one worker of one process calls the model, and every client of every worker
receives each event as the model sends it. The whole completion is kept for ``TTL``
seconds, and a later identical request is replayed from it, event by event.

Only identical requests share a completion (model, messages, temperature and the rest:
the digest is of them all). Whether a completion may be shared at all (a temperature
above 0 gives each caller a draw of its own) is the gateway's policy: this one shares
every identical request within the window, as a cache in front of a paid API does.

The run (the default): 64 concurrent identical requests through 4 uvicorn workers. It
prints the model's calls (1), the tokens each client received (every one, in order), and
when the clients got their first token against the whole completion's time, and exits
non-zero unless the model was called once and every client got every token.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import redis

from stampede import Stampede
from stampede.testing import RedisServer, find_server_binary, free_port

HERE = Path(__file__).parent
TOKENS = int(os.environ.get("MODEL_TOKENS", "40"))
TOKEN_PAUSE = float(os.environ.get("MODEL_TOKEN_PAUSE", "0.02"))
TTL = float(os.environ.get("GATEWAY_TTL", "60"))


def model_app() -> Any:
    """The fake model: a completion streamed as server-sent events, one token at a time."""
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import StreamingResponse
    from starlette.routing import Route

    counter = redis.asyncio.Redis.from_url(os.environ["STAMPEDE_URL"])

    async def completions(request: Request) -> StreamingResponse:
        body = await request.json()
        await counter.incr("model:calls")
        prompt = body["messages"][-1]["content"]
        started = time.time()

        async def events() -> AsyncIterator[bytes]:
            for index in range(TOKENS):
                await asyncio.sleep(TOKEN_PAUSE)
                delta = {"content": f"{prompt.split()[index % len(prompt.split())]}#{index} "}
                chunk = {"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": delta}]}
                yield f"data: {json.dumps(chunk)}\n\n".encode()
            yield b"data: [DONE]\n\n"
            # each call's span, for the load test's windows (loadtest/locust_gateway.py)
            await counter.rpush("model:log", json.dumps({"what": prompt, "started": started, "finished": time.time()}))

        return StreamingResponse(events(), media_type="text/event-stream")

    return Starlette(routes=[Route("/v1/chat/completions", completions, methods=["POST"])])


def gateway_app() -> Any:
    """The gateway: each streaming completion through ``complete``, shared by digest."""
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse, Response, StreamingResponse
    from starlette.routing import Route

    layer = Stampede.from_url(os.environ["STAMPEDE_URL"], namespace="gateway", ttl=TTL, lock_ttl=10.0)
    upstream = os.environ["UPSTREAM_URL"]
    client = httpx.AsyncClient(base_url=upstream, timeout=httpx.Timeout(60.0, connect=5.0))

    @layer.cached_stream("completion:{digest}")
    async def complete(digest: str, body: dict[str, Any]) -> AsyncIterator[bytes]:
        """The model's events for ``body``, one server-sent event per chunk."""
        async with client.stream("POST", "/v1/chat/completions", json=body) as answer:
            answer.raise_for_status()
            async for line in answer.aiter_lines():
                if line:
                    yield (line + "\n\n").encode()

    async def completions(request: Request) -> Response:
        body = await request.json()
        if not body.get("stream"):
            return JSONResponse({"error": 'this gateway streams: send "stream": true'}, status_code=400)
        digest = hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()
        return StreamingResponse(complete(digest, body), media_type="text/event-stream")

    return Starlette(routes=[Route("/v1/chat/completions", completions, methods=["POST"])])


def serve(factory: str, url: str, port: int, workers: int, upstream: str = "") -> subprocess.Popen[bytes]:
    env = {**os.environ, "STAMPEDE_URL": url, "UPSTREAM_URL": upstream}
    command = [sys.executable, "-m", "uvicorn", "--app-dir", str(HERE), "--factory", f"llm_gateway:{factory}",
               "--workers", str(workers), "--port", str(port), "--log-level", "warning"]  # fmt: skip
    return subprocess.Popen(command, env=env)


@contextmanager
def running(url: str, workers: int) -> Iterator[str]:
    """The fake model and the gateway (``workers`` uvicorn workers) over the Redis server
    at ``url``, each on a free 127.0.0.1 port, up: the gateway's base URL. Both are
    stopped (by PID) on exit."""
    model_port, gateway_port = free_port(), free_port()
    model = serve("model_app", url, model_port, 1)
    gateway = serve("gateway_app", url, gateway_port, workers, f"http://127.0.0.1:{model_port}")
    try:
        wait_until_up(f"http://127.0.0.1:{model_port}", model)
        wait_until_up(f"http://127.0.0.1:{gateway_port}", gateway)
        yield f"http://127.0.0.1:{gateway_port}"
    finally:
        for process in (gateway, model):
            process.terminate()
            process.wait(15)


def wait_until_up(base: str, process: subprocess.Popen[bytes], timeout: float = 30.0) -> None:
    """Wait until the server answers (a 405 to a GET of the endpoint will do)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the server exited with {process.returncode}")
        try:
            httpx.get(f"{base}/v1/chat/completions", timeout=5)
            return
        except httpx.TransportError:
            time.sleep(0.1)
    raise RuntimeError(f"the server did not answer within {timeout} s")


async def one_client(client: httpx.AsyncClient, body: dict[str, Any], began: float) -> dict[str, Any]:
    """One streaming request: its tokens, and when its first and last came (s from ``began``)."""
    tokens: list[str] = []
    first = last = 0.0
    async with client.stream("POST", "/v1/chat/completions", json=body) as answer:
        async for line in answer.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            tokens.append(json.loads(line[6:])["choices"][0]["delta"]["content"])
            last = time.monotonic() - began
            first = first or last
    return {"status": answer.status_code, "tokens": tokens, "first": first, "last": last}


async def clients(base: str, body: dict[str, Any], count: int) -> list[dict[str, Any]]:
    limits = httpx.Limits(max_connections=count, max_keepalive_connections=0)
    async with httpx.AsyncClient(base_url=base, limits=limits, timeout=60) as client:
        began = time.monotonic()
        return list(await asyncio.gather(*(one_client(client, body, began) for _ in range(count))))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--workers", type=int, default=4)
    options = parser.parse_args()
    body = {"model": "fake-1", "stream": True, "temperature": 0,
            "messages": [{"role": "user", "content": "why do caches stampede"}]}  # fmt: skip
    with RedisServer(find_server_binary()) as server, running(server.url, options.workers) as base:
        results = asyncio.run(clients(base, body, options.clients))
        replay = asyncio.run(clients(base, body, 1))[0]
        calls = int(redis.Redis.from_url(server.url).get("model:calls") or 0)
    expected = results[0]["tokens"]
    whole = len(expected) == TOKENS and all(result["tokens"] == expected for result in [*results, replay])
    firsts = sorted(result["first"] for result in results)
    lasts = sorted(result["last"] for result in results)
    print(f"{options.clients} concurrent identical streaming requests, {options.workers} uvicorn workers:")
    print(f"  model calls: {calls}, statuses: {sorted({result['status'] for result in results})}")
    print(f"  every client got all {TOKENS} tokens, in order: {whole} (and a later request, replayed: "
          f"{replay['tokens'] == expected})")  # fmt: skip
    model_ms = TOKENS * TOKEN_PAUSE * 1000
    print(f"  first token: {firsts[0] * 1000:.0f}-{firsts[-1] * 1000:.0f} ms, last token: "
          f"{lasts[0] * 1000:.0f}-{lasts[-1] * 1000:.0f} ms (the model takes {model_ms:.0f} ms)")  # fmt: skip
    live = firsts[-1] < lasts[0]  # every client had its first token before any had its last
    print(f"  every client received tokens while the model was still streaming: {live}")
    sys.exit(0 if calls == 1 and whole and live else 1)


if __name__ == "__main__":
    main()
