"""The command line against a real server: inspect values, null sentinels and held leases;
invalidate by template and by glob over 10,000 entries (all gone, nothing else touched);
errors exit non-zero with one line."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from stampede import Stampede
from stampede._core.codec import Codec
from stampede.cli import main
from stampede.testing import free_port

ROOT = Path(__file__).resolve().parents[2]


def cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, Any, str]:
    """Run the command in this process: exit status, stdout (parsed if --json), stderr."""
    status = main(list(args))
    out, err = capsys.readouterr()
    return status, json.loads(out) if "--json" in args and out else out, err


@pytest.fixture
def namespace() -> str:
    return f"cli-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def layer(redis_url: str, namespace: str) -> Iterator[Stampede]:
    made = Stampede.from_url(redis_url, namespace=namespace)
    yield made
    made.close()


def test_inspect_shows_a_value_a_null_sentinel_and_a_held_lease(
    redis_url: str, namespace: str, layer: Stampede, capsys: pytest.CaptureFixture[str]
) -> None:
    gate, loading = threading.Event(), threading.Event()

    @layer.cached_loader("category-map:{shop}", ttl=60)
    def category_map(shop: str) -> dict[str, Any] | None:
        if shop == "slow":
            loading.set()
            assert gate.wait(10)
        return None if shop == "gone" else {"shop": shop, "categories": ["books"]}

    category_map("s1")
    category_map("gone")
    slow = threading.Thread(target=category_map, args=("slow",))
    slow.start()
    try:
        assert loading.wait(10)
        base = ["--url", redis_url, "--namespace", namespace, "--json"]
        status, out, _ = cli(capsys, *base, "inspect", "category-map:{shop}", "shop=s1")
        [entry] = out["entries"]
        assert status == 0 and entry["key"] == f"{namespace}:{{category-map:s1}}"
        assert entry["state"] == "value" and entry["value"] == {"shop": "s1", "categories": ["books"]}
        assert 0 < entry["ttl_s"] <= 60 * (1 + layer.settings.jitter)
        assert 0 <= entry["age_s"] < 10 and entry["size_bytes"] > 0
        assert entry["lock"] == {"held": False} and entry["waiting_processes"] == 0

        _, out, _ = cli(capsys, *base, "inspect", "category-map:gone")
        assert out["entries"][0]["state"] == "null" and "value" not in out["entries"][0]

        _, out, _ = cli(capsys, *base, "inspect", "category-map:{shop}", "shop=slow")
        [entry] = out["entries"]
        assert entry["state"] == "absent" and entry["lock"]["held"]
        assert 0 < entry["lock"]["ttl_s"] <= layer.settings.lock_ttl and len(entry["lock"]["holder"]) == 32

        named = layer.lock("nightly-report")
        assert named.acquire()
        try:
            _, out, _ = cli(capsys, *base, "locks")
            by_kind = {row["kind"]: row for row in out["locks"]}
            assert by_kind["load"]["name"] == "category-map:slow"
            assert by_kind["named"]["name"] == "nightly-report" and by_kind["named"]["fence"] == named.fence
            assert by_kind["named"]["queued"] == 0
        finally:
            named.release()

        # the same, for a person
        status, out, _ = cli(capsys, "--url", redis_url, "--namespace", namespace, "inspect", "category-map:s1")
        assert status == 0 and "state      value" in out and "lease      free" in out and '"books"' in out
    finally:
        gate.set()
        slow.join(10)


def fill(client: redis.Redis, namespace: str, entries: list[str]) -> None:
    """Write a cached value for each entry, as a layer would have."""
    codec, now = Codec(), time.time()
    pipe = client.pipeline(transaction=False)
    for entry in entries:
        pipe.set(f"{namespace}:{{{entry}}}", codec.encode({"entry": entry}, now, 0.001, key=entry), px=300_000)
        if len(pipe) >= 2000:
            pipe.execute()
    pipe.execute()


def entries_of(client: redis.Redis, namespace: str) -> set[str]:
    return {key.decode() for key in client.scan_iter(match=f"{namespace}:*", count=1000)}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("pattern", [["product:*"], ["product:{id}"]], ids=["glob", "template"])
def test_invalidate_by_pattern_removes_ten_thousand_entries_and_nothing_else(
    redis_client: redis.Redis,
    redis_url: str,
    namespace: str,
    layer: Stampede,
    pattern: list[str],
    capsys: pytest.CaptureFixture[str],
) -> None:
    products = [f"product:{index}" for index in range(10_000)]
    others = ["category-map:s1", "product-list:s1", "order:s1:5", "productx"]
    fill(redis_client, namespace, products + others)
    fill(redis_client, "other-ns", ["product:1"])
    named = layer.lock("product:*")  # a named lock whose name matches the glob
    assert named.acquire()
    named.release()
    before = entries_of(redis_client, namespace)
    base = ["--url", redis_url, "--namespace", namespace, "--json"]

    status, out, _ = cli(capsys, *base, "invalidate", *pattern)  # the dry run: a count
    assert status == 0 and out["matched"] == 10_000 and out["invalidated"] == 0
    assert entries_of(redis_client, namespace) == before

    status, out, err = cli(capsys, *base, "invalidate", *pattern, "--yes")
    assert status == 0 and out["invalidated"] == 10_000
    told = [line.split(" (")[0] for line in err.splitlines()]  # progress on stderr, the JSON alone on stdout
    assert told == [f"invalidated {done} of 10000" for done in range(1000, 10_001, 1000)]
    left = entries_of(redis_client, namespace)
    assert left == {f"{namespace}:{{{entry}}}" for entry in others} | {k for k in before if "~lock:" in k}
    assert redis_client.exists("other-ns:{product:1}")
    redis_client.delete("other-ns:{product:1}")


@pytest.mark.parametrize("store", ["redis", "postgres"])
def test_invalidate_a_tag_counts_first_and_inspect_shows_the_tags(
    store: str, namespace: str, request: pytest.FixtureRequest, capsys: pytest.CaptureFixture[str]
) -> None:
    url = request.getfixturevalue(f"{store}_url")
    layer = Stampede.from_url(url, namespace=namespace)
    request.addfinalizer(layer.close)

    @layer.cached_loader("product-list:{category_id}:{page}", tags=["category:{category_id}", "catalog"])
    def product_list(category_id: int, page: int) -> list[int]:
        return [category_id, page]

    for category_id, page in [(1, 1), (1, 2), (2, 1)]:
        product_list(category_id, page)
    base = ["--url", url, "--namespace", namespace, "--json"]
    status, out, _ = cli(capsys, *base, "inspect", "product-list:1:1")
    assert status == 0 and out["entries"][0]["tags"] == ["category:1", "catalog"]

    status, out, _ = cli(capsys, *base, "invalidate", "--tag", "category:{id}", "id:=1")  # the dry run: a count
    assert status == 0 and out == {"tag": "category:1", "matched": 2, "invalidated": 0, "dry_run": True}
    status, out, err = cli(capsys, *base, "invalidate", "--tag", "category:1", "--yes")
    assert status == 0 and out["invalidated"] == 2
    assert err == "invalidating 2 entries tagged 'category:1'...\n"  # said before the long call
    _, out, _ = cli(capsys, *base, "inspect", "product-list:*")
    assert [entry["state"] for entry in out["entries"]] == ["value"]  # 2:1 alone is left

    status, text, _ = cli(capsys, "--url", url, "--namespace", namespace, "invalidate", "--tag", "catalog")
    assert status == 0 and text.strip().startswith("1 entries carry the tag 'catalog'")
    status, _, err = cli(capsys, *base, "invalidate", "--tag", "bad tag")
    assert status == 2 and "bad tag" in err


def test_a_template_matches_its_fields_exactly(
    redis_client: redis.Redis, redis_url: str, namespace: str, capsys: pytest.CaptureFixture[str]
) -> None:
    fill(redis_client, namespace, ["order:s1:1", "order:s1:2", "order:s2:1", "order:s1", "order:s1:1:x"])
    base = ["--url", redis_url, "--namespace", namespace, "--json"]
    _, out, _ = cli(capsys, *base, "invalidate", "order:{shop}:{id}", "shop=s1", "--yes")
    assert out["invalidated"] == 2  # not order:s1 (one field), not order:s1:1:x (three)
    _, out, _ = cli(capsys, *base, "invalidate", "order:{shop}:{id}", "shop=s2", "id:=1")  # names one: no dry run
    assert out["invalidated"] == 1
    assert entries_of(redis_client, namespace) == {f"{namespace}:{{order:s1}}", f"{namespace}:{{order:s1:1:x}}"}


def test_a_pattern_finds_an_entry_whose_load_is_in_flight_by_its_lease(
    redis_url: str, namespace: str, layer: Stampede, capsys: pytest.CaptureFixture[str]
) -> None:
    gate, loading = threading.Event(), threading.Event()

    @layer.cached_loader("report:{day}")
    def report(day: str) -> str:
        loading.set()
        assert gate.wait(10)
        return "stale by now"

    results: list[str] = []
    slow = threading.Thread(target=lambda: results.append(report("mon")))
    slow.start()
    assert loading.wait(10)
    status, out, _ = cli(
        capsys, "--url", redis_url, "--namespace", namespace, "--json", "invalidate", "report:*", "--yes"
    )
    gate.set()
    slow.join(10)
    assert status == 0 and out["invalidated"] == 1
    assert results == ["stale by now"] and layer.stats()["stale_writes_prevented"] == 1  # its write was refused


def test_stats_read_a_running_apps_metrics_endpoint(
    redis_url: str, namespace: str, capsys: pytest.CaptureFixture[str]
) -> None:
    prometheus_client = pytest.importorskip("prometheus_client")
    from stampede.prometheus import PrometheusMetrics

    registry = prometheus_client.CollectorRegistry()
    server, thread = prometheus_client.start_http_server(0, addr="127.0.0.1", registry=registry)
    layer = Stampede.from_url(redis_url, namespace=namespace, observers=[PrometheusMetrics(registry)])

    @layer.cached_loader("item:{n}")
    def item(n: int) -> int:
        return n

    try:
        item(1), item(1), item(2)
        url = f"http://127.0.0.1:{server.server_port}/metrics"
        status, out, _ = cli(capsys, "--namespace", namespace, "--json", "stats", "--metrics-url", url)
        assert status == 0
        assert out["counters"]["loads"] == 2 and out["counters"]["hits"] == 1 and out["counters"]["misses"] == 2
        assert out["load"]["count[value]"] == 2
        status, out, _ = cli(capsys, "--namespace", namespace, "stats", "--metrics-url", url)
        assert status == 0 and "loads" in out and "loads value" in out
    finally:
        layer.close()
        server.shutdown()
        server.server_close()
        thread.join(5)


@pytest.mark.parametrize(
    ("args", "status", "says"),
    [
        (["--url", f"redis://127.0.0.1:{free_port()}/0", "locks"], 1, "Connection refused"),
        (["--url", "nonsense://x", "locks"], 2, "bad URL"),
        (["inspect", "product:["], 2, "never closed"),
        (["invalidate", "product:{id}", "nope=1"], 2, "no placeholder for nope"),
        (["invalidate", "product:{id}", "id"], 2, "bad field"),
        (["stats"], 2, "--metrics-url"),
        (["stats", "--metrics-url", f"http://127.0.0.1:{free_port()}/metrics"], 1, "cannot read metrics"),
    ],
    ids=["unreachable", "bad-url", "bad-glob", "unknown-field", "bad-field", "no-metrics-url", "metrics-down"],
)
def test_errors_exit_non_zero_with_one_line(redis_url: str, args: list[str], status: int, says: str) -> None:
    if "--url" not in args:
        args = ["--url", redis_url, *args]
    done = subprocess.run(
        [sys.executable, "-m", "stampede", *args], cwd=ROOT, capture_output=True, text=True, timeout=30
    )
    assert done.returncode == status, done
    assert done.stdout == "" and len(done.stderr.strip().splitlines()) == 1 and says in done.stderr, done.stderr


@pytest.mark.parametrize("topology", ["redis", "cluster", "sentinel"])
def test_waiters_locks_and_patterns_on_one_server_a_cluster_and_through_sentinel(
    topology: str, request: pytest.FixtureRequest, capsys: pytest.CaptureFixture[str]
) -> None:
    """Entries spread over every primary are all found (SCAN on each), a waiter's
    subscription is counted where it is (sharded on a cluster), locks and invalidation."""
    make = request.getfixturevalue(f"make_{'layer' if topology == 'redis' else topology + '_layer'}")
    url = (
        request.getfixturevalue("redis_url")
        if topology == "redis"
        else request.getfixturevalue(f"{topology}_servers").url
    )
    layer = make(namespace="cli-topology")
    gate, loading = threading.Event(), threading.Event()

    @layer.cached_loader("item:{n}")
    def item(n: int) -> int:
        if n == 0:
            loading.set()
            assert gate.wait(10)
        return n

    for n in range(1, 41):
        item(n)
    waiter_layer = make(namespace="cli-topology")
    loader = threading.Thread(target=item, args=(0,))
    loader.start()
    assert loading.wait(10)

    @waiter_layer.cached_loader("item:{n}")
    def waiting_item(n: int) -> int:
        return n

    waiter = threading.Thread(target=waiting_item, args=(0,))
    waiter.start()
    try:
        base = ["--url", url, "--namespace", "cli-topology", "--json"]
        base += ["--cluster"] if topology == "cluster" else []
        deadline = time.monotonic() + 10
        while True:
            _, out, _ = cli(capsys, *base, "inspect", "item:0")
            if out["entries"][0]["waiting_processes"] == 1 or time.monotonic() > deadline:
                break
        [entry] = out["entries"]
        assert entry["lock"]["held"] and entry["waiting_processes"] == 1
        _, out, _ = cli(capsys, *base, "locks")
        assert [row["name"] for row in out["locks"]] == ["item:0"]
        _, out, _ = cli(capsys, *base, "invalidate", "item:*")
        assert out["matched"] == 41  # 40 values and the lease in flight
    finally:
        gate.set()
        loader.join(10)
        waiter.join(10)
    _, out, _ = cli(capsys, *base, "invalidate", "item:*", "--yes")
    assert out["invalidated"] == 41
    assert layer.matching("item:*") == []


def test_inspect_locks_and_invalidate_on_a_postgresql_store(
    postgres_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """The command line asks the backend, not Redis: the same commands read a PostgreSQL
    store (which cannot count a waiting process, and says so)."""
    namespace = f"cli-{uuid.uuid4().hex[:8]}"
    layer = Stampede.from_url(postgres_url, namespace=namespace)
    gate, loading = threading.Event(), threading.Event()

    @layer.cached_loader("item:{n}", ttl=60)
    def item(n: int) -> dict[str, int] | None:
        if n == 0:
            loading.set()
            assert gate.wait(10)
        return None if n == 2 else {"n": n}

    item(1)
    item(2)
    loader = threading.Thread(target=item, args=(0,))
    loader.start()
    named = layer.lock("report")
    try:
        assert loading.wait(10)
        assert named.acquire()
        base = ["--url", postgres_url, "--namespace", namespace, "--json"]
        _, out, _ = cli(capsys, *base, "inspect", "item:{n}", "n=1")
        [entry] = out["entries"]
        assert entry["state"] == "value" and entry["value"] == {"n": 1} and 0 < entry["ttl_s"] <= 60 * 1.2
        assert entry["lock"] == {"held": False} and entry["waiting_processes"] is None
        _, out, _ = cli(capsys, *base, "inspect", "item:2")
        assert out["entries"][0]["state"] == "null"
        _, out, _ = cli(capsys, *base, "inspect", "item:0")
        assert out["entries"][0]["lock"]["held"] and out["entries"][0]["state"] == "absent"
        _, out, _ = cli(capsys, *base, "locks")
        rows = {(row["kind"], row["name"]): row for row in out["locks"]}
        assert set(rows) == {("load", "item:0"), ("named", "report")}
        assert rows[("named", "report")]["queued"] == 0 and 0 < rows[("load", "item:0")]["ttl_s"] <= 10
        status, out, _ = cli(capsys, *base, "inspect", "item:0")  # the human form too
        status, text, _ = cli(capsys, "--url", postgres_url, "--namespace", namespace, "inspect", "item:1")
        assert status == 0 and "unknown (the store cannot tell)" in text
    finally:
        gate.set()
        loader.join(10)
        named.release()
    _, out, _ = cli(capsys, *base, "invalidate", "item:*", "--yes")
    assert out["invalidated"] == 3
    assert layer.matching("item:*") == []
    layer.close()


def test_an_embedded_store_is_refused_with_a_clear_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--url", "memory://", "locks"]) == 2
    assert "one process's memory" in capsys.readouterr().err


def test_invalidate_a_tag_longer_than_max_key_length(
    layer: Stampede, redis_url: str, namespace: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A tag past ``max_key_length`` is kept shortened (with a digest): the command line
    renders it from the name given, as the layer does, not from its own shortened name."""
    name = "n" * (layer.settings.max_key_length + 50)

    @layer.cached_loader("long-tagged:{name}", tags=["long:{name}"])
    def long_tagged(name: str) -> int:
        return len(name)

    long_tagged(name)
    base = ["--url", redis_url, "--namespace", namespace, "--json"]
    status, out, _ = cli(capsys, *base, "invalidate", "--tag", f"long:{name}")
    assert status == 0 and out["matched"] == 1
    status, out, err = cli(capsys, *base, "invalidate", "--tag", f"long:{name}", "--yes")
    assert status == 0 and out["invalidated"] == 1, err
    assert long_tagged.peek(name) is None


