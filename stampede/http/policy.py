"""What an HTTP response cache decides, with no I/O: which requests may be served from
the cache, under which key, which responses may be kept and for how long, and what a
cached response looks like when served (``Age``, ``ETag``, 304 to ``If-None-Match``).

It follows RFC 9111 for a shared cache, narrowed where sharing would be unsafe:

* Only GET and HEAD are cached. A HEAD is answered from the GET entry (the load asks
  the application for GET, as nginx's ``proxy_cache_convert_head`` does).
* A request carrying ``Authorization`` or a ``Cookie`` is passed through unless the
  cache is told to share such responses (``share_authorized``): its response may be
  someone's own.
* A response is kept only if it says how long (``s-maxage``, else ``max-age``) or its
  status has a ttl of the cache's own (``status_ttls``: 404 and 410 for 10 s by
  default, negative caching). Never with ``private``, ``no-store``, ``no-cache``,
  ``Set-Cookie``, ``Vary: *``, a partial (206) or an informational status.
* A response that is not kept is not shared either: it goes to the request that made
  it, and each concurrent request for it calls the application itself (Varnish's
  hit-for-miss).
* ``Vary``: the key holds the values of the request headers the URL's responses vary on
  (learned from its last response: ``Shape``), and a response is served only to a
  request whose values for them match those it was made for.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from urllib.parse import parse_qsl, urlencode

CACHED_METHODS = frozenset({"GET", "HEAD"})
DEFAULT_STATUS_TTLS: Mapping[int, float] = {404: 10.0, 410: 10.0}
UNSTORED_DIRECTIVES = frozenset({"private", "no-store", "no-cache"})
HOP_BY_HOP = frozenset(
    {"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer", "transfer-encoding",
     "upgrade", "date", "age"}
)  # fmt: skip
"""Headers a cached response does not keep (``Date`` and ``Age`` are set when served)."""
NOT_MODIFIED_KEEPS = ("cache-control", "content-location", "etag", "expires", "vary", "age", "date")
"""The headers a 304 repeats from the response it stands for (RFC 9110 15.4.5)."""

Headers = Sequence[tuple[str, str]]
"""Header fields as (lower-case name, value) pairs, in order."""


@dataclass(frozen=True)
class Request:
    """What the cache reads of a request. ``headers``: lower-case names."""

    method: str
    host: str
    path: str
    query: str
    headers: Headers

    def header(self, name: str) -> str | None:
        """The value of ``name`` (its fields joined by ", "), or None."""
        values = [value for key, value in self.headers if key == name]
        return ", ".join(values) if values else None


@dataclass(frozen=True)
class Shape:
    """What a URL's responses were last seen to need: the request headers they vary on,
    and their stale windows (``stale-while-revalidate``, ``stale-if-error``). A request
    reads it first, to build its key and pick the loader whose windows are these."""

    vary: tuple[str, ...] = ()
    stale_while_revalidate: float = 0.0
    stale_if_error: float = 0.0

    def to_json(self) -> list[object]:
        return [list(self.vary), self.stale_while_revalidate, self.stale_if_error]

    @classmethod
    def from_json(cls, data: object) -> Shape:
        if not isinstance(data, list) or len(data) != 3:
            return cls()
        vary, swr, sie = data
        if not isinstance(vary, list) or not all(isinstance(name, str) for name in vary):
            return cls()
        if not all(isinstance(window, (int, float)) for window in (swr, sie)):
            return cls()
        return cls(tuple(vary), float(swr), float(sie))


@dataclass(frozen=True)
class Stored:
    """A response as the cache keeps it. ``varied``: the request's values of the headers
    in ``vary``, when it was made."""

    status: int
    headers: tuple[tuple[str, str], ...]
    body: bytes
    vary: tuple[str, ...]
    varied: tuple[str | None, ...]
    stored_at: float
    etag: str
    ttl: float = 0.0
    stale_while_revalidate: float = 0.0
    stale_if_error: float = 0.0

    @property
    def shape(self) -> Shape:
        return Shape(self.vary, self.stale_while_revalidate, self.stale_if_error)


@dataclass(frozen=True)
class Keep:
    """How long a response may be kept: ``ttl`` fresh, then its stale windows."""

    ttl: float
    stale_while_revalidate: float = 0.0
    stale_if_error: float = 0.0


@dataclass(frozen=True)
class Rules:
    """The cache's own rules beside the responses' (``ResponseCache`` arguments)."""

    status_ttls: Mapping[int, float] = field(default_factory=lambda: dict(DEFAULT_STATUS_TTLS))
    share_authorized: bool = False
    max_ttl: float = 86400.0
    max_stale: float = 86400.0


def cacheable(request: Request, rules: Rules) -> bool:
    """Whether ``request`` may be answered from the shared cache."""
    if request.method not in CACHED_METHODS:
        return False
    if rules.share_authorized:
        return True
    return request.header("authorization") is None and request.header("cookie") is None


def base_key(request: Request) -> str:
    """The entry of a URL: host, path and query with its parameters sorted by name (so
    ``?a=1&b=2`` and ``?b=2&a=1`` share one; the values of one name keep their order,
    which an application may read as a list). The method is not in it: HEAD reads GET's."""
    pairs = sorted(parse_qsl(request.query, keep_blank_values=True), key=lambda pair: pair[0])
    query = urlencode(pairs)
    return f"{request.host.lower()}{request.path}?{query}" if query else f"{request.host.lower()}{request.path}"


