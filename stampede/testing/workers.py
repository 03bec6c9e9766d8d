"""A workload run by several worker processes at once, one of which a nemesis may kill
mid-load (``worker_killed``): what each did survives it, in its ``Recorder``'s stream.

    with RedisServer() as cache, RedisServer() as database, Workers(
        cache.url, database.url, directory, seconds=20, options={"lock_ttl": 0.6}
    ) as workers:
        with Nemesis([worker_killed(workers)]) as nemesis:
            workers.wait()
    report = History.load(*workers.streams).check(wait_bound=12.0)

Each worker is a process of its own (``python -m stampede.testing.workers SPEC``) with
a layer of one namespace, ``threads`` callers over ``keys`` keys and the rows of one
database (``ServerRows``: a Redis server). They draw no ``set``: two processes setting
one entry could leave the older value last, which no cache can know (in one process,
a key's writes take turns). A killed worker's place is taken by a new one, until the
run's end. Every process is started here and ended by its PID.
"""

from __future__ import annotations

import json
import math
import os
import random
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from types import TracebackType
from typing import Any

from .history import History, Recorder
from .workload import Mix, ServerRows, layer_subject, run_workload


class Workers:
    """``processes`` workers running for ``seconds`` against the layer at ``url`` (with
    layer ``options``, JSON ones) and the rows at ``database``, each recording to a
    stream in ``directory`` (``streams``)."""

    def __init__(
        self,
        url: str,
        database: str,
        directory: str | os.PathLike[str],
        *,
        seconds: float,
        processes: int = 3,
        threads: int = 4,
        keys: int = 4,
        delay: float = 0.01,
        options: dict[str, Any] | None = None,
        seed: int = 0,
    ) -> None:
        self.directory = Path(directory)
        self.processes = processes
        self.seconds = seconds
        self._streams: list[Path] = []
        self.killed: list[str] = []
        """The processes (recorders' names) killed."""
        self._spec: dict[str, Any] = {
            "url": url, "database": database, "options": options or {}, "threads": threads, "keys": keys,
            "delay": delay, "namespace": f"w{uuid.uuid4().hex[:8]}", "seed": seed,
        }  # fmt: skip
        self._running: dict[str, subprocess.Popen[bytes]] = {}
        self._lock = threading.Lock()
        self._deadline = math.inf  # set once every first worker is ready (``__enter__``)
        self._go = self.directory / "go"
        self._started = 0

    def _start(self) -> None:
        """One more worker, running until the run's end (the caller holds the lock)."""
        name = f"w{self._started}"
        self._started += 1
        stream = self.directory / f"{name}.jsonl"
        self._streams.append(stream)
        spec = {**self._spec, "name": name, "stream": str(stream), "go": str(self._go)}
        errors = open(self.directory / f"{name}.err", "wb")  # the child keeps it; ours is closed below
        try:
            self._running[name] = subprocess.Popen(
                [sys.executable, "-m", "stampede.testing.workers", json.dumps(spec)], stderr=errors
            )
        finally:
            errors.close()

    @property
    def streams(self) -> list[Path]:
        """Each worker's stream (none for one killed before it began)."""
        return [stream for stream in self._streams if stream.exists()]

    def __enter__(self) -> Workers:
        """Start the workers, and the run's ``seconds`` once every one is ready (its layer
        and database made): on a busy machine starting Python takes seconds, which would
        otherwise come out of the run (a nemesis striking before any worker loaded)."""
        self.directory.mkdir(parents=True, exist_ok=True)
        with self._lock:
            for _ in range(self.processes):
                self._start()
        try:
            self._wait_ready(list(self._running))
        except BaseException:
            self.__exit__(None, None, None)
            raise
        self._deadline = time.monotonic() + self.seconds
        written = self._go.with_suffix(".tmp")
        written.write_text(repr(self._deadline))  # time.monotonic() is the machine's: every process reads it
        os.replace(written, self._go)
        return self

    def _ready(self, name: str) -> bool:
        return (self.directory / f"{name}.ready").exists()

    def _wait_ready(self, names: list[str], timeout: float = 60.0) -> None:
        given = time.monotonic() + timeout
        for name in names:
            while not self._ready(name):
                process = self._running[name]
                if process.poll() is not None:
                    error = (self.directory / f"{name}.err").read_text(errors="replace")[-2000:]
                    raise RuntimeError(f"worker {name} exited with {process.returncode} before it was ready:\n{error}")
                if time.monotonic() > given:
                    raise RuntimeError(f"worker {name} was not ready within {timeout:g} s")
                time.sleep(0.01)

    def kill(self, rng: random.Random, within: float = 5.0) -> str | None:
        """SIGKILL one running worker, chosen by ``rng``, mid-load: its next load is held,
        begun, until the kill (if it begins one within ``within`` seconds, and before the
        run's end; else it is killed where it is). Another is started in its place if the
        run has time left. Returns the killed one's name."""
        with self._lock:
            alive = sorted(name for name, process in self._running.items() if process.poll() is None)
            alive = [name for name in alive if self._ready(name)]  # a replacement still starting has no load
            if not alive or time.monotonic() > self._deadline - 1.0:
                return None
            name = rng.choice(alive)
            hold = self.directory / f"{name}.hold"
            held = self.directory / f"{name}.hold.held"
            hold.touch()
            try:
                given = min(time.monotonic() + within, self._deadline - 0.5)
                while not held.exists() and time.monotonic() < given:
                    time.sleep(0.002)
                process = self._running.pop(name)
                process.send_signal(signal.SIGKILL)
                process.wait()
            finally:
                hold.unlink()
            self.killed.append(name)
            self._start()
            return name

    def wait(self, timeout: float = 60.0) -> None:
        """Wait for the run's end and every worker's; raise if one failed (a killed one
        did not fail)."""
        time.sleep(max(0.0, self._deadline - time.monotonic()))
        with self._lock:
            running = dict(self._running)
        for name, process in running.items():
            try:
                status = process.wait(timeout)
            except subprocess.TimeoutExpired:
                raise RuntimeError(f"worker {name} did not end") from None
            if status != 0:
                error = (self.directory / f"{name}.err").read_text(errors="replace")[-2000:]
                raise RuntimeError(f"worker {name} exited with {status}:\n{error}")

    def killed_mid_load(self) -> int:
        """How many of the killed workers were running their loader when killed."""
        killed = {self.directory / f"{name}.jsonl" for name in self.killed}
        history = History.load(*(stream for stream in self.streams if stream in killed))
        return len({r.process for r in history.records if r.kind == "load" and r.completed is None})

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        with self._lock:
            self._deadline = 0.0  # no more replacements
            for process in self._running.values():
                if process.poll() is None:
                    process.kill()
                    process.wait()


