"""``stampede.flask_caching``: Flask-Caching's own tests over it (its generic backend
tests and its decorator tests, from its source distribution), and ``@cache.cached`` and
``@cache.memoize`` collapsing a cold key's callers in several processes into one call."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tarfile
import threading
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from stampede import ConfigError

flask_caching = pytest.importorskip(
    "flask_caching", reason="Flask-Caching is not installed (the dev extra installs it)"
)

from flask import Flask  # noqa: E402

from stampede.flask_caching import Cache, StampedeCache  # noqa: E402

from ..scenarios import LineWorker  # noqa: E402
from .sdists import source_distribution  # noqa: E402

HERE = Path(__file__).parent
FLASK_WORKER = str(HERE.parent / "flask_worker.py")
SUITE = ["test_stampede_backend.py", "test_basic_app.py", "test_cache.py", "test_memoize.py", "test_view.py",
         "test_signals.py", "test_templates.py", "test_subclassing.py"]  # fmt: skip
WAITS_A_MINUTE = [  # they advance its fake clock by 50 to 120 s, which a server's clock cannot skip
    "test_memoize.py::test_memoize_entry_written_late_keeps_its_own_timeout",
    "test_memoize.py::test_memoize_delete_resets_version_key",
    "test_memoize.py::test_memoize_version_key_outlives_newest_entry",
    "test_memoize.py::test_memoize_version_key_expires_once_its_entries_have",
]


@pytest.fixture(scope="session")
def flask_caching_tests(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Flask-Caching's tests folder, with this project's adaptor appended to its conftest
    in place of its server fixtures (``flask_caching_suite/``)."""
    from importlib.metadata import version as installed

    version = installed("flask-caching")
    root = tmp_path_factory.mktemp("flask-caching-sdist")
    with tarfile.open(
        source_distribution("flask-caching", version, f"[fF]lask[-_][cC]aching-{version}.tar.gz")
    ) as archive:
        top = archive.getnames()[0].split("/")[0]
        members = [m for m in archive.getmembers() if m.name.startswith(f"{top}/tests/")]
        archive.extractall(root, members=members, filter="data")
    tests = root / top / "tests"
    conftest = (tests / "conftest.py").read_text()
    kept = conftest[: conftest.index("def _server_is_running")].replace("from xprocess import ProcessStarter\n", "")
    adaptor = (HERE / "flask_caching_suite" / "adaptor.py").read_text()
    (tests / "conftest.py").write_text(f"{kept}\n\n{adaptor}")
    shutil.copy(HERE / "flask_caching_suite" / "backend_tests.py", tests / "test_stampede_backend.py")
    return tests


@pytest.mark.extended  # Flask-Caching's own suite, at length: CI's extended step
@pytest.mark.timeout(300)  # about 45 s alone: its timeout tests wait out their timeouts on a real clock
def test_flask_cachings_own_tests_pass_over_redis(flask_caching_tests: Path, redis_url: str) -> None:
    deselected = [arg for test in WAITS_A_MINUTE for arg in ("--deselect", test)]
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "addopts=", "-n", "2", "-rs",
         "--timeout", "60", *SUITE, *deselected],
        cwd=flask_caching_tests, env={**os.environ, "STAMPEDE_FLASK_URL": redis_url},
        capture_output=True, text=True, timeout=280,
    )  # fmt: skip
    report = result.stdout + result.stderr
    assert result.returncode == 0, report[-6000:]
    passed = re.search(r"(\d+) passed", report)
    assert passed is not None and int(passed.group(1)) >= 147, report[-3000:]
    skipped = re.findall(r"^SKIPPED \[\d+\] .*?: (.*)$", report, re.MULTILINE)
    assert all("its RedisCache's tests" in reason or "MemcachedCache" in reason for reason in skipped), skipped


