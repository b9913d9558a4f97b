"""The watchdog interrupts the task that is inside the guard's step, and an ending it records is final.

Each step of the guard may run in a task of its own (``asyncio.wait_for(anext(it), t)`` on Python 3.11,
the host's wind-down loop after the signal, a task that peeks the first event and another that drains
the rest). The watchdog finds, when it fires, the task whose await runs through the guard into the
inner stream, and cancels only that one: never a task that is not inside the guard.

An ending the guard records on its own (stuck, abandoned) is final: nothing the inner stream produces
afterwards is forwarded (a shielded model call awaited again after the cancel cannot deliver a late
delta and ``response.completed``); the guard forwards the terminal its ending calls for instead. The
record and the forwarded stream never disagree.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import pytest

from eventguard import Cause, Lifecycle, State, guard
from eventguard.testing.streams import event, host_context, terminal

from .helpers import tasks_equal_to_any

BOUND = 5.0
GRACE = 0.05
CREATED = event("response.created")
DELTA = {"type": "response.output_text.delta", "delta": "late", "output_index": 0}


def forwarded_agrees(out: list[Any], lc: Lifecycle) -> None:
    """The forwarded stream's terminal (if any) says what the lifecycle says."""
    terminals = [
        e for e in out if e["type"] in ("response.completed", "response.incomplete", "response.failed")
    ]
    assert len(terminals) <= 1, terminals
    if lc.state in (State.COMPLETED, State.INCOMPLETE):
        assert terminals and terminals[0]["type"] == f"response.{lc.state.value}"
    if terminals:
        t = terminals[0]
        said = t["response"]["status"] if t["type"] == "response.failed" else t["type"].split(".")[1]
        assert said == lc.state.value, (said, lc.state)
    assert not any(e is DELTA for e in out[out.index(terminals[0]) :]) if terminals else True


def client_cancel(ctx: Any, signal: asyncio.Event) -> None:
    ctx.client_cancelled = True
    signal.set()


async def blocked_model_call() -> AsyncIterator[Any]:
    """created, then a model call that never returns (but honours task cancellation)."""
    yield CREATED
    await asyncio.sleep(3600)
    yield terminal()


# -- (a) each step in a task of its own --------------------------------------------------------------


def step_with_wait_for(it: Any) -> Any:
    return asyncio.wait_for(anext(it), BOUND)


def step_in_a_task(it: Any) -> Any:
    return asyncio.create_task(anext(it))


def step_with_ensure_future(it: Any) -> Any:
    return asyncio.ensure_future(it.__anext__())


def step_with_anext_default(it: Any) -> Any:
    return asyncio.wait_for(anext(it, None), BOUND)


@pytest.mark.parametrize(
    "step",
    [step_with_wait_for, step_in_a_task, step_with_ensure_future, step_with_anext_default],
    ids=["wait_for(anext(it))", "create_task(anext(it))", "ensure_future(it.__anext__())", "anext(it, None)"],
)
@pytest.mark.parametrize("equal_tasks", [False, True], ids=["", "tasks equal to any"])
async def test_a_consumer_stepping_in_a_task_per_step_is_unstuck_after_a_client_cancel(
    step: Any, equal_tasks: bool
) -> None:
    """``equal_tasks``: under a task factory whose tasks claim to equal any other, the step's task is
    still found (origin: the 2026-12-02 mutation run over watchdog.py: ``task is not hint`` becoming
    ``!=`` in ``waiting_task`` found no task, and the step stayed blocked)."""
    signal, ctx = asyncio.Event(), host_context()
    g = guard(blocked_model_call(), signal, context=ctx, cancel_grace=GRACE)
    it = aiter(g)
    me = asyncio.current_task()
    assert me is not None
    async with asyncio.timeout(BOUND), tasks_equal_to_any() if equal_tasks else contextlib.nullcontext():
        first = await step(it)  # the first step's task is done from here on
        assert first is CREATED
        asyncio.get_running_loop().call_later(0.02, client_cancel, ctx, signal)
        try:
            end = await step(it)  # blocked in the model call until the watchdog interrupts that step
        except StopAsyncIteration:
            end = None
        assert end is None  # the end of the stream (anext(it, None) says it with its default)
    assert (g.lifecycle.state, g.lifecycle.cause) == (State.CANCELLED, Cause.CLIENT_CANCEL)
    assert [a.kind for a in g.lifecycle.anomalies] == ["stuck"]
    assert me.cancelling() == 0


