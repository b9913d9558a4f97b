"""A guard dropped without ``async with`` is finalised like an async generator.

``break`` out of ``async for`` over a guard without ``async with``, then drop the guard: nothing closes
it explicitly. The event loop's async generator finaliser closes the guard's own generator once the
garbage collector finds it unreachable, and the guard ends there: the inner stream is closed (its
``finally`` runs exactly once), the ending is recorded by the decision table (``closed_early``, or the
cause flags), the recorder is flushed, and no task is left behind. The watchdog holds the guard only
by a weak reference, so it never keeps a dropped guard alive.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import weakref
from collections.abc import AsyncIterator
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import pytest

from eventguard import Cause, Lifecycle, State, guard
from eventguard.testing.streams import host_context, stream_events

from .helpers import BOUND, CountingSink, PlainSignal


@dataclass
class Inner:
    """An async generator stream whose ``finally`` is counted."""

    events: list[Any]
    finally_ran: int = 0

    async def stream(self) -> AsyncIterator[Any]:
        try:
            for e in self.events:
                yield e
                await asyncio.sleep(0)
        finally:
            self.finally_ran += 1


def other_tasks() -> set[asyncio.Task[Any]]:
    return {t for t in asyncio.all_tasks() if t is not asyncio.current_task()}


async def collect_until(done: Any) -> None:
    """Collect garbage and give the loop turns until ``done()``; bounded, never swallowing the timeout."""
    async with asyncio.timeout(BOUND):
        while True:
            gc.collect()
            await asyncio.sleep(0.01)
            if done():
                return


async def break_and_drop(
    inner: Inner,
    signal: Any,
    *,
    context: Any = None,
    cancel_grace: float | None,
    sink: Any = None,
    steps: int = 1,
) -> tuple[Lifecycle, weakref.ref[Any]]:
    """Iterate a guard with plain ``async for`` (no ``async with``), break after ``steps`` events, drop it."""
    g = guard(inner.stream(), signal, context=context, cancel_grace=cancel_grace, sink=sink)
    lc, ref = g.lifecycle, weakref.ref(g)
    seen = 0
    async with asyncio.timeout(BOUND):
        async for _ in g:
            seen += 1
            if seen == steps:
                break
    del g
    return lc, ref


@pytest.mark.parametrize("cancel_grace", [0.05, 10.0, None], ids=["grace 0.05", "grace 10", "no watchdog"])
@pytest.mark.parametrize("signal_kind", ["asyncio.Event", "polled"])
async def test_a_guard_dropped_after_break_is_finalised_closed_early(
    cancel_grace: float | None, signal_kind: str
) -> None:
    inner = Inner(stream_events(5))
    # The test keeps the signal (and the context's shutdown event) alive, as the host does: what the
    # watchdog waits on must not keep the guard alive.
    signal: Any = asyncio.Event() if signal_kind == "asyncio.Event" else PlainSignal()
    ctx = host_context()
    lc, ref = await break_and_drop(inner, signal, context=ctx, cancel_grace=cancel_grace, steps=3)
    await collect_until(lambda: lc.ended and not other_tasks())
    assert (lc.state, lc.cause) == (State.FAILED, Cause.CLOSED_EARLY)
    assert inner.finally_ran == 1
    assert lc.events_forwarded == 3
    assert not other_tasks()  # no watchdog, no waiter, no finaliser left running
    gc.collect()
    assert ref() is None  # and the guard itself is gone


@pytest.mark.parametrize("cancel_grace", [10.0, None], ids=["grace 10", "no watchdog"])
async def test_a_dropped_guard_is_finalised_at_once_by_reference_counting(cancel_grace: float | None) -> None:
    # The hot loop's generator holds the guard's parts, not the Guard: nothing refers back to the
    # Guard, so dropping it frees it and its generator at once, with the garbage collector switched off.
    inner = Inner(stream_events(5))
    signal = asyncio.Event()
    gc.disable()
    try:
        lc, ref = await break_and_drop(inner, signal, cancel_grace=cancel_grace, steps=2)
        assert ref() is None  # gone the moment the last reference went
        for _ in range(int(BOUND / 0.01)):  # a few loop turns: the finaliser's aclose() task
            if lc.ended and not other_tasks():
                break
            await asyncio.sleep(0.01)
    finally:
        gc.enable()
    assert (lc.state, lc.cause) == (State.FAILED, Cause.CLOSED_EARLY)
    assert inner.finally_ran == 1


async def test_a_dropped_guard_is_ended_by_the_cause_flags_of_that_moment() -> None:
    # The decision table decides, as for any close: a client cancel before the drop is a cancel.
    inner = Inner(stream_events(5))
    signal = asyncio.Event()
    ctx = host_context()
    ctx.client_cancelled = True
    signal.set()
    lc, _ = await break_and_drop(inner, signal, context=ctx, cancel_grace=10.0, steps=2)
    await collect_until(lambda: lc.ended and not other_tasks())
    assert (lc.state, lc.cause) == (State.CANCELLED, Cause.CLIENT_CANCEL)
    assert inner.finally_ran == 1


async def test_a_guard_dropped_after_its_terminal_keeps_the_terminal() -> None:
    events = stream_events(2)
    inner = Inner(events)
    lc, _ = await break_and_drop(
        inner, asyncio.Event(), context=host_context(), cancel_grace=10.0, steps=len(events)
    )
    await collect_until(lambda: lc.ended and not other_tasks())
    assert (lc.state, lc.cause) == (State.COMPLETED, Cause.NORMAL)
    assert inner.finally_ran == 1


async def test_a_dropped_guard_flushes_its_recorder_once() -> None:
    sink = CountingSink()
    inner = Inner(stream_events(5))
    lc, _ = await break_and_drop(inner, asyncio.Event(), cancel_grace=0.05, sink=sink, steps=2)
    await collect_until(lambda: sink.closes > 0 and not other_tasks())
    assert sink.closes == 1
    assert sink.events == [0, 1]
    assert (lc.state, lc.cause) == (State.FAILED, Cause.CLOSED_EARLY)


async def test_the_ending_of_a_dropped_guard_does_not_wait_for_cancel_grace() -> None:
    # Recorded as soon as the collector finds the guard, not after cancel_grace (here an hour):
    # collect_until's own bound (BOUND seconds) is the check; no wall-clock figure is asserted,
    # so a loaded machine cannot make it fail.
    inner = Inner(stream_events(5))
    lc, _ = await break_and_drop(inner, asyncio.Event(), context=host_context(), cancel_grace=3600.0, steps=1)
    await collect_until(lambda: lc.ended)
    assert lc.cause is Cause.CLOSED_EARLY


async def test_a_consumer_task_that_breaks_and_ends_leaves_nothing_behind() -> None:
    inner = Inner(stream_events(5))
    signal = asyncio.Event()
    holder = SimpleNamespace(lc=None)

    async def consumer() -> None:
        g = guard(inner.stream(), signal, context=host_context(), cancel_grace=0.05)
        holder.lc = g.lifecycle
        async for _ in g:
            break

    async with asyncio.timeout(BOUND):
        await asyncio.create_task(consumer())
    await collect_until(lambda: holder.lc is not None and holder.lc.ended and not other_tasks())
    assert holder.lc is not None and holder.lc.cause is Cause.CLOSED_EARLY
    assert inner.finally_ran == 1
    signal.set()  # a signal set later wakes nothing: the watchdog is gone
    await asyncio.sleep(0.1)
    assert not other_tasks()


async def test_the_watchdog_holds_no_strong_reference_to_its_guard() -> None:
    signal = asyncio.Event()
    g = guard(Inner(stream_events(3)).stream(), signal, context=host_context(), cancel_grace=10.0)
    async with asyncio.timeout(BOUND), g:
        await g.__anext__()
        (watchdog,) = [
            t for t in other_tasks() if getattr(t.get_coro(), "__qualname__", "") == "Watchdog._watch"
        ]
        frame = watchdog.get_coro().cr_frame  # type: ignore[union-attr]
        assert all(v is not g for v in frame.f_locals.values())


class RaisesOnClose:
    """An inner stream whose close raises: ``aclose()`` is where its cleanup fails."""

    def __init__(self, error: BaseException) -> None:
        self.error = error
        self.closed = 0

    def __aiter__(self) -> RaisesOnClose:
        return self

    async def __anext__(self) -> Any:
        await asyncio.sleep(0)
        return {"type": "response.output_text.delta", "delta": "x"}

    async def aclose(self) -> None:
        self.closed += 1
        raise self.error


@pytest.mark.parametrize("error", [RuntimeError("cleanup failed"), KeyError("gone")], ids=repr)
async def test_a_dropped_guard_whose_inner_close_raises_leaves_no_unretrieved_task_exception(
    error: BaseException, caplog: pytest.LogCaptureFixture
) -> None:
    inner = RaisesOnClose(error)
    errors: list[dict[str, Any]] = []
    loop = asyncio.get_running_loop()
    loop.set_exception_handler(lambda _loop, context: errors.append(context))
    try:
        g = guard(inner, asyncio.Event(), cancel_grace=0.05)
        lc = g.lifecycle
        async with asyncio.timeout(BOUND):
            async for _ in g:
                break
        del g
        await collect_until(lambda: lc.ended and inner.closed and not other_tasks())
        gc.collect()
        await asyncio.sleep(0)
    finally:
        loop.set_exception_handler(None)
    assert (lc.state, lc.cause) == (State.FAILED, Cause.CLOSED_EARLY)
    assert inner.closed == 1
    assert errors == []  # nothing left to "Task exception was never retrieved"
    assert type(error).__name__ in caplog.text  # said once, as a warning, instead


class ExitForRecovery(BaseException):
    """Stands in for the host's ResponseExitForRecovery: a BaseException, not an Exception."""


