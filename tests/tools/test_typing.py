"""What users install is typed: mypy --strict on user code sees stampede's types (the
package ships py.typed), in a wheel and in the README's editable install, and the suite
runs with the parser CI asked for."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import redis.utils

pytestmark = pytest.mark.extended  # mypy over user code, at length: CI's extended step (tests/conftest.py)

USER_CODE = """
import asyncio
from stampede import Fetched, RecursiveLoad, Stampede, StampedeError

layer = Stampede(namespace="typed")

@layer.cached_loader("product:{product_id}", ttl=60, stale_while_revalidate=10, stale_if_error=300)
def product(product_id: int) -> dict[str, int] | None:
    return {"id": product_id}

@layer.cached_loader
def category_map(site_id: int) -> list[str]:
    return ["a"]

@layer.cached_loader("async-product:{product_id}")
async def async_product(product_id: int) -> str:
    return "p"

class Repository:
    @layer.cached_loader("row:{row_id}")
    def row(self, row_id: int) -> int:
        return row_id

found: dict[str, int] | None = product(1)
names: list[str] = category_map(1)
key: str = product.key(1)
product.invalidate(1)
product.expire(1)
fetched: Fetched[dict[str, int] | None] = product.fetch(1)
stale: bool = fetched.stale
text: str = asyncio.run(async_product(1))
async_fetched: Fetched[str] = asyncio.run(async_product.fetch(1))
error: type[StampedeError] = RecursiveLoad
reveal_type(product)
"""


def mypy_strict(tmp_path: Path, code: str) -> subprocess.CompletedProcess[str]:
    """mypy --strict on ``code`` as a user's module, seeing stampede as installed."""
    pytest.importorskip("mypy", reason="mypy comes with the dev extra")
    (tmp_path / "user.py").write_text(code)
    return subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--cache-dir", str(tmp_path / "cache"), "user.py"],
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
        env={**os.environ, "PYTHONPATH": "", "MYPYPATH": ""},
    )  # fmt: skip


def test_user_code_type_checks_against_the_installed_package(tmp_path: Path) -> None:
    done = mypy_strict(tmp_path, USER_CODE)
    hint = (
        "mypy cannot follow setuptools' import hook of a default editable install: install with "
        "pip install --config-settings editable_mode=compat -e '.[dev]' (see the README)"
    )
    assert "Cannot find implementation" not in done.stdout, hint
    assert done.returncode == 0, done.stdout + done.stderr
    assert re.search(
        r'Revealed type is "stampede\._cached\.CachedLoader\[\[product_id: (builtins\.)?int\]', done.stdout
    )


def test_the_suite_runs_with_the_parser_it_was_asked_for() -> None:
    """CI runs the suite twice: STAMPEDE_TEST_PARSER says with which redis-py parser."""
    expected = os.environ.get("STAMPEDE_TEST_PARSER")
    if expected is None:
        pytest.skip("STAMPEDE_TEST_PARSER is not set (CI sets it to python or hiredis)")
    assert expected in ("python", "hiredis")
    assert redis.utils.HIREDIS_AVAILABLE == (expected == "hiredis")


MISTYPED_USER_CODE = """
from stampede import Stampede, cached_loader_many

layer = Stampede(namespace="typed", ttl="60")

@layer.cached_loader("product:{product_id}", tll=60)
def product(product_id: int) -> int:
    return product_id

@cached_loader_many("row:{row_id}", near_cache="always")
def rows(row_ids: list[int]) -> dict[int, int]:
    return {}

@layer.cached_loader("page:{page_id}", jitter=0.2)
def page(page_id: int) -> int:
    return page_id
"""


def test_a_setting_misspelt_or_of_the_wrong_type_fails_the_type_check(tmp_path: Path) -> None:
    """Settings are keyword arguments typed once (``stampede._core.config.LoaderSettings``
    and its kin): mypy names a misspelt one, a value of the wrong type, and a layer-only
    setting given to one loader, on every entry point."""
    done = mypy_strict(tmp_path, MISTYPED_USER_CODE)
    assert done.returncode == 1, done.stdout + done.stderr
    errors = {int(line.split(":")[1]) for line in done.stdout.splitlines() if ": error:" in line}
    assert errors == {4, 6, 10, 14}, done.stdout
    assert '"ttl"' in done.stdout and '"tll"' in done.stdout and '"jitter"' in done.stdout, done.stdout
