"""Load budgets (``max_concurrent_loads``): how many loads may run at once, counted across
every process that shares the store, and what a budget is made of. No I/O: taking a slot
is ``_drivers.abudget``'s.

A storm of many distinct cold keys (a flushed cache, a bumped namespace, a fleet of new
pods) is collapsed to one load per key, and still sends the database one query per key
in the same second. A budget bounds that: a load takes its key's lease first (so the
callers of that key cost nothing), then a slot of its budget, and gives the slot back
when the loader returns. Slots are leases in the store (renewed while the load runs, lost
within ``lock_ttl`` when their holder dies) with a fair queue, and a freed slot wakes the
waiters by message.

Which budget a loader draws on is decided at decoration (``budget_name``): the loader's own
``max_concurrent_loads`` is a budget of its own, named by its key template; a
``load_budget`` name shares one budget between every loader that gives it; a layer's
``max_concurrent_loads`` is one budget for every loader of the layer that has none of
its own. Two loaders naming one budget with different sizes are refused.
"""

from __future__ import annotations

import contextvars
from dataclasses import dataclass

from .._errors import ConfigError
from .config import Settings
from .effects import milliseconds
from .keys import EntryKeys, budget_keys

LAYER_BUDGET = "~layer"
"""The name of the budget a layer's own ``max_concurrent_loads`` makes (no loader's
template or ``load_budget`` name starts with ``~``)."""


@dataclass(frozen=True, eq=False)
class LoadBudget:
    """One budget: its name and size, its keys in the store, and how its slots are taken.
    One object per name and layer (compared by identity: ``HOLDING``)."""

    name: str
    slots: int
    keys: EntryKeys
    lease_ms: int  # a slot's lease (the loaders' lock_ttl), renewed while the load runs
    wait_timeout: float  # the longest a load waits for a slot
    recheck_interval: float  # a waiter re-checks at least this often, without a message
    raise_on_backend_error: bool  # on_backend_error="raise": a store that fails the take fails the load

    @property
    def queue_ms(self) -> int:
        """How long a waiter's place in the queue lasts without a try: a waiter tries at
        least every third of it (``_core.acquiring``)."""
        return self.lease_ms


def new_budget(namespace: str, max_key_length: int, name: str, settings: Settings) -> LoadBudget:
    """The budget ``name`` of ``settings.max_concurrent_loads`` slots, its slots leased
    for ``lock_ttl`` and waited for up to ``wait_timeout``."""
    return LoadBudget(
        name,
        settings.max_concurrent_loads,
        budget_keys(namespace, name, max_key_length),
        milliseconds(settings.lock_ttl),
        settings.wait_timeout,
        settings.recheck_interval,
        settings.on_backend_error == "raise",
    )


def refuse_another_size(budget: LoadBudget, slots: int) -> None:
    if budget.slots != slots:
        raise ConfigError(
            f"load budget {budget.name!r} has {budget.slots} slots, and a loader asks it for {slots}: "
            "give every loader sharing a budget one max_concurrent_loads"
        )


HOLDING: contextvars.ContextVar[frozenset[LoadBudget]] = contextvars.ContextVar(
    "stampede_budgets_held", default=frozenset()
)
"""The budgets whose slot the running load holds (in its thread, its task and the tasks
or threads it starts with a copy of its context): a loader that calls another loader of
the same budget runs it in its own slot, rather than wait for a second one, which N
loads each holding one would wait for in vain (a budget of N, deadlocked)."""


def budget_name(layer: Settings, loader: Settings, own_limit: bool, template: str) -> str | None:
    """The budget a loader draws on, or None: its ``load_budget``; else its template when
    it gave ``max_concurrent_loads`` itself; else the layer's when the layer has one."""
    if loader.load_budget:
        if not loader.max_concurrent_loads:
            raise ConfigError(
                f"load_budget={loader.load_budget!r} needs max_concurrent_loads (the budget's size) on the "
                "loader or the layer"
            )
        return loader.load_budget
    if own_limit and loader.max_concurrent_loads:
        return template
    if layer.max_concurrent_loads and loader.max_concurrent_loads:
        return LAYER_BUDGET
    return None
