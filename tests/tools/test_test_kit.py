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
