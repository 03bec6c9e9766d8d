"""What only one backend family or topology does: Redis, Cluster, Sentinel, TLS, ACLs,
the near cache, Redlock, PostgreSQL and ZooKeeper, and gevent."""
