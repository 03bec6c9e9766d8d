"""Compression (``compress_above``): values past it are stored compressed on every backend,
blocking and asyncio, read by any reader that knows the kind, refused (as a miss) by one
that does not, bounded by ``max_value_bytes`` when expanded, and kept expanded in the
near cache (``_core.compression``)."""

from __future__ import annotations

import struct
import threading
import zlib
from collections.abc import Callable
from typing import Any

import pytest
import redis

from stampede import ConfigError, Fetched, Stampede
from stampede._core.compression import ZSTD

from ..modes import Blocking, OnALoop
from ..scenarios import wait_until
from .test_controls import Versions, loader

CATEGORY_MAP = {str(n): {"name": f"category {n}", "parent": n // 10, "slug": f"cat-{n}"} for n in range(200)}
COMPRESSIONS = ["zlib", pytest.param("zstd", marks=pytest.mark.skipif(ZSTD is None, reason="zstd extra not installed"))]


@pytest.mark.parametrize("compression", COMPRESSIONS)
def test_values_past_compress_above_are_stored_compressed_and_read_back(
    layer_of_each_backend: Callable[..., Stampede], mode: Blocking | OnALoop, compression: str
) -> None:
    layer = layer_of_each_backend(compress_above=512, compression=compression)
    db = Versions(answer=lambda key, row: CATEGORY_MAP if key == "map" else row)
    row = loader(layer, mode, db)
    assert mode(row, "map") == CATEGORY_MAP
    assert mode(row, "map") == CATEGORY_MAP  # a hit expands it
    assert mode(row.peek, "map") == Fetched(CATEGORY_MAP, False)
    saved = layer.stats()["compressed_bytes_saved"]
    assert saved > 8000  # about 11 kB of JSON in 1-2 kB
    assert mode(row, 1) == {"key": 1, "version": 1}  # too short to compress
    assert layer.stats()["compressed_bytes_saved"] == saved
    assert db.calls == {"map": 1, 1: 1}


def test_a_waiter_in_another_layer_is_woken_with_the_compressed_value(make_layer: Callable[..., Stampede]) -> None:
    leading, waiting = make_layer(compress_above=512), make_layer(compress_above=512)
    release = threading.Event()

    @leading.cached_loader("map:{key}")
    def slow(key: str) -> Any:
        assert release.wait(10)
        return CATEGORY_MAP

    @waiting.cached_loader("map:{key}")
    def never(key: str) -> Any:
        raise AssertionError("the waiter loads nothing")

    result: dict[str, Any] = {}
    leader = threading.Thread(target=lambda: result.setdefault("leader", slow("a")))
    leader.start()
    wait_until(lambda: leading._runner.store.holder(slow._keys.keys(("a",), {})) is not None, "the lease")  # type: ignore[union-attr]
    follower = threading.Thread(target=lambda: result.setdefault("waiter", never("a")))
    follower.start()
    wait_until(lambda: waiting.stats()["lock_waits"] == 1, "the waiter to wait")
    release.set()
    leader.join(10)
    follower.join(10)
    assert result == {"leader": CATEGORY_MAP, "waiter": CATEGORY_MAP}


def test_readers_without_compress_above_read_compressed_values(make_layer: Callable[..., Stampede]) -> None:
    writer, reader = make_layer(compress_above=64), make_layer()

    @writer.cached_loader("map:{key}")
    def written(key: str) -> Any:
        return CATEGORY_MAP

    @reader.cached_loader("map:{key}")
    def read(key: str) -> Any:
        raise AssertionError("the compressed value is a hit")

    written("a")
    assert read("a") == CATEGORY_MAP


def test_an_unknown_compression_kind_is_a_miss_and_a_bomb_is_refused(
    make_layer: Callable[..., Stampede], redis_client: redis.Redis
) -> None:
    layer = make_layer(max_value_bytes=10_000)
    loads: list[str] = []

    @layer.cached_loader("map:{key}")
    def category_map(key: str) -> Any:
        loads.append(key)
        return "loaded"

    header = struct.pack(">2sBBdf", b"\xa7S", 1, 9, 1.0, 0.1)  # kind 9: a compression of the future
    redis_client.set(category_map.key("future"), header + b"payload")
    bomb = zlib.compress(b'"' + b"a" * 10_000_000 + b'"', 9)  # 10 MB of JSON in about 10 kB
    redis_client.set(category_map.key("bomb"), struct.pack(">2sBBdf", b"\xa7S", 1, 3, 1.0, 0.1) + bomb)

    assert category_map("future") == "loaded"
    assert category_map("bomb") == "loaded"
    assert loads == ["future", "bomb"]
    assert layer.stats()["corrupt_values"] == 2


def test_the_near_cache_keeps_copies_expanded(make_layer: Callable[..., Stampede]) -> None:
    layer = make_layer(compress_above=64, near_cache=True)

    @layer.cached_loader("map:{key}")
    def category_map(key: str) -> Any:
        return CATEGORY_MAP

    category_map("a")
    assert layer._near is not None
    wait_until(lambda: category_map("a") == CATEGORY_MAP and layer.stats()["near_hits"] > 0, "a near hit")
    copy = layer._near._copies[category_map.key("a")]
    assert copy.raw[3] == 1  # a plain value's kind: no hit expands it again


def test_bad_compression_settings_are_refused() -> None:
    with pytest.raises(ConfigError, match="compression"):
        Stampede(compression="lz4")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="compress_above"):
        Stampede(compress_above=-1)
