"""Keys, the envelope and settings: pure code, no server."""

from __future__ import annotations

import dataclasses
import sys
import uuid
from typing import Any

import pytest
import redis
import redis.asyncio

from stampede import ConfigError, InvalidKey, SerializationError, Settings, Stampede
from stampede._core.codec import NOT_A_VALUE, Codec, Kind
from stampede._core.keys import _INT_KEYS_KEPT, KeyBuilder, escape


def build(func, template=None, max_len=200):  # type: ignore[no-untyped-def]
    builder = KeyBuilder(func, template, "ns", max_len)
    return lambda *a, **kw: builder.keys(a, kw).value


def pair(a, b):  # type: ignore[no-untyped-def]
    return None


def test_separators_inside_arguments_cannot_collide() -> None:
    key = build(pair, "u:{a}:{b}")
    assert key("x:y", "z") != key("x", "y:z")
    assert key("a}b", "{c") == "ns:{u:a%7Db:%7Bc}"  # braces cannot forge a hash tag
    assert key("%3A", "") != key(":", "")
    assert key(" ", "\n") == "ns:{u:%20:%0A}"
    assert key("\ud800", "é") == "ns:{u:%D800:é}"  # a lone surrogate could not be encoded
    assert key("\ud800", "").encode()


def test_values_of_other_types_are_tagged_and_canonical() -> None:
    key = build(pair, "u:{a}:{b}")
    assert key(1, "1") == key("1", 1)  # ints and their text are one entry, by design
    assert key(None, 1) != key("None", 1) != key("~null", 1)
    assert key({"b": 1, "a": 2}, 0) == key({"a": 2, "b": 1}, 0)
    assert key(True, 0) != key(1, 0)
    assert key(b"\x00:", 0) == "ns:{u:~x003a:0}" != key("~x003a", 0)
    assert key(uuid.UUID(int=1), 0).startswith("ns:{u:~")
    with pytest.raises(InvalidKey, match="argument 'a' .*object has no canonical form"):
        key(object(), 1)


def test_keys_without_a_template_use_every_argument() -> None:
    key = build(pair)
    assert key(1, 2) == key(1, b=2) == key(a=1, b=2)
    assert key(1, 2) != key(2, 1)
    assert key(1, 2).startswith("ns:{" + __name__ + ".pair:")
    with pytest.raises(TypeError):
        key(1)


def test_long_keys_keep_a_prefix_and_end_in_a_hash() -> None:
    key = build(pair, "u:{a}:{b}", max_len=64)
    long_a, long_b = key("x" * 100, 1), key("x" * 100, 2)
    assert long_a != long_b and len(long_a) == len("ns:{}") + 64
    assert long_a.startswith("ns:{u:xxx") and "#" in long_a


def test_bad_templates_and_namespaces_are_refused_early() -> None:
    for template in ("u:{missing}", "u:{a!r}", "u:{a:>4}", "u {a}", "{{a}}", "u:{a", ""):
        with pytest.raises(ConfigError):
            build(pair, template)
    for namespace in ("", "a b", "a{b}", "a::b"):
        with pytest.raises(ConfigError):
            Stampede(namespace=namespace)


def test_escape_is_reversible_in_principle() -> None:
    assert escape("plain-text_1.2") == "plain-text_1.2"
    assert escape("a%b") == "a%25b"


def test_envelope_round_trip_and_classification() -> None:
    codec = Codec()
    raw = codec.encode({"x": [1, 2]}, 1000.0, 0.125, key="k")
    decoded = codec.decode(raw)
    assert (decoded.kind, decoded.value, decoded.loaded_at, decoded.load_duration) == (
        Kind.VALUE, {"x": [1, 2]}, 1000.0, 0.125)  # fmt: skip
    assert codec.decode(codec.encode(None, 1.0, 0.0, key="k")).kind is Kind.NULL
    for garbage in (b"", b"{}", raw[:10], b"\xa7S\x02" + raw[3:], raw[:16] + b"{", raw[:3] + b"\x09" + raw[4:]):
        assert codec.decode(garbage).kind is Kind.CORRUPT


def test_unencodable_values_name_the_key_and_type() -> None:
    with pytest.raises(SerializationError, match="'k'.*set") as raised:
        Codec().encode({1}, 0.0, 0.0, key="k")
    assert raised.value.key == "k"


def test_a_custom_serializer_is_used() -> None:
    class Upper:
        def dumps(self, value: str) -> bytes:
            return value.upper().encode()

        def loads(self, data: bytes) -> str:
            return data.decode().lower()

    codec = Codec(Upper())
    assert codec.decode(codec.encode("abc", 0.0, 0.0, key="k")).value == "abc"


def test_settings_are_validated_with_the_field_named() -> None:
    for bad in ({"ttl": 0}, {"ttl": float("nan")}, {"lock_ttl": 0.01}, {"jitter": 0.9},
                {"on_wait_timeout": "wait"}, {"max_key_length": 10}, {"wait_timeout": True},
                {"max_value_bytes": 10}):  # fmt: skip
        field = next(iter(bad))
        with pytest.raises(ConfigError, match=field):
            Settings(**bad)
    with pytest.raises(ConfigError, match="unknown"):
        Settings().replace(tll=3)
    assert Settings().replace(ttl=5, null_ttl=None).ttl == 5
    with pytest.raises(dataclasses.FrozenInstanceError):
        Settings().ttl = 1  # type: ignore[misc]
    with pytest.raises(ConfigError):
        Stampede(tll=3)


