"""Pure decisions and the contracts they speak: the miss path of an entry, taking a
named lock, Redlock's majority, the effects they yield, keys, values, settings and the
store contract. Nothing here imports a client library, threading or asyncio.
"""
