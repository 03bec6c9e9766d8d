"""The code blocks of the README and the docs, run as written (tests/tools/test_snippets.py).

A page's ``python`` blocks run in order in one namespace, as a reader pasting them into
``python -m asyncio`` would: a later block may use what an earlier one defined, and a
top-level ``await`` runs on the page's one event loop. The address the pages give for a
throwaway server (``redis://127.0.0.1:6379``, what ``stampede server`` starts) is the
server the test started. A block that cannot run as written (a settings module, a piece
of a larger program) says so on the line before its fence, with the reason::

    <!-- fragment: Django's settings module -->

``python tests/tools/snippets.py PAGE URL`` runs one page and exits non-zero at its
first failing block, naming the block's line.
"""

from __future__ import annotations

import ast
import asyncio
import re
import sys
import traceback
import types
import warnings
from dataclasses import dataclass
from pathlib import Path

from stampede import Stampede

ROOT = Path(__file__).resolve().parents[2]
PAGES = ["README.md", *sorted(str(path.relative_to(ROOT)) for path in (ROOT / "docs").rglob("*.md"))]
FENCE = re.compile(r"^(?P<indent> *)(?P<fence>```+|~~~+)\s*(?P<info>[^\n]*)$")
FRAGMENT = re.compile(r"^\s*<!-- fragment: (?P<reason>[^>]*\S) -->\s*$")
DOCS_ADDRESS = "127.0.0.1:6379"


@dataclass(frozen=True)
class Block:
    page: str
    line: int  # of the fence, from 1
    language: str
    code: str
    fragment: str | None  # the reason it does not run, if it says so


def blocks(page: str) -> list[Block]:
    """Every fenced block of ``page``, in order."""
    lines = (ROOT / page).read_text(encoding="utf-8").splitlines()
    found: list[Block] = []
    index = 0
    while index < len(lines):
        opening = FENCE.match(lines[index])
        if opening is None:
            index += 1
            continue
        indent, fence = len(opening["indent"]), opening["fence"]
        language = opening["info"].split()[0] if opening["info"].strip() else ""
        end = index + 1
        while end < len(lines) and lines[end].strip() != fence:
            end += 1
        code = "\n".join(line[indent:] for line in lines[index + 1 : end])
        before = lines[index - 1] if index else ""
        marked = FRAGMENT.match(before)
        found.append(Block(page, index + 1, language, code, marked["reason"] if marked else None))
        index = end + 1
    return found


def runnable(page: str) -> list[Block]:
    return [block for block in blocks(page) if block.language in ("python", "py") and block.fragment is None]


def served_by(code: str, url: str) -> str:
    """``code`` with the docs' address replaced by that of the server at ``url``."""
    return code.replace(DOCS_ADDRESS, url.split("://", 1)[1].split("/", 1)[0].rsplit("@", 1)[-1])


def run_page(page: str, url: str) -> int:
    """Run ``page``'s runnable blocks against the server at ``url``; 0 if all ran."""
    page_module = types.ModuleType("__main__")  # as a script is: classes defined here are found by name
    sys.modules["__main__"] = page_module
    namespace = page_module.__dict__
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    warnings.simplefilter("error")  # a snippet that warns is a snippet that misleads
    try:
        for block in runnable(page):
            code = served_by(block.code, url)
            try:
                compiled = compile(code, f"{page}:{block.line}", "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
                result = eval(compiled, namespace)  # the page's own code
                if asyncio.iscoroutine(result):
                    loop.run_until_complete(result)
            except BaseException:
                print(f"{page}, the block at line {block.line} failed:", file=sys.stderr)
                traceback.print_exc()
                return 1
        for value in list(namespace.values()):  # what a reader's interpreter would drop at its exit
            if isinstance(value, Stampede):
                loop.run_until_complete(value.aclose())
        return 0
    finally:
        loop.close()


if __name__ == "__main__":
    sys.exit(run_page(sys.argv[1], sys.argv[2]))
