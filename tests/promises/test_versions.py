"""Entries safe across a rolling deploy (``cached_loader(..., version=...)``,
docs/deploys.md): two versions of a loader whose value type changed share a namespace,
each reads only values written for its own type and loads each key once, and an
invalidation, expiry or set from either reaches both versions' entries, a load in
flight of the other version included."""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Callable
from typing import Any, TypedDict

import pytest
import redis

from stampede import ConfigError, Stampede
from stampede._core.versions import type_identity
from stampede.testing import RedisServer
from stampede.testing.servers import find_server_binary

from ..modes import Blocking, Database, OnALoop

pytestmark = pytest.mark.timeout(60)


@dataclasses.dataclass
class ProductV1:
    id: int
    name: str


@dataclasses.dataclass
class ProductV2:  # the deploy renamed a field and added one
    id: int
    title: str
    price: float


def two_versions(layer: Stampede, mode: Blocking | OnALoop) -> tuple[Any, Any, Database, Database]:
    """The loader of the old deploy and of the new one, on one layer (one namespace), each
    over a database of its own that counts its loads."""
    old = Database(lambda key: {"id": key, "name": f"n{key}"})
    new = Database(lambda key: {"id": key, "title": f"t{key}", "price": 1.5})
    old_load, new_load = mode.loader(old), mode.loader(new)
    if isinstance(mode, Blocking):

        def v1(key: int) -> ProductV1:
            return old_load(key)  # type: ignore[no-any-return]

        def v2(key: int) -> ProductV2:
            return new_load(key)  # type: ignore[no-any-return]

    else:

        async def v1(key: int) -> ProductV1:  # type: ignore[misc]
            return await old_load(key)  # type: ignore[no-any-return]

        async def v2(key: int) -> ProductV2:  # type: ignore[misc]
            return await new_load(key)  # type: ignore[no-any-return]

    first = layer.cached_loader("product:{key}", version=True)(v1)
    second = layer.cached_loader("product:{key}", version=True)(v2)
    return first, second, old, new


def shape(value: dict[str, Any]) -> str:
    return "v2" if "title" in value else "v1" if "name" in value else "?"