class SwallowsCancelThenFailsToClose:
    """Stuck after one event; swallows the watchdog's cancel and produces one more; its close raises
    a BaseException, in the background task the guard leaves it to."""

    def __init__(self) -> None:
        self.n = 0
        self.closed = 0

    def __aiter__(self) -> SwallowsCancelThenFailsToClose:
        return self

    async def __anext__(self) -> Any:
        self.n += 1
        if self.n == 1:
            return {"type": "response.output_text.delta", "delta": "x"}
        with contextlib.suppress(asyncio.CancelledError):  # swallowed
            await asyncio.sleep(3600)
        return {"type": "response.output_text.delta", "delta": "late"}

    async def aclose(self) -> None:
        self.closed += 1
        raise ExitForRecovery


async def test_a_stuck_inner_whose_background_close_raises_a_base_exception_is_logged_not_left_unretrieved(
    caplog: pytest.LogCaptureFixture,
) -> None:
    inner = SwallowsCancelThenFailsToClose()
    signal = asyncio.Event()
    signal.set()
    errors: list[dict[str, Any]] = []
    loop = asyncio.get_running_loop()
    loop.set_exception_handler(lambda _loop, context: errors.append(context))
    try:
        g = guard(inner, signal, cancel_grace=0.05)
        async with asyncio.timeout(BOUND):
            got = [ev async for ev in g]
        await collect_until(lambda: inner.closed and not other_tasks())
    finally:
        loop.set_exception_handler(None)
    assert [e.get("delta") for e in got] == ["x"]  # the late event is not forwarded
    assert g.lifecycle.ended
    assert errors == []
    assert "ExitForRecovery" in caplog.text
