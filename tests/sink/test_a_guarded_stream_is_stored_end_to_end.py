"""End to end through guard(..., sink=SqlSink(...)) on real SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from sqlalchemy import text

from eventguard.sink import SqlSink
from eventguard.store import ResponseStore

from .conftest import Target
from .helpers import run_guarded, script


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
