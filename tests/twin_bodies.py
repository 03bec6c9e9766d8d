"""Body-for-body: each blocking method beside its asyncio twin, the async one read as
blocking (``async``/``await`` dropped, ``Async`` names and ``a``-prefixed twins mapped,
as unasync does), and what still differs recorded in ``tests/twins.txt``.

A fix made in one twin changes its difference from the other, and ``test_twins.py``
fails, showing the difference: make the same fix in the other twin, or, if the two
must differ, record it (``python tests/twin_bodies.py --record``) and say why in the
commit. redis-py's two lock files were 0.82 alike and still drifted; here a drift
cannot land unseen.
"""

from __future__ import annotations

import ast
import difflib
import hashlib
import inspect
import re
import sys
import textwrap
from pathlib import Path
from typing import Any

RECORD = Path(__file__).with_name("twins.txt")

# Written the blocking way: what unasync would turn the asyncio text into.
_UNASYNC = [
    (re.compile(r"\basync (def|with|for)\b"), r"\1"),
    (re.compile(r"\bawait "), ""),
    (re.compile(r"\bAsync(?=[A-Z])"), ""),
    (re.compile(r"\b__aenter__\b"), "__enter__"),
    (re.compile(r"\b__aexit__\b"), "__exit__"),
    (re.compile(r"\barun\b"), "run"),
    (re.compile(r"\ba(close|check|acquire|release|invalidate|expire|fetch|matching|clear)\b"), r"\1"),
    (re.compile(r"\bainvalidate_matching\b"), "invalidate_matching"),
]


def unasync(text: str) -> str:
    for pattern, replacement in _UNASYNC:
        text = pattern.sub(replacement, text)
    return text


def _body(cls: type, name: str) -> list[str]:
    """The method's code as ``ast.unparse`` writes it: no docstring, no comment, one
    layout, so that only what runs is compared."""
    function = ast.parse(textwrap.dedent(inspect.getsource(vars(cls)[name]))).body[0]
    assert isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef))
    body = function.body
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        body = body[1:] or [ast.Pass()]
    function.body = body
    function.decorator_list = []
    return ast.unparse(function).splitlines()


def _methods(cls: type) -> dict[str, Any]:
    return {name: value for name, value in vars(cls).items() if inspect.isfunction(value)}


def differences(blocking: type, asyncio_twin: type) -> dict[str, str]:
    """Method name -> the unified difference of its twin's body read as blocking ("" if none)."""
    async_names = {unasync(name): name for name in _methods(asyncio_twin)}
    found = {}
    for name in sorted(set(_methods(blocking)) & set(async_names)):
        mine = _body(blocking, name)
        theirs = [unasync(line) for line in _body(asyncio_twin, async_names[name])]
        diff = difflib.unified_diff(mine, theirs, "blocking", "asyncio", n=0, lineterm="")
        found[name] = "\n".join(line for line in diff if not line.startswith("@@"))
    return found


def fingerprint(difference: str) -> str:
    return "same" if not difference else hashlib.sha1(difference.encode()).hexdigest()[:12]


def current(pairs: list[tuple[type, type]]) -> dict[str, tuple[str, str]]:
    """``Blocking/Async.method`` -> (fingerprint, difference)."""
    found = {}
    for blocking, asyncio_twin in pairs:
        for name, difference in differences(blocking, asyncio_twin).items():
            found[f"{blocking.__name__}/{asyncio_twin.__name__}.{name}"] = (fingerprint(difference), difference)
    return found


def recorded() -> dict[str, str]:
    rows = [line.split() for line in RECORD.read_text().splitlines() if line and not line.startswith("#")]
    return {name: mark for name, mark in rows}


def recorded_on() -> str:
    """The Python that recorded the fingerprints: ``ast.unparse`` writes some constructs
    (f-strings, since 3.12) differently in other versions."""
    first = RECORD.read_text().splitlines()[0]
    return first.rsplit("python ", 1)[1]


def this_python() -> str:
    return f"{sys.version_info[0]}.{sys.version_info[1]}"


def record(pairs: list[tuple[type, type]]) -> None:
    rows = [f"{name} {mark}" for name, (mark, _) in sorted(current(pairs).items())]
    header = f"# twin method, and 'same' or the fingerprint of its difference, by python {this_python()}\n"
    RECORD.write_text(header + "\n".join(rows) + "\n")


if __name__ == "__main__" and sys.argv[1:] == ["--record"]:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from tests.tools.test_twins import BODY_PAIRS

    record(BODY_PAIRS)
    print(f"recorded {RECORD}")