def work(spec: dict[str, Any]) -> None:
    """One worker's run (``Workers`` starts it in a process of its own)."""
    from .. import Stampede

    recorder = Recorder(spec["name"], stream=spec["stream"])
    rows = ServerRows(
        recorder, spec["database"], delay=spec["delay"], prefix=f"{spec['namespace']}:rows:",
        hold=str(Path(spec["stream"]).with_suffix(".hold")),
    )  # fmt: skip
    layer = Stampede.from_url(spec["url"], namespace=spec["namespace"], ttl=300, **spec["options"])
    try:
        subject = layer_subject(layer, rows)
        Path(spec["stream"]).with_suffix(".ready").touch()
        go, given = Path(spec["go"]), time.monotonic() + 120.0
        while not go.exists():  # the run begins when every first worker is ready
            if time.monotonic() > given:
                raise RuntimeError("the run never began")
            time.sleep(0.005)
        seconds = float(go.read_text()) - time.monotonic()
        seed = spec["seed"] * 1000 + int(spec["name"][1:])
        run_workload(
            subject, recorder, keys=spec["keys"], threads=spec["threads"], operations=10**9, seconds=seconds,
            seed=seed, mix=Mix(set=0),
        )  # fmt: skip
    finally:
        layer.close()
        rows.close()
        recorder.close()


if __name__ == "__main__":
    work(json.loads(sys.argv[1]))


__all__ = ["Workers", "work"]
