"""PostgreSQL and ZooKeeper servers on 127.0.0.1 for tests, demos and benchmarks, each
started by this process and stopped by its PID. Exported by ``stampede.testing``.

* PostgreSQL: the binaries of the ``pgserver`` wheel (a dev dependency), else of a
  ``postgresql`` package on the machine (``pg_config --bindir``, or Debian's
  ``/usr/lib/postgresql/<version>/bin``). ``initdb`` and ``postgres`` refuse to run as
  root: as root they run as the unprivileged user ``nobody``, in a folder it owns.
* ZooKeeper: Debian's ``zookeeper`` package (its jars in ``/usr/share/java``), or the
  jars under ``$ZOOKEEPER_HOME/lib``, run standalone with the ``java`` on PATH.

``find_postgres()`` and ``find_zookeeper()`` say what is missing, for a test to skip
with one clear line.
"""

from __future__ import annotations

import glob
import importlib.util
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from .servers import _PortTaken, _taken, free_port, on_a_free_port, spawn, stop_process


def find_postgres() -> str | None:
    """The folder of ``initdb`` and ``postgres``, or None."""
    spec = importlib.util.find_spec("pgserver")  # not imported: its import warns without XDG_RUNTIME_DIR
    if spec is not None and spec.origin:
        bundled = Path(spec.origin).parent / "pginstall" / "bin"
        if (bundled / "postgres").exists():
            return str(bundled)
    pg_config = shutil.which("pg_config")
    candidates = sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True)
    if pg_config:
        bindir = subprocess.run([pg_config, "--bindir"], capture_output=True, text=True).stdout.strip()
        candidates.insert(0, bindir)
    for folder in candidates:
        if os.path.exists(os.path.join(folder, "postgres")) and os.path.exists(os.path.join(folder, "initdb")):
            return folder
    return None


def find_zookeeper() -> tuple[str, str] | str:
    """``(java, classpath)`` to run a ZooKeeper server, or what is missing."""
    java = shutil.which("java")
    if java is None:
        return "no java on PATH to run ZooKeeper"
    home = os.environ.get("ZOOKEEPER_HOME")
    folders = [os.path.join(home, "lib"), home] if home else []
    folders.append("/usr/share/java")
    for folder in folders:
        if glob.glob(os.path.join(folder, "zookeeper-3*.jar")) or glob.glob(os.path.join(folder, "zookeeper.jar")):
            return java, os.path.join(folder, "*")
    return "no ZooKeeper jars: apt-get install zookeeper, or set ZOOKEEPER_HOME"


def _wait_port(port: int, process: subprocess.Popen[bytes], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while True:
        if process.poll() is not None:
            raise RuntimeError(f"{what} exited with {process.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what} did not listen on port {port} within {timeout} s")
        time.sleep(0.02)


class PostgresServer:
    """One PostgreSQL server on 127.0.0.1 with a database cluster in a temporary folder,
    trusting local connections. ``url`` while it runs. A context manager."""

    def __init__(self, port: int | None = None) -> None:
        folder = find_postgres()
        if folder is None:
            raise RuntimeError("no PostgreSQL binaries: pip install pgserver, or apt-get install postgresql")
        self.bindir = folder
        self.port = port or free_port()
        self._port_chosen = port is None  # given up for another if taken before the bind
        self.process: subprocess.Popen[bytes] | None = None
        self._dir: str | None = None
        self._user: dict[str, Any] = {}

    @property
    def url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def _as_user(self) -> dict[str, Any]:
        """Run as ``nobody`` when root: initdb and postgres refuse root."""
        if os.geteuid() != 0:
            return {}
        nobody = pwd.getpwnam("nobody")
        return {"user": nobody.pw_uid, "group": nobody.pw_gid, "extra_groups": []}

    def start(self, timeout: float = 30.0) -> PostgresServer:
        """Create the cluster (first start only) and start the server. Return once it
        accepts connections, its own (another server on the port would accept them too).
        A second start reuses the cluster and the port: a restart. A port this object
        chose that another process took between the choice and the server's bind is
        given up for another, up to 5 times, as ``RedisServer.start`` does."""
        self._user = self._as_user()
        if self._dir is None:
            self._dir = tempfile.mkdtemp(prefix="stampede-pg-")
            if self._user:
                os.chown(self._dir, self._user["user"], self._user["group"])
            data = os.path.join(self._dir, "data")
            subprocess.run(
                [os.path.join(self.bindir, "initdb"), "-D", data, "-U", "postgres", "--auth=trust", "-E", "UTF8"],
                check=True,
                capture_output=True,
                cwd=self._dir,  # a folder the server's user can enter
                **self._user,
            )
        return on_a_free_port(self, self._start, timeout)

    def _start(self, timeout: float) -> PostgresServer:
        assert self._dir is not None
        data = os.path.join(self._dir, "data")
        command = [
            os.path.join(self.bindir, "postgres"), "-D", data, "-p", str(self.port),
            "-c", "listen_addresses=127.0.0.1", "-c", f"unix_socket_directories={self._dir}",
            "-c", "fsync=off", "-c", "max_connections=300", "-c", "shared_buffers=32MB",
        ]  # fmt: skip
        self.process = spawn(
            command,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            cwd=self._dir,
            **self._user,
        )
        self._wait_ready(data, timeout)
        self._port_chosen = False  # its URL is known now: a restart keeps its port
        return self

    def _wait_ready(self, data: str, timeout: float) -> None:
        """Until the server this object started answers on its port (its data folder is
        ``data``): ``_PortTaken`` if it exited with the port taken by another process."""
        import psycopg

        process = self.process
        assert process is not None
        deadline = time.monotonic() + timeout
        while True:
            if process.poll() is not None:
                self.process = None
                if _taken(self.port):
                    raise _PortTaken(f"postgres exited with {process.returncode}: port {self.port} is taken")
                raise RuntimeError(f"postgres exited with {process.returncode}")
            try:
                with psycopg.connect(self.url, connect_timeout=2) as connection:
                    row = connection.execute("SHOW data_directory").fetchone()
                if row is not None and os.path.realpath(row[0]) == os.path.realpath(data):
                    return
            except psycopg.Error:  # "the database system is starting up", or not a postgres
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"postgres did not answer on port {self.port} within {timeout} s")
            time.sleep(0.05)

    def stop(self, mode: str = "fast") -> None:
        """Stop the server: ``fast`` (SIGINT: roll back, disconnect everyone), ``smart``
        (SIGTERM: wait for sessions to end) or ``immediate`` (SIGQUIT: no shutdown, as a
        crash, UNLOGGED tables come back empty). The cluster stays for ``start()``."""
        process, self.process = self.process, None
        signals = {"fast": signal.SIGINT, "smart": signal.SIGTERM, "immediate": signal.SIGQUIT}
        if process is not None:
            stop_process(process, signals[mode], timeout=10)

    def close(self) -> None:
        """Stop the server and remove its cluster."""
        self.stop()
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None

    def __enter__(self) -> PostgresServer:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def _read_all(sock: socket.socket) -> bytes:
    """What the peer sends until it closes the connection (a four-letter-word answer)."""
    chunks = []
    while chunk := sock.recv(4096):
        chunks.append(chunk)
    return b"".join(chunks)


