"""The test kit (``stampede.testing``) cleans up after itself: a server left running by a
test that failed before its ``stop``, or by a process that exited without stopping it,
is stopped when that process exits."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from ..scenarios import wait_until

LEAVES_A_SERVER_RUNNING = textwrap.dedent(
    """
    from stampede.testing import RedisServer

    server = RedisServer().start()
    print(server.process.pid, flush=True)
    raise SystemExit(3)  # as a failed run would: no stop(), no context manager's exit
    """
)


def _running(pid: int) -> bool:
    """Whether ``pid`` is a live process (a zombie counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(") ", 1)[1][0] != "Z"
    except FileNotFoundError:
        return False


def test_a_server_left_running_stops_when_the_process_that_started_it_exits() -> None:
    done = subprocess.run(
        [sys.executable, "-c", LEAVES_A_SERVER_RUNNING], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 3, done.stderr
    pid = int(done.stdout.split()[0])
    try:
        wait_until(lambda: not _running(pid), "the server to stop with the process that started it", timeout=10)
    finally:
        if _running(pid):
            os.kill(pid, 9)  # this test's own leftover, by the PID the child printed


FORKS_UNDER_GEVENT = textwrap.dedent(
    """
    from gevent import monkey

    monkey.patch_all()
    import os
    import redis
    from stampede.testing import RedisServer

    server = RedisServer().start()
    child = os.fork()
    if child == 0:
        raise SystemExit(0)  # a forked worker ends: its exit hooks run
    os.waitpid(child, 0)
    print(redis.Redis.from_url(server.url, socket_timeout=5).ping(), flush=True)
    server.stop()
    """
)


def test_a_forked_child_leaves_its_parents_servers_running() -> None:
    pytest.importorskip("gevent")
    done = subprocess.run(
        [sys.executable, "-c", FORKS_UNDER_GEVENT], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["True"]


def test_a_chosen_port_taken_before_the_server_binds_it_is_given_up_for_another(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A free port is free until someone binds it: a server whose chosen port another
    process took meanwhile starts on another (CI saw two fail at once beside other runs);
    a port given by the caller, or one a server already ran on, is kept and refused."""
    import socket

    from stampede.testing import RedisServer, servers

    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        taken = holder.getsockname()[1]
        chosen, real = iter([taken]), servers.free_port
        monkeypatch.setattr(servers, "free_port", lambda: next(chosen, None) or real())
        server = RedisServer()
        assert server.port == taken
        with server:
            assert server.port != taken and server.url.endswith(f":{server.port}/0")
        with pytest.raises(RuntimeError, match=f"port {taken} is taken"):
            RedisServer(port=taken).start()


def test_a_started_server_entered_as_a_context_is_not_started_twice() -> None:
    """``with RedisServer().start() as server`` once started a second process on the port,
    which exited (the port was the first's) while the first was left running, unstopped:
    entering a running server keeps it, and leaving stops it."""
    from stampede.testing import RedisServer

    server = RedisServer().start()
    first = server.process
    assert first is not None
    with server as entered:
        assert entered.process is first and first.poll() is None
    assert first.poll() is not None and server.process is None
