"""200 concurrent guarded streams of 50 events: every event once, one terminal each, no lock errors."""

from __future__ import annotations

import asyncio
import logging

import pytest
from sqlalchemy import func, select

from eventguard.sink import SqlSink
from eventguard.sql.tables import TERMINAL, events, responses, transitions

from .conftest import Target
from .helpers import aiter_of, script

N_STREAMS = 200
N_EVENTS = 50


async def _one(sink: SqlSink, rid: str) -> int:
    from eventguard import guard

    evs = script(rid, n_deltas=N_EVENTS - 4)  # created, in_progress, deltas, item done, terminal
    assert len(evs) == N_EVENTS
    n = 0
    g = guard(aiter_of(evs, pause=0.0005), asyncio.Event(), sink=sink)
    async with g:
        async for _ in g:
            n += 1
    return n


@pytest.mark.slow
async def test_200_concurrent_streams_are_all_stored_with_no_lock_error(
    target: Target, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    sink = SqlSink(target.url, schema=target.schema, spool_path=target.spool)
    async with asyncio.timeout(120):
        await sink.start()
        ids = [f"resp_{i:03d}" for i in range(N_STREAMS)]
        counts = await asyncio.gather(*(_one(sink, rid) for rid in ids))
        assert counts == [N_EVENTS] * N_STREAMS
        await sink.aclose()

    assert sink.stats.batches_spooled == 0, sink.stats.last_error
    assert not target.spool.exists()
    assert "locked" not in caplog.text
    assert sink.stats.last_error is None

    async with asyncio.timeout(30), sink.engine.connect() as conn:
        n_events = (await conn.execute(select(func.count()).select_from(events))).scalar_one()
        distinct = (
            await conn.execute(
                select(func.count()).select_from(
                    select(events.c.response_id, events.c.attempt, events.c.seq).distinct().subquery()
                )
            )
        ).scalar_one()
        status_rows = await conn.execute(
            select(responses.c.status, func.count()).group_by(responses.c.status)
        )
        statuses: dict[str, int] = {str(k): int(v) for k, v in status_rows.all()}
        terminals = (
            await conn.execute(
                select(transitions.c.response_id, func.count())
                .where(transitions.c.to_state.in_(TERMINAL))
                .group_by(transitions.c.response_id)
            )
        ).all()
    await sink.engine.dispose()
    assert n_events == distinct == N_STREAMS * N_EVENTS
    assert statuses == {"completed": N_STREAMS}
    assert len(terminals) == N_STREAMS
    assert all(k == 1 for _, k in terminals)


@pytest.mark.slow
async def test_several_sinks_share_one_sqlite_file(sqlite_target: Target) -> None:
    # Several writers (as several processes would be) on one file: BEGIN IMMEDIATE + busy_timeout.
    sinks = [SqlSink(sqlite_target.url, spool_path=sqlite_target.spool) for _ in range(4)]
    async with asyncio.timeout(120):
        await sinks[0].start()
        for s in sinks[1:]:
            await s.start()
        await asyncio.gather(*(_one(sinks[i % 4], f"r{i}") for i in range(80)))
        for s in sinks:
            await s.aclose()
    assert sum(s.stats.batches_spooled for s in sinks) == 0
    async with asyncio.timeout(30), sinks[0].engine.connect() as conn:
        assert (await conn.execute(select(func.count()).select_from(events))).scalar_one() == 80 * N_EVENTS
    await sinks[0].engine.dispose()
