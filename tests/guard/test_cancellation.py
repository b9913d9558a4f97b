"""Cancellation: a cancel from outside is never swallowed nor taken for the guard's own, and a cancel is
read by the flags at the moment it lands.
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest

from eventguard import Cause, State, guard
from eventguard.testing.streams import (
    Scripted,
    block_ignoring_signal,
    host_context,
    stream_events,
)

from .helpers import (
    CREATED_R1,
    drain,
)


async def test_outside_cancel_in_the_same_turn_as_the_watchdog_is_not_swallowed() -> None:
    """Origin: a review finding; failed before its fix (test_review_regressions.py)."""

    async def inner() -> Any:
        yield CREATED_R1
        await block_ignoring_signal()  # stuck, but honours task cancellation
        yield {"type": "response.output_text.delta", "delta": "x"}

    signal = asyncio.Event()

    async def consume() -> None:
        async with guard(inner(), signal, cancel_grace=0) as g:
            async for _ in g:
                pass

    task = asyncio.create_task(consume())
    await asyncio.sleep(0.05)  # the consumer is now inside the inner stream's await
    signal.set()  # the watchdog wakes on the next turn...
    await asyncio.sleep(0)
    task.cancel()  # ...and an outside cancel (a timeout, the host) lands in the same turn
    with pytest.raises(asyncio.CancelledError):
        async with asyncio.timeout(5):
            await task


async def test_cancel_thrown_into_the_async_with_body_is_a_cancel() -> None:
    # A foreground disconnect with store=false throws CancelledError into the host's handler at
    # its yield: the guard's async with exits with it, and records a cancel, not a walk-away.
    """Origin: a review finding; failed before its fix (test_review_regressions.py)."""
    g = guard(Scripted(stream_events(3)), asyncio.Event(), context=host_context())

    async def handler() -> Any:
        async with g as events:
            async for event in events:
                yield event

    gen = handler()
    async with asyncio.timeout(5):
        await gen.__anext__()
        with pytest.raises(asyncio.CancelledError):
            await gen.athrow(asyncio.CancelledError())
    assert g.lifecycle.state is State.CANCELLED


@pytest.mark.parametrize("client_cancelled", [False, True])
async def test_a_cancel_the_host_did_not_ask_for_is_explained(client_cancelled: bool) -> None:
    """Origin: a mutant that survived the run over guard.py (docs/mutation.md; test_guard_edges.py)."""
    ctx = host_context()
    ctx.client_cancelled = client_cancelled
    sig = asyncio.Event()
    if client_cancelled:
        sig.set()
    events = stream_events(1, final="cancelled")
    g = guard(Scripted(events), sig, context=ctx)
    await drain(g)
    kinds = [a.kind for a in g.lifecycle.anomalies]
    assert ("cancel_without_client_cancel" in kinds) is not client_cancelled
    assert g.lifecycle.state is State.CANCELLED


async def test_an_outside_cancel_landing_with_the_stuck_cancel_propagates() -> None:
    """Origin: a mutant that survived the run over guard.py (docs/mutation.md; test_guard_edges.py)."""

    async def inner() -> Any:
        for e in stream_events(1, final=None):
            yield e
        try:
            await block_ignoring_signal()
        except asyncio.CancelledError:
            task = asyncio.current_task()
            assert task is not None
            task.cancel()  # someone else cancels too, while ours is being delivered
            raise

    sig = asyncio.Event()
    sig.set()
    g = guard(inner(), sig, cancel_grace=0.05)
    task = asyncio.create_task(drain(g))
    with pytest.raises(asyncio.CancelledError):
        async with asyncio.timeout(5):
            await task
    assert g.lifecycle.state is State.CANCELLED
    assert "stuck" not in [a.kind for a in g.lifecycle.anomalies]  # ended by that cancel, not by ours


async def test_a_dropped_event_does_not_change_how_a_later_cancel_is_read() -> None:
    """Origin: a mutant that survived the run over guard.py (docs/mutation.md; test_guard_edges.py)."""
    sig = asyncio.Event()
    sig.set()
    events = stream_events(2)
    events.insert(3, 42)  # dropped, with an anomaly, just before the stream gets stuck
    inner = Scripted(events, before={4: block_ignoring_signal})
    g = guard(inner, sig, cancel_grace=0.05)
    await drain(g)  # the watchdog's cancel is taken back: no CancelledError here
    assert [a.kind for a in g.lifecycle.anomalies] == ["not_a_mapping", "stuck"]


async def test_a_cancel_after_object_events_on_the_hot_path_is_a_cancel() -> None:
    """Attribute-style events (the openai SDK's are pydantic objects) take the hot path from the second
    of a type on; a cancel that lands while the guard pulls the next event is still the inner stream's
    ending, a cancel, not the guard's own error. Origin: the 2026-12-02 mutation run over core.py (the
    hot loop's ``phase = 0`` after an object's type was read, made 1: that cancel was recorded failed)."""
    delta = SimpleNamespace(type="response.output_text.delta", delta="x")
    pulled = asyncio.Event()

    async def inner() -> Any:
        yield CREATED_R1
        yield delta  # the slow path: its type joins the hot set
        yield delta  # the hot path, read by attribute
        pulled.set()
        await asyncio.Event().wait()  # the consumer's task is cancelled here

    g = guard(inner(), asyncio.Event())
    seen: list[Any] = []

    async def consume() -> None:
        async with g:
            async for e in g:
                seen.append(e)

    task = asyncio.create_task(consume())
    async with asyncio.timeout(5):
        await pulled.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    assert seen == [CREATED_R1, delta, delta]
    assert (g.lifecycle.state, g.lifecycle.cause) == (State.CANCELLED, Cause.CLIENT_CANCEL)
