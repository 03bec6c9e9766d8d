"""Write the blocking twin of each asyncio module: ``a<name>.py`` is the source,
``<name>.py`` is generated beside it, so that the two are one text and a fix is made once.

    python .ci/unasync.py            write every blocking module
    python .ci/unasync.py --check    fail if one differs from what its source makes,
                                     or if a substitution below is used by no source

The conversion is textual, as httpcore's ``scripts/unasync.py`` and psycopg's
``tools/async_to_sync.py`` do:

- ``async def``/``async with``/``async for`` lose ``async``; ``await`` is dropped;
  ``Awaitable[X]`` is ``X``, ``asyncio.to_thread(f, args)`` is ``f(args)``;
- ``Async<Name>`` becomes ``<Name>`` (``AsyncStore`` -> ``Store``), every name in
  ``SUBSTITUTIONS`` its blocking twin (``arun`` -> ``run``, ``asyncio.sleep`` ->
  ``time.sleep``), and the ``a<name>`` modules of ``GENERATED`` their blocking modules;
- where the two truly differ, the source says both, the asyncio way first::

      if True:  # ASYNC
          return await asyncio.shield(task)
      else:
          return effect_result

  The blocking module keeps only the ``else`` branch (none: nothing). ``if True`` costs
  the asyncio module nothing: the compiler drops it. A line ending in ``# ASYNC`` is
  left out of the blocking module, and a comment ``# SYNC: <line>`` is put in as
  ``<line>`` (an import only the blocking module needs);
- what one module names of its own is rewritten by that module, which declares it in a
  comment of its own (the converter knows Python, not modules; the comment is left
  out of the blocking module):

      # UNASYNC: self._state() -> self.state      this text becomes that one (whole words)
      # UNASYNC: unwrap self._send 1              self._send(key, command, args) becomes
                                                  command(args): the call unwrapped, its
                                                  first argument dropped
      # UNASYNC: module notify_async -> notify    a hand-written twin module imported
                                                  (``from .notify_async import``)

Imports the blocking module no longer uses are removed and the rest sorted (``ruff
check --select I,F401 --fix``), the text formatted by ``ruff format``; it opens with a
"generated" header.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# (asyncio source, blocking module), from the repository's root.
GENERATED = [
    ("stampede/_acached.py", "stampede/_cached.py"),
    ("stampede/_astream.py", "stampede/_stream.py"),
    ("stampede/_atap.py", "stampede/_tap.py"),
    ("stampede/_awarm.py", "stampede/_warm.py"),
    ("stampede/_backends/aeach.py", "stampede/_backends/each.py"),
    ("stampede/_backends/asteps.py", "stampede/_backends/steps.py"),
    ("stampede/_backends/postgres/astore.py", "stampede/_backends/postgres/store.py"),
    ("stampede/_backends/redis/alock_servers.py", "stampede/_backends/redis/lock_servers.py"),
    ("stampede/_backends/redis/astore.py", "stampede/_backends/redis/store.py"),
    ("stampede/_backends/zookeeper/alocks.py", "stampede/_backends/zookeeper/locks.py"),
    ("stampede/_drivers/abatched.py", "stampede/_drivers/batched.py"),
    ("stampede/_drivers/abudget.py", "stampede/_drivers/budget.py"),
    ("stampede/_drivers/adrive.py", "stampede/_drivers/drive.py"),
    ("stampede/_drivers/aleases.py", "stampede/_drivers/leases.py"),
    ("stampede/_drivers/amany_keys.py", "stampede/_drivers/many_keys.py"),
    ("stampede/_drivers/aone_key.py", "stampede/_drivers/one_key.py"),
    ("stampede/_drivers/aperform.py", "stampede/_drivers/perform.py"),
    ("stampede/_drivers/arunner.py", "stampede/_drivers/runner.py"),
    ("stampede/_drivers/averify.py", "stampede/_drivers/verify.py"),
    ("tests/aleased.py", "tests/leased.py"),
]

# Names that are the same thing in the two worlds, asyncio first. Whole words only.
SUBSTITUTIONS = {
    "arun": "run",
    "abounded": "bounded",
    "abudgeted": "budgeted",
    "awarm": "warm",
    "afinish": "finish",
    "asyncio.sleep": "time.sleep",
    "ano_load": "no_load",
    "aone_of": "one_of",
    "asynccontextmanager": "contextmanager",
    "aclose": "close",
    "redis.asyncio.Redis": "redis.Redis",
}


HEADER = (
    "# Generated from {source} by .ci/unasync.py: do not edit.\n"
    "# Edit the asyncio source, then run `python .ci/unasync.py`.\n"
)

_ASYNC_BLOCK = re.compile(r"^(?P<indent>[ ]*)if True:  # ASYNC$")
_DECLARED = re.compile(
    r"^# UNASYNC: (?:unwrap (?P<callee>\S+) (?P<dropped>\d+)|(?P<module>module )?(?P<old>.+?) -> (?P<new>.+))$", re.M
)
_SYNC_LINE = re.compile(r"^(?P<indent>[ ]*)# SYNC: (?P<line>.*)$")
_KEYWORDS = [
    (re.compile(r"\basync (def|with|for)\b"), r"\1"),
    (re.compile(r"\bawait "), ""),
    (re.compile(r"(?<![A-Za-z0-9])Async(?=[A-Z])"), ""),  # _AsyncX too
]


def _module_names() -> dict[str, str]:
    """``a<name>`` -> ``<name>`` for every generated module and hand-written twin (imports)."""
    return {Path(source).stem: Path(blocking).stem for source, blocking in GENERATED}


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" "))


def _block(lines: list[str], start: int, indent: int) -> int:
    """The index after the block whose lines, from ``start``, are indented past ``indent``
    (blank lines included)."""
    end = start
    while end < len(lines) and (not lines[end].strip() or _indent(lines[end]) > indent):
        end += 1
    while end > start and not lines[end - 1].strip():  # trailing blank lines belong after it
        end -= 1
    return end


def keep_blocking_branches(text: str) -> str:
    """Each ``if True:  # ASYNC`` block replaced by its ``else`` branch, dedented; every
    line ending in ``# ASYNC`` dropped, every ``# SYNC:`` line put in."""
    lines = text.split("\n")
    out: list[str] = []
    index = 0
    while index < len(lines):
        line = lines[index]
        found = _ASYNC_BLOCK.match(line)
        if found is None:
            sync_line = _SYNC_LINE.match(line)
            if sync_line is not None:
                out.append(sync_line["indent"] + sync_line["line"])
            elif not line.rstrip().endswith("# ASYNC"):
                out.append(line)
            index += 1
            continue
        indent = len(found["indent"])
        index = _block(lines, index + 1, indent)
        if index < len(lines) and lines[index] == " " * indent + "else:":
            end = _block(lines, index + 1, indent)
            out.extend(branch[4:] if branch.strip() else branch for branch in lines[index + 1 : end])
            index = end
    return "\n".join(out)