async def host_winddown(aiter_: Any, cancel_signal: asyncio.Event, budget: float) -> AsyncIterator[Any]:
    """The shape of the host's own wind-down loop (azure-ai-agentserver-responses, _iter_with_winddown):
    plain steps until the signal, then each step in ``asyncio.wait_for`` (a task per step on 3.11)."""
    loop = asyncio.get_running_loop()
    deadline: float | None = None
    while True:
        if cancel_signal.is_set() and deadline is None:
            deadline = loop.time() + budget
        try:
            if deadline is not None:
                remaining = deadline - loop.time()
                if remaining <= 0:
                    return
                item = await asyncio.wait_for(aiter_.__anext__(), timeout=remaining)
            else:
                item = await aiter_.__anext__()
        except (StopAsyncIteration, TimeoutError):
            return
        yield item


async def test_in_the_hosts_winddown_shape_the_step_is_interrupted_never_the_hosts_task() -> None:
    signal, ctx = asyncio.Event(), host_context()
    g = guard(blocked_model_call(), signal, context=ctx, cancel_grace=GRACE)

    async def handler() -> AsyncIterator[Any]:  # what GuardedResponses does
        async with g as events:
            async for e in events:
                yield e

    async def host() -> list[Any]:
        out = []
        async for e in host_winddown(handler(), signal, budget=10.0):
            out.append(e)
            if len(out) == 1:
                client_cancel(ctx, signal)  # from now on the host steps in wait_for: a task per step
        return out

    task = asyncio.create_task(host())
    async with asyncio.timeout(BOUND):
        out = await task  # a CancelledError here would be the guard cancelling the host's task
    assert out == [CREATED]
    assert task.cancelling() == 0
    assert (g.lifecycle.state, g.lifecycle.cause) == (State.CANCELLED, Cause.CLIENT_CANCEL)
    assert [a.kind for a in g.lifecycle.anomalies] == ["stuck"]
    assert g.inner_closed == 1


# -- (b) one task peeks, another drains ------------------------------------------------------------


@pytest.mark.parametrize("peeker_waits", ["sleeping", "awaiting the drainer"])
async def test_the_task_that_peeked_is_never_cancelled_and_the_draining_step_is(peeker_waits: str) -> None:
    signal, ctx = asyncio.Event(), host_context()
    gate = asyncio.Event()

    async def inner() -> AsyncIterator[Any]:
        yield CREATED
        await gate.wait()  # a model call that ignores the (steering) signal
        yield DELTA
        yield terminal()

    g = guard(inner(), signal, context=ctx, cancel_grace=GRACE)
    peeker = asyncio.current_task()
    assert peeker is not None
    async with asyncio.timeout(BOUND):
        assert await g.__anext__() is CREATED  # this task took the first step

        async def drain() -> list[Any]:
            return [e async for e in g]

        drainer = asyncio.create_task(drain())
        await asyncio.sleep(0.01)
        signal.set()  # steering: the signal with neither cause flag
        if peeker_waits == "sleeping":
            await asyncio.sleep(4 * GRACE)  # a CancelledError here: the guard cancelled the wrong task
        out = await drainer
        gate.set()
    assert peeker.cancelling() == 0
    assert (g.lifecycle.state, g.lifecycle.cause) == (State.FAILED, Cause.STUCK)
    assert [e["type"] for e in out] == ["response.failed"]  # the drainer's step was the one cut short
    forwarded_agrees([CREATED, *out], g.lifecycle)


async def test_a_drained_run_that_completes_within_grace_is_recorded_completed() -> None:
    signal, ctx = asyncio.Event(), host_context()

    async def inner() -> AsyncIterator[Any]:
        yield CREATED
        await asyncio.sleep(GRACE / 5)
        yield DELTA
        yield terminal()

    g = guard(inner(), signal, context=ctx, cancel_grace=GRACE)
    async with asyncio.timeout(BOUND):
        assert await g.__anext__() is CREATED
        signal.set()
        out = await asyncio.create_task(_drain(g))
        await asyncio.sleep(2 * GRACE)  # the watchdog's time comes and goes: nothing to do
    assert [e["type"] for e in out] == ["response.output_text.delta", "response.completed"]
    assert (g.lifecycle.state, g.lifecycle.cause) == (State.COMPLETED, Cause.STEERING)
    assert g.lifecycle.anomalies == []


async def _drain(g: Any) -> list[Any]:
    return [e async for e in g]


# -- (c) a shielded model call awaited again after the cancel ----------------------------------------


