"""A short response's lifecycle changes are written together, not one transaction each (issue 13).

A change that does not end the response (created, ``in_progress``, an anomaly) wakes the writer
within ``flush_interval``, not at once; the end of the response (a terminal, an interruption) and
its close wake it at once. So a response shorter than ``flush_interval`` costs one transaction,
and every response ending in the same turn shares it.
"""

from __future__ import annotations

import asyncio
from typing import Any

from eventguard.lifecycle import Lifecycle, ResponseInfo, State
from eventguard.sink import SqlSink

from .conftest import Target
from .helpers import run_guarded, script, stored_events


def make_sink(target: Target, **kw: Any) -> SqlSink:
    return SqlSink(target.url, schema=target.schema, spool_path=target.spool, **kw)


async def _batches_for(sink: SqlSink, rid: str) -> int:
    before = sink.stats.batches_written
    await run_guarded(sink, script(rid, n_deltas=5))
    return sink.stats.batches_written - before


async def test_a_short_response_is_one_transaction_with_its_creation_events_and_end(target: Target) -> None:
    # flush_interval far away: only the end of the response may wake the writer.
    sink = make_sink(target, flush_interval=3600)
    async with asyncio.timeout(60):
        await sink.start()
        await _batches_for(sink, "resp_warm")
        batches = await _batches_for(sink, "resp_short")
        stored = await stored_events(sink, "resp_short")
        await sink.aclose()
    assert batches == 1
    assert stored == len(script("x", n_deltas=5))


async def test_a_response_still_streaming_is_written_within_flush_interval(target: Target) -> None:
    # The in_progress row is not held back until the end: the change's wake-up comes later, not never.
    sink = make_sink(target, flush_interval=0.01)
    async with asyncio.timeout(60):
        await sink.start()
        lc = Lifecycle(info=ResponseInfo(response_id="resp_streaming"))
        rec = sink.recorder(lc)
        lc.transition(State.IN_PROGRESS)
        rec.changed()
        written = asyncio.Event()
        poll = asyncio.get_running_loop().call_later

        def look() -> None:  # bounded by the timeout above
            if sink.stats.batches_written:
                written.set()
            else:
                poll(0.005, look)

        look()
        await written.wait()
        lc.transition(State.COMPLETED)
        rec.changed()
        await rec.close()
        await sink.aclose()
    assert sink.stats.batches_written == 2
