"""The test kit: what stampede's own suite runs on, for applications and third-party
backends to run theirs on.

* Throwaway servers on 127.0.0.1, each started by this process and stopped by its PID:
  ``RedisServer``, ``ClusterServers``, ``SentinelServers``, ``PostgresServer``,
  ``ZooKeeperServer`` (``servers``, ``topologies``, ``services``).
* Faults and their witnesses: ``FaultProxy`` (a slow, stalled or cut network) and
  ``CommandMonitor`` (the commands clients sent) (``faults``).
* Histories and their checker: a ``Recorder`` in each process records what every
  caller did, ``History.check`` checks it against stampede's promises (``history``),
  a generated workload over versioned ``Rows`` makes one (``workload``), in worker
  processes too (``Workers``, ``workers``), and faults strike while it runs
  (``stampede.testing.nemesis``).
* The deterministic simulator: the layer for several processes on virtual time, with
  faults, near caches and named locks from a seed (``stampede.testing.simulation``,
  ``near``, ``locks``, ``planted``: each imported on its own).
* The store contract suite, for pytest (``stampede.testing.contract``, imported on its
  own, since it needs pytest).
"""

from __future__ import annotations

from .faults import HANDSHAKE, CommandMonitor, FaultProxy, names
from .history import History, Operation, Record, Recorder, Report, Violation
from .servers import RedisServer, find_server_binary, free_port, server_url
from .services import PostgresServer, ZooKeeperServer, find_postgres, find_zookeeper
from .topologies import ClusterServers, SentinelServers
from .workers import Workers
from .workload import Mix, Rows, ServerRows, Subject, arun_workload, layer_subject, run_workload

__all__ = [
    # servers
    "ClusterServers",
    "PostgresServer",
    "RedisServer",
    "SentinelServers",
    "ZooKeeperServer",
    "find_postgres",
    "find_server_binary",
    "find_zookeeper",
    "free_port",
    "server_url",
    # faults
    "HANDSHAKE",
    "CommandMonitor",
    "FaultProxy",
    "names",
    # histories
    "History",
    "Mix",
    "Operation",
    "Record",
    "Recorder",
    "Report",
    "Rows",
    "ServerRows",
    "Subject",
    "Violation",
    "Workers",
    "arun_workload",
    "layer_subject",
    "run_workload",
]
