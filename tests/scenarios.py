"""Scenarios shared by several test modules (not tests themselves)."""

from __future__ import annotations

import asyncio
import json
import random
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from stampede import Stampede
from stampede.testing import FaultProxy

NETWORK_FAULTS = ["cut", "latency", "stall"]


class WaitsBegun:
    """An observer counting the waits begun (a joiner of a flight begins one, and so does
    a caller waiting on another process's lease), in every layer it is added to."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.begun = 0

    def count(self, namespace: str, event: str, n: int) -> None:
        pass

    def began(self, namespace: str, measure: str) -> None:
        if measure == "wait":
            with self._lock:
                self.begun += 1

    def ended(self, namespace: str, measure: str, outcome: str, seconds: float) -> None:
        pass


def wait_until(condition: Callable[[], Any], what: str = "condition", timeout: float = 5.0) -> None:
    """Poll ``condition`` until it holds; fail the test after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.005)


def parked_in(function: Callable[..., Any]) -> bool:
    """Whether some thread is inside ``function`` now (blocked in it, as a rule)."""
    code = function.__code__
    for frame in sys._current_frames().values():
        while frame is not None:
            if frame.f_code is code:
                return True
            frame = frame.f_back  # type: ignore[assignment]
    return False


async def until(condition: Callable[[], Any], what: str = "condition", timeout: float = 5.0) -> None:
    """``wait_until`` for a coroutine: the event loop runs while it polls."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.005)


def one_load_and_a_wake_up(first: Stampede, second: Stampede) -> tuple[int, float]:
    """A load in ``first`` while ``second`` waits on its lease: loads, and how long after
    the write the waiter had the value. With lease and re-check at 20 s (the caller makes
    the layers so), only the pub/sub message, on the subscriber's own connection, wakes
    it in time: so that connection works (authenticated, over TLS, ...)."""
    calls: list[int] = []
    loading, finish = threading.Event(), threading.Event()

    def slow(key: int) -> dict[str, int]:
        calls.append(key)
        loading.set()
        assert finish.wait(10)
        return {"key": key}

    load_first = first.cached_loader("item:{key}")(slow)
    load_second = second.cached_loader("item:{key}")(slow)
    done: dict[str, float] = {}
    leader = threading.Thread(target=lambda: done.setdefault("leader", (load_first(1), time.monotonic())[1]))
    leader.start()
    assert loading.wait(10)
    waiter_value: list[Any] = []
    waiter = threading.Thread(target=lambda: waiter_value.append((load_second(1), time.monotonic())))
    waiter.start()
    wait_until(lambda: second.stats()["lock_waits"], "the waiter to find the lease held", timeout=10)
    finish.set()
    leader.join(10)
    waiter.join(10)
    assert waiter_value and waiter_value[0][0] == {"key": 1}
    return len(calls), waiter_value[0][1] - done["leader"]


def commands_run(client: Any, command: str) -> int:
    """How many times the server has run ``command`` (INFO commandstats)."""
    stats = client.info("commandstats").get(f"cmdstat_{command}")
    return int(stats["calls"]) if stats else 0


def disturb(proxy: FaultProxy, fault: str, latency: float, rng: random.Random, stop: threading.Event) -> None:
    """One network fault through ``proxy``: cut every connection, or add ``latency`` to
    each chunk, or stall the network, for 0.1-0.5 s (less if ``stop`` is set)."""
    if fault == "cut":
        proxy.cut()
    elif fault == "latency":
        proxy.delay = latency
        stop.wait(rng.uniform(0.1, 0.5))
        proxy.delay = 0.0
    elif fault == "stall":
        proxy.stall()
        stop.wait(rng.uniform(0.1, 0.5))
        proxy.flow()
    else:
        raise ValueError(f"unknown network fault {fault!r}")


def forked_child_passes(check: Callable[[], bool], held: Any) -> bool:
    """Fork while ``held`` is held (a lock a parent's thread would hold mid-report), and
    whether ``check()`` returned True in the child, which must not wait for a lock nobody
    in the child will release (a hung child is killed, and fails)."""
    import os
    import signal

    with held:
        pid = os.fork()
        if pid == 0:
            os._exit(0 if check() else 1)
    exited: list[int] = []

    def child_exited() -> bool:
        ended, status = os.waitpid(pid, os.WNOHANG)
        if ended:
            exited.append(status)
        return bool(ended)

    try:
        wait_until(child_exited, "the forked child's call (a lock held at the fork would hang it)", timeout=10)
    finally:
        if not exited:  # hung: end it (it is ours)
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(exited[0]) == 0


class LineWorker:
    """A worker script in a process of its own, talking a line at a time over its stdin
    and stdout: it prints "ready" once set up, then answers what it is sent."""

    def __init__(self, script: str, *args: str) -> None:
        self.process = subprocess.Popen(
            [sys.executable, script, *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        assert self.line() == "ready"

    def line(self) -> str:
        assert self.process.stdout is not None
        return self.process.stdout.readline().strip()

    def send(self, line: str) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(line + "\n")
        self.process.stdin.flush()

    def ask(self, line: str) -> str:
        """Send ``line`` and return the line it answers."""
        self.send(line)
        return self.line()

    def outcome_line(self) -> dict[str, Any]:
        """The next line it prints, a JSON object, while it goes on."""
        return json.loads(self.line())  # type: ignore[no-any-return]

    def outcome(self, timeout: float = 45.0) -> dict[str, Any]:
        """The JSON object of the last line it prints before it ends (which it must do
        cleanly)."""
        out, _ = self.process.communicate(timeout=timeout)
        assert self.process.returncode == 0, f"the worker exited with {self.process.returncode}"
        return json.loads(out.strip().splitlines()[-1])  # type: ignore[no-any-return]

    def stop(self) -> None:
        """End it if it still runs (by its PID), and close its pipes."""
        if self.process.poll() is None:
            self.process.kill()
        self.process.communicate(timeout=10)


def lead_join_replay(layer: Stampede, template: str) -> None:
    """One streamed call of each role on a cold key of ``template``: a leader, a listener
    in another thread that joins once the leader has made its first chunk, then a replay
    of the kept stream. Each receives ["once", "upon"]."""
    listening = threading.Event()

    @layer.cached_stream(template)
    def story(n: int) -> Any:
        yield "once"
        assert listening.wait(30)
        yield "upon"

    leader = story(1)
    assert next(leader) == "once"
    heard: list[str] = []
    thread = threading.Thread(target=lambda: [(heard.append(chunk), listening.set()) for chunk in story(1)])
    thread.start()
    assert listening.wait(30)
    assert list(leader) == ["upon"]
    thread.join(30)
    assert heard == ["once", "upon"] and list(story(1)) == ["once", "upon"]
