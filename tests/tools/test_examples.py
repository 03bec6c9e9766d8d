"""The README's demo, the examples and the benchmarks run, in their short forms, and say what they should
(the benchmarks that print their figures as JSON: tests/tools/test_loadtest.py)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from stampede.testing import PostgresServer

pytestmark = pytest.mark.extended  # each example is a program run at length: CI's extended step (tests/conftest.py)

ROOT = Path(__file__).resolve().parents[2]


def run(*args: str) -> str:
    done = subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_the_demo_shows_one_query_with_protection_and_many_without() -> None:
    out = run("-m", "stampede", "demo", "--processes", "2", "--threads", "8")
    table = [line.split() for line in out.splitlines()]
    rows = {words[0]: words for words in table if words[:1] in (["off"], ["sleep-spin"], ["stampede"])}
    assert int(rows["stampede"][1]) == 1
    assert int(rows["sleep-spin"][1]) == 1
    assert int(rows["off"][1]) > 1


def test_the_demo_runs_from_examples_too() -> None:
    assert "python -m stampede demo" in run("examples/demo.py", "--help")


def test_the_core_benchmark_runs_in_its_quick_form() -> None:
    out = run("loadtest/bench_core.py", "--quick", "--processes", "2", "--threads", "8")
    assert "ratio" in out and "stampede" in out


def test_the_web_app_serves_a_burst_with_one_database_query() -> None:
    out = run("examples/web_app.py", "--check", "--requests", "100")
    assert "(cold): 1 distinct body, database queries so far: 1" in out
    assert "(after invalidate): 1 distinct body, database queries so far: 2" in out


@pytest.mark.parametrize("server", [[], ["--wsgi"]])
def test_the_http_pages_example_calls_the_view_once_for_a_burst_across_workers(server: list[str]) -> None:
    out = run("examples/http_pages.py", *server)
    assert "view calls: 1, statuses: [200], distinct bodies: 1" in out


def test_the_llm_gateway_calls_the_model_once_for_a_burst_and_every_client_streams_live() -> None:
    out = run("examples/llm_gateway.py", "--clients", "32")
    assert "model calls: 1, statuses: [200]" in out
    assert "in order: True (and a later request, replayed: True)" in out
    assert "while the model was still streaming: True" in out


def test_the_flask_caching_example_renders_once_where_flask_caching_renders_for_each() -> None:
    out = run("examples/flask_caching_app.py")
    assert "page renders: 1, report renders: 1" in out and out.rstrip().endswith("OK")
    theirs = re.search(
        r"page renders: (\d+), report renders: (\d+)", run("examples/flask_caching_app.py", "--flask-caching")
    )
    assert theirs is not None and int(theirs.group(1)) > 1 and int(theirs.group(2)) > 1


def test_the_fastapi_example_runs_its_endpoint_once_for_64_requests_and_evicts() -> None:
    out = run("examples/fastapi_app.py")
    assert "4 processes x 16 concurrent requests for one cold product: endpoint calls 1" in out
    assert (
        "with If-None-Match: 304" in out and "'name': 'desk'}; endpoint calls: 2" in out and out.rstrip().endswith("OK")
    )


def test_the_litestar_example_runs_its_handler_once_for_64_requests_and_keeps_sessions() -> None:
    out = run("examples/litestar_app.py")
    assert "4 processes x 16 concurrent requests for one cold product: handler calls 1" in out
    assert "'name': 'desk'}; handler calls: 2" in out and "visits [1, 2, 3]" in out and out.rstrip().endswith("OK")


def test_the_query_cache_example_sends_a_cold_query_once_and_again_after_a_write() -> None:
    out = run("examples/query_cache.py")
    assert "4 processes x 16 threads ran one cold ORM query: sent to the database 1 time(s)" in out
    assert "(sent 1 time(s) for two runs)" in out and out.rstrip().endswith("OK")


def test_the_warm_start_example_takes_most_misses_away(redis_url: str) -> None:
    sizes = ["--calls", "5000", "--products", "300", "--warm", "250", "--sample", "0.5"]
    out = run("examples/warm_start.py", "--redis", redis_url, *sizes)
    assert "warming: " in out and out.rstrip().endswith("OK")
    imported = re.search(r"3\. (\d+) hot calls imported", out)  # from the file, after the restart
    assert imported is not None and int(imported.group(1)) > 0, out


def test_the_category_map_example_shows_one_query_per_burst_and_the_null_sentinel(redis_url: str) -> None:
    for backend in ([], ["--redis", redis_url]):
        out = run("examples/category_map.py", "--threads", "30", *backend)
        assert "a cold shop" in out and out.rstrip().endswith("OK")


def test_the_orm_example_caches_rows_as_their_own_type(redis_url: str) -> None:
    for backend in ([], ["--redis", redis_url]):
        out = run("examples/orm_sqlalchemy.py", "--threads", "30", *backend)
        assert "a cold product                         30 threads: 1 SELECT" in out
        assert "a page of 20 products, one cached      30 threads: 1 SELECT, one value: 20 products" in out
        assert out.rstrip().endswith("OK")


def test_the_fencing_example_refuses_the_paused_holders_late_write(redis_url: str) -> None:
    for backend in ([], ["--redis", redis_url]):
        out = run("examples/fencing.py", *backend)
        assert "accepted: False" in out and out.rstrip().endswith("OK")


def test_the_lock_benchmark_runs_in_its_quick_form() -> None:
    out = run("loadtest/bench_lock.py", "--quick")
    assert "stampede  2  EVALSHA EVALSHA" in out and "ratio" in out and "stampede (message)" in out
    assert "Redlock, 3 of 5 up" in out


def test_the_examples_run_on_the_postgresql_store(postgres_server: PostgresServer) -> None:
    out = run("examples/category_map.py", "--threads", "30", "--redis", postgres_server.url)
    assert "a cold shop" in out and out.rstrip().endswith("OK")
    out = run("examples/fencing.py", "--redis", postgres_server.url)
    assert "accepted: False" in out and out.rstrip().endswith("OK")


def test_the_examples_readme_lists_every_example_with_its_command() -> None:
    """``examples/README.md`` names each example (a module, or a project's folder), and
    gives each runnable one the command that runs it."""
    text = (ROOT / "examples" / "README.md").read_text()
    folder = ROOT / "examples"
    examples = sorted(path.name for path in folder.iterdir() if not path.name.startswith((".", "_", "README")))
    assert [name for name in examples if f"`{name}`" not in text and f"`{name}/`" not in text] == []
    runnable = [name for name in examples if name.endswith(".py") and "__main__" in (folder / name).read_text()]
    assert [name for name in runnable if f"python examples/{name}" not in text] == []
