"""The Redis family: one server, Sentinel's master or a Cluster, over redis-py (blocking and asyncio)."""
