"""``SqlSink.flush()`` returns only once everything recorded before it is written, even when the
writer task took that work first and its transaction is still waiting for the database.

Before the fix, a flush that found nothing left to take returned at once: the events the writer
task was writing were not in the database yet (nor, for a reader, anywhere), and a caller that
read them back after ``flush()`` found them missing.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from sqlalchemy import func, select

from eventguard.sink import SqlSink
from eventguard.sql.tables import events
from tests._postgres import PG_DSN

from .conftest import Target
from .helpers import delta, stored_in_progress

_EVENTS = 50


@asynccontextmanager
async def _database_busy(target: Target) -> AsyncIterator[None]:
    """Another client holds a lock that makes the sink's next write wait, until the block ends."""
    if target.kind == "sqlite":
        path = Path(target.url.removeprefix("sqlite+aiosqlite:///"))
        conn = sqlite3.connect(path, isolation_level=None)
        try:
            conn.execute("BEGIN IMMEDIATE")  # the one write lock: the writer's BEGIN waits for it
            yield
            conn.execute("COMMIT")
        finally:
            conn.close()
        return
    import asyncpg  # type: ignore[import-untyped]  # the postgres extra

    pg = await asyncpg.connect(PG_DSN)
    try:
        tr = pg.transaction()
        await tr.start()
        # EXCLUSIVE lets readers read and makes every INSERT into the table wait.
        await pg.execute(f'LOCK TABLE "{target.schema}".{events.name} IN EXCLUSIVE MODE')
        yield
        await tr.commit()
    finally:
        await pg.close()


async def _stored(sink: SqlSink, rid: str) -> int:
    async with sink.engine.connect() as conn:
        stmt = select(func.count()).select_from(events).where(events.c.response_id == rid)
        return int((await conn.execute(stmt)).scalar_one())


async def test_flush_waits_for_the_transaction_the_writer_task_already_started(target: Target) -> None:
    sink = SqlSink(target.url, schema=target.schema, spool_path=target.spool, flush_interval=0.01)
    async with asyncio.timeout(60):
        await sink.start()
        try:
            _lc, rec = await stored_in_progress(sink, "resp_flush")
            async with _database_busy(target):
                for i in range(_EVENTS):
                    rec.event(i, "response.output_text.delta", delta(i))
                # The writer task takes the events within flush_interval; its write then waits.
                loop = asyncio.get_running_loop()
                give_up = loop.time() + 5.0
                while not rec.inflight and loop.time() < give_up:  # noqa: ASYNC110 - the writer task's state
                    await asyncio.sleep(0.005)
                assert rec.inflight, "the writer task never took the events"
                flushing = asyncio.ensure_future(sink.flush())
                # A flush that does not wait for that write is done long before 0.3 s.
                await asyncio.wait({flushing}, timeout=0.3)
                assert not flushing.done(), "flush() returned while the writer's write was still waiting"
            await flushing
            # Read at once: whatever flush() said is written must be there.
            assert await _stored(sink, "resp_flush") == _EVENTS
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
            while (stored := await _stored(sink, "resp_paused")) < 10 and loop.time() < give_up:  # noqa: ASYNC110 - the database
                await asyncio.sleep(0.01)
            assert stored == 10, "the events waited for the stream's next change"
            await rec.close()
        finally:
            await sink.aclose()
