"""Sentinel's ``+switch-master``, watched: no command after a failover waits on the old master.

redis-py's Sentinel pool learns where the master is only when it opens a connection. The
connections already in the pool still point at the old master. A master that crashed
refuses them at once, but one frozen (SIGSTOP, a stalled VM, a partition) answers
nothing, and every pooled connection that carries a command there waits out its socket
timeout before the pool asks the sentinels: a second load per key, in every process.

So one thread per layer listens on a sentinel's ``+switch-master`` channel. When a switch
names the layer's service, it tells the blocking pool to ask the sentinels, which drops
the pool's idle connections to the old master (redis-py drops those in use as they come
back), and counts the switch in ``generation``: the asyncio stores, whose pools belong to
their event loops, ask at their next command (see ``AsyncRedisStore``). On every
(re)connection to a sentinel it does the same once, for a switch it may have missed.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from ..._fork import reset_after_fork

log = logging.getLogger("stampede.backend")

CHANNEL = "+switch-master"
RETRY_INTERVAL = 0.5  # before the next sentinel, doubled while none answers
MAX_RETRY_INTERVAL = 8.0
READ_INTERVAL = 1.0  # how often a quiet listener looks whether it was closed
SILENCE = 10.0  # a sentinel that answers nothing (not even a PING) this long is left

# What a sentinel's connection keeps of the settings of redis-py's own sentinel clients.
KEPT = ("host", "port", "username", "password", "socket_timeout", "socket_connect_timeout", "client_name")


class Switches(Protocol):
    """What an asyncio store reads of a watch: how many switches it saw."""

    generation: int


class NoSwitches:
    """The watch of a store that reaches no master through Sentinel: never a switch."""

    generation = 0


NO_SWITCHES = NoSwitches()


def sentinel_settings(pool: Any) -> tuple[str, list[dict[str, Any]]] | None:
    """The service and the sentinels (as connection settings) of a Sentinel pool, blocking
    or asyncio; None for any other pool."""
    manager = getattr(pool, "sentinel_manager", None)
    service = getattr(pool, "service_name", None)
    if manager is None or not isinstance(service, str):
        return None
    sentinels = []
    for client in getattr(manager, "sentinels", []):
        kwargs = client.connection_pool.connection_kwargs
        settings = {name: value for name, value in kwargs.items() if name in KEPT or name.startswith("ssl_")}
        if "SSL" in client.connection_pool.connection_class.__name__:
            settings["ssl"] = True
        sentinels.append({name: value for name, value in settings.items() if value is not None})
    return (service, sentinels) if sentinels else None


def switch_names(message: Any, service: str) -> bool:
    """Whether a ``+switch-master`` message (``<service> <old ip> <old port> <new ip>
    <new port>``) is about ``service``."""
    if not isinstance(message, dict) or message.get("type") != "message":
        return False
    data = message.get("data")
    text = data.decode(errors="replace") if isinstance(data, bytes) else str(data)
    return text.split(" ", 1)[0] == service


class SwitchWatch:
    """Listens to the sentinels for a new master of ``service``; calls ``switched()`` (in
    its thread) for each, and once after each reconnection (not the first connection: the
    pools ask the sentinels when they connect). Never raises: a sentinel that fails is
    left for the next, after ``RETRY_INTERVAL``, doubled up to ``MAX_RETRY_INTERVAL``
    while none answers."""

    def __init__(self, service: str, sentinels: Sequence[dict[str, Any]], switched: Callable[[], None]) -> None:
        self.service = service
        self._sentinels = list(sentinels)
        self._switched = switched
        self.generation = 0  # switches seen (and reconnections), for the asyncio stores
        self.listening = threading.Event()  # set while subscribed at a sentinel
        self._closed = threading.Event()
        self._pubsub: Any = None
        self._listened = False  # whether a sentinel ever confirmed the subscription
        self._thread: threading.Thread | None = None
        reset_after_fork(self)

    def start(self) -> SwitchWatch:
        self._thread = threading.Thread(target=self._run, name="stampede-sentinel-switches", daemon=True)
        self._thread.start()
        return self

    def close(self) -> None:
        self._closed.set()
        pubsub = self._pubsub
        if pubsub is not None:
            try:
                pubsub.close()  # ends a read in progress
            except Exception:  # already gone
                pass
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(READ_INTERVAL + 5)

    def after_fork_in_child(self) -> None:
        """The parent's thread and connection do not exist here: a thread of our own."""
        self._pubsub = None
        self.listening = threading.Event()
        if not self._closed.is_set():
            self.start()

    def _run(self) -> None:
        turn, pause = 0, RETRY_INTERVAL
        while not self._closed.is_set():
            settings = self._sentinels[turn % len(self._sentinels)]
            turn += 1
            try:
                self._listen(settings)
            except Exception as error:  # the sentinel failed or went away (or close() closed it)
                if self._closed.is_set():
                    return
                log.info("stampede: lost the sentinel at %s:%s (%s)", settings.get("host"), settings.get("port"), error)
            finally:
                pause = RETRY_INTERVAL if self.listening.is_set() else min(pause * 2, MAX_RETRY_INTERVAL)
                self.listening.clear()
            self._closed.wait(pause)

    def _listen(self, settings: dict[str, Any]) -> None:
        """Subscribe at one sentinel, and follow each switch it announces until it fails
        or stays silent past ``SILENCE`` (a PING goes out halfway)."""
        # No retry of redis-py's own: close() shuts the socket to end a read at once, and a
        # retry would connect again and read on (a layer's close took READ_INTERVAL); a
        # failure goes to _run, which tries the next sentinel.
        client = redis.Redis(**{**settings, "retry": Retry(NoBackoff(), 0)}, health_check_interval=0)
        pubsub = client.pubsub()  # type: ignore[no-untyped-call, unused-ignore]  # typed from redis-py 8.2
        self._pubsub = pubsub
        try:
            if self._closed.is_set():
                return
            pubsub.subscribe(CHANNEL)
            heard, pinged = time.monotonic(), False
            while not self._closed.is_set():
                message = pubsub.get_message(timeout=READ_INTERVAL)
                now = time.monotonic()
                if message is None:
                    if now - heard > SILENCE:
                        raise redis.TimeoutError(f"the sentinel said nothing for {SILENCE} s")
                    if now - heard > SILENCE / 2 and not pinged:
                        pubsub.ping()
                        pinged = True
                    continue
                heard, pinged = now, False
                if message.get("type") == "subscribe":
                    if self._listened:
                        self._follow()  # a switch while nobody listened
                    self._listened = True
                    self.listening.set()
                elif switch_names(message, self.service):
                    self._follow()
        finally:
            self._pubsub = None
            try:
                pubsub.close()
            except Exception:  # closing a socket that failed
                pass
            client.close()

    def _follow(self) -> None:
        self.generation += 1
        try:
            self._switched()
        except Exception as error:  # the sentinels cannot say now: the pool asks on its next connect
            log.info("stampede: cannot ask the sentinels for the new master of %r (%s)", self.service, error)