def _word(name: str) -> re.Pattern[str]:
    return re.compile(rf"(?<![\w.]){re.escape(name)}(?!\w)")


def substitutions() -> list[tuple[re.Pattern[str], str]]:
    modules = [(re.compile(rf"(?<!\w){name}(?!\w)"), blocking) for name, blocking in _module_names().items()]
    return [(_word(name), blocking) for name, blocking in SUBSTITUTIONS.items()] + modules


def unwrap_awaitables(text: str) -> str:
    """Every ``Awaitable[X]`` replaced by ``X`` (brackets inside ``X`` matched)."""
    while (start := text.find("Awaitable[")) != -1:
        end = _closing(text, start + len("Awaitable"))
        text = text[:start] + text[start + len("Awaitable[") : end] + text[end + 1 :]
    return text


def _closing(text: str, opening: int) -> int:
    """The index of the bracket that closes the one at ``opening``."""
    depth, index = 0, opening
    while True:
        depth += {"[": 1, "(": 1, "]": -1, ")": -1}.get(text[index], 0)
        if depth == 0:
            return index
        index += 1


def unwrap(text: str, callee: str, dropped: int) -> tuple[str, int]:
    """Every ``callee(a1, ..., f, args)`` with ``dropped`` arguments before ``f`` replaced
    by ``f(args)``, and how many: ``asyncio.to_thread(f, args)`` is ``f(args)`` (what a
    task hands to a worker thread, a thread calls), and a module may declare its own."""
    count = 0
    while (start := _call_of(text, callee)) != -1:
        opening = start + len(callee)
        closing = _closing(text, opening)
        rest = text[opening + 1 : closing]
        for _ in range(dropped):
            rest = rest[_top_level_comma(rest) + 1 :].strip()
        comma = _top_level_comma(rest)
        function, args = rest[:comma].strip(), rest[comma + 1 :].strip()
        text = text[:start] + f"{function}({args})" + text[closing + 1 :]
        count += 1
    return text, count


