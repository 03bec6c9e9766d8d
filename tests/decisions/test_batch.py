"""The order a batch of flows takes its steps in (``_core.batch.together``), without a
server: which steps go together, which wait, and how a failure or an interruption ends."""

from __future__ import annotations

from typing import Any

import pytest

from stampede._core.batch import Each, Failed, One, together
from stampede._core.effects import Acquire, AwaitNotice, Decision, Load, Release, Subscribe, WriteRelease
from stampede._core.flow import fill
from stampede._core.store import AcquireReply, LockState, Written

from .test_flow import make_ctx


def script(*effects: Any) -> Decision[list[Any]]:
    """A flow that yields ``effects`` in turn and returns the replies it got."""
    replies = []
    for effect in effects:
        replies.append((yield effect))
    return replies


def kinds(step: One | Each) -> Any:
    if isinstance(step, One):
        return (step.index, type(step.effect).__name__)
    return [(one.index, type(one.effect).__name__) for one in step.steps]


def drive(flows: list[Decision[Any]], answer: Any) -> tuple[list[Any], list[Any]]:
    """Run ``together(flows)``, answering each step with ``answer(step)``: the steps seen
    and the outcomes."""
    batch = together(flows)
    seen = []
    reply: Any = None
    while True:
        try:
            step = batch.send(reply)
        except StopIteration as stop:
            return seen, stop.value
        seen.append(kinds(step))
        reply = answer(step)


def test_steps_of_one_kind_go_together_and_waits_go_last() -> None:
    flows = [
        script(Acquire(), Load(leased=True), WriteRelease(b"a", 1, True)),
        script(Subscribe(), AwaitNotice(1.0)),
        script(Acquire(), Load(leased=True), WriteRelease(b"c", 1, True)),
    ]

    def answer(step: One | Each) -> Any:
        return [f"r{one.index}" for one in step.steps] if isinstance(step, Each) else "r"

    seen, outcomes = drive(flows, answer)

    assert seen == [
        [(1, "Subscribe")],  # subscriptions first, confirmed together
        [(0, "Acquire"), (2, "Acquire")],  # every lease in one round trip
        [(0, "Load"), (2, "Load")],  # one call of the loader
        [(0, "WriteRelease"), (2, "WriteRelease")],  # every write together
        (1, "AwaitNotice"),  # the wait for another holder: once its own are written
    ]
    assert outcomes == [["r0", "r0", "r0"], ["r1", "r"], ["r2", "r2", "r2"]]


def test_a_failed_step_fails_its_flow_only() -> None:
    flows = [script(Acquire(), Load(leased=True)), script(Acquire(), Load(leased=True))]
    error = RuntimeError("no lease for this one")

    def answer(step: One | Each) -> Any:
        assert isinstance(step, Each)
        if isinstance(step.steps[0].effect, Acquire):
            return [Failed(error), "locked"]
        return ["value"]

    seen, outcomes = drive(flows, answer)

    assert seen == [[(0, "Acquire"), (1, "Acquire")], [(1, "Load")]]
    assert outcomes == [Failed(error), ["locked", "value"]]


def test_a_failure_of_a_whole_round_trip_is_each_steps() -> None:
    flows = [script(Acquire()), script(Acquire())]
    batch = together(flows)
    step = batch.send(None)
    assert isinstance(step, Each)
    error = ConnectionError("the server went away")
    with pytest.raises(StopIteration) as stop:
        batch.throw(error)
    assert stop.value.value == [Failed(error), Failed(error)]


def test_an_interruption_releases_every_lease_then_goes_on() -> None:
    contexts = [make_ctx()[0] for _ in range(2)]
    batch = together([fill(ctx) for ctx in contexts])
    step = batch.send(None)
    assert isinstance(step, Each) and all(isinstance(one.effect, Acquire) for one in step.steps)
    step = batch.send([AcquireReply(LockState.LOCKED), AcquireReply(LockState.LOCKED)])
    assert isinstance(step, Each) and all(isinstance(one.effect, Load) for one in step.steps)

    cleanup = [batch.throw(KeyboardInterrupt())]
    cleanup.append(batch.send(True))
    assert [kinds(step) for step in cleanup] == [(0, "Release"), (1, "Release")]
    assert all(isinstance(step, One) and isinstance(step.effect, Release) for step in cleanup)
    with pytest.raises(KeyboardInterrupt):
        batch.send(True)


def test_real_flows_load_once_and_wait_for_another_holder_after_their_writes() -> None:
    contexts = [make_ctx()[0] for _ in range(3)]
    batch = together([fill(ctx) for ctx in contexts])
    locked, held = AcquireReply(LockState.LOCKED), AcquireReply(LockState.HELD, lease_left=5.0)
    steps = [batch.send(None)]
    steps.append(batch.send([locked, held, locked]))
    steps.append(batch.send([None]))  # subscribed: entry 1 re-checks
    steps.append(batch.send([held]))
    steps.append(batch.send(["value 0", "value 2"]))  # one loader call for entries 0 and 2
    steps.append(batch.send([Written.YES, Written.YES]))
    assert [kinds(step) for step in steps] == [
        [(0, "Acquire"), (1, "Acquire"), (2, "Acquire")],
        [(1, "Subscribe")],
        [(1, "Acquire")],
        [(0, "Load"), (2, "Load")],
        [(0, "WriteRelease"), (2, "WriteRelease")],
        (1, "AwaitNotice"),
    ]
    envelope = contexts[1].codec.encode("value 1", 0.0, 0.0, key="k")
    with pytest.raises(StopIteration) as stop:
        batch.send(envelope)  # woken with the value another holder wrote
    assert stop.value.value == ["value 0", "value 1", "value 2"]


def test_waits_are_charged_for_what_is_left_of_them_and_a_wait_that_is_over_goes_first() -> None:
    """Three flows wait one second each: performed one after the other, the first waits
    its second, and then the others' are over: they are performed with nothing left, before
    the first flow's next step, so that their re-checks go together with its own."""
    now = [0.0]
    flows = [script(AwaitNotice(1.0), Acquire()) for _ in range(3)]
    batch = together(flows, clock=lambda: now[0])
    performed: list[Any] = []
    reply: Any = None
    while True:
        try:
            step = batch.send(reply)
        except StopIteration:
            break
        if isinstance(step, One):
            performed.append((step.index, step.effect))
            now[0] += step.effect.timeout  # the wait, in silence
            reply = None
        else:
            performed.append([one.index for one in step.steps])
            reply = ["r"] * len(step.steps)
    assert performed == [
        (0, AwaitNotice(1.0)),
        (1, AwaitNotice(0.0)),
        (2, AwaitNotice(0.0)),
        [0, 1, 2],  # the re-checks, together
    ]
