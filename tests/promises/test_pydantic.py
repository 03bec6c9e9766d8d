"""pydantic models as typed values (``PydanticSerializer``): decoded into the loader's
return annotation, for the caller who loaded and for hits alike, over a real server."""

from __future__ import annotations

import asyncio
import datetime
import threading
from collections.abc import Callable

import pytest
import redis

from stampede import ConfigError, PydanticSerializer, SerializationError, Stampede

pydantic = pytest.importorskip("pydantic", reason="pydantic comes with the dev extra")


class Line(pydantic.BaseModel):
    sku: str
    quantity: int


class Order(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(frozen=True)

    id: int
    placed: datetime.datetime
    lines: tuple[Line, ...]
    total: float


def order_of(order_id: int) -> Order:
    placed = datetime.datetime(2026, 11, 28, 9, 30, tzinfo=datetime.timezone.utc)
    return Order(id=order_id, placed=placed, lines=(Line(sku="a", quantity=2),), total=12.5)


def test_every_caller_gets_the_model_back(make_layer: Callable[..., Stampede], redis_client: redis.Redis) -> None:
    """The leader, a hit, an async caller of the same entries: each gets an ``Order``
    equal to the loaded one (its nested models, its aware datetime); None is the null
    sentinel, cached as such."""
    layer = make_layer(serializer=PydanticSerializer())

    @layer.cached_loader("order:{order_id}")
    def load(order_id: int) -> Order | None:
        return order_of(order_id) if order_id < 100 else None

    first, hit = load(7), load(7)
    assert first == hit == order_of(7) and isinstance(hit, Order) and isinstance(hit.lines[0], Line)
    assert hit.placed.tzinfo is not None
    assert load(100) is None and load(100) is None
    assert redis_client.exists("test:{order:7}", "test:{order:100}") == 2

    @layer.cached_loader("order:{order_id}")
    async def aload(order_id: int) -> Order | None:
        raise AssertionError("the entry is cached")

    async def main() -> None:
        assert await aload(7) == order_of(7)
        await layer.aclose()

    asyncio.run(main())


def test_a_cold_models_callers_share_one_load(make_layer: Callable[..., Stampede]) -> None:
    """32 threads ask for one cold order at once: one load, and each gets an ``Order``."""
    layer = make_layer(serializer=PydanticSerializer())
    calls: list[int] = []
    gate = threading.Barrier(32)

    @layer.cached_loader("order:{order_id}")
    def load(order_id: int) -> Order:
        calls.append(order_id)
        return order_of(order_id)

    got: list[object] = []

    def caller() -> None:
        gate.wait(10)
        got.append(load(3))

    threads = [threading.Thread(target=caller) for _ in range(32)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(20)
    assert calls == [3]
    assert len(got) == 32 and all(isinstance(value, Order) and value == order_of(3) for value in got)


def test_a_many_key_loaders_models_come_back_as_models(make_layer: Callable[..., Stampede]) -> None:
    """``cached_loader_many`` returning ``dict[int, Order]``: each id's value is an
    ``Order``, loaded and hit."""
    layer = make_layer(serializer=PydanticSerializer())
    asked: list[list[int]] = []

    @layer.cached_loader_many("order:{order_id}")
    def load(order_ids: list[int]) -> dict[int, Order]:
        asked.append(list(order_ids))
        return {order_id: order_of(order_id) for order_id in order_ids}

    assert load([1, 2]) == {1: order_of(1), 2: order_of(2)}
    found = load([1, 2, 3])  # two hits, one load
    assert found == {order_id: order_of(order_id) for order_id in (1, 2, 3)} and asked == [[1, 2], [3]]
    assert all(isinstance(value, Order) for value in found.values())


def test_a_value_that_is_not_the_annotated_model_is_refused_and_nothing_is_written(
    make_layer: Callable[..., Stampede], redis_client: redis.Redis
) -> None:
    """A loader annotated ``-> Order`` that returns a dict: refused at the write, with
    nothing written and no lease left, and no warning from pydantic (it is asked to fail).
    NaN has no JSON form: refused too."""
    layer = make_layer()

    def wrong(order_id: int) -> Order:
        return {"id": "not an order"}  # type: ignore[return-value]

    load = layer.cached_loader("wrong:{order_id}", serializer=PydanticSerializer())(wrong)
    with pytest.raises(SerializationError, match="not serializable"):
        load(1)
    assert redis_client.exists("test:{wrong:1}", "test:{wrong:1}:lock") == 0

    def nan(order_id: int) -> float:
        return float("nan")

    with pytest.raises(SerializationError, match="NaN and infinity"):
        layer.cached_loader("nan:{order_id}", serializer=PydanticSerializer())(nan)(1)


def test_bytes_that_do_not_validate_are_a_miss(make_layer: Callable[..., Stampede]) -> None:
    """An entry written for another shape (a deploy's older model, here a plain JSON
    layer's dict) does not validate into ``Order``: a miss, loaded again, never handed
    over as the wrong type."""
    plain = make_layer()
    typed = make_layer(serializer=PydanticSerializer())
    plain.cached_loader("order:{order_id}")(lambda order_id: {"id": order_id})(5)
    calls: list[int] = []

    @typed.cached_loader("order:{order_id}")
    def load(order_id: int) -> Order:
        calls.append(order_id)
        return order_of(order_id)

    assert load(5) == order_of(5) and calls == [5]


def test_a_type_pydantic_cannot_validate_is_a_config_error() -> None:
    """(An annotation that names nothing: ``test_msgspec``, for both typed serializers.)"""

    class Opaque:  # no schema pydantic can make
        pass

    with pytest.raises(ConfigError, match="pydantic cannot validate"):
        PydanticSerializer(Opaque)
