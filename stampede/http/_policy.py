"""What an HTTP response cache decides, with no I/O: which requests may be served from
the cache, under which key, which responses may be kept and for how long, and what a
cached response looks like when served (``Age``, ``Date``, 304 to a conditional request).

It follows RFC 9111 for a shared cache (see docs/frameworks.md, section by section),
narrowed where sharing would be unsafe:

* Only GET and HEAD are cached. A HEAD is answered from the GET entry (the load asks
  the application for GET, as nginx's ``proxy_cache_convert_head`` does). A successful
  response to any other method but OPTIONS and TRACE invalidates its target URI, and the
  ``Location`` and ``Content-Location`` it names on the same host (section 4.4).
* The key is the method's entry for the target URI as the client sent it (section 2):
  the scheme, the host, the raw path (percent-encoding as received: ``/a%3Fb`` is not
  ``/a?b``), the raw query (its parameters in order of name, each as received: ``?q=%E9``
  is not ``?q=%E8``, ``?a`` is not ``?a=``), and the request headers an application may
  build a page from without a ``Vary`` (``key_headers``: ``X-Forwarded-Host`` and its
  kin by default). Its parts are encoded as a JSON array, which no input can forge.
* A request carrying ``Authorization`` or a ``Cookie`` is passed through unless the
  cache is told to share such responses (``share_authorized``): its response may be
  someone's own. So is a request whose ``Cache-Control`` says ``no-store``.
* A response is kept only if it says how long it is fresh (``Surrogate-Control`` or
  ``s-maxage``, else ``max-age``, else ``Expires``), or says nothing of it and its status
  has a ttl of the cache's own (``status_ttls``: 404 and 410 for 10 s by default,
  negative caching), and only while it is fresh, counting the age it came with. Never
  with ``private``, ``no-store``, ``no-cache``, ``Set-Cookie``, ``Vary: *``, a 1xx, 206 or
  304, or ``must-understand`` on a status the cache does not know.
* A response that is not kept is not shared either: it goes to the request that made
  it, and each concurrent request for it calls the application itself (Varnish's
  hit-for-miss). It is no error: no stale page is served in its place.
* ``Vary``: the key holds the values of the request headers the URL's responses vary on
  (learned from its responses: ``Shape``), and a response is served only to a request
  whose values for them match those it was made for.
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

from ._freshness import (
    Headers,
    control,
    delta_seconds,
    directives,
    explicit_lifetime,
    field_values,
    format_http_date,
    heuristic_lifetime,
    http_date,
    initial_age,
)

CACHED_METHODS = frozenset({"GET", "HEAD"})
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS", "TRACE"})
DEFAULT_STATUS_TTLS: Mapping[int, float] = {404: 10.0, 410: 10.0}
DEFAULT_KEY_HEADERS = ("forwarded", "x-forwarded-host", "x-forwarded-proto", "x-forwarded-port", "x-forwarded-prefix",
                       "x-original-url", "x-rewrite-url")  # fmt: skip
"""Request headers that frameworks build URLs from when told to trust them (Django's
``USE_X_FORWARDED_HOST``, Werkzeug's ``ProxyFix``), with no ``Vary`` on the page: in the
key, so that nobody can have a page with their host in it kept for everyone."""
DEFAULT_TAG_HEADERS = ("surrogate-key", "xkey")
"""Response headers whose names become the page's tags (Fastly's, Varnish's xkey)."""
UNSTORED_DIRECTIVES = frozenset({"private", "no-store", "no-cache"})
UNSTORED_STATUSES = frozenset({206, 304})
NO_STALE_DIRECTIVES = frozenset({"must-revalidate", "proxy-revalidate", "s-maxage"})
"""A response with one of these may not be served stale (RFC 9111 sections 4.2.4, 5.2.2)."""
UNDERSTOOD_STATUSES = frozenset({200, 201, 202, 203, 204, 205, 206, 300, 301, 302, 303, 304, 305, 307, 308, 400, 401,
                                 402, 403, 404, 405, 406, 407, 408, 409, 410, 411, 412, 413, 414, 415, 416, 417, 421,
                                 422, 426, 500, 501, 502, 503, 504, 505})  # fmt: skip
"""The status codes of RFC 9110: ``must-understand`` lets a response be kept only with one."""
STALE_ON_ARRIVAL = 0.001
"""The ttl of a response already stale when it came but with validators: it is kept (for
``revalidation_window``) only so that the next request revalidates it rather than fetch
it whole. HTTP dates count whole seconds: a response whose ``Expires`` is its ``Date``
plus one second may arrive a second old."""
HEURISTIC_STATUSES = frozenset({200, 203, 204, 206, 300, 301, 308, 404, 405, 410, 414, 501})
NOT_STORED_HEADERS = frozenset(
    {"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "proxy-connection", "te", "trailer",
     "transfer-encoding", "upgrade", "age", "surrogate-control"}
)  # fmt: skip
"""Headers a cached response does not keep: hop-by-hop ones (RFC 9110 section 7.6.1),
``Age`` (set when served) and ``Surrogate-Control`` (the cache's alone)."""
NOT_MODIFIED_KEEPS = ("cache-control", "content-location", "date", "etag", "expires", "vary")
"""The headers a 304 repeats from the response it stands for (RFC 9110 15.4.5)."""
NOT_UPDATED_BY_304 = frozenset({"content-length", "content-encoding", "content-md5", "content-range", "etag"})
"""Stored headers a 304's own do not replace (RFC 9111 section 3.2: those the stored body
depends on)."""
LIST_VALUED = frozenset({"accept", "accept-charset", "accept-encoding", "accept-language"})
CASE_FREE = frozenset({"accept-charset", "accept-encoding", "accept-language"})
_ENTITY_TAG = re.compile(r'\s*((?:W/)?"[^"]*")\s*(?:,|$)')


@dataclass(frozen=True)
class Request:
    """What the cache reads of a request. ``target``: the path as the client sent it
    (not percent-decoded); ``query``: likewise. ``headers``: lower-case names."""

    method: str
    scheme: str
    host: str
    target: str
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
    in ``vary``, when it was made. ``stored_at``: when it arrived; ``initial_age``: how
    old it was then. ``synthetic_etag``: the cache made ``etag`` (a hash of the body), so
    it is not the application's to revalidate with. ``tags``: what ``invalidate_tag``
    drops it by."""

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
    initial_age: float = 0.0
    synthetic_etag: bool = False
    tags: tuple[str, ...] = ()
    revalidation: float = 0.0

    @property
    def shape(self) -> Shape:
        """Its URL's shape. The loader's ``stale_if_error`` window also holds the time it is
        kept after its freshness to be revalidated (``revalidation``): past its ttl, the
        next request's load asks the application whether it changed, and the layer serves
        it only if that load fails and ``errors_masked_until`` allows."""
        return Shape(self.vary, self.stale_while_revalidate, max(self.stale_if_error, self.revalidation))

    def errors_masked_until(self) -> float:
        """Until when (POSIX seconds) the response itself lets an error be masked by it
        (its ``stale-if-error``, RFC 5861 section 4)."""
        return self.stored_at + self.ttl + self.stale_if_error

    def header(self, name: str) -> str | None:
        values = [value for key, value in self.headers if key == name]
        return ", ".join(values) if values else None


@dataclass(frozen=True)
class Keep:
    """How long a response may be kept: ``ttl`` fresh (what is left of its freshness
    lifetime after ``initial_age``), then its stale windows."""

    ttl: float
    stale_while_revalidate: float = 0.0
    stale_if_error: float = 0.0
    initial_age: float = 0.0


@dataclass(frozen=True)
class Rules:
    """The cache's own rules beside the responses' (``ResponseCache`` arguments)."""

    status_ttls: Mapping[int, float] = field(default_factory=lambda: dict(DEFAULT_STATUS_TTLS))
    share_authorized: bool = False
    max_ttl: float = 86400.0
    max_stale: float = 86400.0
    key_headers: tuple[str, ...] = DEFAULT_KEY_HEADERS
    tag_headers: tuple[str, ...] = DEFAULT_TAG_HEADERS
    heuristic_fraction: float = 0.0
    revalidation_window: float = 300.0


def cacheable(request: Request, rules: Rules) -> bool:
    """Whether ``request`` may be answered from the shared cache."""
    if request.method not in CACHED_METHODS:
        return False
    if "no-store" in directives(request.header("cache-control")):
        return False  # nothing of it or its response may be stored (RFC 9111 5.2.1.5)
    if rules.share_authorized:
        return True
    return request.header("authorization") is None and request.header("cookie") is None


def invalidates(request: Request, status: int) -> bool:
    """Whether ``request``'s response invalidates its target URI: an unsafe method's
    non-error response (RFC 9111 section 4.4)."""
    return request.method not in SAFE_METHODS and 200 <= status < 400


def invalidated(request: Request, status: int, headers: Headers, rules: Rules) -> list[str]:
    """The entries an unsafe method's response invalidates (RFC 9111 section 4.4): none
    for an error; else its target URI's, and those of the ``Location`` and
    ``Content-Location`` it names on the same scheme and host."""
    if not invalidates(request, status):
        return []
    bases = [base_key(request, rules)]
    for name in ("location", "content-location"):
        for value in field_values(headers, name):
            target = _same_origin_target(request, value.strip())
            if target is not None:
                bases.append(base_key(request, rules, target))
    return list(dict.fromkeys(bases))


def _same_origin_target(request: Request, reference: str) -> str | None:
    """The path and query ``reference`` names, if on ``request``'s scheme and host."""
    reference = reference.partition("#")[0]
    if reference.startswith("/") and not reference.startswith("//"):
        return reference
    origin = f"{request.scheme.lower()}://{request.host.lower()}"
    if reference.lower().startswith(origin) and reference[len(origin) : len(origin) + 1] in ("/", "?", ""):
        rest = reference[len(origin) :]
        return rest if rest.startswith("/") else "/" + rest
    return None


def base_key(request: Request, rules: Rules, target: str | None = None) -> str:
    """The entry of a URL (or of ``target``, a path and query on the same host): the
    scheme, host, raw path, raw query with its parameters in order of name (the values of
    one name keep their order, which an application may read as a list), and the values
    of ``rules.key_headers``, as a JSON array. The method is not in it: HEAD reads GET's."""
    path, query = (request.target, request.query) if target is None else _split_target(target)
    parameters = sorted(query.split("&"), key=lambda parameter: parameter.split("=", 1)[0]) if query else []
    parts: list[object] = [request.scheme.lower(), request.host.lower(), path, parameters]
    keyed = [request.header(name) for name in rules.key_headers]
    if any(value is not None for value in keyed):
        parts.append(keyed)
    return json.dumps(parts, separators=(",", ":"))


def _split_target(target: str) -> tuple[str, str]:
    path, _, query = target.partition("?")
    return path, query


def url_tag(base: str) -> str:
    """The tag every variant of the URL whose entry is ``base`` carries."""
    return "url:" + hashlib.sha256(base.encode()).hexdigest()[:32]


def selecting(request: Request, name: str) -> str | None:
    """``request``'s value of a header a response varies on, as compared: its lines
    joined, and for the ``Accept`` family, members trimmed (and, where case means
    nothing, lower-case), so that spellings the application reads alike share a variant."""
    value = request.header(name)
    if value is None or name not in LIST_VALUED:
        return value
    members = [member.strip() for member in value.split(",") if member.strip()]
    joined = ", ".join(members)
    return joined.lower() if name in CASE_FREE else joined


def variant_key(base: str, shape: Shape, request: Request) -> str:
    """The entry of ``request``'s variant: the URL's entry plus its values of the headers
    the URL's responses vary on (a hash of them: they may be long, and are the client's)."""
    if not shape.vary:
        return base
    values = json.dumps([selecting(request, name) for name in shape.vary])
    return f"{base} vary:{hashlib.sha256(values.encode()).hexdigest()[:32]}"


def matches(stored: Stored, request: Request) -> bool:
    """Whether ``stored`` may answer ``request``: its values of every header the response
    varies on are those the response was made for."""
    return all(selecting(request, name) == value for name, value in zip(stored.vary, stored.varied, strict=False))


def vary_names(headers: Headers) -> tuple[str, ...] | None:
    """The request headers a response varies on, lower-case and sorted; None for ``*``."""
    names: set[str] = set()
    for value in field_values(headers, "vary"):
        for part in value.split(","):
            part = part.strip().lower()
            if part == "*":
                return None
            if part:
                names.add(part)
    return tuple(sorted(names))


def _surrogate(headers: Headers) -> dict[str, str | None]:
    """The ``Surrogate-Control`` directives meant for every surrogate (not a targeted one)."""
    found = directives(", ".join(field_values(headers, "surrogate-control")))
    return {name: argument for name, argument in found.items() if ";" not in name and ";" not in (argument or "")}


def keep(
    status: int,
    headers: Headers,
    rules: Rules,
    request_time: float | None = None,
    response_time: float | None = None,
) -> Keep | None:
    """How long a response may be kept in the shared cache, or None if it may not be.
    ``request_time``, ``response_time``: when its load asked and when the answer came
    (now, by default), for its age."""
    response_time = time.time() if response_time is None else response_time
    request_time = response_time if request_time is None else request_time
    if status < 200 or status in UNSTORED_STATUSES:
        return None
    if any(name == "set-cookie" for name, _ in headers) or vary_names(headers) is None:
        return None
    cc, surrogate = control(headers), _surrogate(headers)
    if "no-store" in surrogate:
        return None
    if not surrogate and UNSTORED_DIRECTIVES & cc.keys():
        return None
    if "must-understand" in cc and status not in UNDERSTOOD_STATUSES:
        return None
    lifetime = delta_seconds(surrogate["max-age"]) if "max-age" in surrogate else None
    if lifetime is None:
        lifetime = explicit_lifetime(headers, cc, response_time)
    if lifetime is None:
        lifetime = rules.status_ttls.get(status)
    if lifetime is None and status in HEURISTIC_STATUSES:
        lifetime = heuristic_lifetime(headers, rules.heuristic_fraction, response_time)
    if not lifetime:
        return None
    age = initial_age(headers, request_time, response_time)
    if age is None:
        return None
    left = lifetime - age
    if left <= 0:  # stale on arrival: kept only to be revalidated, if it can be
        validated = any(name in ("etag", "last-modified") for name, _ in headers)
        return Keep(STALE_ON_ARRIVAL, initial_age=age) if validated and rules.revalidation_window > 0 else None
    swr = delta_seconds(cc.get("stale-while-revalidate")) or 0.0
    sie = delta_seconds(cc.get("stale-if-error")) or 0.0
    if NO_STALE_DIRECTIVES & cc.keys():
        swr = sie = 0.0
    return Keep(min(left, rules.max_ttl), min(swr, rules.max_stale), min(sie, rules.max_stale), age)


def tags_of(headers: Headers, rules: Rules) -> tuple[str, ...]:
    """The page's tags, from ``rules.tag_headers`` (names apart by spaces or commas). A
    name no tag can be (braces, ``#``, ``~``, control characters) is left out."""
    names: dict[str, None] = {}
    for header in rules.tag_headers:
        for value in field_values(headers, header):
            for name in value.replace(",", " ").split():
                if len(name) <= 200 and not any(char in name for char in "{}#~") and name.isprintable():
                    names[name] = None
    return tuple(names)


def stored(
    status: int,
    headers: Headers,
    body: bytes,
    request: Request,
    kept: Keep,
    rules: Rules | None = None,
    response_time: float | None = None,
) -> Stored:
    """The response as kept: hop-by-hop headers, those its ``Connection`` names and its
    tag headers dropped, its body's own ``Content-Length``, a ``Date`` added if it had
    none (RFC 9110 section 6.6.1), an ``ETag`` added if it had none (a hash of the body:
    the same bytes, the same tag, in every process)."""
    rules = Rules() if rules is None else rules
    response_time = time.time() if response_time is None else response_time
    vary = vary_names(headers) or ()
    named = {part.strip().lower() for value in field_values(headers, "connection") for part in value.split(",")}
    dropped = NOT_STORED_HEADERS | named | set(rules.tag_headers) | {"content-length"}  # the body's, below
    kept_headers = [(name, value) for name, value in headers if name not in dropped]
    if status != 204:  # sent with it, for GET and HEAD alike
        kept_headers.append(("content-length", str(len(body))))
    if not any(name == "date" for name, _ in kept_headers):
        kept_headers.append(("date", format_http_date(response_time)))
    etag = next((value for name, value in headers if name == "etag"), None)
    synthetic = etag is None
    if etag is None:
        etag = '"' + hashlib.sha256(body).hexdigest()[:32] + '"'
        kept_headers.append(("etag", etag))
    validated = not synthetic or any(name == "last-modified" for name, _ in kept_headers)
    return Stored(
        status,
        tuple(kept_headers),
        body,
        vary,
        tuple(selecting(request, name) for name in vary),
        response_time,
        etag,
        kept.ttl,
        kept.stale_while_revalidate,
        kept.stale_if_error,
        kept.initial_age,
        synthetic,
        tags_of(headers, rules),
        min(rules.revalidation_window, rules.max_stale) if validated else 0.0,
    )


def updated(previous: Stored, headers: Headers, kept: Keep, response_time: float) -> Stored:
    """``previous`` as a 304 to its revalidation leaves it (RFC 9111 section 4.3.4): the
    304's headers replace the stored ones of the same name (but those that describe the
    stored body), and its freshness starts again; the body stays."""
    if not any(name == "date" for name, _ in headers):  # a 304 without one is dated when it came
        headers = [*headers, ("date", format_http_date(response_time))]
    fresh = {name for name, _ in headers if name not in NOT_STORED_HEADERS and name not in NOT_UPDATED_BY_304}
    merged = [(name, value) for name, value in previous.headers if name not in fresh]
    merged += [(name, value) for name, value in headers if name in fresh]
    return Stored(previous.status, tuple(merged), previous.body, previous.vary, previous.varied, response_time,
                  previous.etag, kept.ttl, kept.stale_while_revalidate, kept.stale_if_error, kept.initial_age,
                  previous.synthetic_etag, previous.tags, previous.revalidation)  # fmt: skip


def revalidated(
    previous: Stored, headers: Headers, rules: Rules, request_time: float, response_time: float
) -> tuple[Stored, Keep | None]:
    """``previous`` after a 304 to its revalidation (``updated``), and how long it may be
    kept now (None: not at all, by what the 304 says)."""
    probe = updated(previous, headers, Keep(0.0), response_time)
    kept = keep(previous.status, probe.headers, rules, request_time, response_time)
    return updated(previous, headers, kept or Keep(0.0), response_time), kept


def validators(previous: Stored) -> list[tuple[str, str]]:
    """The conditional headers that revalidate ``previous`` with the application: its
    own ``ETag`` (not one the cache made) and ``Last-Modified``."""
    conditions = []
    if not previous.synthetic_etag:
        conditions.append(("if-none-match", previous.etag))
    modified = previous.header("last-modified")
    if modified is not None:
        conditions.append(("if-modified-since", modified))
    return conditions


def _opaque(tag: str) -> str:
    return tag.strip().removeprefix("W/")


def entity_tags(value: str) -> list[str] | None:
    """The entity-tags of an ``If-None-Match`` list (a tag may hold commas); None if the
    list cannot be read."""
    tags, position = [], 0
    value = value.strip()
    while position < len(value):
        match = _ENTITY_TAG.match(value, position)
        if match is None:
            return None
        tags.append(match.group(1))
        position = match.end()
    return tags


def none_match(etag: str, condition: str) -> bool:
    """Whether an ``If-None-Match`` list names the representation whose tag is ``etag``
    (RFC 9110 section 13.1.2): ``*`` names any, and the weak comparison otherwise."""
    if condition.strip() == "*":
        return True
    tags = entity_tags(condition)
    return tags is not None and _opaque(etag) in {_opaque(tag) for tag in tags}


def not_modified(stored: Stored, request: Request) -> bool:
    """Whether the client already holds ``stored`` (RFC 9110 section 13.1): ``If-None-Match``
    names its entity (the weak comparison), or, with no ``If-None-Match``, it was not
    modified since ``If-Modified-Since``. Only for a 2xx: preconditions apply to no other."""
    if not 200 <= stored.status < 300:
        return False
    condition = request.header("if-none-match")
    if condition is not None:
        return none_match(stored.etag, condition)
    since = http_date(request.header("if-modified-since"))
    if since is None:
        return False
    modified = http_date(stored.header("last-modified")) or http_date(stored.header("date")) or stored.stored_at
    return modified <= since


@dataclass(frozen=True)
class Answer:
    """A response to send: status, headers (lower-case names) and body."""

    status: int
    headers: list[tuple[str, str]]
    body: bytes


def current_age(stored: Stored, now: float | None = None) -> int:
    """How old ``stored`` is now, in whole seconds (RFC 9111 section 4.2.3)."""
    resident = max(0.0, (time.time() if now is None else now) - stored.stored_at)
    return int(stored.initial_age + resident)


def answer(stored: Stored, request: Request, now: float | None = None) -> Answer:
    """What ``request`` is sent from ``stored``: the response with its ``Age``, a 304 if
    the client already holds it, no body for HEAD."""
    age = ("age", str(current_age(stored, now)))
    if not_modified(stored, request):
        kept = [(name, value) for name, value in stored.headers if name in NOT_MODIFIED_KEEPS]
        return Answer(304, [*kept, age], b"")
    return Answer(stored.status, [*stored.headers, age], b"" if request.method == "HEAD" else stored.body)


class StoredSerializer:
    """A ``Stored`` as bytes: one JSON line of its fields, then the body as it is (no
    pickle: the bytes come from the cache server, which need not be trusted with code)."""

    def dumps(self, value: Stored) -> bytes:
        head = [value.status, [list(pair) for pair in value.headers], list(value.vary), list(value.varied),
                value.stored_at, value.etag, value.ttl, value.stale_while_revalidate, value.stale_if_error,
                value.initial_age, value.synthetic_etag, list(value.tags), value.revalidation]  # fmt: skip
        return json.dumps(head, separators=(",", ":")).encode() + b"\n" + value.body

    def loads(self, data: bytes) -> Stored:
        line, _, body = data.partition(b"\n")
        fields = json.loads(line)
        status, headers, vary, varied, stored_at, etag, ttl, swr, sie = fields[:9]
        age, synthetic, tags, revalidation = fields[9:13] if len(fields) >= 13 else (0.0, False, [], 0.0)
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
            float(age),
            bool(synthetic),
            tuple(str(tag) for tag in tags),
            float(revalidation),
        )