@pytest.mark.parametrize("decorator", ["cached", "memoize"])
def test_a_cold_key_is_rendered_once_for_64_callers_in_4_processes(
    redis_url: str, redis_client: Any, line_workers: Callable[..., LineWorker], decorator: str
) -> None:
    namespace = f"fl-{uuid.uuid4().hex[:8]}"
    options = ["--callers", "16", "--hold", "0.3"] + (["--memoize"] if decorator == "memoize" else [])
    workers = [line_workers(FLASK_WORKER, "--url", redis_url, "--namespace", namespace, *options) for _ in range(4)]
    for worker in workers:
        worker.send("go")
    outcomes = [worker.outcome() for worker in workers]
    got = [value for outcome in outcomes for value in outcome["got"]]
    assert int(redis_client.get(f"{namespace}:calls")) == 1
    expected = "rendered by call 1" + (" for 2026" if decorator == "memoize" else "")
    assert got == [expected] * 64
    # and a memoized function's version (a part of its keys) is made once too, by an add,
    # and renewed once, by the caller whose function made the value (a touch is a load)
    assert sum(outcome["stats"]["loads"] for outcome in outcomes) == (3 if decorator == "memoize" else 1)


def make_app(url: str, **config: Any) -> Flask:
    """An app over a layer whose server may be slow to answer (a busy machine): a command
    that timed out would be Flask-Caching's cue to call the function uncached."""
    app = Flask(__name__)
    options = {"namespace": f"fl-{uuid.uuid4().hex[:8]}", "socket_timeout": 10}
    app.config.update(CACHE_TYPE="stampede.flask_caching.StampedeCache", CACHE_STAMPEDE_URL=url,
                      CACHE_STAMPEDE_OPTIONS=options, **config)  # fmt: skip
    return app


def test_a_response_its_filter_refuses_is_not_kept_though_its_waiters_get_it(redis_url: str) -> None:
    """The load writes what the decorator would: a 500 ``response_filter`` refuses is
    handed to the callers waiting on that load, and kept for nobody after."""
    app = make_app(redis_url)
    cache = Cache(app)
    calls: list[int] = []
    status = [500]

    @app.route("/")
    @cache.cached(60, response_filter=lambda response: response[1] < 400)
    def view() -> tuple[str, int]:
        calls.append(1)
        return f"call {len(calls)}", status[0]

    client = app.test_client()
    assert client.get("/").status_code == 500 and client.get("/").get_data(as_text=True) == "call 2"
    status[0] = 200
    assert client.get("/").get_data(as_text=True) == "call 3"
    assert client.get("/").get_data(as_text=True) == "call 3" and len(calls) == 3


def test_a_value_found_stale_or_forced_is_loaded_again_once(redis_url: str) -> None:
    """``is_stale`` and ``forced_update`` are Flask-Caching's: a kept value either finds
    stale is not served by the load (which would read it back), but loaded again."""
    app = make_app(redis_url)
    cache = Cache(app)
    calls: list[int] = []
    stale, forced = [False], [False]

    @cache.memoize(60, is_stale=lambda value, *args: stale[0], forced_update=lambda *args: forced[0])
    def report(year: int) -> str:
        calls.append(year)
        return f"report {len(calls)}"

    with app.app_context():
        assert report(2026) == report(2026) == "report 1"
        stale[0] = True
        assert report(2026) == "report 2"
        stale[0], forced[0] = False, True
        assert report(2026) == "report 3"
        forced[0] = False
        assert report(2026) == "report 3"


def test_a_waiter_of_one_thread_gets_the_loaders_value(redis_url: str) -> None:
    """In one process too: callers missing one key while its load runs wait for it."""
    app = make_app(redis_url)
    cache = Cache(app)
    loading, release = threading.Event(), threading.Event()
    calls: list[int] = []

    @cache.memoize(60)
    def slow(key: str) -> str:
        calls.append(1)
        loading.set()
        assert release.wait(10)
        return f"{key} loaded"

    got: list[str] = []

    def call() -> None:
        with app.app_context():
            got.append(slow("a"))

    first = threading.Thread(target=call)
    first.start()
    assert loading.wait(10)
    others = [threading.Thread(target=call) for _ in range(7)]
    for thread in others:
        thread.start()
    release.set()
    for thread in [first, *others]:
        thread.join(10)
    assert got == ["a loaded"] * 8 and len(calls) == 1


