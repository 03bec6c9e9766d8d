"""Counting the commands clients send, with MONITOR (script-internal commands excluded)."""

from __future__ import annotations

import threading
import uuid
from typing import Any

import redis


class CommandMonitor:
    """Records every command clients send to the server while it is open."""

    def __init__(self, url: str) -> None:
        self._client = redis.Redis.from_url(url, socket_timeout=5)
        self._monitor: Any = None
        self._lock = threading.Lock()
        self._commands: list[tuple[str, ...]] = []
        self._seen = threading.Condition(self._lock)
        self._thread: threading.Thread | None = None

    def __enter__(self) -> CommandMonitor:
        self._monitor = self._client.monitor()
        self._monitor.__enter__()
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()
        self.checkpoint()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._monitor.connection.disconnect()
        assert self._thread is not None
        self._thread.join(5)
        self._client.close()

    def checkpoint(self) -> list[tuple[str, ...]]:
        """The commands sent since the last checkpoint (all of them: a marker sent now
        arrives after them), and start counting afresh."""
        marker = f"checkpoint-{uuid.uuid4()}"
        self._client.echo(marker)
        with self._seen:
            assert self._seen.wait_for(lambda: ("ECHO", marker) in self._commands, 5), "marker not seen"
            index = self._commands.index(("ECHO", marker))
            before, self._commands = self._commands[:index], self._commands[index + 1 :]
        return before

    def checkpoint_peek(self) -> list[tuple[str, ...]]:
        """The commands recorded since the last checkpoint, so far."""
        with self._lock:
            return list(self._commands)

    def _read(self) -> None:
        try:
            for event in self._monitor.listen():
                if event.get("client_type") == "lua":
                    continue
                words = tuple(str(event["command"]).split())
                command = (words[0].upper(), *words[1:]) if words else ("",)
                with self._seen:
                    self._commands.append(command)
                    self._seen.notify_all()
        except (redis.RedisError, OSError, ValueError, AttributeError):
            return


HANDSHAKE = ("CLIENT", "HELLO", "AUTH", "SELECT")


def names(commands: list[tuple[str, ...]]) -> list[str]:
    """Command names, without a new connection's handshake (sent once per connection)."""
    return [command[0] for command in commands if command[0] not in HANDSHAKE]
