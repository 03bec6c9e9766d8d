"""The HTTP cache's decisions (``stampede.http._policy`` and ``flow``), with no I/O."""

from __future__ import annotations

from typing import Any

import pytest

from stampede.http._flow import Learn, Loaded, LoadResponse, Pass, ReadShape, Serve, respond
from stampede.http._policy import (
    Keep,
    Request,
    Rules,
    Shape,
    StoredSerializer,
    answer,
    base_key,
    cacheable,
    directives,
    keep,
    matches,
    not_modified,
    stored,
    variant_key,
)

RULES = Rules()


def request(method: str = "GET", path: str = "/p", query: str = "", **headers: str) -> Request:
    pairs = [(name.replace("_", "-"), value) for name, value in headers.items()]
    return Request(method, "https", "Example.com", path, query, [("host", "example.com"), *pairs])


def test_only_get_and_head_without_credentials_are_cacheable() -> None:
    assert cacheable(request(), RULES) and cacheable(request("HEAD"), RULES)
    assert not cacheable(request("POST"), RULES)
    assert not cacheable(request(cookie="s=1"), RULES)
    assert not cacheable(request(authorization="Bearer x"), RULES)
    assert cacheable(request(cookie="s=1"), Rules(share_authorized=True))


def test_keys_normalise_the_query_and_separate_hosts_and_variants() -> None:
    assert base_key(request(query="b=2&a=1"), RULES) == base_key(request(query="a=1&b=2"), RULES)
    assert base_key(request(query="b=2&a=1"), RULES) == '["https","example.com","/p",["a=1","b=2"]]'
    assert base_key(request(query="a=1&a=2"), RULES) != base_key(request(query="a=2&a=1"), RULES)  # order in a name
    other = Request("GET", "https", "other.example", "/p", "", [])
    assert base_key(other, RULES) != base_key(request(), RULES)
    shape = Shape(("accept-language",))
    en, fr = request(accept_language="en"), request(accept_language="fr")
    assert variant_key("b", shape, en) != variant_key("b", shape, fr)
    assert variant_key("b", Shape(), en) == "b"


@pytest.mark.parametrize(
    ("status", "headers", "expected"),
    [
        (200, [("cache-control", "max-age=60")], Keep(60.0)),
        (200, [("cache-control", "max-age=60, s-maxage=5")], Keep(5.0)),
        (200, [("cache-control", "public, max-age=0, s-maxage=60")], Keep(60.0)),
        (200, [("cache-control", "max-age=9, stale-while-revalidate=30, stale-if-error=600")], Keep(9.0, 30.0, 600.0)),
        (200, [], None),  # nothing says how long
        (404, [], Keep(10.0)),  # negative caching
        (200, [("cache-control", "private, max-age=60")], None),
        (200, [("cache-control", "no-store")], None),
        (200, [("cache-control", "no-cache, max-age=60")], None),
        (200, [("cache-control", "max-age=60"), ("set-cookie", "s=1")], None),
        (200, [("cache-control", "max-age=60"), ("vary", "Accept, *")], None),
        (206, [("cache-control", "max-age=60")], None),
        (200, [("cache-control", "max-age=0")], None),
        (200, [("cache-control", "max-age=abc")], None),
        (200, [("cache-control", "max-age=999999999")], Keep(86400.0)),
    ],
)
def test_what_is_kept_and_for_how_long(status: int, headers: list[tuple[str, str]], expected: Keep | None) -> None:
    assert keep(status, headers, RULES) == expected


def test_directives_parse_quoted_arguments_and_case() -> None:
    assert directives('Max-Age="60", PUBLIC') == {"max-age": "60", "public": None}


