"""After the guard records its own ending (``abandoned``: the host stopped iterating past
``cancel_grace`` after a cancel), a consumer that resumes gets the terminal it is owed. That event
is stored, and the row's ``event_count`` counts it: before, the row was terminal already and the
upsert took no change at all, so the count stayed one short of the stored events."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from eventguard import guard
from eventguard.sink import SqlSink
from eventguard.store import ResponseStore

from .conftest import Target
from .helpers import script


async def test_the_terminal_owed_after_an_abandoned_ending_is_counted_in_the_row(target: Target) -> None:
    rid = "resp_owed"
    signal = asyncio.Event()

    async def slow() -> AsyncIterator[Any]:
        for ev in script(rid, n_deltas=20):
            await asyncio.sleep(0.01)
            yield ev

    sink = SqlSink(target.url, schema=target.schema, spool_path=target.spool)
    await sink.start()
    seen: list[str] = []
    try:
        async with asyncio.timeout(30):
            g = guard(slow(), signal, sink=sink, cancel_grace=0.05, on_cancel="emit")
            async with g:
                async for ev in g:
                    seen.append(ev["type"])
                    if len(seen) == 3:
                        signal.set()  # the client cancels, and the host stalls past cancel_grace
                        await asyncio.sleep(0.5)
    finally:
        await sink.aclose()
    assert seen[-1] == "response.failed" and len(seen) == 4, seen
    async with ResponseStore(target.url, schema=target.schema) as store, asyncio.timeout(30):
        record = await store.get(rid)
        history = await store.history(rid)
    assert record is not None and history is not None
    assert (record.status, record.cause) == ("cancelled", "client_cancel")
    stored = sum(len(a.events) for a in history.attempts)
    assert (record.event_count, stored) == (4, 4)


async def test_a_terminal_row_takes_only_a_higher_count_at_the_same_state_and_status(target: Target) -> None:
    """The one change a terminal row takes (the count of its own stream at the same state) must not
    be a way back: a row of the same owner, attempt, stream and state but another status (a
    replica's reaper that ended the run under the sink's own owner name, while the stream lives on)
    stays as it is."""
    import copy

    from sqlalchemy import select

    from eventguard.sink.apply import write
    from eventguard.sql.tables import responses

    from .test_spool_format import make_batch

    ended = make_batch("resp_ended_row")  # failed, state_seq 3, event_count 3
    ended.stream_id = "stream_ended_row"
    live = copy.deepcopy(ended)
    live.events, live.transitions, live.anomalies, live.refusal_idx = [], [], [], None
    live.row.update(status="in_progress", cause=None, finished_at=None, event_count=7)
    live.terminal = False
    counted = copy.deepcopy(live)
    counted.row.update(status="failed", cause="error", finished_at=ended.row["finished_at"], event_count=4)
    counted.terminal = True
    sink = SqlSink(target.url, schema=target.schema, spool_path=target.spool)
    await sink.start()
    r = responses.c
    try:
        async with asyncio.timeout(30):
            rows = []
            for batch in (ended, live, counted):
                async with sink.engine.begin() as conn:
                    await write(conn, [batch])
                async with sink.engine.connect() as conn:
                    query = select(r.status, r.finished_at, r.event_count)
                    row = (await conn.execute(query.where(r.response_id == batch.response_id))).one()
                rows.append((row.status, row.finished_at is not None, row.event_count))
    finally:
        await sink.aclose()
    assert rows == [("failed", True, 3), ("failed", True, 3), ("failed", True, 4)]