def test_an_unreachable_postgres_is_one_line_naming_the_cause(capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("psycopg", reason="psycopg is not installed (the dev extra installs it)")
    started = time.monotonic()
    status, _, err = cli(capsys, "--url", f"postgresql://app:secret@127.0.0.1:{free_port()}/db", "inspect", "x*")
    assert status == 1
    assert len(err.strip().splitlines()) == 1, err  # no pool's retries on the way
    assert "Connection refused" in err and "secret" not in err
    assert time.monotonic() - started < 4.5  # not the pool's 5 s wait for a connection


def test_version_names_stampedes_version_and_what_it_runs_on() -> None:
    """``stampede --version`` (here ``python -m stampede``, as the console script runs
    ``stampede.cli:main``): the package's version, redis-py's and Python's, and exit 0."""
    import stampede

    done = subprocess.run([sys.executable, "-m", "stampede", "--version"], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    python = ".".join(str(part) for part in sys.version_info[:3])
    assert done.stdout.strip() == f"stampede {stampede.__version__} (redis-py {redis.__version__}, Python {python})"


def test_server_runs_a_throwaway_server_until_stopped_and_refuses_a_taken_port() -> None:
    """``stampede server``, the docs' one-line way to a server for their snippets: it
    answers at the address it prints, a second one on the same port is refused with one
    line (it would otherwise find the first answering), and stopping the command stops the
    server it started."""
    port = free_port()
    command = [sys.executable, "-m", "stampede", "server", "--port", str(port)]
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as running:
        try:
            assert running.stdout is not None
            first_line = running.stdout.readline()
            assert f"redis://127.0.0.1:{port}/0" in first_line
            with redis.Redis(port=port, socket_timeout=5) as client:
                assert client.ping()
                server_pid = int(client.info("server")["process_id"])
            taken = subprocess.run(command, capture_output=True, text=True, timeout=30)
            assert taken.returncode == 1
            said = f"stampede server: 127.0.0.1:{port} is taken (Address already in use); try --port"
            assert taken.stderr.strip() == said
        finally:
            running.terminate()
            assert running.wait(timeout=10) == 0
    deadline = time.monotonic() + 5
    while Path(f"/proc/{server_pid}").exists() and time.monotonic() < deadline:
        time.sleep(0.02)  # reaped by the command's stop before it exited: gone at once
    assert not Path(f"/proc/{server_pid}").exists()