def variant_key(base: str, shape: Shape, request: Request) -> str:
    """The entry of ``request``'s variant: the URL's entry plus its values of the headers
    the URL's responses vary on (a hash of them: they may be long, and are the client's)."""
    if not shape.vary:
        return base
    values = json.dumps([request.header(name) for name in shape.vary])
    return f"{base} vary:{hashlib.sha256(values.encode()).hexdigest()[:32]}"


def matches(stored: Stored, request: Request) -> bool:
    """Whether ``stored`` may answer ``request``: its values of every header the response
    varies on are those the response was made for."""
    return all(request.header(name) == value for name, value in zip(stored.vary, stored.varied, strict=False))


def directives(value: str | None) -> dict[str, str | None]:
    """``Cache-Control`` as {directive: argument or None}, directives lower-case."""
    found: dict[str, str | None] = {}
    if not value:
        return found
    for part in value.split(","):
        name, _, argument = part.strip().partition("=")
        name = name.strip().lower()
        if name:
            found.setdefault(name, argument.strip().strip('"') if argument else None)
    return found


def _seconds(argument: str | None) -> float | None:
    if argument is None or not argument.isdigit():
        return None
    return float(argument)


def vary_names(headers: Headers) -> tuple[str, ...] | None:
    """The request headers a response varies on, lower-case and sorted; None for ``*``."""
    names: set[str] = set()
    for name, value in headers:
        if name == "vary":
            for part in value.split(","):
                part = part.strip().lower()
                if part == "*":
                    return None
                if part:
                    names.add(part)
    return tuple(sorted(names))


def keep(status: int, headers: Headers, rules: Rules) -> Keep | None:
    """How long a response may be kept in the shared cache, or None if it may not be."""
    if status < 200 or status == 206:
        return None
    if any(name == "set-cookie" for name, _ in headers) or vary_names(headers) is None:
        return None
    control = directives(", ".join(value for name, value in headers if name == "cache-control"))
    if UNSTORED_DIRECTIVES & control.keys():
        return None
    ttl = _seconds(control.get("s-maxage")) if "s-maxage" in control else _seconds(control.get("max-age"))
    if ttl is None:
        ttl = rules.status_ttls.get(status)
    if not ttl or ttl <= 0:
        return None
    swr = _seconds(control.get("stale-while-revalidate")) or 0.0
    sie = _seconds(control.get("stale-if-error")) or 0.0
    return Keep(min(ttl, rules.max_ttl), min(swr, rules.max_stale), min(sie, rules.max_stale))


def stored(status: int, headers: Headers, body: bytes, request: Request, kept: Keep) -> Stored:
    """The response as kept: hop-by-hop headers dropped, an ``ETag`` added if it had none
    (a hash of the body: the same bytes, the same tag, in every process)."""
    vary = vary_names(headers) or ()
    etag = next((value for name, value in headers if name == "etag"), None)
    kept_headers = [(name, value) for name, value in headers if name not in HOP_BY_HOP]
    if etag is None:
        etag = '"' + hashlib.sha256(body).hexdigest()[:32] + '"'
        kept_headers.append(("etag", etag))
    return Stored(
        status,
        tuple(kept_headers),
        body,
        vary,
        tuple(request.header(name) for name in vary),
        time.time(),
        etag,
        kept.ttl,
        kept.stale_while_revalidate,
        kept.stale_if_error,
    )


def _opaque(tag: str) -> str:
    return tag.strip().removeprefix("W/")


def not_modified(stored: Stored, request: Request) -> bool:
    """Whether ``If-None-Match`` names ``stored``'s entity (the weak comparison, which
    RFC 9110 prescribes for it)."""
    condition = request.header("if-none-match")
    if condition is None:
        return False
    if condition.strip() == "*":
        return True
    return _opaque(stored.etag) in {_opaque(tag) for tag in condition.split(",")}


@dataclass(frozen=True)
class Answer:
    """A response to send: status, headers (lower-case names) and body."""

    status: int
    headers: list[tuple[str, str]]
    body: bytes


def answer(stored: Stored, request: Request, now: float | None = None) -> Answer:
    """What ``request`` is sent from ``stored``: the response with ``Age``, a 304 if it
    already holds it, no body for HEAD."""
    age = max(0, int((time.time() if now is None else now) - stored.stored_at))
    if not_modified(stored, request):
        kept = [(name, value) for name, value in stored.headers if name in NOT_MODIFIED_KEEPS]
        return Answer(304, [*kept, ("age", str(age))], b"")
    headers = [*stored.headers, ("age", str(age))]
    return Answer(stored.status, headers, b"" if request.method == "HEAD" else stored.body)


class StoredSerializer:
    """A ``Stored`` as bytes: one JSON line of its fields, then the body as it is (no
    pickle: the bytes come from the cache server, which need not be trusted with code)."""

    def dumps(self, value: Stored) -> bytes:
        head = [value.status, [list(pair) for pair in value.headers], list(value.vary), list(value.varied),
                value.stored_at, value.etag, value.ttl, value.stale_while_revalidate, value.stale_if_error]  # fmt: skip
        return json.dumps(head, separators=(",", ":")).encode() + b"\n" + value.body

    def loads(self, data: bytes) -> Stored:
        line, _, body = data.partition(b"\n")
        status, headers, vary, varied, stored_at, etag, ttl, swr, sie = json.loads(line)
        return Stored(
            int(status),
            tuple((str(name), str(value)) for name, value in headers),
            body,
            tuple(vary),
            tuple(varied),
            float(stored_at),
            str(etag),
            float(ttl),
            float(swr),
            float(sie),
        )
