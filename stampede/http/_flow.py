"""One request through the response cache, as steps a driver performs (``asgi``,
``wsgi``): the decisions written once, for blocking and asyncio servers alike."""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass
from typing import Any

from ._policy import (
    SAFE_METHODS,
    Answer,
    Request,
    Rules,
    Shape,
    Stored,
    answer,
    base_key,
    cacheable,
    matches,
    variant_key,
)


@dataclass(frozen=True)
class ReadShape:
    """Step: the shape of ``base``'s responses (``ResponseCache.shape``)."""

    base: str


@dataclass(frozen=True)
class LoadResponse:
    """Step: the response entry ``key``, by the loader of ``shape``'s windows; the load
    calls the application. Answered with a ``Loaded``."""

    shape: Shape
    key: str


@dataclass(frozen=True)
class Learn:
    """Step: record ``shape`` as ``base``'s. ``rewrite``: the entry just loaded, to write
    again through the loader of the new shape's stale windows (the load's own loader wrote
    it with the old ones, which would end it at its ttl): (key, stored), or None."""

    base: str
    shape: Shape
    rewrite: tuple[str, Stored] | None = None


@dataclass(frozen=True)
class Loaded:
    """What a ``LoadResponse`` got: the stored response, or (``stored`` None) one that is
    not shared, whose ``handover`` is this request's own if ``mine``. ``mine``: this
    request's call of the application made it. ``stale``: the stored response is past
    its freshness (served under a stale window)."""

    stored: Stored | None
    mine: bool
    handover: Any = None
    stale: bool = False


@dataclass(frozen=True)
class Pass:
    """Outcome: call the application for this request, outside the cache. ``invalidating``:
    an unsafe method, whose successful response invalidates the URLs it names
    (``policy.invalidated``), before it is sent."""

    invalidating: bool = False


@dataclass(frozen=True)
class Handover:
    """Outcome: send the response this request's own load made and did not keep."""

    handover: Any


@dataclass(frozen=True)
class Serve:
    """Outcome: send ``answer``; ``status`` says how it was found (for ``X-Cache``)."""

    answer: Answer
    status: str


Step = ReadShape | LoadResponse | Learn
Outcome = Pass | Handover | Serve


def respond(request: Request, rules: Rules) -> Generator[Step, Any, Outcome]:
    """What to send ``request``. A response made for other values of the headers it
    varies on than the request's is never sent: the request tries the variant its
    values name (once the shape is known), or passes."""
    if not cacheable(request, rules):
        return Pass(invalidating=request.method not in SAFE_METHODS)
    base = base_key(request, rules)
    shape: Shape = yield ReadShape(base)
    for _ in range(2):
        key = variant_key(base, shape, request)
        loaded: Loaded = yield LoadResponse(shape, key)
        stored = loaded.stored
        if stored is None:
            return Handover(loaded.handover) if loaded.mine else Pass()
        if loaded.mine and stored.shape != shape:
            # Written again where the next request with these values will look: under its
            # variant's key with the new shape's windows.
            yield Learn(base, stored.shape, (variant_key(base, stored.shape, request), stored))
        if matches(stored, request):
            return Serve(answer(stored, request), "STALE" if loaded.stale else "MISS" if loaded.mine else "HIT")
        if stored.vary == shape.vary:
            break
        shape = stored.shape
    return Pass()
