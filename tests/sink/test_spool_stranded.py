"""What is spooled is replayed without a restart: after a background replay an outage stopped, and
after an overflow spill (no outage at all). On SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
import sqlite3
from typing import Any

from sqlalchemy import func, select

from eventguard.lifecycle import Lifecycle, ResponseInfo, State
from eventguard.sink import SqlSink
from eventguard.sink import sink as sinkmod
from eventguard.sink.batch import Batch
from eventguard.sink.tables import events, responses

from .conftest import Target
from .helpers import delta, run_guarded, script


def make_sink(target: Target, **kw: Any) -> SqlSink:
    return SqlSink(target.url, schema=target.schema, spool_path=target.spool, **kw)


async def stored(sink: SqlSink, rid: str) -> tuple[str | None, int]:
    async with sink.engine.connect() as conn:
        status = (
            await conn.execute(select(responses.c.status).where(responses.c.response_id == rid))
        ).scalar()
        n = (
            await conn.execute(select(func.count()).select_from(events).where(events.c.response_id == rid))
        ).scalar_one()
    return status, int(n)


async def until(check: Any, seconds: float = 15.0) -> None:
    async with asyncio.timeout(seconds):
        while not await check():  # noqa: ASYNC110  # polling the database, not an event
            await asyncio.sleep(0.02)


async def test_a_replay_an_outage_stopped_goes_on_when_writes_succeed_again(target: Target) -> None:
    async with asyncio.timeout(60):
        sink = make_sink(target, flush_interval=0.01)
        await sink.start()
        persist = sink._persist

        async def spool_all(batches: list[Batch]) -> None:
            sink._to_spool(batches, None)  # as an overflow, or an outage, would leave them

        sink._persist = spool_all  # type: ignore[method-assign]
        await run_guarded(sink, script("resp_spooled", n_deltas=3))
        sink._persist = persist  # type: ignore[method-assign]
        assert sink.spool.pending()

        apply = sink._apply
        calls = 0

        async def locked_once(batches: list[Batch], tally: Any) -> None:
            nonlocal calls
            calls += 1
            if calls == 1:  # the background replay meets an outage-class error
                raise sinkmod._Stopped(sqlite3.OperationalError("database is locked"), list(batches))
            await apply(batches, tally)

        sink._apply = locked_once  # type: ignore[method-assign]
        sink._replay_soon()
        st = sink._live
        assert st is not None and st.replay is not None
        await asyncio.wait([st.replay])
        assert sink.spool.pending()

        async def replayed() -> bool:
            await run_guarded(sink, script("resp_live", n_deltas=1))  # live writes go on
            return await stored(sink, "resp_spooled") == ("completed", 7)

        await until(replayed)
        await until(lambda: _false(sink.spool.pending()))
        await sink.aclose()


async def _false(value: bool) -> bool:
    return not value


async def test_an_overflow_spill_is_replayed_without_a_restart(target: Target) -> None:
    async with asyncio.timeout(60):
        sink = make_sink(target, max_buffered=50, flush_every=10, flush_interval=0.01)
        await sink.start()
        lc = Lifecycle(info=ResponseInfo(response_id="resp_full"))
        rec = sink.recorder(lc)
        lc.transition(State.IN_PROGRESS)
        rec.changed()
        for i in range(500):  # no await in between: the writer cannot keep up
            rec.event(i, "response.output_text.delta", delta(i))
        assert sink.stats.overflows > 0 and sink.spool.pending()
        lc.transition(State.COMPLETED)
        rec.changed()
        await rec.close()

        async def loaded() -> bool:
            return await stored(sink, "resp_full") == ("completed", 500)

        await until(loaded)  # nobody called replay_spool()
        await until(lambda: _false(sink.spool.pending()))
        await sink.aclose()
