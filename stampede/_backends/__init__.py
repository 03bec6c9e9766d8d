"""Stores that implement the store contract (``_core.store``): Redis (blocking and
asyncio, with their pub/sub subscribers), the embedded in-memory store, and Redlock's
lock servers. Backends import the core, never a driver, nor each other's internals.
"""
