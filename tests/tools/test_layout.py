"""Imports point one way, read from the source (no import is run):

* ``stampede._core`` (pure decisions and contracts) imports no client library, no
  threading and no asyncio, and nothing of the drivers, the backends or the public
  modules: only itself, the standard library, orjson, and ``stampede._errors``;
* ``stampede._drivers`` import the core, never a backend, and no public module (their
  tracing hooks are a room of theirs, ``_drivers.tracing``, which imports nothing of the
  package but the core, the drivers' reports (``_drivers.observe``) and the leaves);
* ``stampede._backends`` import the core, never a driver; a family (a folder under
  ``_backends``) imports no other family;
* the layer (``_layer.py``) names no backend: ``stampede._backend`` chooses it, and is
  the one module at the top that imports a family;
* ``stampede.testing`` imports no private module but the backend seam;
* no circle of imports anywhere in the package.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import stampede

PACKAGE = Path(stampede.__file__).parent
LEAVES = {"stampede._errors", "stampede._fork", "stampede._futures", "stampede._redact"}  # imported by every layer
NOT_PURE = {"redis", "hiredis", "threading", "asyncio", "socket", "select", "cachetools"}


def _imports(path: Path) -> set[str]:
    """The absolute names of the modules ``path`` imports (relative imports resolved)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found |= _imports_of(path, node)
    return found


def _imports_of(path: Path, node: ast.Import | ast.ImportFrom) -> set[str]:
    if isinstance(node, ast.Import):
        return {alias.name for alias in node.names}
    module = "stampede." + ".".join(path.relative_to(PACKAGE).with_suffix("").parts)
    package = module.rsplit(".", 1)[0] if path.name != "__init__.py" else module.removesuffix(".__init__")
    if node.level:
        base = package.split(".")
        base = base[: len(base) - node.level + 1]
        name = ".".join(base + ([node.module] if node.module else []))
    else:
        name = node.module or ""
    return {name} | {f"{name}.{alias.name}" for alias in node.names}  # from . import submodule


def _modules(subpackage: str) -> list[Path]:
    return sorted((PACKAGE / subpackage).rglob("*.py"))


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE).with_suffix("").parts
    return ".".join(("stampede", *parts)).removesuffix(".__init__")


FAMILIES = sorted(path.name for path in (PACKAGE / "_backends").iterdir() if (path / "__init__.py").exists())


def _layer_of(name: str) -> str | None:
    parts = name.split(".")
    if parts[0] != "stampede" or len(parts) < 2:
        return None
    return parts[1] if parts[1] in ("_core", "_drivers", "_backends") else "top"


@pytest.mark.parametrize("path", _modules("_core"), ids=lambda path: path.name)
def test_the_core_is_pure(path: Path) -> None:
    for name in _imports(path):
        root = name.split(".")[0]
        assert root not in NOT_PURE, f"{path.name} imports {name}"
        layer = _layer_of(name)
        if layer is not None and layer != "_core":
            assert any(name == leaf or name.startswith(leaf + ".") for leaf in LEAVES), f"{path.name} imports {name}"


OUTER = [(path, "_backends") for path in _modules("_drivers")] + [(path, "_drivers") for path in _modules("_backends")]


@pytest.mark.parametrize(("path", "forbidden"), OUTER, ids=lambda value: getattr(value, "name", value))
def test_drivers_and_backends_import_neither_each_other_nor_public_modules(path: Path, forbidden: str) -> None:
    for name in _imports(path):
        layer = _layer_of(name)
        assert layer != forbidden, f"{path.name} imports {name}"
        if layer == "top":
            assert any(name == leaf or name.startswith(leaf + ".") for leaf in LEAVES), f"{path.name} imports {name}"


def test_the_tracing_hooks_import_only_the_core_the_drivers_reports_and_the_leaves() -> None:
    allowed = LEAVES | {"stampede._drivers.observe"}
    for name in _imports(PACKAGE / "_drivers" / "tracing.py"):
        layer = _layer_of(name)
        if layer is not None and layer != "_core":
            assert any(name == leaf or name.startswith(leaf + ".") for leaf in allowed), f"tracing.py imports {name}"


def test_no_driver_imports_the_public_observability_wing() -> None:
    for path in _modules("_drivers"):
        assert not [name for name in _imports(path) if name.startswith("stampede.otel")], path.name