def _call_of(text: str, callee: str) -> int:
    """Where the first call of ``callee`` begins in ``text`` (-1: none)."""
    found = re.search(rf"(?<![\w.]){re.escape(callee)}\(", text)
    return -1 if found is None else found.start()


def declared(text: str, path: str, unused: list[str]) -> str:
    """``text`` with the rewrites it declares (``# UNASYNC:``) made, and their lines left
    out. A declaration that rewrites nothing is added to ``unused``."""
    declarations = list(_DECLARED.finditer(text))
    text = re.sub(r"^# UNASYNC: .*\n", "", text, flags=re.M)
    for found in declarations:
        if found["callee"]:
            text, count = unwrap(text, found["callee"], int(found["dropped"]))
        elif found["module"]:
            text, count = re.subn(rf"(?<!\w){re.escape(found['old'])}(?!\w)", found["new"], text)
        else:
            text, count = _word(found["old"]).subn(found["new"], text)
        if not count:
            unused.append(f"{path}: {found[0]}")
    return text


def _top_level_comma(inner: str) -> int:
    """The index of the first comma of ``inner`` outside brackets (its length if none)."""
    depth = 0
    for index, char in enumerate(inner):
        depth += {"[": 1, "(": 1, "]": -1, ")": -1}.get(char, 0)
        if char == "," and depth == 0:
            return index
    return len(inner)


def convert(text: str, used: set[str] | None = None, path: str = "", unused: list[str] | None = None) -> str:
    """The blocking module ``text``, an asyncio module, makes (unformatted). The
    substitutions that changed something are added to ``used``, the declarations of the
    module that changed nothing to ``unused``."""
    text = declared(text, path, [] if unused is None else unused)
    text = unwrap(unwrap_awaitables(keep_blocking_branches(text)), "asyncio.to_thread", 0)[0]
    for pattern, replacement in _KEYWORDS:
        text = pattern.sub(replacement, text)
    for pattern, replacement in substitutions():
        text, count = pattern.subn(replacement, text)
        if count and used is not None:
            used.add(pattern.pattern)
    return text


def formatted(text: str, path: str) -> str:
    """``text`` without the imports it no longer uses, sorted and formatted as ``ruff``
    does (the project's style, pyproject.toml): renamed imports may sort elsewhere,
    shorter lines join."""
    for command in (["check", "--select", "I,F401", "--fix", "--quiet", "--exit-zero"], ["format"]):
        done = subprocess.run(
            [sys.executable, "-m", "ruff", *command, "--stdin-filename", path, "-"],
            input=text,
            capture_output=True,
            text=True,
            cwd=ROOT,
            check=False,
        )
        if done.returncode != 0:
            raise SystemExit(f"ruff {command[0]} failed on the blocking text of {path}:\n{done.stderr}")
        text = done.stdout
    return text


def generate(used: set[str] | None = None, unused: list[str] | None = None) -> dict[str, str]:
    """Blocking module path -> the text its source makes."""
    made = {}
    for source, blocking in GENERATED:
        text = convert((ROOT / source).read_text(), used, source, unused)
        made[blocking] = HEADER.format(source=Path(source).name) + formatted(text, blocking)
    return made


def main(argv: list[str]) -> int:
    used: set[str] = set()
    unused_declared: list[str] = []
    made = generate(used, unused_declared)
    if argv == ["--check"]:
        stale = [path for path, text in made.items() if (ROOT / path).read_text() != text]
        unused = [name for name in SUBSTITUTIONS if _word(name).pattern not in used]
        for path in stale:
            print(f"{path} differs from what its asyncio source makes: run python .ci/unasync.py")
        for name in unused:
            print(f"a substitution no source uses: {name} (remove it from .ci/unasync.py)")
        for declaration in unused_declared:
            print(f"a declared rewrite that rewrites nothing: {declaration}")
        return 1 if stale or unused or unused_declared else 0
    if argv:
        print(__doc__)
        return 2
    for path, text in made.items():
        (ROOT / path).write_text(text)
    print(f"wrote {len(made)} blocking modules")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
