"""End to end through guard(..., sink=SqlSink(...)) on real SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import AsyncIterator
from typing import Any

import pytest
from sqlalchemy import text

from eventguard import guard
from eventguard.lifecycle import ResponseInfo
from eventguard.sink import SqlSink
from eventguard.store import ResponseStore

from .conftest import Target
from .helpers import aiter_of, run_guarded, script


@pytest.fixture
async def sink(target: Target) -> AsyncIterator[SqlSink]:
    s = SqlSink(target.url, schema=target.schema, spool_path=target.spool)
    async with asyncio.timeout(30):
        await s.start()
    try:
        yield s
    finally:
        async with asyncio.timeout(30):
            await s.aclose()


@pytest.fixture
async def store(target: Target, sink: SqlSink) -> AsyncIterator[ResponseStore]:
    st = ResponseStore(target.url, schema=target.schema)
    try:
        yield st
    finally:
        await st.aclose()


@pytest.mark.parametrize("final", ["completed", "failed", "incomplete"])
async def test_one_row_with_the_verified_status(sink: SqlSink, store: ResponseStore, final: str) -> None:
    events = script("resp_a", n_deltas=4, final=final)
    seen = await run_guarded(sink, events)
    assert seen == events
    async with asyncio.timeout(10):
        rec = await store.get("resp_a")
        hist = await store.history("resp_a")
    assert rec is not None
    assert rec.status == final
    assert rec.finished_at is not None
    assert rec.event_count == len(events)
    if final != "failed":
        assert (rec.input_tokens, rec.output_tokens, rec.total_tokens) == (3, 5, 8)
    assert hist is not None
    [attempt] = hist.attempts
    assert [e.seq for e in attempt.events] == list(range(len(events)))
    assert [e.type for e in attempt.events] == [e["type"] for e in events]
    assert attempt.events[2].payload == events[2]
    assert [t.to_state for t in attempt.transitions][-1] == final


async def test_view_answers_plain_sql(sink: SqlSink, store: ResponseStore) -> None:
    await run_guarded(sink, script("r1"))
    await run_guarded(sink, script("r2", final="failed"))
    await run_guarded(sink, script("r3", final=None))  # no terminal: the guard decides
    async with asyncio.timeout(10), sink.engine.connect() as conn:
        rows = (
            await conn.execute(
                text(
                    "SELECT status, count(*) FROM eventguard_terminal_states GROUP BY status ORDER BY status"
                )
            )
        ).all()
    statuses: dict[str, int] = {str(k): int(v) for k, v in rows}
    assert statuses["completed"] == 1
    assert statuses["failed"] >= 1
    assert sum(statuses.values()) == 3


async def test_a_guard_dropped_before_its_first_step_leaves_no_row_and_one_stepped_is_there_at_once(
    sqlite_target: Target,
) -> None:
    """A guard built and dropped unstepped (the caller's own check fails in between): nothing ends
    it (no generator, no finaliser), and its row, written at construction, stayed 'new' for good.
    The row is written from the guard's first step instead, before the stream says anything, so a
    run still thinking when its process dies is there for ``recover()``."""
    t = sqlite_target
    release = asyncio.Event()

    async def thinking() -> AsyncIterator[Any]:
        await release.wait()  # the model has not answered yet
        for ev in script("resp_stepped"):
            yield ev

    async with SqlSink(t.url, spool_path=t.spool) as sink, asyncio.timeout(30):
        dropped = guard(
            aiter_of(script("resp_dropped")),
            asyncio.Event(),
            sink=sink,
            info=ResponseInfo(response_id="resp_dropped"),
        )
        del dropped
        gc.collect()
        g = guard(thinking(), asyncio.Event(), sink=sink, info=ResponseInfo(response_id="resp_stepped"))
        step = asyncio.ensure_future(anext(g))
        await asyncio.sleep(0.01)
        await sink.flush()
        async with ResponseStore(t.url) as store:
            assert [(r.response_id, r.status) for r in await store.recent(limit=10)] == [
                ("resp_stepped", "new")
            ]
        release.set()
        await step
        async for _ in g:
            pass
    async with ResponseStore(t.url) as store, asyncio.timeout(30):
        assert [(r.response_id, r.status) for r in await store.recent(limit=10)] == [
            ("resp_stepped", "completed")
        ]
