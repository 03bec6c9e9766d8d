"""A process's invalidation stream for its near cache: one connection and one thread per
layer, kept while the layer lives (see ``_core.near`` for the agreement it keeps).

The connection speaks RESP2 and, once connected, only listens: ``CLIENT TRACKING ON
REDIRECT <its own id> BCAST PREFIX <namespace>:{`` sends it the name of every key of the
namespace that changes (a write, a delete, an expiry, an eviction, ``None`` for a
FLUSHDB), and ``SUBSCRIBE`` adds the namespace's invalidation requests. It is not
redis-py's client-side caching, which refuses Valkey, has no asyncio client and takes
over pub/sub on the client it runs on.

Every fifth of its lease the thread registers this process through the layer's client (a
command on a pooled connection) and then sends a PING down each tracking connection. The
last of their PONGs renews the lease. A stream that stops answering (a primary cut off
from this process alone, packets dropped) so stops the renewals within one lease, though
the others still answer. Requests are acknowledged through the pooled client too, in one
pipeline for everything read in one go. On any failure the lease is revoked and every
copy dropped before the thread reconnects. Through Sentinel it also reconnects when the
master moved. On a Redis Cluster it keeps one such connection per primary (``Stream``),
and listens for requests on the registry's primary only. It reconnects to all of them
when the primaries change.
"""

from __future__ import annotations

import logging
import secrets
import selectors
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Protocol

import redis

from ..._core.near import ACK_KEY_TTL_MS, NEAR_LEASE, RENEWALS_PER_LEASE, NearChannel, parse_request
from ..._fork import reset_after_fork
from . import scripts as _scripts
from .commands import SlotScript, as_text, follows_master, is_cluster
from .notify import FOLLOW_INTERVAL, connect_pubsub, master_moved

log = logging.getLogger("stampede.near")

RETRY_INTERVAL = 0.5
"""How long a tracker waits between attempts to connect."""

_INVALIDATIONS = b"__redis__:invalidate"


@dataclass(frozen=True)
class Stream:
    """One tracking connection: to the one server, or to one primary of a cluster (the
    ``home`` one also carries the invalidation requests)."""

    name: str
    connection: Any
    home: bool


