"""The example Django site (examples/django_site) under real multi-process servers,
gunicorn (WSGI) and uvicorn (ASGI), 4 workers each: ``get_or_set``, ``cache_page``, a
cached template fragment and cache-backed sessions, all through ``StampedeCache``."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import redis

pytest.importorskip("django", reason="Django is not installed (the dev extra installs it)")

EXAMPLES = Path(__file__).parent.parent.parent / "examples"
sys.path.insert(0, str(EXAMPLES))

from http_pages import burst, wait_until_up  # noqa: E402

from stampede.testing import free_port  # noqa: E402

SITE = EXAMPLES / "django_site"


@pytest.fixture(scope="module", params=["gunicorn", "uvicorn"])
def site(request: pytest.FixtureRequest, redis_url: str) -> Iterator[str]:
    port = free_port()
    if request.param == "gunicorn":
        command = ["-m", "gunicorn", "--chdir", str(SITE), "-w", "4", "--threads", "16", "-b", f"127.0.0.1:{port}",
                   "--log-level", "warning", "wsgi:application"]  # fmt: skip
    else:
        command = ["-m", "uvicorn", "--app-dir", str(SITE), "--workers", "4", "--port", str(port),
                   "--log-level", "warning", "wsgi:asgi_application"]  # fmt: skip
    process = subprocess.Popen([sys.executable, *command], env={**os.environ, "STAMPEDE_URL": redis_url}, cwd=SITE)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_until_up(base, process)
        yield base
    finally:
        process.terminate()
        process.wait(15)


@pytest.fixture
def counter(site: str, redis_url: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_url, socket_timeout=5)
    for key in client.scan_iter("site:*"):
        client.delete(key)
    yield client
    client.close()


def calls(counter: redis.Redis, name: str) -> int:
    return int(counter.get(f"site:calls:{name}") or 0)


def test_get_or_set_runs_the_report_once_for_64_requests_in_4_workers(site: str, counter: redis.Redis) -> None:
    responses = asyncio.run(burst(site, "/report", 64))
    assert {response.status_code for response in responses} == {200}
    assert [response.json() for response in responses] == [{"rendered_by_call": 1}] * 64
    assert calls(counter, "report") == 1


def test_cache_page_serves_the_second_request_from_the_cache(site: str, counter: redis.Redis) -> None:
    first, second = (httpx.get(site + "/cached-page", timeout=30) for _ in range(2))
    assert first.text == second.text == "cached page, call 1"
    assert calls(counter, "cached_page") == 1


def test_a_cached_fragment_is_rendered_once(site: str, counter: redis.Redis) -> None:
    pages = [httpx.get(site + "/fragment", timeout=30).text for _ in range(3)]
    assert all("sidebar rendered by call 1" in page for page in pages)
    assert calls(counter, "sidebar") == 1


def test_sessions_live_in_the_cache_across_workers(site: str, counter: redis.Redis) -> None:
    with httpx.Client(base_url=site, timeout=30) as client:  # keeps the session cookie
        assert [client.get("/visits").json()["visits"] for _ in range(6)] == [1, 2, 3, 4, 5, 6]
    with httpx.Client(base_url=site, timeout=30) as stranger:
        assert stranger.get("/visits").json()["visits"] == 1
