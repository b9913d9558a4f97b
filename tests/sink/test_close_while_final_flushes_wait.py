"""A recorder whose final flush outlives ``close_timeout`` while the sink closes is written, not spooled.

Under load (a thousand streams closing at once) a guard's final flush goes on in the background
after ``close_timeout``; its recorder keeps waiting while the writer lives. ``aclose()`` detaches
the writer task before its own final flush: the waiting recorders took that for "the writer is
gone" and moved their batches to the spool (the flaky
``test_1000_concurrent_streams_store_everything_directly`` under load). A close under way on the
loop counts as a writer: its final flush takes their work.
"""

from __future__ import annotations

import asyncio
from typing import Any

from sqlalchemy import func, select

from eventguard.lifecycle import Lifecycle, ResponseInfo, State
from eventguard.sink import SqlSink
from eventguard.sql.tables import events

from .conftest import Target
from .helpers import delta


def make_sink(target: Target, **kw: Any) -> SqlSink:
    return SqlSink(target.url, schema=target.schema, spool_path=target.spool, **kw)


async def test_a_final_flush_still_waiting_when_the_sink_closes_is_written_not_spooled(
    target: Target,
) -> None:
    sink = make_sink(target, close_timeout=0.05)
    async with asyncio.timeout(60):
        await sink.start()
        lock = sink.writer.loops.here().lock
        await lock.acquire()  # the writer is busy: every write waits
        lc = Lifecycle(info=ResponseInfo(response_id="resp_waiting"))
        rec = sink.recorder(lc)
        lc.transition(State.IN_PROGRESS)
        for i in range(3):
            rec.event(i, "response.output_text.delta", delta(i))
        lc.transition(State.COMPLETED)
        rec.changed()
        closing = asyncio.create_task(rec.close())
        await asyncio.sleep(0.2)  # past close_timeout: the recorder waits on, the writer alive
        assert not closing.done()
        aclose = asyncio.create_task(sink.aclose())
        await asyncio.sleep(0.2)  # the close is under way, its writer detached; the recorder looks again
        lock.release()
        await aclose
        await closing
        async with sink.engine.connect() as conn:
            stmt = select(func.count()).select_from(events).where(events.c.response_id == "resp_waiting")
            stored = int((await conn.execute(stmt)).scalar_one())
        await sink.engine.dispose()
    assert sink.stats.batches_spooled == 0
    assert stored == 3
