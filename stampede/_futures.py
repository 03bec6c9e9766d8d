"""A leaf every layer may import: settling an asyncio future that someone else (a timer,
a message, a cancellation) may have settled first."""

from __future__ import annotations

import asyncio


def settle(future: asyncio.Future[bool], result: bool) -> None:
    """Set ``future``'s result unless it is done already (set, or cancelled)."""
    if not future.done():
        future.set_result(result)