def test_a_stored_response_gets_an_etag_and_loses_hop_by_hop_headers() -> None:
    kept = stored(200, [("content-type", "text/plain"), ("connection", "close")], b"body", request(), Keep(60.0))
    assert dict(kept.headers).keys() == {"content-type", "etag", "date", "content-length"}  # Date: its arrival
    again = stored(200, [("content-type", "text/plain")], b"body", request(), Keep(60.0))
    assert kept.etag == again.etag  # the same bytes, the same tag, in every process
    assert stored(200, [("etag", '"mine"')], b"body", request(), Keep(60.0)).etag == '"mine"'


def test_if_none_match_uses_the_weak_comparison() -> None:
    kept = stored(200, [("etag", '"abc"')], b"x", request(), Keep(60.0))
    assert not_modified(kept, request(if_none_match='W/"abc"'))
    assert not_modified(kept, request(if_none_match='"zzz", "abc"'))
    assert not_modified(kept, request(if_none_match="*"))
    assert not not_modified(kept, request(if_none_match='"zzz"'))
    sent = answer(kept, request(if_none_match='"abc"'), now=kept.stored_at + 7.9)
    assert sent.status == 304 and sent.body == b"" and ("age", "7") in sent.headers
    assert answer(kept, request("HEAD")).body == b""


def test_a_varied_response_answers_only_its_own_values() -> None:
    kept = stored(200, [("vary", "Accept-Language")], b"en", request(accept_language="en"), Keep(60.0))
    assert matches(kept, request(accept_language="en"))
    assert not matches(kept, request(accept_language="fr"))
    assert not matches(kept, request())


def test_the_serializer_round_trips_and_holds_no_code() -> None:
    kept = stored(200, [("vary", "Accept")], b"\x00\nbinary\n", request(accept="a/b"), Keep(5.0, 1.0, 2.0))
    data = StoredSerializer().dumps(kept)
    assert StoredSerializer().loads(data) == kept
    assert b"pickle" not in data


def test_a_junk_shape_reads_as_none() -> None:
    for junk in (None, 1, [1, 2], [[1], 0, 0], ["x", 0, 0], [["a"], "x", 0]):
        assert Shape.from_json(junk) == Shape()
    assert Shape.from_json(Shape(("a",), 1.0, 2.0).to_json()) == Shape(("a",), 1.0, 2.0)


def drive(flow: Any, replies: list[Any]) -> tuple[list[Any], Any]:
    steps = []
    reply = None
    try:
        while True:
            steps.append(flow.send(reply))
            reply = replies.pop(0)
    except StopIteration as stop:
        return steps, stop.value


def test_the_flow_retries_once_under_the_variant_a_response_names() -> None:
    fr = request(accept_language="fr")
    made_for_en = stored(200, [("vary", "Accept-Language")], b"en", request(accept_language="en"), Keep(60.0))
    made_for_fr = stored(200, [("vary", "Accept-Language")], b"fr", fr, Keep(60.0))
    steps, outcome = drive(respond(fr, RULES), [Shape(), Loaded(made_for_en, False), Loaded(made_for_fr, True)])
    assert isinstance(steps[0], ReadShape) and isinstance(steps[1], LoadResponse)
    assert steps[2] == LoadResponse(Shape(("accept-language",)), variant_key(steps[0].base, made_for_fr.shape, fr))
    assert len(steps) == 3  # the shape it loaded under was the response's: nothing to learn
    assert isinstance(outcome, Serve) and outcome.answer.body == b"fr" and outcome.status == "MISS"


def test_a_load_that_changes_the_shape_learns_it_and_rewrites_with_its_windows() -> None:
    page = stored(200, [("cache-control", "max-age=1, stale-while-revalidate=30")], b"p", request(), Keep(1.0, 30.0))
    steps, outcome = drive(respond(request(), RULES), [Shape(), Loaded(page, True), None])
    assert steps[2] == Learn(steps[0].base, Shape((), 30.0, 0.0), (steps[1].key, page))
    assert isinstance(outcome, Serve)


