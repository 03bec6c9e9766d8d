"""The HTTP Working Group's cache tests (cache-tests.fyi) against ``stampede.http`` as a
reverse proxy, under both middlewares (``loadtest/cache_tests``): more tests pass than for
any reverse proxy whose results the suite publishes, and no required test fails that
Varnish, httpd or Traffic Server passes, but the deviations ``run.DEVIATIONS`` names.

It needs Node.js and npm (the suite is installed with npm once, into
``$STAMPEDE_CACHE_TESTS_DIR``); without them it skips, saying so. It runs with the
timing tests: the suite's tests wait out freshness lifetimes of a few seconds."""

from __future__ import annotations

import importlib.util
import shutil
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.extended  # the HTTP WG's suite, at length: CI's extended step (tests/conftest.py)

HARNESS = Path(__file__).parent.parent.parent / "loadtest" / "cache_tests" / "run.py"
_spec = importlib.util.spec_from_file_location("cache_tests_run", HARNESS)
assert _spec is not None and _spec.loader is not None
run = importlib.util.module_from_spec(_spec)
sys.modules["cache_tests_run"] = run
_spec.loader.exec_module(run)


@pytest.mark.timing
@pytest.mark.timeout(600)
def test_the_http_working_groups_cache_tests() -> None:
    if shutil.which("node") is None or shutil.which("npm") is None:
        pytest.skip("Node.js and npm are not installed: the HTTP cache's conformance is not checked")
    ours = {f"stampede-{middleware}": run.run_suite(middleware) for middleware in ("asgi", "wsgi")}
    summary = run.classify(ours)  # type: ignore[arg-type]
    # A required test failed on a machine busy with other suites is run again, alone;
    # it is a failure if it fails there too. The first run's words are kept either way.
    problems = [problem for name in ours if (problem := run.fewer_passed(summary, name))]
    for name, results in ours.items():
        for test in run.failing_required(summary, name):
            first = f"{name} fails required {test}: {results.get(test)}"  # type: ignore[attr-defined]
            again = run.run_suite(name.removeprefix("stampede-"), test)
            if "✅" not in again.rsplit("Results", 1)[-1]:  # the suite's mark of a test passed
                problems.append(f"{first}\nand again, alone:\n{again[-3000:]}")
            else:
                print(f"{first}\n(among the others; passed alone)")
    assert not problems, "\n" + run.table(summary, list(ours)) + "\n" + "\n".join(problems)
