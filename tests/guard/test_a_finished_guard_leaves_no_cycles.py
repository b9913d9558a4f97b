"""A guarded stream that has ended is freed with it: nothing of it waits for the cycle collector.

With a thousand responses in flight, every object a response leaves in a reference cycle survives to
the oldest generation and is freed only by a full collection, which then walks the whole heap; a guard
that leaves no cycle is freed by reference counting the moment its stream ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
from collections.abc import Iterator

import pytest

from eventguard import guard
from eventguard.testing.streams import Scripted, terminal

from .helpers import BOUND, CREATED_R1, drain

STREAMS = 20


@contextlib.contextmanager
def collector_off() -> Iterator[None]:
    was_on = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        if was_on:
            gc.enable()


@pytest.mark.parametrize("cancel_grace", [10.0, None], ids=["watchdog", "no-watchdog"])
async def test_guarded_streams_that_ended_leave_nothing_for_the_cycle_collector(
    cancel_grace: float | None,
) -> None:
    async def one() -> None:
        stream = Scripted([CREATED_R1, {"type": "response.output_text.delta", "delta": "x"}, terminal()])
        await drain(guard(stream, asyncio.Event(), cancel_grace=cancel_grace))

    with collector_off():
        async with asyncio.timeout(BOUND):
            for _ in range(STREAMS):
                await one()
            await asyncio.sleep(0)  # the watchdogs' cancels are delivered
            await asyncio.sleep(0)
        found = gc.collect()
    # One object left in a cycle per stream would be STREAMS; the watchdog's cycle was 21 or more.
    assert found < STREAMS, f"{found} objects in reference cycles after {STREAMS} guarded streams ended"