def registration(client: Any) -> Callable[[list[str], list[Any]], Any]:
    """The registration script on ``client``: on a cluster, sent to the registry's slot."""
    if is_cluster(client):
        return SlotScript(client, _scripts.REGISTER_NEAR)
    script = client.register_script(_scripts.REGISTER_NEAR)
    return lambda keys, args: script(keys=keys, args=args, client=client)


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
        client: Any,
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
        self._follows_master = follows_master(client)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lost_since: float | None = None  # warn once per outage, not once per try
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
        """The parent's thread and connection are not in the child. The child is a member
        of its own, started again by its first near-cache call."""
        self._lock = threading.Lock()
        stopped, self._stop = self._stop.is_set(), threading.Event()  # its lock may have been held
        if stopped:
            self._stop.set()
        self._thread = None
        self._new_member()
        self._copies.revoke()

    def _run(self) -> None:
        delay = 0.0
        while not self._stop.wait(delay):
            streams: list[Stream] = []
            try:
                streams = self._connect()
                self._serve(streams)
                delay = 0.0  # the master (or a primary) moved: to the new one at once
            except Exception as error:
                delay = RETRY_INTERVAL
                if not self._stop.is_set():
                    self._lost(error)
            finally:
                self._copies.revoke()
                for stream in streams:
                    try:
                        stream.connection.disconnect()
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

    def _servers(self) -> list[tuple[str, Any, bool]]:
        """(name, pool, home) of each server whose changes to track: the one server, or
        every primary of a cluster (asked afresh), home being the one that holds the
        registry, where requests are published (leases are renewed on every one)."""
        client = self._client
        if not is_cluster(client):
            return [("server", client.connection_pool, True)]
        client.nodes_manager.initialize()
        home = client.get_node_from_key(self._channel.members).name
        return [
            (node.name, node.redis_connection.connection_pool, node.name == home) for node in client.get_primaries()
        ]

    def _connect(self) -> list[Stream]:
        streams: list[Stream] = []
        try:
            for name, pool, home in self._servers():
                streams.append(Stream(name, self._connect_to(pool, home), home))
        except BaseException:
            for stream in streams:
                stream.connection.disconnect()
            raise
        # From here on every change reaches us. What was filled before may be stale.
        self._copies.flush()
        if self._lost_since is not None:
            log.warning("stampede: the near cache's invalidation stream is back")
            self._lost_since = None
        return streams

    def _connect_to(self, pool: Any, home: bool) -> Any:
        connection = connect_pubsub(pool, self._timeout)
        connection.connect()
        connection.send_command("CLIENT", "ID")
        client_id = connection.read_response()
        connection.send_command(
            "CLIENT", "TRACKING", "ON", "REDIRECT", client_id, "BCAST", "PREFIX", self._channel.prefix
        )
        connection.read_response()
        channels = [_INVALIDATIONS, self._request_channel] if home else [_INVALIDATIONS]
        connection.send_command("SUBSCRIBE", *channels)
        confirmed = 0
        while confirmed < len(channels):  # messages before the confirmations: the flush covers them
            if not connection.can_read(timeout=self._timeout):
                raise redis.TimeoutError("the server did not confirm the tracking subscription")
            reply = connection.read_response()
            confirmed += isinstance(reply, list) and bool(reply) and reply[0] == b"subscribe"
        return connection

    def _serve(self, streams: list[Stream]) -> None:
        """Renew, read and acknowledge until the stop, a failure (raised) or a move of the
        master (Sentinel) or of a primary (a cluster): then it returns."""
        with selectors.DefaultSelector() as selector:  # not select(): descriptors may pass 1024
            for stream in streams:
                selector.register(stream.connection._sock, selectors.EVENT_READ, stream.connection)
            self._serve_with(streams, selector)

    def _serve_with(self, streams: list[Stream], selector: selectors.BaseSelector) -> None:
        """``_serve``'s loop: a renewal every fifth of the lease (a registration, then a
        PING on every stream, renewing once all have answered), the messages of every
        stream as they come, acknowledgements for everything read in one go."""
        register = registration(self._client)
        next_renewal = time.monotonic()
        next_follow = next_renewal + FOLLOW_INTERVAL
        registered_at = 0.0
        ping_sent: float | None = None  # PINGs are out, not every PONG read yet
        unanswered: set[Any] = set()  # the connections whose PONG is still to come
        while not self._stop.is_set():
            now = time.monotonic()
            if ping_sent is None and now >= next_renewal:
                registered_at = now
                register([self._channel.members], [self.member, round(self._lease * 1000)])
                for stream in streams:
                    stream.connection.send_command("PING")
                unanswered = {stream.connection for stream in streams}
                ping_sent = time.monotonic()
                next_renewal = registered_at + self._renew_every
            elif ping_sent is not None and now - ping_sent > self._timeout:
                silent = ", ".join(stream.name for stream in streams if stream.connection in unanswered)
                raise redis.TimeoutError(f"no PONG within {self._timeout} s from {silent}")
            if now >= next_follow:
                next_follow = now + FOLLOW_INTERVAL
                if self._moved(streams):
                    return
            wait = self._renew_every if ping_sent is not None else next_renewal - time.monotonic()
            nonces: list[str] = []
            for key, _ in selector.select(max(0.0, wait)):
                connection = key.data
                while connection.can_read(timeout=0):  # what the parser holds, then the socket
                    if self._handle(connection.read_response(disconnect_on_error=False), nonces):
                        unanswered.discard(connection)
                        if ping_sent is not None and not unanswered:  # every stream is live
                            self._copies.renew(registered_at + self._lease)
                            ping_sent = None
            if nonces:
                self._acknowledge(nonces)

    def _moved(self, streams: list[Stream]) -> bool:
        """Whether the servers to track are no longer the ones ``streams`` reach."""
        client = self._client
        if is_cluster(client):
            home = client.get_node_from_key(self._channel.members).name
            now = {(node.name, node.name == home) for node in client.get_primaries()}
            if now != {(stream.name, stream.home) for stream in streams}:
                log.info("stampede: the cluster's primaries changed; tracking them afresh")
                return True
            return False
        if self._follows_master and master_moved(client.connection_pool, streams[0].connection):
            log.info("stampede: the master moved; tracking there")
            return True
        return False

    def _handle(self, reply: Any, nonces: list[str]) -> bool:
        """Obey one message. True for the PONG that renews the lease."""
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
                nonce, value_keys = request
                self._copies.drop(value_keys)
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
