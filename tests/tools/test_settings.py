"""The settings are declared once, in ``Settings``; the keyword arguments that give them
(``LayerSettings`` and the loaders' subsets, typed for mypy) are that declaration's typed
face, kept alike here, and the layer's entry points take them and no other. A layer's
options are declared once too (``Options``), typed for ``Stampede(...)`` and
``Stampede.from_url(...)`` alike (``LayerOptions``)."""

from __future__ import annotations

import dataclasses
import inspect

import pytest

import stampede
from stampede import ConfigError, Settings, Stampede
from stampede._core.config import (
    RENAMED,
    SETTING_NAMES,
    LayerSettings,
    LoaderSettings,
    ManyLoaderSettings,
)
from stampede._options import OPTION_NAMES, LayerOptions, Options


def test_every_setting_is_a_keyword_of_a_layer_with_its_declared_type() -> None:
    declared = {field.name: field.type for field in dataclasses.fields(Settings)}
    typed = {name: _spelled(hint) for name, hint in LayerSettings.__annotations__.items()}
    for old, new in RENAMED.items():
        assert typed.pop(old) == declared[new]
    assert typed == declared


def test_a_loader_takes_a_subset_and_a_many_key_loader_the_same_and_max_batch() -> None:
    loader, many = set(LoaderSettings.__optional_keys__), set(ManyLoaderSettings.__optional_keys__)
    assert loader < many == loader | {"max_batch"}
    assert many < set(LayerSettings.__optional_keys__) == SETTING_NAMES | set(RENAMED)
    assert set(RENAMED) <= loader  # an old name is taken wherever its new one is


def _spelled(hint: object) -> object:
    """A TypedDict's annotation as the dataclass keeps it (a ForwardRef's text)."""
    return getattr(hint, "__forward_arg__", hint)


@pytest.mark.parametrize(
    "entry",
    [Stampede.cached_loader, Stampede.cached_loader_many, stampede.cached_loader, stampede.cached_loader_many],
)
def test_each_entry_point_takes_the_settings_as_typed_keywords(entry: object) -> None:
    parameters = inspect.signature(entry).parameters  # type: ignore[arg-type]
    assert parameters["settings"].kind is inspect.Parameter.VAR_KEYWORD
    assert str(parameters["settings"].annotation).startswith("Unpack[")
    assert not set(parameters) & SETTING_NAMES  # spelled nowhere else


def test_every_option_is_a_typed_keyword_of_both_ways_to_make_a_layer() -> None:
    declared = {field.name: field.type for field in dataclasses.fields(Options)}
    typed = {name: _spelled(hint) for name, hint in LayerOptions.__annotations__.items()}
    assert {name: typed[name] for name in OPTION_NAMES} == declared  # each with its declared type
    assert set(LayerOptions.__optional_keys__) == OPTION_NAMES | set(LayerSettings.__optional_keys__)
    for entry in (Stampede.__init__, Stampede.from_url):
        parameters = inspect.signature(entry).parameters
        assert parameters["options"].kind is inspect.Parameter.VAR_KEYWORD
        assert str(parameters["options"].annotation) == "Unpack[LayerOptions]"
        assert not set(parameters) & (SETTING_NAMES | OPTION_NAMES)  # spelled nowhere else


def test_from_url_takes_every_option_stampede_takes() -> None:
    layer = Stampede.from_url(
        "memory://", namespace="options", max_entries=7, near_cache_entries=5, near_cache_bytes=4096, near_lease=1.5
    )
    try:
        assert layer.namespace == "options" and layer.store()._values.maxsize == 7  # type: ignore[attr-defined]
    finally:
        layer.close()


def test_an_option_misspelt_is_refused_with_the_closest_name_before_a_connection_opens() -> None:
    with pytest.raises(ConfigError, match=r"'max_entry' \(did you mean 'max_entries'\?\)"):
        Stampede(max_entry=5)  # type: ignore[call-arg]
    with pytest.raises(ConfigError, match=r"'namespce' \(did you mean 'namespace'\?\)"):
        Stampede.from_url("redis://127.0.0.1:1", namespce="x")  # type: ignore[call-arg]


def test_a_setting_a_loader_cannot_give_is_refused_with_the_closest_name() -> None:
    layer = Stampede(namespace="settings")
    with pytest.raises(ConfigError, match=r"'tll' \(did you mean 'ttl'\?\)"):
        layer.cached_loader("k:{x}", tll=5)  # type: ignore[call-arg]
    with pytest.raises(ConfigError, match=r"'jitter'"):
        layer.cached_loader("k:{x}", jitter=0.2)  # type: ignore[call-arg]
    with pytest.raises(ConfigError, match=r"'max_batch'"):
        layer.cached_loader("k:{x}", max_batch=5)  # type: ignore[call-arg]
    with pytest.warns(DeprecationWarning, match="on_redis_error is deprecated"):
        layer.cached_loader_many("m:{x}", on_redis_error="raise")(lambda xs: {})
    loader = layer.cached_loader("k:{x}", ttl=5, near_cache=False, serializer=None, tags=None)(lambda x: x)
    assert loader(1) == 1
    layer.close()
