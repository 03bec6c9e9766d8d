"""The typed serializer: values decoded into the loader's return annotation, for the
caller who loaded and for hits alike, over a real server."""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import enum
import uuid
from collections.abc import Callable

import pytest
import redis

from stampede import ConfigError, MsgspecSerializer, PydanticSerializer, SerializationError, Stampede

pytest.importorskip("msgspec", reason="msgspec comes with the dev extra")


class Status(enum.Enum):
    OPEN = "open"
    PAID = "paid"


@dataclasses.dataclass(frozen=True)
class Order:
    id: uuid.UUID
    placed: datetime.datetime
    status: Status
    lines: tuple[int, ...]
    total: float


ORDER = Order(uuid.UUID(int=7), datetime.datetime(2026, 11, 23, 9, 30, tzinfo=datetime.timezone.utc),
              Status.PAID, (1, 2, 3), 12.5)  # fmt: skip


def order(order_id: int) -> Order | None:
    return ORDER if order_id == 7 else None


async def async_order(order_id: int) -> Order | None:
    return order(order_id)


def wrong(order_id: int) -> Order:
    return {"id": "not an order"}  # type: ignore[return-value]


def test_every_caller_gets_the_annotated_type_back(
    make_layer: Callable[..., Stampede], redis_client: redis.Redis
) -> None:
    layer = make_layer(serializer=MsgspecSerializer())
    load = layer.cached_loader("order:{order_id}")(order)
    assert load(7) == ORDER and isinstance(load(7), Order)  # the leader, then a hit
    assert load(7).placed.tzinfo is not None and load(7).lines == (1, 2, 3)
    assert load(8) is None and load(8) is None  # the null sentinel
    assert redis_client.exists("test:{order:7}") == 1

    aload = layer.cached_loader("order:{order_id}")(async_order)  # the same entries

    async def main() -> None:
        assert await aload(7) == ORDER
        await layer.aclose()

    asyncio.run(main())


def test_a_value_that_does_not_match_the_annotation_is_refused(
    make_layer: Callable[..., Stampede], redis_client: redis.Redis
) -> None:
    layer = make_layer()
    load = layer.cached_loader("wrong:{order_id}", serializer=MsgspecSerializer())(wrong)
    with pytest.raises(SerializationError, match="does not read back"):
        load(1)
    assert redis_client.exists("test:{wrong:1}", "test:{wrong:1}:lock") == 0
    with pytest.raises(SerializationError, match="NaN and infinity"):
        layer.cached_loader("nan:{order_id}", serializer=MsgspecSerializer())(lambda order_id: float("nan"))(1)
    with pytest.raises(SerializationError, match="does not read back"):  # a set checks it too
        load.set(wrong(2), 2)
    assert redis_client.exists("test:{wrong:2}", "test:{wrong:2}:lock") == 0


@pytest.mark.parametrize("typed", ["msgspec", "pydantic"])
def test_an_annotation_that_cannot_be_resolved_is_a_config_error(typed: str) -> None:
    """Either typed serializer (``PydanticSerializer`` too): a loader whose return
    annotation names nothing is refused at decoration, unless the type is given."""
    if typed == "pydantic":
        pytest.importorskip("pydantic", reason="pydantic comes with the dev extra")
    serializer = MsgspecSerializer if typed == "msgspec" else PydanticSerializer

    def load(order_id: int) -> Missing:  # type: ignore[name-defined]  # noqa: F821
        return None

    with pytest.raises(ConfigError, match="give the serializer its type"):
        Stampede(serializer=serializer()).cached_loader("x:{order_id}")(load)
    explicit = Stampede().cached_loader("x:{order_id}", serializer=serializer(Order))(load)
    assert explicit(1) is None  # a type given outright needs no annotation
