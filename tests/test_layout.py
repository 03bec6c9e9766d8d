"""Imports point one way, read from the source (no import is run):

* ``stampede._core`` (pure decisions and contracts) imports no client library, no
  threading and no asyncio, and nothing of the drivers, the backends or the public
  modules: only itself, the standard library, orjson, and ``stampede._errors``;
* ``stampede._drivers`` import the core, never a backend;
* ``stampede._backends`` import the core, never a driver;
* only the public modules at the top wire drivers and backends together.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import stampede

PACKAGE = Path(stampede.__file__).parent
LEAVES = {"stampede._errors", "stampede._fork"}  # imported by every layer
NOT_PURE = {"redis", "hiredis", "threading", "asyncio", "socket", "select", "cachetools"}


def _imports(path: Path) -> set[str]:
    """The absolute names of the modules ``path`` imports (relative imports resolved)."""
    module = "stampede." + ".".join(path.relative_to(PACKAGE).with_suffix("").parts)
    package = module.rsplit(".", 1)[0] if path.name != "__init__.py" else module.removesuffix(".__init__")
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                name = ".".join(base + ([node.module] if node.module else []))
            else:
                name = node.module or ""
            found.add(name)
            found.update(f"{name}.{alias.name}" for alias in node.names)  # from . import submodule
    return found


def _modules(subpackage: str) -> list[Path]:
    return sorted((PACKAGE / subpackage).glob("*.py"))


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


def test_the_rules_see_relative_imports() -> None:
    names = _imports(PACKAGE / "_drivers" / "perform.py")
    assert "stampede._core.effects" in names and "stampede._drivers.watchdog" in names
