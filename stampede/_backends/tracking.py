"""A process's invalidation stream for its near cache: one connection and one thread per
layer, kept while the layer lives (see ``_core.near`` for the agreement it keeps).

The connection speaks RESP2 and, once connected, only listens: ``CLIENT TRACKING ON
REDIRECT <its own id> BCAST PREFIX <namespace>:{`` sends it the name of every key of the
namespace that changes (a write, a delete, an expiry, an eviction; ``None`` for a
FLUSHDB), and ``SUBSCRIBE`` adds the namespace's invalidation requests. It is not
redis-py's client-side caching, which refuses Valkey, has no asyncio client and takes
over pub/sub on the client it runs on.

Every fifth of its lease the thread registers this process through the layer's client (a
command on a pooled connection) and then sends a PING down the tracking connection; the
PONG renews the lease. Requests are acknowledged through the pooled client too, in one
pipeline for everything read in one go. On any failure the lease is revoked and every
copy dropped before the thread reconnects; through Sentinel it also reconnects when the
master moved.
"""

from __future__ import annotations

import logging
import secrets
import threading
import time
from collections.abc import Iterable
from typing import Any, Protocol

import redis

from .._core import scripts as _scripts
from .._core.near import ACK_KEY_TTL_MS, NEAR_LEASE, RENEWALS_PER_LEASE, NearChannel, parse_request
from .._fork import reset_after_fork
from .notify import FOLLOW_INTERVAL, connect_pubsub, master_moved

log = logging.getLogger("stampede")

RETRY_INTERVAL = 0.5
"""How long a tracker waits between attempts to connect."""

_INVALIDATIONS = b"__redis__:invalidate"


class NearCopies(Protocol):
    """What a tracker tells the near cache."""

    def drop(self, keys: Iterable[str]) -> None:
        """These keys changed: drop their copies, and refuse fills of reads begun before."""

    def flush(self) -> None:
        """Anything may have changed: drop every copy, refuse every fill begun before."""

    def renew(self, until: float) -> None:
        """The lease runs until ``until`` (monotonic seconds)."""

    def revoke(self) -> None:
        """The stream is lost: serve nothing from now on, and drop every copy."""