def test_two_versions_side_by_side_each_read_their_own_values_and_load_each_key_once(
    layer_of_each_backend: Callable[..., Stampede], mode: Blocking | OnALoop
) -> None:
    layer = layer_of_each_backend(namespace=f"deploy-{uuid.uuid4().hex[:8]}")
    v1, v2, old, new = two_versions(layer, mode)
    assert v1.key(1) != v2.key(1)
    calls = [(v1 if index % 2 else v2, index // 2 % 6) for index in range(48)]  # both versions, interleaved
    values = mode.burst(lambda call: call[0](call[1]), calls)
    assert [shape(value) for value in values] == ["v1" if loader is v1 else "v2" for loader, _ in calls]
    assert old.calls == dict.fromkeys(range(6), 1) and new.calls == dict.fromkeys(range(6), 1)


def test_an_invalidation_expiry_or_set_from_either_version_reaches_both(
    layer_of_each_backend: Callable[..., Stampede], mode: Blocking | OnALoop
) -> None:
    layer = layer_of_each_backend(namespace=f"deploy-{uuid.uuid4().hex[:8]}")
    v1, v2, old, new = two_versions(layer, mode)
    mode(v1, 7), mode(v2, 7)
    mode(v1.invalidate, 7)
    assert [shape(mode(v1, 7)), shape(mode(v2, 7))] == ["v1", "v2"] and (old.calls, new.calls) == ({7: 2}, {7: 2})
    mode(v2.invalidate, 7)
    mode(v1, 7), mode(v2, 7)
    assert (old.calls, new.calls) == ({7: 3}, {7: 3})
    mode(v1.expire, 7)
    mode(v1, 7), mode(v2, 7)
    assert (old.calls, new.calls) == ({7: 4}, {7: 4})
    assert mode(v2.set, {"id": 7, "title": "set", "price": 2.0}, 7) is True
    assert mode(v2, 7)["title"] == "set" and new.calls == {7: 4}  # its own entry holds the value set
    assert shape(mode(v1, 7)) == "v1" and old.calls == {7: 5}  # the old version's value went


def test_a_load_in_flight_of_one_version_is_not_written_after_the_others_invalidation(
    layer_of_each_backend: Callable[..., Stampede], mode: Blocking | OnALoop
) -> None:
    layer = layer_of_each_backend(namespace=f"deploy-{uuid.uuid4().hex[:8]}")
    v1, v2, _, new = two_versions(layer, mode)
    new.release.clear()
    loading = mode.start(v2, 3)  # reads the row, then waits
    assert new.started.wait(10)
    mode(v1.invalidate, 3)  # the row changed after v2's load read it
    new.release.set()
    assert shape(loading.result(10)) == "v2"
    mode(v2, 3)
    assert new.calls == {3: 2}  # the load begun before the invalidation was not kept


def many_versions(layer: Stampede, mode: Blocking | OnALoop) -> tuple[Any, Any, Any, Database, Database]:
    """``two_versions`` for many-key loaders (``cached_loader_many``), and the new deploy's
    one-key loader of the same entries."""
    old = Database(lambda key: {"id": key, "name": f"n{key}"})
    new = Database(lambda key: {"id": key, "title": f"t{key}", "price": 1.5})
    old_load, new_load = mode.loader(old), mode.loader(new)
    if isinstance(mode, Blocking):

        def v1(ids: list[int]) -> dict[int, ProductV1]:
            return {key: old_load(key) for key in ids}

        def v2(ids: list[int]) -> dict[int, ProductV2]:
            return {key: new_load(key) for key in ids}

        def one(key: int) -> ProductV2:
            return new_load(key)  # type: ignore[no-any-return]

    else:

        async def v1(ids: list[int]) -> dict[int, ProductV1]:  # type: ignore[misc]
            return {key: await old_load(key) for key in ids}

        async def v2(ids: list[int]) -> dict[int, ProductV2]:  # type: ignore[misc]
            return {key: await new_load(key) for key in ids}

        async def one(key: int) -> ProductV2:  # type: ignore[misc]
            return await new_load(key)  # type: ignore[no-any-return]

    first = layer.cached_loader_many("product:{key}", version=True)(v1)
    second = layer.cached_loader_many("product:{key}", version=True)(v2)
    single = layer.cached_loader("product:{key}", version=True)(one)
    return first, second, single, old, new


def test_many_key_loaders_of_two_versions_read_their_own_values_and_load_each_key_once(
    layer_of_each_backend: Callable[..., Stampede], mode: Blocking | OnALoop
) -> None:
    layer = layer_of_each_backend(namespace=f"deploy-{uuid.uuid4().hex[:8]}")
    v1, v2, single, old, new = many_versions(layer, mode)
    calls = [(v1 if index % 2 else v2, [index % 4, (index + 1) % 4]) for index in range(24)]
    found = mode.burst(lambda call: call[0](call[1]), calls)
    for (loader, ids), values in zip(calls, found, strict=True):
        assert list(values) == ids and {shape(value) for value in values.values()} == {"v1" if loader is v1 else "v2"}
    assert old.calls == dict.fromkeys(range(4), 1) and new.calls == dict.fromkeys(range(4), 1)
    assert shape(mode(single, 2)) == "v2" and new.calls[2] == 1  # the one-key loader's entry is the same


def test_an_invalidation_or_expiry_from_either_many_key_version_reaches_both(
    layer_of_each_backend: Callable[..., Stampede], mode: Blocking | OnALoop
) -> None:
    layer = layer_of_each_backend(namespace=f"deploy-{uuid.uuid4().hex[:8]}")
    v1, v2, single, old, new = many_versions(layer, mode)
    mode(v1, [7, 8]), mode(v2, [7, 8])
    mode(v1.invalidate, [7, 8])
    mode(v1, [7, 8]), mode(v2, [7, 8])
    assert (old.calls, new.calls) == ({7: 2, 8: 2}, {7: 2, 8: 2})
    mode(v2.expire, 7)
    mode(v1, [7, 8]), mode(v2, [7, 8])
    assert (old.calls, new.calls) == ({7: 3, 8: 2}, {7: 3, 8: 2})
    mode(single.invalidate, 8)  # the one-key loader of the new version reaches the old many-key one
    assert [shape(value) for value in mode(v1, [7, 8]).values()] == ["v1", "v1"]
    assert (old.calls, new.calls) == ({7: 3, 8: 3}, {7: 3, 8: 2})


def adopting(layer: Stampede, mode: Blocking | OnALoop, **tags: Any) -> tuple[Any, Any, Any, Any, Database, Database]:
    """The deploy that first adopts ``version=``: the old pods' one-key and many-key
    loaders have none, the new pods' the same templates with ``version=True`` (the same
    type: the entries differ by key only)."""
    old, new = (
        Database(lambda key: {"id": key, "name": f"n{key}"}),
        Database(lambda key: {"id": key, "name": f"n{key}"}),
    )
    old_load, new_load = mode.loader(old), mode.loader(new)
    if isinstance(mode, Blocking):

        def one_old(key: int) -> ProductV1:
            return old_load(key)  # type: ignore[no-any-return]

        def one_new(key: int) -> ProductV1:
            return new_load(key)  # type: ignore[no-any-return]

        def many_old(ids: list[int]) -> dict[int, ProductV1]:
            return {key: old_load(key) for key in ids}

        def many_new(ids: list[int]) -> dict[int, ProductV1]:
            return {key: new_load(key) for key in ids}

    else:

        async def one_old(key: int) -> ProductV1:  # type: ignore[misc]
            return await old_load(key)  # type: ignore[no-any-return]

        async def one_new(key: int) -> ProductV1:  # type: ignore[misc]
            return await new_load(key)  # type: ignore[no-any-return]

        async def many_old(ids: list[int]) -> dict[int, ProductV1]:  # type: ignore[misc]
            return {key: await old_load(key) for key in ids}

        async def many_new(ids: list[int]) -> dict[int, ProductV1]:  # type: ignore[misc]
            return {key: await new_load(key) for key in ids}

    return (
        layer.cached_loader("product:{key}", **tags)(one_old),
        layer.cached_loader("product:{key}", version=True, **tags)(one_new),
        layer.cached_loader_many("product:{key}", **tags)(many_old),
        layer.cached_loader_many("product:{key}", version=True, **tags)(many_new),
        old,
        new,
    )


def test_the_deploy_that_adopts_a_version_reaches_the_unversioned_entries_from_the_new_side(
    layer_of_each_backend: Callable[..., Stampede], mode: Blocking | OnALoop
) -> None:
    """Old pods without ``version=``, new pods with it: after the new pod's ``invalidate``
    returned, an old pod read the old value until the ttl. The unversioned entry counts as
    one more version of a versioned loader's: its invalidate, expire and set, one-key or
    many-key, reach the old side's entries (docs/deploys.md says why the old side's do not
    reach the new side's, and how to deploy around it)."""
    layer = layer_of_each_backend(namespace=f"adopt-{uuid.uuid4().hex[:8]}")
    one_old, one_new, many_old, many_new, old, new = adopting(layer, mode)
    assert one_old.key(1) != one_new.key(1)
    mode(one_old, 1), mode(one_new, 1)
    assert (old.calls, new.calls) == ({1: 1}, {1: 1})
    for step, reach in enumerate((one_new.invalidate, one_new.expire), 2):
        mode(reach, 1)
        mode(one_old, 1), mode(one_new, 1)
        assert (old.calls[1], new.calls[1]) == (step, step), reach
    assert mode(one_new.set, {"id": 1, "name": "set new"}, 1) is True
    assert mode(one_new, 1)["name"] == "set new" and mode(one_old, 1)["name"] == "n1"  # the old value went
    assert old.calls[1] == 4
    # many-key loaders, and across kinds
    mode(many_old, [2, 3]), mode(one_old, 4), mode(many_new, [2, 3, 4])
    mode(many_new.invalidate, [2, 3, 4])
    mode(many_old, [2, 3]), mode(one_old, 4)
    assert (old.calls[2], old.calls[3], old.calls[4]) == (2, 2, 2)
    mode(many_new.expire, 3)
    mode(many_old, [2, 3])
    assert (old.calls[2], old.calls[3]) == (2, 3)
    mode(one_new.invalidate, 2)  # a new one-key loader reaches the old many-key entries
    mode(many_old, [2, 3])
    assert (old.calls[2], old.calls[3]) == (3, 3)


def test_the_deploy_that_adopts_a_version_reaches_the_versioned_entries_from_the_old_side(
    layer_of_each_backend: Callable[..., Stampede], mode: Blocking | OnALoop
) -> None:
    """The other way round: after the old pod's ``invalidate`` returned, a new pod read the
    old value until the ttl. A versioned load marks the entry without ``version=`` before it
    reads the database, and the old side's invalidate, expire and set, one-key or
    many-key, find the mark in their own step and reach every versioned entry (and keep a
    versioned load in flight from writing)."""
    layer = layer_of_each_backend(namespace=f"adopt-{uuid.uuid4().hex[:8]}")
    one_old, one_new, many_old, many_new, old, new = adopting(layer, mode)
    mode(one_old, 1), mode(one_new, 1)
    for step, reach in enumerate((one_old.invalidate, one_old.expire), 2):
        mode(reach, 1)
        mode(one_old, 1), mode(one_new, 1)
        assert (old.calls[1], new.calls[1]) == (step, step), reach
    assert mode(one_old.set, {"id": 1, "name": "set old"}, 1) is True
    assert mode(one_old, 1)["name"] == "set old" and mode(one_new, 1)["name"] == "n1"  # the new side's went
    assert new.calls[1] == 4
    # many-key loaders, and across kinds
    mode(many_new, [2, 3]), mode(one_new, 4), mode(many_old, [2, 3, 4])
    mode(many_old.invalidate, [2, 3, 4])
    mode(many_new, [2, 3]), mode(one_new, 4)
    assert (new.calls[2], new.calls[3], new.calls[4]) == (2, 2, 2)
    mode(many_old.expire, 3)
    mode(many_new, [2, 3])
    assert (new.calls[2], new.calls[3]) == (2, 3)
    mode(one_old.invalidate, 2)  # an old one-key loader reaches the new many-key entries
    mode(many_new, [2, 3])
    assert (new.calls[2], new.calls[3]) == (3, 3)
    # A new-side load begun before the old side's invalidation is not written.
    new.release.clear()
    new.started.clear()
    loading = mode.start(one_new, 5)  # marks the entry, reads the row, then waits
    assert new.started.wait(10)
    mode(one_old.invalidate, 5)  # the row changed after that load read it
    new.release.set()
    loading.result(10)
    mode(one_new, 5)
    assert new.calls[5] == 2
    # The layer's invalidation of the entries a pattern names reaches their versions too.
    mode(one_old, 6), mode(one_new, 6)
    matching = layer.invalidate_matching if isinstance(mode, Blocking) else layer.ainvalidate_matching
    assert mode(matching, "product:6") == 1
    mode(one_new, 6)
    assert new.calls[6] == 2


def test_an_entry_no_versioned_loader_marked_costs_its_invalidations_nothing_more() -> None:
    """A loader without ``version=`` whose entries no versioned loader loaded invalidates,
    expires and sets in one script each, as before versions reached it: the mark is read
    in the script it sends anyway. (A server of its own: its command counts are this
    test's alone.)"""
    if find_server_binary() is None:
        pytest.skip("no server binary to start a server of its own")
    with RedisServer() as server, Stampede.from_url(server.url, namespace="plain") as layer:
        client = redis.Redis.from_url(server.url)
        plain = layer.cached_loader("plain:{key}")(lambda key: {"id": key})
        plain(1)
        plain.invalidate(1), plain.expire(1), plain.set({"id": 1}, 1)  # the scripts loaded once

        def scripts() -> int:  # a tag invalidation's steps are scripts too
            stats = client.info("commandstats")
            return sum(int(stats.get(f"cmdstat_{name}", {}).get("calls", 0)) for name in ("evalsha", "eval"))

        before = scripts()
        plain.invalidate(1)
        plain.expire(1)
        plain.set({"id": 1}, 1)
        assert scripts() - before == 3
        client.close()


def test_tag_invalidations_reach_both_sides_and_a_load_in_flight_is_not_written(
    layer_of_each_backend: Callable[..., Stampede], mode: Blocking | OnALoop
) -> None:
    """A tag of both sides' entries is invalidated on both, from either; an old-side load
    begun before the new side's invalidation is not written."""
    layer = layer_of_each_backend(namespace=f"adopt-{uuid.uuid4().hex[:8]}")
    one_old, one_new, _, _, old, new = adopting(layer, mode, tags=["shop:{key}"])
    mode(one_old, 4), mode(one_new, 4)
    mode(layer.invalidate_tag if isinstance(mode, Blocking) else layer.ainvalidate_tag, "shop:4")
    mode(one_old, 4), mode(one_new, 4)
    assert (old.calls, new.calls) == ({4: 2}, {4: 2})
    old.release.clear()
    old.started.clear()
    loading = mode.start(one_old, 5)  # reads the row, then waits
    assert old.started.wait(10)
    mode(one_new.invalidate, 5)  # the row changed after that load read it
    old.release.set()
    loading.result(10)
    mode(one_old, 5)
    assert old.calls[5] == 2  # the load begun before was not kept


def test_a_version_is_a_schema_or_a_name_and_bad_ones_are_refused_at_decoration() -> None:
    same = dataclasses.make_dataclass("ProductV1", [("id", int), ("name", str)])  # the next deploy's, unchanged

    class Typed(TypedDict):
        id: int

    assert type_identity(ProductV1) == type_identity(same) != type_identity(ProductV2)
    assert type_identity(Typed) != type_identity(dict[str, int])
    layer = Stampede.from_url("memory://", namespace="named")
    try:

        def plain(key: int) -> dict[str, Any]:
            return {"key": key}

        unversioned = layer.cached_loader("row:{key}")(plain)
        named = layer.cached_loader("row:{key}", version="2")(plain)
        assert unversioned.key(1) == "named:{row:1}" and named.key(1) == "named:{row:1~v:2}"
        with pytest.raises(ConfigError, match="needs a return annotation"):
            layer.cached_loader("a:{key}", version=True)(lambda key: key)
        with pytest.raises(ConfigError, match="version must be a non-empty str"):
            layer.cached_loader("b:{key}", version="")(plain)
        assert layer.cached_loader("c:{key}", version=False)(plain).key(1) == "named:{c:1}"

        def many(ids: list[int]) -> dict[int, ProductV1]:
            return {key: ProductV1(key, "n") for key in ids}

        def unannotated(ids: list[int]):  # type: ignore[no-untyped-def]
            return {}

        assert layer.cached_loader_many("d:{key}", version="2")(many)([1]) == {1: {"id": 1, "name": "n"}}
        assert layer.store().scan("named", "d:*") == {"named:{d:1~v:2}"}
        with pytest.raises(ConfigError, match="needs a return annotation"):
            layer.cached_loader_many("e:{key}", version=True)(unannotated)
    finally:
        layer.close()
