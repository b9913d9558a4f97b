"""``SqlSink.flush()`` returns only once everything recorded before it is written, even when the
writer task took that work first and its transaction is still waiting for the database.

Before the fix, a flush that found nothing left to take returned at once: the events the writer
task was writing were not in the database yet (nor, for a reader, anywhere), and a caller that
read them back after ``flush()`` found them missing.
"""

from __future__ import annotations

import asyncio

from eventguard.sink import SqlSink

from .conftest import Target
from .helpers import database_busy, delta, stored_events, stored_in_progress, until_in_flight

_EVENTS = 50


async def test_flush_waits_for_the_transaction_the_writer_task_already_started(target: Target) -> None:
    sink = SqlSink(target.url, schema=target.schema, spool_path=target.spool, flush_interval=0.01)
    async with asyncio.timeout(60):
        await sink.start()
        try:
            _lc, rec = await stored_in_progress(sink, "resp_flush")
            async with database_busy(target):
                for i in range(_EVENTS):
                    rec.event(i, "response.output_text.delta", delta(i))
                # The writer task takes the events within flush_interval; its write then waits.
                await until_in_flight(rec)
                flushing = asyncio.ensure_future(sink.flush())
                # A flush that does not wait for that write is done long before 0.3 s.
                await asyncio.wait({flushing}, timeout=0.3)
                assert not flushing.done(), "flush() returned while the writer's write was still waiting"
            await flushing
            # Read at once: whatever flush() said is written must be there.
            assert await stored_events(sink, "resp_flush") == _EVENTS
            assert sink.stats.batches_spooled == 0
            await rec.close()
        finally:
            await sink.aclose()


async def test_events_of_a_stream_that_pauses_are_written_within_flush_interval(target: Target) -> None:
    # Fewer events than flush_every and no lifecycle change after them (a stream waiting on a tool
    # call): the idle writer is woken within flush_interval all the same. Before the fix it slept
    # with no timeout and the events stayed in memory until the stream's next change.
    sink = SqlSink(target.url, schema=target.schema, spool_path=target.spool, flush_interval=0.01)
    async with asyncio.timeout(60):
        await sink.start()
        try:
            _lc, rec = await stored_in_progress(sink, "resp_paused")
            await asyncio.sleep(0.2)  # the change's own wake-up has come and gone: the writer is idle
            for i in range(10):
                rec.event(i, "response.output_text.delta", delta(i))
            loop = asyncio.get_running_loop()
            give_up = loop.time() + 5.0  # 500 flush intervals
            while (stored := await stored_events(sink, "resp_paused")) < 10 and loop.time() < give_up:  # noqa: ASYNC110 - the database
                await asyncio.sleep(0.01)
            assert stored == 10, "the events waited for the stream's next change"
            await rec.close()
        finally:
            await sink.aclose()