def test_the_flow_passes_what_it_cannot_share() -> None:
    _, outcome = drive(respond(request("POST"), RULES), [])
    assert outcome == Pass(invalidating=True)  # and its success invalidates the URL
    _, outcome = drive(respond(request("OPTIONS"), RULES), [])
    assert outcome == Pass()
    _, outcome = drive(respond(request(), RULES), [Shape(), Loaded(None, False)])
    assert outcome == Pass()  # another request's unshared response: call the app itself


def test_http_dates_in_their_three_forms_and_nothing_else() -> None:
    from stampede.http._freshness import format_http_date, http_date

    moment = 784111777.0  # Sun, 06 Nov 1994 08:49:37 GMT (RFC 9110's example)
    assert http_date("Sun, 06 Nov 1994 08:49:37 GMT") == moment
    assert http_date("Sunday, 06-Nov-94 08:49:37 GMT", now=moment) == moment
    assert http_date("Sun Nov  6 08:49:37 1994") == moment
    assert format_http_date(moment) == "Sun, 06 Nov 1994 08:49:37 GMT"
    wrongs = [
        "0",
        "-1",
        "sun, 06 Nov 1994 08:49:37 GMT",
        "Sun, 06 Nov 1994 08:49:37 UTC",
        "Sun, 06 Nov 1994 8:49:37 GMT",
        "Sun, 06 Nov 94 08:49:37 GMT",
        "Sun, 32 Nov 1994 08:49:37 GMT",
    ]
    for wrong in wrongs:
        assert http_date(wrong) is None, wrong


@pytest.mark.parametrize(
    ("lines", "age"),
    [([], 0.0), (["7"], 7.0), (["0,7200"], 0.0), (["7200,0"], 7200.0), (["abc"], None), (["-1"], None),
     (["1.5"], None), (["7;x=1"], None), (["0", "0"], None)],
)  # fmt: skip
def test_an_age_that_cannot_be_read_is_none(lines: list[str], age: float | None) -> None:
    from stampede.http._freshness import age_of

    assert age_of([("age", line) for line in lines]) == age


def test_freshness_counts_the_age_a_response_came_with() -> None:
    now = 1_000_000.0
    assert keep(200, [("cache-control", "max-age=60"), ("age", "50")], RULES, now, now) == Keep(10.0, initial_age=50.0)
    assert keep(200, [("cache-control", "max-age=60"), ("age", "60")], RULES, now, now) is None
    assert keep(200, [("cache-control", "max-age=60"), ("age", "x")], RULES, now, now) is None
    stale_with_a_validator = [("cache-control", "max-age=60"), ("age", "60"), ("etag", '"v"')]
    assert keep(200, stale_with_a_validator, RULES, now, now) == Keep(0.001, initial_age=60.0)  # to revalidate
    dated = [("expires", "Sun, 06 Nov 1994 08:50:37 GMT"), ("date", "Sun, 06 Nov 1994 08:49:37 GMT")]
    assert keep(200, dated, RULES, now, now) == Keep(60.0)  # Expires less Date, whatever the clock
    assert keep(404, [("expires", "0")], RULES, now, now) is None  # explicitly stale: no status ttl


def test_if_none_match_reads_entity_tags_with_commas() -> None:
    from stampede.http._policy import entity_tags

    assert entity_tags('"a,b", W/"c"') == ['"a,b"', 'W/"c"']
    assert entity_tags('"a", nonsense') is None


def test_an_unsafe_method_invalidates_its_target_and_same_origin_locations() -> None:
    from stampede.http._policy import invalidated

    post = request("POST")
    headers = [("location", "https://example.com/new?x=1"), ("content-location", "https://other.example/p")]
    bases = invalidated(post, 201, headers, RULES)
    assert bases == [base_key(request(), RULES), base_key(request(path="/new", query="x=1"), RULES)]
    assert invalidated(post, 500, headers, RULES) == []
    assert invalidated(request(), 200, headers, RULES) == []