def shielding_inner(returns_after: float, then: str = "yield") -> Any:
    """An executor that shields its model call and, cancelled, awaits the same call again."""

    async def model() -> str:
        await asyncio.sleep(returns_after)
        return "late"

    async def inner() -> AsyncIterator[Any]:
        yield CREATED
        call = asyncio.ensure_future(model())
        try:
            await asyncio.shield(call)
        except asyncio.CancelledError:
            await call  # swallows the cancel, waits again
        if then == "raise":
            raise RuntimeError("the late call failed")
        if then == "end":
            return
        yield DELTA
        yield terminal()

    return inner()


@pytest.mark.parametrize("then", ["yield", "end", "raise"])
@pytest.mark.parametrize(
    ("flags", "on_cancel", "state", "cause", "terminal_status"),
    [
        ("steering", "omit", State.FAILED, Cause.STUCK, "failed"),
        ("client cancel", "omit", State.CANCELLED, Cause.CLIENT_CANCEL, None),
        ("client cancel", "emit", State.CANCELLED, Cause.CLIENT_CANCEL, "cancelled"),
    ],
)
async def test_after_a_stuck_ending_nothing_the_inner_produces_is_forwarded(
    then: str, flags: str, on_cancel: Any, state: State, cause: Cause, terminal_status: str | None
) -> None:
    signal, ctx = asyncio.Event(), host_context()
    g = guard(shielding_inner(6 * GRACE, then), signal, context=ctx, cancel_grace=GRACE, on_cancel=on_cancel)
    out: list[Any] = []

    async def consume() -> None:
        async for e in g:
            out.append(e)

    task = asyncio.create_task(consume())
    async with asyncio.timeout(BOUND):
        await asyncio.sleep(0.01)
        if flags == "client cancel":
            ctx.client_cancelled = True
        signal.set()
        await asyncio.sleep(3 * GRACE)  # grace: cancel swallowed; second grace: the ending is recorded
        assert g.lifecycle.state is state  # recorded while the consumer is still blocked
        assert not task.done()
        if then == "raise":
            with pytest.raises(RuntimeError, match="late call failed"):
                await task
        else:
            await task
    assert (g.lifecycle.state, g.lifecycle.cause) == (state, cause)  # final: never corrected afterwards
    assert DELTA not in out and not any(e["type"] == "response.completed" for e in out)
    expected = [] if terminal_status is None or then == "raise" else [("response.failed", terminal_status)]
    assert [(e["type"], e["response"]["status"]) for e in out[1:]] == expected
    forwarded_agrees(out, g.lifecycle)
    kinds = [a.kind for a in g.lifecycle.anomalies]
    assert kinds.count("stuck") == 1
    assert task.cancelling() == 0
    assert g.inner_closed == 1


async def test_a_stuck_ending_is_recorded_once_and_the_late_events_kept_as_anomalies() -> None:
    signal = asyncio.Event()
    g = guard(shielding_inner(6 * GRACE), signal, context=host_context(), cancel_grace=GRACE)
    async with asyncio.timeout(BOUND):
        task = asyncio.create_task(_drain(g))
        await asyncio.sleep(0.01)
        signal.set()
        out = await task
    lc = g.lifecycle
    assert [e["type"] for e in out] == ["response.created", "response.failed"]
    assert out[-1]["response"]["error"]["code"] == "stuck"
    late = [a for a in lc.anomalies if a.kind == "event_after_terminal"]
    assert [a.payload for a in late] == [DELTA]  # the first late event ends the guard's stream
    assert [t.to_state for t in lc.transitions] == [State.IN_PROGRESS, State.FAILED]


async def test_the_watchdog_never_cancels_a_task_it_cannot_see_inside_the_guard() -> None:
    # A step driven by hand (no task awaits through the guard): the ending is recorded, nobody is
    # cancelled, and what the inner stream produces later is replaced by the recorded ending's terminal.
    signal, release = asyncio.Event(), asyncio.Event()

    async def inner() -> AsyncIterator[Any]:
        yield CREATED
        await release.wait()
        yield terminal()

    g = guard(inner(), signal, context=host_context(), cancel_grace=GRACE)
    me = asyncio.current_task()
    assert me is not None
    async with asyncio.timeout(BOUND):
        assert await g.__anext__() is CREATED
        step = g.__anext__()
        fut = step.send(None)  # suspended inside the inner stream's await, in no task's chain of awaits
        signal.set()
        await asyncio.sleep(3 * GRACE)
        assert me.cancelling() == 0 and not fut.cancelled()
        assert (g.lifecycle.state, g.lifecycle.cause) == (State.FAILED, Cause.STUCK)
        release.set()
        await asyncio.sleep(0)
        with pytest.raises(StopIteration) as stop:
            step.send(None)
        await g.aclose()
    last = stop.value.value
    assert (last["type"], last["response"]["status"]) == ("response.failed", "failed")
    assert [a.kind for a in g.lifecycle.anomalies] == ["stuck", "duplicate_terminal"]


