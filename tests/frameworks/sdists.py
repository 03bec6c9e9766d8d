"""Source distributions of the hosts whose own tests judge an integration (their wheels
ship no tests): downloaded once per machine into ``~/.cache/stampede-tests/<name>``."""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
from pathlib import Path

import pytest

CACHE = Path(os.environ.get("STAMPEDE_SDIST_CACHE", Path.home() / ".cache" / "stampede-tests"))


def source_distribution(name: str, version: str, pattern: str) -> Path:
    """The sdist of ``name`` at ``version`` (its file matches ``pattern``), downloaded
    if need be. Under a lock: the suite's workers ask at once on a new machine, and one
    extracting what another is still writing fails. Skips the test if pip cannot get it."""
    folder = CACHE / name
    folder.mkdir(parents=True, exist_ok=True)
    with (folder / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        found = sorted(folder.glob(pattern))
        if not found:
            download = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:"]
            result = subprocess.run(
                [*download, f"{name}=={version}", "-d", str(folder)], capture_output=True, text=True, timeout=300
            )
            found = sorted(folder.glob(pattern))
            if result.returncode != 0 or not found:
                pytest.skip(
                    f"the source distribution of {name} {version} could not be downloaded: {result.stderr[-300:]}"
                )
        return found[0]