def test_a_loader_kind_without_a_client_is_refused_at_decoration(redis_url: str) -> None:
    async def load_async(x: int) -> int:
        return x

    def load(x: int) -> int:
        return x

    sync_only = Stampede(redis.Redis.from_url(redis_url, socket_timeout=1))
    with pytest.raises(ConfigError, match="async_client"):
        sync_only.cached_loader("x:{x}")(load_async)
    async_only = Stampede(async_client=redis.asyncio.Redis.from_url(redis_url, socket_timeout=1))
    with pytest.raises(ConfigError, match="blocking client"):
        async_only.cached_loader("x:{x}")(load)
    sync_only.close()
    async_only.close()


@pytest.mark.parametrize("template", ["p:{product_id}", "shop:{shop}:p:{product_id}:v2"])
def test_a_many_key_loaders_keys_are_the_single_key_loaders(template: str) -> None:
    def product(shop: str, product_id: Any) -> None:
        pass

    keys = KeyBuilder(product, template, "ns", 64)
    ids = [1, -5, 0, 10**40, 10**70, -(10**70), "a b", 2.5, True, (1, 2), None]
    assert keys.value_keys(["north", None], 1, ids) == [keys.value_key(("north", id_), {}) for id_ in ids]


def test_a_many_key_loaders_kept_int_keys_stay_the_single_key_loaders() -> None:
    """Page keys of int ids are kept by id once printed: a later page, a bool beside an
    int, more ids than are kept and a lowered int printing limit (ids it no longer
    prints in decimal) all still get the keys the single-key loader builds, and what
    is kept stays bounded."""

    def product(product_id: Any) -> None:
        pass

    keys = KeyBuilder(product, "p:{product_id}", "ns", 2000)

    def single(ids: list[Any]) -> list[str]:
        return [keys.value_key((id_,), {}) for id_ in ids]

    page = list(range(-25, 25))
    assert keys.value_keys([None], 0, page) == single(page)
    assert keys.value_keys([None], 0, page) == single(page)  # from what was kept
    assert keys.value_keys([None], 0, [True, 2]) == single([True, 2]) != keys.value_keys([None], 0, [1, 2])
    assert keys.value_keys([None], 0, [1.0, 2]) == single([1.0, 2])
    for start in range(0, 3 * _INT_KEYS_KEPT, 50):
        ids = list(range(start, start + 50))
        assert keys.value_keys([None], 0, ids) == single(ids)
        assert len(keys._int_keys) <= _INT_KEYS_KEPT
    if hasattr(sys, "set_int_max_str_digits"):
        long_ids = [10**700 + n for n in range(3)]
        printed = keys.value_keys([None], 0, long_ids)
        assert printed == single(long_ids) and str(long_ids[0]) in printed[0]
        limit = sys.get_int_max_str_digits()
        sys.set_int_max_str_digits(640)  # 701 digits no longer print in decimal
        try:
            assert keys.value_keys([None], 0, long_ids) == single(long_ids) != printed
        finally:
            sys.set_int_max_str_digits(limit)


class _AnyBytes:
    """A serializer that reads any bytes: a decoder that skipped a check would show."""

    def dumps(self, value: Any) -> bytes:
        return repr(value).encode()

    def loads(self, data: bytes) -> str:
        return data.decode("latin-1")


@pytest.mark.parametrize("serializer", [None, _AnyBytes()], ids=["json", "any-bytes"])
def test_a_pages_values_decode_as_each_entrys_would(serializer: Any) -> None:
    """``decode_hits`` (a page's values, one comprehension when all are plain values of
    one envelope version) agrees entry by entry with ``decode_hit`` on every mix: plain,
    version 2, compressed, null, empty, corrupt and missing entries, first or later."""
    codec = Codec(serializer, compress_above=64)
    plain = [codec.encode({"id": n}, 1.0, 0.1, key="k") for n in range(3)]
    second = [codec.encode({"id": n}, 1.0, 0.1, key="k", stale_for=30.0) for n in range(3)]
    compressed = codec.encode({"id": "x" * 200}, 1.0, 0.1, key="k")
    null = codec.encode(None, 1.0, 0.1, key="k")
    kinds: list[bytes | None] = [
        *plain, *second, compressed, null, plain[0][:16], plain[0][:16] + b"{", b"\xa7S", b"not an envelope", None,
    ]  # fmt: skip
    assert second[0][:4] != plain[0][:4] and compressed[:4] != plain[0][:4]

    def one_by_one(raws: list[bytes | None]) -> tuple[list[Any], int]:
        values = [NOT_A_VALUE if raw is None else codec.decode_hit(raw) for raw in raws]
        return values, sum(value is NOT_A_VALUE for value in values)

    assert codec.decode_hits(plain) == ([codec.decode_hit(raw) for raw in plain], 0)
    assert codec.decode_hits(second) == ([codec.decode_hit(raw) for raw in second], 0)
    assert codec.decode_hit(second[0]) == codec.decode_hit(plain[0]) is not NOT_A_VALUE
    assert codec.decode_hits([]) == ([], 0)
    for first in kinds:
        for later in kinds:
            for page in ([first, later], [first, *plain, later], [first, *second, later]):
                assert codec.decode_hits(page) == one_by_one(page), page
