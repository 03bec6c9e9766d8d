"""What a Locust run needs besides Locust, started by us on 127.0.0.1 and stopped by PID:
a throwaway Redis-compatible server, a fresh shop database, and the web app over them.

``run_locust.py`` starts the web app for each run. ``locustfile.py`` starts all three
itself when it is run on its own (``locust -f loadtest/locustfile.py --headless ...``)
without ``--redis-url``, ``--db`` or ``--host``: see ``Standalone``.
"""

from __future__ import annotations

import atexit
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT / "examples"))

from shop import ShopDatabase  # noqa: E402

from stampede.testing import RedisServer, free_port  # noqa: E402


class WebApp:
    """examples/web_app.py in a subprocess of ours, stopped by its PID."""

    def __init__(self, url: str, database: Path, protection: str, ttl: float, log: Path) -> None:
        self.port = free_port()
        self._log = log.open("w")
        self.process = subprocess.Popen(
            [sys.executable, str(ROOT / "examples" / "web_app.py"), "--redis", url, "--db", str(database),
             "--port", str(self.port), "--ttl", str(ttl), "--protection", protection],
            stdout=self._log, stderr=subprocess.STDOUT, cwd=ROOT,
        )  # fmt: skip
        self.base = f"http://127.0.0.1:{self.port}"

    def wait_ready(self, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"the web app exited with {self.process.returncode}; see {self._log.name}")
            try:
                with urllib.request.urlopen(self.base + "/stats", timeout=2) as response:
                    if response.status == 200:
                        return
            except OSError:
                time.sleep(0.1)
        raise RuntimeError(f"the web app did not answer within {timeout} s")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._log.close()


class Standalone:
    """What this process started for a run given no server, database or host; stopped
    at exit, by the process that started it only (Locust forks its workers after)."""

    def __init__(self) -> None:
        self.owner = os.getpid()
        self.redis_url: str | None = None
        self.db: str | None = None
        self.ttl = 3.0
        self.protection = "on"
        self.started: list[str] = []
        self._server: RedisServer | None = None
        self._folder: Path | None = None  # not a TemporaryDirectory: forked workers would delete it at their exit
        self._web_app: WebApp | None = None
        atexit.register(self.stop)

    def server(self) -> str:
        if self._server is None:
            self._server = RedisServer().start()
            self.started.append(f"a throwaway server at {self._server.url}")
        return self._server.url

    def database(self) -> str:
        if self._folder is None:
            self._folder = Path(tempfile.mkdtemp(prefix="stampede-locust-"))
            path = ShopDatabase.create(self._folder / "shop.sqlite").path
            self.started.append(f"a shop database at {path}")
            self.db = str(path)
        assert self.db is not None
        return self.db

    def web_app(self) -> str:
        if self._web_app is None:
            url = self.redis_url or self.server()
            db = self.db or self.database()
            log = Path(tempfile.gettempdir()) / f"stampede-locust-web_app-{os.getpid()}.log"
            self._web_app = WebApp(url, Path(db), self.protection, self.ttl, log)
            self._web_app.wait_ready()
            self.started.append(f"the web app at {self._web_app.base} (log: {log})")
        return self._web_app.base

    def stop(self) -> None:
        if os.getpid() != self.owner:
            return
        if self._web_app is not None:
            self._web_app.stop()
            self._web_app = None
        if self._server is not None:
            self._server.stop()
            self._server = None
        if self._folder is not None:
            shutil.rmtree(self._folder, ignore_errors=True)
            self._folder = None