class Tracker:
    """Keeps ``copies`` told of every change to the keys of ``channel``'s namespace, and
    holds its lease, on a connection made like ``client``'s."""

    def __init__(
        self,
        client: redis.Redis,
        channel: NearChannel,
        copies: NearCopies,
        timeout: float,
        lease: float = NEAR_LEASE,
    ) -> None:
        self._client = client
        self._channel = channel
        self._request_channel = channel.channel.encode()
        self._copies = copies
        self._timeout = timeout
        self._lease = lease
        self._renew_every = lease / RENEWALS_PER_LEASE
        self._register = client.register_script(_scripts.REGISTER_NEAR)
        self._follows_master = callable(getattr(client.connection_pool, "get_master_address", None))
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lost_since: float | None = None  # warn once per outage, not once per try
        self.connected = threading.Event()  # set while tracked (for tests and tools)
        self._new_member()
        reset_after_fork(self)

    def _new_member(self) -> None:
        self.member = secrets.token_hex(8)
        self._channel.own = self.member

    def start(self) -> None:
        """Start the thread, once (it lives until ``close()``)."""
        with self._lock:
            if self._thread is None and not self._stop.is_set():
                self._thread = threading.Thread(target=self._run, name="stampede-tracker", daemon=True)
                self._thread.start()

    def close(self) -> None:
        with self._lock:
            self._stop.set()
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(self._timeout + 1.0)
            try:  # invalidators need not wait for us until our deadline
                self._client.zrem(self._channel.members, self.member)
            except Exception:
                pass
        self._copies.revoke()

    def after_fork_in_child(self) -> None:
        """The parent's thread and connection are not in the child; the child is a member
        of its own, started again by its first near-cache call."""
        self._lock = threading.Lock()
        stopped, self._stop = self._stop.is_set(), threading.Event()  # its lock may have been held
        if stopped:
            self._stop.set()
        self._thread = None
        self.connected = threading.Event()
        self._new_member()
        self._copies.revoke()

    def _run(self) -> None:
        delay = 0.0
        while not self._stop.wait(delay):
            connection = None
            try:
                connection = self._connect()
                self._serve(connection)
                delay = 0.0  # the master moved: to the new one at once
            except Exception as error:
                delay = RETRY_INTERVAL
                if not self._stop.is_set():
                    self._lost(error)
            finally:
                self.connected.clear()
                self._copies.revoke()
                if connection is not None:
                    try:
                        connection.disconnect()
                    except Exception:
                        pass

    def _lost(self, error: Exception) -> None:
        now = time.monotonic()
        if self._lost_since is None:
            self._lost_since = now
            log.warning(
                "stampede: the near cache's invalidation stream is lost (%s: %s); calls read Redis until it is back",
                type(error).__name__,
                error,
            )
        else:
            log.info("stampede: the near cache's invalidation stream is still lost (%s)", error)

    def _connect(self) -> Any:
        connection = connect_pubsub(self._client.connection_pool, self._timeout)
        connection.connect()
        connection.send_command("CLIENT", "ID")
        client_id = connection.read_response()
        connection.send_command(
            "CLIENT", "TRACKING", "ON", "REDIRECT", client_id, "BCAST", "PREFIX", self._channel.prefix
        )
        connection.read_response()
        connection.send_command("SUBSCRIBE", _INVALIDATIONS, self._request_channel)
        confirmed = 0
        while confirmed < 2:  # messages before the confirmations: the flush below covers them
            if not connection.can_read(timeout=self._timeout):
                raise redis.TimeoutError("the server did not confirm the tracking subscription")
            reply = connection.read_response()
            confirmed += isinstance(reply, list) and bool(reply) and reply[0] == b"subscribe"
        # From here on every change reaches us; what was filled before may be stale.
        self._copies.flush()
        self.connected.set()
        if self._lost_since is not None:
            log.warning("stampede: the near cache's invalidation stream is back")
            self._lost_since = None
        return connection

    def _serve(self, connection: Any) -> None:
        """Renew, read and acknowledge until the stop, a failure (raised) or, through
        Sentinel, a move of the master (returns)."""
        next_renewal = time.monotonic()
        next_follow = next_renewal + FOLLOW_INTERVAL
        registered_at = 0.0
        ping_sent: float | None = None  # a PING is out, its PONG not yet read
        while not self._stop.is_set():
            now = time.monotonic()
            if ping_sent is None and now >= next_renewal:
                registered_at = now
                lease_ms = round(self._lease * 1000)
                self._register(keys=[self._channel.members], args=[self.member, lease_ms], client=self._client)
                connection.send_command("PING")
                ping_sent = time.monotonic()
                next_renewal = registered_at + self._renew_every
            elif ping_sent is not None and now - ping_sent > self._timeout:
                raise redis.TimeoutError(f"no PONG within {self._timeout} s")
            if self._follows_master and now >= next_follow:
                next_follow = now + FOLLOW_INTERVAL
                if master_moved(self._client.connection_pool, connection):
                    log.info("stampede: the master moved; tracking there")
                    return
            wait = self._renew_every if ping_sent is not None else next_renewal - time.monotonic()
            if not connection.can_read(timeout=max(0.0, wait)):
                continue
            nonces: list[str] = []
            while True:
                if self._handle(connection.read_response(disconnect_on_error=False), nonces):
                    self._copies.renew(registered_at + self._lease)
                    ping_sent = None
                if not connection.can_read(timeout=0):
                    break
            if nonces:
                self._acknowledge(nonces)

    def _handle(self, reply: Any, nonces: list[str]) -> bool:
        """Obey one message; True for the PONG that renews the lease."""
        if not isinstance(reply, list) or not reply:
            return False
        if reply[0] == b"pong":
            return True
        if reply[0] != b"message" or len(reply) != 3:
            return False
        _, channel, data = reply
        if channel == _INVALIDATIONS:
            if data is None:  # FLUSHDB, FLUSHALL
                self._copies.flush()
            else:
                self._copies.drop(as_text(key) for key in data)
        elif channel == self._request_channel:
            request = parse_request(data)
            if request is not None:
                nonce, value_key = request
                self._copies.drop([value_key])
                nonces.append(nonce)
        return False

    def _acknowledge(self, nonces: list[str]) -> None:
        try:
            pipeline = self._client.pipeline(transaction=False)
            for nonce in nonces:
                key = self._channel.ack_key(nonce)
                pipeline.rpush(key, self.member)
                pipeline.pexpire(key, ACK_KEY_TTL_MS)
            pipeline.execute()
        except Exception as error:  # the invalidators wait for our deadline instead
            log.info("stampede: cannot acknowledge %d invalidation(s) (%s)", len(nonces), error)


def as_text(key: Any) -> str:
    return key.decode(errors="replace") if isinstance(key, bytes) else str(key)
