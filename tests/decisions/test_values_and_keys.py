"""Keys, the envelope and settings: pure code, no server."""

from __future__ import annotations

import dataclasses
import uuid
from typing import Any

import pytest
import redis
import redis.asyncio

from stampede import ConfigError, InvalidKey, SerializationError, Settings, Stampede
from stampede._core.codec import Codec, Kind
from stampede._core.keys import KeyBuilder, escape


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
