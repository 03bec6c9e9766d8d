"""Every ``python`` block of the README and the docs runs as written against a server of
its own, or says on the line before its fence why it cannot (tests/tools/snippets.py):
docs that cannot drift from the code."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator

import pytest

from stampede.testing import RedisServer

from .snippets import PAGES, ROOT, blocks, runnable, served_by


@pytest.fixture
def own_url() -> Iterator[str]:
    with RedisServer() as server:  # a page may clear its namespace: no other test's server
        yield server.url


@pytest.mark.parametrize("page", [page for page in PAGES if runnable(page)])
def test_each_pages_python_blocks_run_as_written(page: str, own_url: str) -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "tests" / "tools" / "snippets.py"), page, own_url],
        capture_output=True, text=True, timeout=50, cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Warning" not in done.stderr, done.stderr[-3000:]


@pytest.mark.parametrize("page", ["README.md", "docs/getting-started.md"])
def test_the_first_pages_paste_into_the_asyncio_prompt_they_name(page: str, own_url: str) -> None:
    """What they tell a reader to do: paste each block into ``python -m asyncio``, where
    a compound statement ends only at a blank line."""
    pasted = "\n\n".join(served_by(block.code, own_url) for block in runnable(page))
    done = subprocess.run(
        [sys.executable, "-m", "asyncio"], input=pasted + "\n\nprint('pasted', 'whole')\n",
        capture_output=True, text=True, timeout=50, cwd=ROOT,
    )  # fmt: skip
    assert "Traceback" not in done.stderr and "Error" not in done.stderr, done.stderr[-3000:]
    assert "pasted whole" in done.stdout + done.stderr


def test_the_readme_and_getting_started_have_no_fragments() -> None:
    """A newcomer's first two pages run whole."""
    for page in ("README.md", "docs/getting-started.md"):
        python = [block for block in blocks(page) if block.language == "python"]
        assert python, page
        assert [block.line for block in python if block.fragment] == [], page