def test_another_cache_type_or_a_setting_flask_caching_decides_is_refused(redis_url: str) -> None:
    app = Flask(__name__)
    app.config["CACHE_TYPE"] = "SimpleCache"
    with pytest.raises(ConfigError, match="CACHE_TYPE='stampede.flask_caching.StampedeCache'"):
        Cache(app)
    for option in ("ttl", "serializer", "stale_while_revalidate"):
        with pytest.raises(ConfigError, match=option):
            StampedeCache(redis_url, options={option: 1, "namespace": f"refused-{option}"})
    with pytest.raises(ConfigError, match="CACHE_STAMPEDE_URL"):
        Cache(make_app(""))


def test_timeouts_as_flask_caching_reads_them(redis_url: str, redis_client: Any) -> None:
    namespace = f"fl-{uuid.uuid4().hex[:8]}"
    backend = StampedeCache(redis_url, default_timeout=60, options={"namespace": namespace})
    assert backend.set("forever", 1, timeout=0) and backend.get("forever") == 1
    assert backend.set("minute", 1) and backend.get("minute") == 1
    lives = {
        key.decode().partition("flask:")[2]: redis_client.pttl(key) for key in redis_client.scan_iter(f"{namespace}*")
    }
    assert lives["forever}"] > 10**9 and 50_000 < lives["minute}"] <= 60_000, lives  # 0: kept until deleted
    assert backend.set("gone", 1, timeout=-1) and backend.get("gone") is None
    assert backend.add("default", 2) and not backend.add("default", 3) and backend.get("default") == 2
    assert backend.inc("n") == 1 and backend.inc("n", 4) == 5 and backend.dec("n") == 4
    assert backend.delete("n") and not backend.delete("n")


def test_a_value_written_between_the_read_and_the_call_is_taken_not_loaded_again(
    redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another process's load writes the key just after this call found it missing: the
    call's load finds that value and takes it (one render in all), where a second look
    (``has``) would have taken it for a value to load again."""
    app = make_app(redis_url)
    cache = Cache(app)
    calls: list[int] = []

    @cache.memoize(60)
    def report(year: int) -> str:
        calls.append(year)
        return "rendered here"

    find = StampedeCache.find

    def found_missing_then_written(backend: StampedeCache, key: str) -> tuple[bool, Any]:
        found = find(backend, key)
        if not found[0] and not key.endswith("_memver"):  # the function's key, not its version's
            backend.set(key, "rendered by another process")
        return found

    monkeypatch.setattr(StampedeCache, "find", found_missing_then_written)
    with app.app_context():
        assert report(2026) == "rendered by another process"
    assert calls == []


def test_a_memoized_functions_version_is_renewed_not_written_over(
    redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Flask-Caching renews a version's life after each load by writing it again: a
    reader of a version being written over found none, made its own, and so loaded
    again (2 calls for 8 threads in 1 run of 6). Here it is added once and touched."""
    app = make_app(redis_url)
    cache = Cache(app)
    written: list[str] = []
    set_ = StampedeCache.set

    def noting_set(backend: StampedeCache, key: str, value: Any, timeout: Any = None) -> bool:
        written.append(key)
        return set_(backend, key, value, timeout)

    monkeypatch.setattr(StampedeCache, "set", noting_set)

    @cache.memoize(60)
    def report(year: int) -> str:
        return f"report of {year}"

    with app.app_context():
        assert report(2025) == "report of 2025"
        assert report(2026) == report(2026) == "report of 2026"
    assert [key for key in written if key.endswith("_memver")] == []
