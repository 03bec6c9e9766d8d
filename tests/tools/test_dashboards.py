"""The Grafana dashboard (contrib/grafana/stampede.json) and the Prometheus alert rules
(contrib/prometheus/stampede-alerts.yml) that ship with the package: the rules pass
``promtool check rules``, and every metric and label any panel or rule names is in a live
scrape of the example web app (examples/web_app.py) under load."""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from stampede.testing import free_port

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "contrib" / "grafana" / "stampede.json"
RULES = ROOT / "contrib" / "prometheus" / "stampede-alerts.yml"

sys.path.insert(0, str(ROOT / "examples"))
from http_pages import wait_until_up  # noqa: E402


def dashboard_expressions() -> list[str]:
    dashboard = json.loads(DASHBOARD.read_text())
    found = [target["expr"] for panel in dashboard["panels"] for target in panel.get("targets", [])]
    found += [variable["definition"] for variable in dashboard["templating"]["list"] if "definition" in variable]
    return found


def rule_expressions() -> list[str]:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return [rule["expr"] for group in groups for rule in group["rules"]]


METRIC = re.compile(r"\bstampede_[a-z_]+\b")
GROUPING = re.compile(r"\b(?:by|without|on|ignoring)\s*\(([^)]*)\)")
MATCHERS = re.compile(r"\{([^}]*)\}")


def selectors(expression: str) -> tuple[set[str], set[str]]:
    """The metric names and the label names an expression uses (in matchers, in grouping
    clauses, and in ``label_values``)."""
    names = set(METRIC.findall(expression))
    labels: set[str] = set()
    for clause in GROUPING.findall(expression):
        labels |= {label.strip() for label in clause.split(",") if label.strip()}
    for matchers in MATCHERS.findall(expression):
        labels |= {matcher.split("=")[0].strip(" !~") for matcher in matchers.split(",") if matcher.strip()}
    labels |= set(re.findall(r"label_values\([^,]+,\s*(\w+)\)", expression))
    return names, labels


def test_the_dashboard_has_a_panel_for_each_question_and_a_row_per_namespace() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    titles = {panel["title"] for panel in dashboard["panels"]}
    for question in ("Hit ratio by tier", "Loads", "Load duration", "Callers collapsed per load", "Waits",
                     "Stale served, by reason", "Refreshes", "Circuit breakers open", "Evicted leases (1 h)",
                     "Backend errors", "Consistency (nines)", "Consistency checks, by result",
                     "Load budget"):  # fmt: skip
        assert question in titles
    (repeated,) = [panel for panel in dashboard["panels"] if panel.get("repeat")]
    assert repeated["type"] == "row" and repeated["repeat"] == "namespace"
    ids = [panel["id"] for panel in dashboard["panels"]]
    assert len(ids) == len(set(ids))


def test_the_alert_rules_pass_promtool() -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool is not on the PATH (Debian's prometheus package has it; .ci/run installs it)")
    done = subprocess.run([promtool, "check", "rules", str(RULES)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS: 6 rules found" in done.stdout


@pytest.fixture
def web_app() -> Iterator[str]:
    """examples/web_app.py on a free port, on a throwaway server of its own; entries live
    1 s, so traffic over a few seconds both hits and loads."""
    port = free_port()
    command = [sys.executable, "examples/web_app.py", "--port", str(port), "--ttl", "1"]
    process = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_until_up(base, process, path="/stats")  # type: ignore[arg-type]
        yield base
    finally:
        process.terminate()
        try:
            out, _ = process.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            out, _ = process.communicate(timeout=10)
    # Its throwaway server ended with it (uvicorn raises SIGTERM again after shutting down).
    cache = re.search(r"cache: redis://127\.0\.0\.1:(\d+)", out)
    assert cache is not None, out
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", int(cache.group(1))), timeout=2).close()


async def traffic(base: str) -> None:
    """Bursts on cold shops (one load, the rest collapsed), hits, unknown ids (the null
    sentinel), invalidations, and the same again after the entries expire."""
    async with httpx.AsyncClient(base_url=base, timeout=30, limits=httpx.Limits(max_connections=50)) as http:
        for round_number in range(2):
            for shop in ("shop-1", "shop-2", "no-such-shop"):
                await asyncio.gather(*(http.get(f"/categories/{shop}") for _ in range(40)))
            await asyncio.gather(*(http.get(f"/products/{product}") for product in [*range(1, 20), 99999] * 3))
            (await http.post("/categories/shop-1/invalidate")).raise_for_status()
            await asyncio.gather(*(http.get("/categories/shop-1") for _ in range(20)))
            if not round_number:
                await asyncio.sleep(1.1)  # past the ttl: loads again


@pytest.mark.timeout(90)
def test_every_metric_and_label_of_the_panels_and_rules_is_in_a_live_scrape(web_app: str) -> None:
    asyncio.run(traffic(web_app))
    scrape = httpx.get(f"{web_app}/metrics", timeout=10).text
    labels_of: dict[str, set[str]] = {}  # sample name -> label names, for every sample name the app can export
    for family in text_string_to_metric_families(scrape):
        suffixes = {"counter": ["_total", "_created"], "histogram": ["_bucket", "_count", "_sum", "_created"]}
        for suffix in suffixes.get(family.type, [""]):
            labels_of.setdefault(family.name + suffix, set())
        for sample in family.samples:
            labels_of.setdefault(sample.name, set()).update(sample.labels)
    # Under this traffic the measures the panels lean on most have samples, labelled.
    busiest = ["loads_total", "hits_total", "null_hits_total", "collapsed_total", "load_seconds_bucket",
               "wait_seconds_count", "loads_in_progress"]  # fmt: skip
    for name in [f"stampede_{measure}" for measure in busiest]:
        assert "namespace" in labels_of[name], name
    assert {"namespace", "outcome", "le"} <= labels_of["stampede_wait_seconds_bucket"]
    expressions = dashboard_expressions() + rule_expressions()
    assert len(expressions) > 30
    for expression in expressions:
        names, labels = selectors(expression)
        assert names, expression
        if "le" in labels:  # a quantile's buckets
            assert all(name.endswith("_bucket") for name in names), expression
        for name in names:
            assert name in labels_of, f"{name} is not in the scrape ({expression})"
            seen = labels_of[name]
            if seen:  # a labelled metric with no sample yet shows no labels to check
                assert labels <= seen, f"{name} has no label {labels - seen} ({expression})"
