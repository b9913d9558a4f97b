"""A guarded stream recorded by a sink is freed once it is written: neither the recorder nor the
writer leaves it in a reference cycle for the collector (see tests/guard's twin of this test)."""

from __future__ import annotations

import asyncio
import gc

from eventguard import guard
from eventguard.sink import SqlSink
from eventguard.testing.streams import Scripted, terminal

from .conftest import Target

STREAMS = 20


async def test_recorded_streams_that_ended_leave_nothing_for_the_cycle_collector(target: Target) -> None:
    sink = SqlSink(target.url, schema=target.schema, spool_path=target.spool)
    async with asyncio.timeout(30):
        await sink.start()
        try:
            # Warm the sink first (its engine, its statements): what a first write builds stays.
            await _stream(sink, "warm")
            await sink.flush()
            gc.collect()
            gc.disable()
            try:
                for i in range(STREAMS):
                    await _stream(sink, f"r{i}")
                await sink.flush()
                await asyncio.sleep(0)
                found = gc.collect()
            finally:
                gc.enable()
        finally:
            await sink.aclose()
    assert found < STREAMS, f"{found} objects in reference cycles after {STREAMS} recorded streams ended"
    assert sink.stats.events_written == (STREAMS + 1) * 3


async def _stream(sink: SqlSink, rid: str) -> None:
    events = [
        {"type": "response.created", "response": {"id": rid, "status": "in_progress"}},
        {"type": "response.output_text.delta", "delta": "x"},
        terminal(rid=rid),
    ]
    async with guard(Scripted(events), asyncio.Event(), sink=sink) as g:
        async for _ in g:
            pass
