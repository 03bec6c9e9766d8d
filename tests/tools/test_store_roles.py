"""The store contract is split into roles (``stampede._core.store``), each a capability's
own: every command of ``Store`` is in exactly one role, blocking and asyncio alike, and
``OneByOne`` gives a store the many-key role from its one-entry commands."""

from __future__ import annotations

import inspect

from stampede import Stampede, backends

ROLES = [
    backends.EntryStore, backends.ControlStore, backends.ManyKeyStore, backends.TagStore, backends.NamedLockStore,
    backends.BudgetStore, backends.HotSetStore, backends.StoreAdmin,
]  # fmt: skip
ASYNC_ROLES = [
    backends.AsyncEntryStore, backends.AsyncControlStore, backends.AsyncManyKeyStore, backends.AsyncTagStore,
    backends.AsyncNamedLockStore, backends.AsyncBudgetStore, backends.AsyncHotSetStore, backends.AsyncStoreAdmin,
]  # fmt: skip


def _commands(protocol: type) -> set[str]:
    return {name for name, _ in inspect.getmembers(protocol, inspect.isfunction) if not name.startswith("_")}


def _own(protocol: type) -> set[str]:
    return {name for name in vars(protocol) if inspect.isfunction(vars(protocol)[name]) and not name.startswith("_")}


def test_every_command_is_in_exactly_one_role() -> None:
    for whole, roles in ((backends.Store, ROLES), (backends.AsyncStore, ASYNC_ROLES)):
        owned = [_own(role) for role in roles]
        assert sum(len(commands) for commands in owned) == len(set().union(*owned))  # no command in two roles
        assert set().union(*owned) == _commands(whole) and not _own(whole)  # the whole is its roles


def test_each_async_role_has_its_blocking_roles_commands() -> None:
    for role, async_role in zip(ROLES, ASYNC_ROLES, strict=True):
        assert _own(role) - {"close"} == _own(async_role) - {"aclose"}


def test_one_by_one_is_the_many_key_role() -> None:
    assert _own(backends.OneByOne) == _own(backends.ManyKeyStore)
    assert _own(backends.AsyncOneByOne) == _own(backends.AsyncManyKeyStore)


def test_a_store_declares_its_optional_roles_and_has_their_commands(redis_url: str) -> None:
    """Budgets, hot sets, slot leases and stream relays are the optional roles
    (``backends.Roles``): a shipped store declares each it has, and a role declared is a
    role implemented, blocking and asyncio alike."""
    every = backends.Roles.BUDGETS | backends.Roles.HOT_SETS | backends.Roles.SLOT_LEASES | backends.Roles.STREAMS
    commands = {
        backends.Roles.BUDGETS: _own(backends.BudgetStore),
        backends.Roles.HOT_SETS: _own(backends.HotSetStore),
        backends.Roles.SLOT_LEASES: _own(backends.SlotLeaseStore),
        backends.Roles.STREAMS: _own(backends.StreamStore),
    }
    for layer in (Stampede(namespace="roles"), Stampede.from_url(redis_url, namespace="roles")):
        try:
            store = layer.store()
            assert backends.roles_of(store) == every
            for role, names in commands.items():
                assert role in backends.roles_of(store) and all(callable(getattr(store, name)) for name in names)
        finally:
            layer.close()
    assert backends.roles_of(object()) == backends.Roles.NONE  # a store that declares nothing has none


def test_the_stream_role_is_the_same_awaited() -> None:
    assert _own(backends.StreamStore) == _own(backends.AsyncStreamStore) == {"relay_add", "relay_read"}


def test_no_role_asks_more_than_twelve_commands() -> None:
    """A role is one capability's: one that grew past a dozen commands holds two."""
    for role in ROLES + ASYNC_ROLES:
        assert len(_own(role)) <= 12, (role.__name__, sorted(_own(role)))
