"""PostgreSQL: a write cancelled while it is on the wire (the direct path, straight on the pool's
asyncpg connection: :mod:`eventguard.sink.direct`) loses nothing, and leaves no connection in the
pool that the next write would fail on.

The write is held in flight by a lock another session takes on the responses table, so the
cancellation lands while the statement waits on the server, not before or after it. Who is
cancelled: the writer task itself (as ``asyncio.run()`` cancels every task when the loop ends
early), or the task that called ``sink.flush()`` (a request handler whose client went away).
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest

from eventguard.lifecycle import Lifecycle, ResponseInfo, State
from eventguard.sink import SqlSink
from tests._postgres import PG_DSN, execute

from .conftest import Target
from .helpers import delta, run_guarded, script

pytestmark = pytest.mark.postgres

N_DELTAS = 10


async def _stored(schema: str, rid: str) -> tuple[int, str | None]:
    events = await execute(f'SELECT count(*) FROM "{schema}".eventguard_events WHERE response_id = $1', rid)
    row = await execute(f'SELECT status FROM "{schema}".eventguard_responses WHERE response_id = $1', rid)
    return int(events[0][0]), (row[0][0] if row else None)


async def _waiting_on_a_lock(application_name: str) -> None:
    """Return once a backend of ``application_name`` waits on a lock (the caller bounds it)."""
    query = "SELECT 1 FROM pg_stat_activity WHERE application_name = $1 AND wait_event_type = 'Lock'"
    while True:
        if await execute(query, application_name):
            return
        await asyncio.sleep(0.02)


async def _every_pooled_connection_answers(sink: SqlSink) -> int:
    """Check out every connection the pool holds at once (so each is a different one) and run a
    query on its asyncpg connection; how many there were."""
    engine = sink.engine
    held = [await engine.connect() for _ in range(engine.pool.checkedin())]  # type: ignore[attr-defined]
    try:
        for conn in held:
            driver: Any = (await conn.get_raw_connection()).driver_connection
            assert not driver.is_closed()
            assert not driver.is_in_transaction()
            assert await driver.fetchval("SELECT 1") == 1
    finally:
        for conn in held:
            await conn.close()
    return len(held)


@pytest.mark.parametrize("cancelled", ["the writer task", "a flush's caller"])
async def test_a_write_cancelled_in_flight_loses_nothing_and_the_next_write_succeeds(
    pg_target: Target, cancelled: str
) -> None:
    import asyncpg  # type: ignore[import-untyped]

    schema = pg_target.schema
    assert schema is not None
    owner = f"cancelled-write-{uuid.uuid4().hex[:12]}"
    # No timer wakes the writer: only the response's end (or the flush) writes.
    sink = SqlSink(pg_target.url, schema=schema, spool_path=pg_target.spool, owner=owner, flush_interval=3600)
    async with asyncio.timeout(120):
        await sink.start()
        locker = await asyncpg.connect(PG_DSN)
        try:
            await run_guarded(sink, script("resp_warm", N_DELTAS))  # the pool holds a used connection
            lc = Lifecycle(info=ResponseInfo(response_id="resp_cut"))
            rec = sink.recorder(lc)
            lc.transition(State.IN_PROGRESS)
            rec.changed()
            for i in range(N_DELTAS):
                rec.event(i, "response.output_text.delta", delta(i))
            tx = locker.transaction()
            await tx.start()
            await locker.execute(f'LOCK TABLE "{schema}".eventguard_responses IN EXCLUSIVE MODE')
            if cancelled == "the writer task":
                writer = sink.writer.loops.here().task
                assert writer is not None
                lc.transition(State.COMPLETED)
                rec.changed()  # the end of the response wakes the writer at once
                closing = asyncio.create_task(rec.close())
                await _waiting_on_a_lock(f"eventguard {owner}")
                writer.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await writer
                await closing  # what was in flight is in the spool: the close is not left waiting
            else:
                flushing = asyncio.create_task(sink.flush())
                await _waiting_on_a_lock(f"eventguard {owner}")
                flushing.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await flushing
            spooled = sink.stats.batches_spooled
            assert spooled >= 1, "the write in flight was kept in the spool"
            await tx.rollback()

            # No connection in the pool is left broken (inside a transaction, closed, busy).
            await _every_pooled_connection_answers(sink)
            # The next writes go straight in, on whatever connection the pool gives them.
            if cancelled == "a flush's caller":
                lc.transition(State.COMPLETED)
                rec.changed()
                await rec.close()
            await run_guarded(sink, script("resp_next", N_DELTAS))
            await sink.flush()
            assert sink.stats.batches_spooled == spooled, "a write after the cancelled one was spooled"
            assert await _stored(schema, "resp_next") == (len(script("x", N_DELTAS)), "completed")
            # And the spooled write is replayed: nothing of the cut response is lost.
            result = await sink.replay_spool()
            assert not sink.spool.pending(), result
        finally:
            await locker.close()
            await sink.aclose()
    assert await _stored(schema, "resp_cut") == (N_DELTAS, "completed")
