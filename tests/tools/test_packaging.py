"""What a release ships: a wheel built from this checkout holds every subpackage and
module of ``stampede`` and the ``py.typed`` marker, and the version is written once."""

from __future__ import annotations

import importlib.metadata
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

import stampede

ROOT = Path(__file__).resolve().parents[2]
SOURCE = ROOT / "stampede"

pytestmark = pytest.mark.skipif(
    not (SOURCE / "__init__.py").exists(), reason="no source tree here (the suite runs against an installed wheel)"
)


@pytest.mark.timeout(180)
def test_the_wheel_holds_every_module_and_the_typing_marker(tmp_path: Path) -> None:
    built = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(tmp_path),
            str(ROOT),
        ],
        capture_output=True,
        text=True,
        timeout=170,
    )
    assert built.returncode == 0, built.stderr
    (wheel,) = tmp_path.glob("stampede_guard-*.whl")
    shipped = set(zipfile.ZipFile(wheel).namelist())
    expected = {path.relative_to(ROOT).as_posix() for path in SOURCE.rglob("*.py")} | {"stampede/py.typed"}
    assert expected - shipped == set()
    assert wheel.name.startswith(f"stampede_guard-{stampede.__version__}-")


def test_the_version_is_written_once() -> None:
    assert importlib.metadata.version("stampede-guard") == stampede.__version__
    assert "version =" not in (ROOT / "pyproject.toml").read_text().split("[project]")[1].split("[")[0]


def test_every_editable_install_the_docs_show_is_one_mypy_can_follow() -> None:
    """A default editable install puts setuptools' import hook where mypy cannot follow it
    (user code and the typing tests then fail: "Cannot find implementation or library stub
    for module named stampede"). Every editable install a reader is told to run (the
    README, the docs, the examples, CI) installs the one way: editable_mode=compat."""
    pages = [ROOT / "README.md", ROOT / ".ci" / "run", *sorted((ROOT / "docs").glob("*.md"))]
    pages += sorted((ROOT / "examples").glob("*.md"))
    default = [
        f"{page.relative_to(ROOT)}: {line.strip()}"
        for page in pages
        for line in page.read_text().splitlines()
        if re.search(r"pip install\b[^`]*\s-e\s", line) and "editable_mode=compat" not in line
    ]
    assert default == [], default
