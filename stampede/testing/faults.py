"""Faults and their witnesses: a TCP proxy that injects network faults, and a way to
count the commands clients send a server. Exported by ``stampede.testing``."""

from __future__ import annotations

import socket
import threading
import time
import uuid
from typing import Any

import redis


class FaultProxy:
    """A TCP proxy on 127.0.0.1 in front of a server, for fault tests: clients connect to
    ``url`` and every byte is relayed, unless the test says otherwise:

    * ``delay``: seconds added before each chunk is relayed, both ways (a slow network).
    * ``stall()`` / ``flow()``: stop relaying, connections kept open (a black hole), and
      start again. ``stall_replies()`` holds back only what the server sends, so commands
      still reach it and run, but their replies wait.
    * ``cut()``: close every open connection at once (a reset, a failover).
    * ``requests_received``: how many chunks clients have sent so far, counted as they
      arrive (before any delay): a test's proof that no command was even attempted.

    Only connections it accepted and made are closed. ``close()`` stops it.
    """

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.delay = 0.0
        self.requests_received = 0
        self._requests_flowing = threading.Event()
        self._replies_flowing = threading.Event()
        self.flow()
        self._lock = threading.Lock()
        self._sockets: set[socket.socket] = set()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self._listener.getsockname()[1])
        self._closed = False
        threading.Thread(target=self._accept, name="fault-proxy", daemon=True).start()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def stall(self) -> None:
        self._requests_flowing.clear()
        self._replies_flowing.clear()

    def stall_replies(self) -> None:
        self._replies_flowing.clear()

    def flow(self) -> None:
        self._requests_flowing.set()
        self._replies_flowing.set()

    def cut(self) -> None:
        with self._lock:
            sockets, self._sockets = self._sockets, set()
        for sock in sockets:
            _close(sock)

    def close(self) -> None:
        self._closed = True
        _close(self._listener)
        self.flow()
        self.cut()

    def __enter__(self) -> FaultProxy:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                continue  # closed
            try:
                server = socket.create_connection(("127.0.0.1", self.target_port), timeout=5)
                server.settimeout(None)
            except OSError:
                _close(client)  # the server is down: so is the connection
                continue
            with self._lock:
                self._sockets.update((client, server))
            for source, sink, flowing in (
                (client, server, self._requests_flowing),
                (server, client, self._replies_flowing),
            ):
                threading.Thread(target=self._relay, args=(source, sink, flowing), daemon=True).start()

    def _relay(self, source: socket.socket, sink: socket.socket, flowing: threading.Event) -> None:
        try:
            while True:
                data = source.recv(65536)
                if not data:
                    break
                if flowing is self._requests_flowing:
                    with self._lock:
                        self.requests_received += 1
                flowing.wait()
                if self.delay:
                    time.sleep(self.delay)
                sink.sendall(data)
        except OSError:
            pass
        _close(source)
        _close(sink)


def _close(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    sock.close()


MARKER_WAIT = 20.0
"""The longest ``CommandMonitor.checkpoint`` waits for its marker to come back."""


class CommandMonitor:
    """Records every command clients send to the server while it is open."""

    def __init__(self, url: str) -> None:
        self._client = redis.Redis.from_url(url, socket_timeout=5)
        self._monitor: Any = None
        self._lock = threading.Lock()
        self._commands: list[tuple[str, ...]] = []
        self._seen = threading.Condition(self._lock)
        self._thread: threading.Thread | None = None
        self._closing = False
        self.reconnects = 0  # MONITOR connections the server closed (commands sent meanwhile are not seen)

    def __enter__(self) -> CommandMonitor:
        self._monitor = self._client.monitor()  # type: ignore[no-untyped-call]
        self._monitor.__enter__()
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()
        self.checkpoint()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._closing = True
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
            # Seen at once on a quiet machine; MARKER_WAIT covers a busy one, where the
            # MONITOR stream of a node under a stampede is read seconds behind.
            assert self._seen.wait_for(lambda: ("ECHO", marker) in self._commands, MARKER_WAIT), "marker not seen"
            index = self._commands.index(("ECHO", marker))
            before, self._commands = self._commands[:index], self._commands[index + 1 :]
        return before

    def checkpoint_peek(self) -> list[tuple[str, ...]]:
        """The commands recorded since the last checkpoint, so far."""
        with self._lock:
            return list(self._commands)

    def _read(self) -> None:
        while not self._closing:
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
                if self._closing:
                    return
            # The server closed the MONITOR connection (a busy server's reader falls
            # behind): monitor again, so that later checkpoints still see their markers.
            try:
                self._monitor = self._client.monitor()  # type: ignore[no-untyped-call]
                self._monitor.__enter__()
                self.reconnects += 1
            except (redis.RedisError, OSError):
                return


HANDSHAKE = ("CLIENT", "HELLO", "AUTH", "SELECT")


def names(commands: list[tuple[str, ...]]) -> list[str]:
    """Command names, without a new connection's handshake (sent once per connection)."""
    return [command[0] for command in commands if command[0] not in HANDSHAKE]
