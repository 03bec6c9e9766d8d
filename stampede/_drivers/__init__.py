"""What performs the decisions: the blocking and asyncio performers and runners, the
in-process singleflight, the lease watchdog, counters, and a layer's Redlock leases
over two stores. Drivers import the core and the store contract, never a backend.
"""