@pytest.mark.parametrize("path", _modules("_backends"), ids=lambda path: str(path.relative_to(PACKAGE)))
def test_a_backend_family_imports_no_other_family(path: Path) -> None:
    parts = path.relative_to(PACKAGE / "_backends").parts
    own = parts[0] if len(parts) > 1 else None
    for name in _imports(path):
        family = name.split(".")[2] if name.startswith("stampede._backends.") else None
        if family in FAMILIES:
            assert family == own, f"{path.relative_to(PACKAGE)} imports {name}"


TOP = [path for path in sorted(PACKAGE.glob("*.py"))]


@pytest.mark.parametrize("path", TOP, ids=lambda path: path.name)
def test_only_the_seam_and_public_family_modules_import_a_backend(path: Path) -> None:
    """``_backend.py`` chooses, and hands ``Redlock`` its servers; ``postgres.py`` is the
    PostgreSQL family's public module (its advisory lock). The CLI asks the backend (its
    ``inspector``), whatever the family."""
    allowed = {"_backend.py", "postgres.py"}
    imported = sorted(name for name in _imports(path) if name.startswith("stampede._backends"))
    assert path.name in allowed or not imported, f"{path.name} imports {imported}"


def test_the_layer_names_no_backend() -> None:
    names = _imports(PACKAGE / "_layer.py")
    assert not [name for name in names if name.startswith("stampede._backends")]


def test_the_test_kit_imports_no_private_module_but_the_seam() -> None:
    for path in (
        sorted((PACKAGE / "testing").rglob("*.py")) if (PACKAGE / "testing").is_dir() else [PACKAGE / "testing.py"]
    ):
        for name in _imports(path):
            parts = name.split(".")
            if parts[0] == "stampede" and len(parts) > 1 and parts[1].startswith("_"):
                # A planted defect patches one of the layer's own steps: the parts the layer
                # shares with its rooms (``_parts``) are where the invalidation's drop is.
                known = ("_backend", "_core", "_errors") + (("_parts",) if path.name == "planted.py" else ())
                assert parts[1] in known, f"{path.name} imports {name}"


def test_no_circle_of_imports() -> None:
    """Module-level imports only: one inside a function runs when called, not on import."""
    graph: dict[str, set[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        module = _module_name(path)
        tree = ast.parse(path.read_text())
        top_level = ast.Module(body=[node for node in tree.body if not isinstance(node, ast.If)], type_ignores=[])
        names = set()
        for node in top_level.body:
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                names |= _imports_of(path, node)
        graph[module] = {name for name in names if name.startswith("stampede")}
    modules = set(graph)

    def edges(module: str) -> set[str]:
        found = set()
        for name in graph[module]:
            while name and name not in modules:
                name = name.rpartition(".")[0]
            if name and name != module and not module.startswith(name + "."):
                found.add(name)
        return found

    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(module: str) -> None:
        state[module] = 1
        stack.append(module)
        for target in sorted(edges(module)):
            if state.get(target) == 1:
                circle = [*stack[stack.index(target) :], target]
                raise AssertionError("a circle of imports: " + " -> ".join(circle))
            if target not in state:
                visit(target)
        stack.pop()
        state[module] = 2

    for module in sorted(modules):
        if module not in state:
            visit(module)


def test_the_rules_see_relative_imports() -> None:
    names = _imports(PACKAGE / "_drivers" / "perform.py")
    assert "stampede._core.effects" in names and "stampede._drivers.watchdog" in names


def test_docstrings_and_comments_are_written_in_short_sentences() -> None:
    """At most 3 semicolons per 1,000 words of docstrings and comments, as in the models
    (httpcore, h11, dogpile, cachetools: 0-3): two sentences are two sentences."""
    import io
    import tokenize

    words = semicolons = 0
    for path in sorted(PACKAGE.rglob("*.py")):
        source = path.read_text()
        texts = [
            ast.get_docstring(node, clean=False) or ""
            for node in ast.walk(ast.parse(source))
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
        ]
        texts += [
            token.string
            for token in tokenize.generate_tokens(io.StringIO(source).readline)
            if token.type == tokenize.COMMENT
        ]
        words += sum(len(text.split()) for text in texts)
        semicolons += sum(text.count(";") for text in texts)
    assert semicolons * 1000 <= 3 * words, f"{semicolons} semicolons in {words} words"
