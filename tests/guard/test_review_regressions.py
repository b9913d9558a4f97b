"""Regressions from review: each case was reproduced against the guard before its fix."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from eventguard import State, guard
from eventguard.testing.streams import Scripted, block_ignoring_signal, host_context, stream_events

CREATED = {"type": "response.created", "response": {"id": "r1", "status": "in_progress"}}


async def test_outside_cancel_in_the_same_turn_as_the_watchdog_is_not_swallowed() -> None:
    async def inner() -> Any:
        yield CREATED
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


async def test_aclose_from_another_task_mid_step_is_refused_and_changes_nothing() -> None:
    inner = Scripted(stream_events(1), before={2: lambda: asyncio.sleep(0.1)})
    g = guard(inner, asyncio.Event(), context=host_context())
    out: list[Any] = []

    async def consume() -> None:
        async for e in g:
            out.append(e)

    task = asyncio.create_task(consume())
    await asyncio.sleep(0.05)  # the consumer is inside the inner stream's await
    with pytest.raises(RuntimeError, match="another task"):
        await g.aclose()
    assert inner.closes == 0
    async with asyncio.timeout(5):
        await task
    assert out[-1]["type"] == "response.completed"
    assert g.lifecycle.state is State.COMPLETED
    assert inner.closes == 1


async def test_inner_that_swallows_the_cancel_and_waits_again_is_recorded_and_cancel_count_restored() -> None:
    release = asyncio.Event()

    async def inner() -> Any:
        yield CREATED
        while not release.is_set():
            try:
                await release.wait()
            except asyncio.CancelledError:
                continue  # a retry loop that swallows every cancel

    signal = asyncio.Event()
    g = guard(inner(), signal, cancel_grace=0.05)

    async def consume() -> None:
        async for _ in g:
            pass

    task = asyncio.create_task(consume())
    await asyncio.sleep(0.02)
    signal.set()
    done, _ = await asyncio.wait([task], timeout=0.5)
    assert not done  # the consumer stays blocked: that cannot be helped without a task per pull
    assert g.lifecycle.state is State.CANCELLED  # but the ending is recorded
    assert [a.kind for a in g.lifecycle.anomalies] == ["stuck"]
    assert task.cancelling() == 0  # and the task's cancel count is given back
    release.set()
    async with asyncio.timeout(5):
        await task


async def test_cancel_thrown_into_the_async_with_body_is_a_cancel() -> None:
    # A foreground disconnect with store=false throws CancelledError into the host's handler at
    # its yield: the guard's async with exits with it, and records a cancel, not a walk-away.
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
