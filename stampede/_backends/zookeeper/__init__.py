"""The ZooKeeper family: leases as ephemeral nodes beside a Redis cache server, over kazoo."""
