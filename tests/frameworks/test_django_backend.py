"""``stampede.django.StampedeCache``: Django's own cache backend tests over it, and
``get_or_set`` collapsing a cold key's callers in several processes into one call."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tarfile
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from stampede import ConfigError

django = pytest.importorskip("django", reason="Django is not installed (the dev extra installs it)")

from django.core.cache.backends.base import DEFAULT_TIMEOUT  # noqa: E402

from stampede.django.cache import StampedeCache  # noqa: E402

from ..scenarios import LineWorker  # noqa: E402
from .sdists import source_distribution  # noqa: E402

HERE = Path(__file__).parent
DJANGO_WORKER = str(HERE.parent / "django_worker.py")
SUITE_MEMBERS = ("tests/cache/", "tests/runtests.py", "tests/test_sqlite.py", "tests/urls.py")
SKIPPED_AS_FOR_REDIS = {"test_cull", "test_cull_delete_when_store_empty", "test_zero_cull"}


@pytest.fixture(scope="session")
def django_tests(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Django's test directory (the parts the cache tests need), with this project's
    adaptor (``django_cache_suite.py``) in its ``cache`` package."""
    root = tmp_path_factory.mktemp("django-sdist")
    with tarfile.open(
        source_distribution("django", django.__version__, f"[dD]jango-{django.__version__}.tar.gz")
    ) as archive:
        top = archive.getnames()[0].split("/")[0]
        members = [m for m in archive.getmembers() if m.name.startswith(tuple(f"{top}/{p}" for p in SUITE_MEMBERS))]
        archive.extractall(root, members=members, filter="data")
    tests = root / top / "tests"
    shutil.copy(HERE / "django_cache_suite.py", tests / "cache" / "test_stampede.py")
    return tests


def _run_django_suite(tests: Path, location: str) -> None:
    env = {**os.environ, "STAMPEDE_DJANGO_LOCATION": location, "PYTHONWARNINGS": "ignore::ResourceWarning"}
    result = subprocess.run(
        [sys.executable, "runtests.py", "cache.test_stampede", "--settings=test_sqlite", "--parallel=1", "-v", "2"],
        cwd=tests,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    report = result.stdout + result.stderr
    assert result.returncode == 0, report[-6000:]
    ran = re.search(r"Ran (\d+) tests?", report)
    assert ran is not None and int(ran.group(1)) >= 50, report[-3000:]
    skipped = set(re.findall(r"^(test_\w+) \(.*\) \.\.\. skipped", report, re.MULTILINE))
    assert skipped <= SKIPPED_AS_FOR_REDIS, f"skipped beyond the cull tests Django skips for Redis: {skipped}"


@pytest.mark.extended  # Django's own suite, at length: CI's extended step
def test_django_cache_suite_passes_over_redis(django_tests: Path, redis_url: str) -> None:
    _run_django_suite(django_tests, redis_url)


@pytest.mark.extended  # Django's own suite, at length: CI's extended step
def test_django_cache_suite_passes_in_memory(django_tests: Path) -> None:
    _run_django_suite(django_tests, "memory")


@pytest.mark.extended  # Django's own suite, at length: CI's extended step
def test_django_cache_suite_passes_over_postgres(django_tests: Path, postgres_url: str) -> None:
    _run_django_suite(django_tests, postgres_url)


@pytest.mark.parametrize("kind", ["threads", "asyncio"])
def test_get_or_set_calls_the_default_once_for_64_callers_in_4_processes(
    redis_url: str, redis_client: Any, line_workers: Callable[..., LineWorker], kind: str
) -> None:
    namespace = f"dj-{uuid.uuid4().hex[:8]}"
    options = ["--callers", "16", "--hold", "0.3"] + (["--asyncio"] if kind == "asyncio" else [])
    workers = [
        line_workers(DJANGO_WORKER, "--location", redis_url, "--namespace", namespace, *options) for _ in range(4)
    ]
    for worker in workers:
        worker.send("go")
    outcomes = [worker.outcome() for worker in workers]
    got = [value for outcome in outcomes for value in outcome["got"]]
    assert len(got) == 64
    assert int(redis_client.get(f"{namespace}:page:calls")) == 1
    assert got == [{"rendered_by_call": 1}] * 64
    assert sum(outcome["stats"]["loads"] for outcome in outcomes) == 1


def test_options_django_decides_are_refused() -> None:
    for option in ("ttl", "jitter", "stale_while_revalidate"):
        backend = StampedeCache("memory", {"OPTIONS": {option: 1, "namespace": f"refused-{option}"}})
        with pytest.raises(ConfigError, match=option):
            backend.get("key")


def test_one_location_only() -> None:
    with pytest.raises(ConfigError, match="one LOCATION"):
        StampedeCache(["redis://127.0.0.1:1/0", "redis://127.0.0.1:2/0"], {})


def test_a_set_overtakes_a_get_or_set_in_flight() -> None:
    """The stale-set guard, through Django's API: a value set while a ``get_or_set`` loads
    is not replaced by that load's result, and the load's caller gets the value set."""
    import threading

    backend = StampedeCache("memory", {"OPTIONS": {"namespace": "overtaken"}})
    loading, release = threading.Event(), threading.Event()
    got: list[Any] = []

    def slow_default() -> str:
        loading.set()
        assert release.wait(10)
        return "read before the write"

    caller = threading.Thread(target=lambda: got.append(backend.get_or_set("row", slow_default, timeout=60)))
    caller.start()
    assert loading.wait(10)
    backend.set("row", "written", timeout=60)
    release.set()
    caller.join(10)
    assert backend.get("row") == "written"
    assert got == ["read before the write"]  # its own caller gets what it read; nobody else does


def test_timeouts_as_django_reads_them() -> None:
    backend = StampedeCache("memory", {"TIMEOUT": None, "OPTIONS": {"namespace": "forever"}})
    backend.set("kept", 1)
    assert backend.get("kept") == 1
    backend.set("gone", 1, timeout=0)
    assert backend.get("gone", "missing") == "missing"
    assert backend.add("gone", 2, timeout=-1) is True
    assert backend.get("gone", "missing") == "missing"
    assert backend.get_or_set("never", lambda: 3, timeout=0) == 3
    assert backend.has_key("never") is False
    assert backend.get_or_set("default", lambda: 4, timeout=DEFAULT_TIMEOUT) == 4
    assert backend.get("default") == 4