class _ClaimsToBeAnything:
    """What a coroutine awaiting :class:`_Bystanding` shows as its ``cr_await``: it delegates to a
    future, and claims to equal any object (the guard's generator included)."""

    def __init__(self, fut: asyncio.Future[None]) -> None:
        self._it = fut.__await__()

    def __iter__(self) -> _ClaimsToBeAnything:
        return self

    def __next__(self) -> Any:
        return next(self._it)

    def send(self, value: Any) -> Any:
        return self._it.send(value)

    def throw(self, *args: Any) -> Any:
        return self._it.throw(*args)

    def __eq__(self, other: object) -> bool:
        return True

    __hash__ = object.__hash__


class _Bystanding:
    def __init__(self, fut: asyncio.Future[None]) -> None:
        self.fut = fut

    def __await__(self) -> Any:
        return _ClaimsToBeAnything(self.fut)


async def test_a_task_awaiting_something_that_claims_to_be_the_guard_is_not_taken_for_its_step() -> None:
    """The chain of awaits is matched to the guard's generator by identity: a task elsewhere that awaits an
    object claiming to equal anything is not inside the guard, and is never cancelled; the stuck ending is
    recorded without interrupting anyone, as when no task is inside the step.

    Origin: the 2026-12-02 mutation run over watchdog.py: ``obj is gen`` becoming ``==`` in
    ``awaits_through`` cancelled that task."""
    signal, release = asyncio.Event(), asyncio.Event()

    async def inner() -> AsyncIterator[Any]:
        yield CREATED
        await release.wait()
        yield terminal()

    loop = asyncio.get_running_loop()
    fut: asyncio.Future[None] = loop.create_future()

    async def bystander() -> None:
        await _Bystanding(fut)

    other = asyncio.create_task(bystander())
    g = guard(inner(), signal, context=host_context(), cancel_grace=GRACE)
    async with asyncio.timeout(BOUND):
        await asyncio.sleep(0)  # the bystander is waiting
        assert await g.__anext__() is CREATED
        step = g.__anext__()
        step.send(None)  # suspended inside the inner stream's await, in no task's chain of awaits
        signal.set()
        await asyncio.sleep(3 * GRACE)
        assert other.cancelling() == 0 and not other.done()
        assert (g.lifecycle.state, g.lifecycle.cause) == (State.FAILED, Cause.STUCK)
        fut.set_result(None)
        await other
        release.set()
        await asyncio.sleep(0)
        with pytest.raises(StopIteration):
            step.send(None)
        await g.aclose()
    assert "could be found" in g.lifecycle.anomalies[0].reason


# -- (d) how far a chain of awaits is followed -----------------------------------------------------


async def _awaits_down(depth: int, step: Any) -> Any:
    """``depth`` coroutines, each awaiting the next, the last awaiting ``step``."""
    if depth == 0:
        return await step
    return await _awaits_down(depth - 1, step)


@pytest.mark.parametrize(("depth", "found"), [(0, True), (253, True), (254, False), (400, False)])
async def test_a_chain_of_awaits_is_followed_256_links_deep_and_no_further(depth: int, found: bool) -> None:
    """From a task's coroutine to the guard's generator: ``depth + 1`` coroutines, the step's awaitable,
    then the generator, the 256th link at ``depth`` 253. A chain longer than that is not followed (no
    stream nests so deep), and is never taken for one that reaches the generator.

    Origin: ``_MAX_CHAIN`` becoming 255 or 257, and ``awaits_through`` answering True past the bound,
    survived the run over guard/watchdog.py (docs/mutation.md)."""
    from eventguard.guard.watchdog import awaits_through

    gate = asyncio.get_running_loop().create_future()

    async def gen() -> AsyncIterator[Any]:
        await gate
        yield None

    g = gen()
    task = asyncio.create_task(_awaits_down(depth, anext(g)))
    try:
        await asyncio.sleep(0)  # the task is now suspended on the gate, through the whole chain
        assert g.ag_await is not None
        assert awaits_through(task, g) is found
    finally:
        gate.set_result(None)
        async with asyncio.timeout(BOUND):
            await task
        await g.aclose()