class ZooKeeperServer:
    """One standalone ZooKeeper server on 127.0.0.1, its data in a temporary folder.
    ``hosts`` (``127.0.0.1:port``) while it runs. ``tick_ms`` sets the shortest session
    timeout it grants (2 ticks). A context manager."""

    def __init__(self, port: int | None = None, tick_ms: int = 250) -> None:
        found = find_zookeeper()
        if isinstance(found, str):
            raise RuntimeError(found)
        self.java, self.classpath = found
        self.port = port or free_port()
        self.tick_ms = tick_ms
        self.process: subprocess.Popen[bytes] | None = None
        self._dir: str | None = None

    @property
    def hosts(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self, timeout: float = 60.0) -> ZooKeeperServer:
        """Start the server (keeping its data across a restart) and return once it serves."""
        if self._dir is None:
            self._dir = tempfile.mkdtemp(prefix="stampede-zk-")
        config = os.path.join(self._dir, "zoo.cfg")
        Path(config).write_text(
            f"tickTime={self.tick_ms}\ndataDir={self._dir}/data\nclientPort={self.port}\n"
            "clientPortAddress=127.0.0.1\nmaxClientCnxns=0\nadmin.enableServer=false\n"
            "4lw.commands.whitelist=srvr\nforceSync=no\npreAllocSize=1024\n"
        )
        log4j = os.path.join(self._dir, "log4j.properties")
        Path(log4j).write_text("log4j.rootLogger=WARN, NULL\nlog4j.appender.NULL=org.apache.log4j.varia.NullAppender\n")
        command = [
            self.java, "-Xmx256m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1",
            f"-Dlog4j.configuration=file:{log4j}", "-Dzookeeper.admin.enableServer=false",
            "-cp", self.classpath, "org.apache.zookeeper.server.quorum.QuorumPeerMain", config,
        ]  # fmt: skip
        self.process = spawn(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        _wait_port(self.port, self.process, timeout, "zookeeper")
        self._wait_serving(timeout)
        return self

    def _wait_serving(self, timeout: float) -> None:
        """Wait until the server takes sessions: ``srvr`` reports a mode only once the data
        is loaded (``ruok`` answers as soon as the port is open, and a session asked for
        before then may wait unanswered)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1) as sock:
                    sock.sendall(b"srvr")
                    if b"Mode: " in _read_all(sock):
                        return
            except OSError:
                pass
            time.sleep(0.05)
        raise RuntimeError(f"zookeeper on port {self.port} did not serve within {timeout} s")

    def stop(self) -> None:
        """Stop the process (SIGTERM). Its data stays for ``start()``."""
        process, self.process = self.process, None
        if process is not None:
            stop_process(process, timeout=10)

    def close(self) -> None:
        self.stop()
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None

    def __enter__(self) -> ZooKeeperServer:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.close()
