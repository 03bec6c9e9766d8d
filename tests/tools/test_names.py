"""Names users see: public classes show their public name (``stampede.X``) in a repr; old
names keep working for a while, each with a DeprecationWarning naming its successor and
pointing at the caller's own line."""

from __future__ import annotations

import pytest

from stampede import ConfigError, MsgspecSerializer, Redlock, Stampede


def test_public_classes_show_their_public_name(redis_url: str) -> None:
    layer = Stampede()
    load = layer.cached_loader("item:{key}")(lambda key: key)
    manager = Redlock([redis_url])
    try:
        shown = [repr(layer), repr(load), repr(layer.lock("job")), repr(manager), repr(manager.lock("job"))]
        shown.append(repr(MsgspecSerializer()))
        for text, name in zip(
            shown, ["Stampede", "CachedLoader", "Lock", "Redlock", "RedlockLock", "MsgspecSerializer"], strict=True
        ):
            assert text.lstrip("<").startswith(f"stampede.{name}"), text
        assert "backend=memory" in shown[0]
    finally:
        manager.close()
        layer.close()


def test_on_redis_error_is_taken_as_on_backend_error_with_a_warning() -> None:
    with pytest.warns(DeprecationWarning, match="on_redis_error is deprecated: use on_backend_error") as caught:
        layer = Stampede(on_redis_error="raise")
    assert caught[0].filename == __file__
    assert layer.settings.on_backend_error == "raise"
    with pytest.warns(DeprecationWarning, match="use on_backend_error") as caught:
        load = layer.cached_loader("item:{key}", on_redis_error="load")(lambda key: key)
    assert caught[0].filename == __file__
    assert load.settings.on_backend_error == "load" and load(1) == 1
    layer.close()


def test_both_names_at_once_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="give on_backend_error only"):
        Stampede(on_redis_error="raise", on_backend_error="load")


def test_redlocks_retry_delay_is_taken_as_retry_interval_with_a_warning(redis_url: str) -> None:
    manager = Redlock([redis_url])
    try:
        with pytest.warns(DeprecationWarning, match="retry_delay is deprecated: use retry_interval") as caught:
            lock = manager.lock("job", retry_delay=0.05)
        assert caught[0].filename == __file__
        assert lock.retry_interval == 0.05
    finally:
        manager.close()
