"""Regressions from review, on both databases: each was reproduced before its fix."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

from sqlalchemy import text

from eventguard import ResponseStore, SqlSink
from eventguard.lifecycle import Lifecycle, ResponseInfo, State

from .conftest import Target
from .helpers import run_guarded, script


async def test_a_nul_character_neither_blocks_the_write_nor_the_next_response(target: Target) -> None:
    # PostgreSQL's jsonb refuses U+0000; it used to fail the whole write as if the database were away.
    bad = script("resp_nul", n_deltas=1)
    bad[2] = {**bad[2], "delta": "a\x00b"}
    async with asyncio.timeout(30):
        sink = SqlSink(target.url, schema=target.schema, spool_path=target.spool)
        await sink.migrate()
        await run_guarded(sink, bad)
        await run_guarded(sink, script("resp_after", n_deltas=1))
        await sink.flush()
        async with sink.engine.connect() as conn:
            rows = (
                await conn.execute(text("SELECT response_id, status FROM eventguard_responses ORDER BY pk"))
            ).all()
            kinds = (await conn.execute(text("SELECT kind FROM eventguard_anomalies"))).scalars().all()
            payloads = (
                (
                    await conn.execute(
                        text(
                            "SELECT payload FROM eventguard_events WHERE response_id = 'resp_nul' AND seq = 2"
                        )
                    )
                )
                .scalars()
                .all()
            )
        await sink.aclose()
    assert [tuple(r) for r in rows] == [("resp_nul", "completed"), ("resp_after", "completed")]
    assert sink.stats.batches_spooled == 0
    assert "not_serialisable" in kinds
    assert "a\ufffdb" in repr(payloads) or "a\\ufffdb" in repr(payloads)


async def test_an_overlong_event_type_is_cut_with_an_anomaly(target: Target) -> None:
    events = script("resp_long", n_deltas=1)
    events.insert(2, {"type": "x" * 300})
    async with asyncio.timeout(30):
        sink = SqlSink(target.url, schema=target.schema, spool_path=target.spool)
        await sink.migrate()
        await run_guarded(sink, events)
        await sink.flush()
        async with sink.engine.connect() as conn:
            types = (
                (
                    await conn.execute(
                        text("SELECT type FROM eventguard_events WHERE response_id = 'resp_long'")
                    )
                )
                .scalars()
                .all()
            )
            reasons = (await conn.execute(text("SELECT reason FROM eventguard_anomalies"))).scalars().all()
        await sink.aclose()
    assert "x" * 128 in types
    assert any("300 characters" in r for r in reasons)


async def test_replaying_a_dead_writers_spool_does_not_undo_recover(target: Target) -> None:
    async with asyncio.timeout(30):
        sink = SqlSink(target.url, schema=target.schema, spool_path=target.spool)
        await sink.migrate()
        lc = Lifecycle(info=ResponseInfo(response_id="resp_dead"))
        rec = sink.recorder(lc)
        lc.transition(State.IN_PROGRESS, reason="response.in_progress")
        rec.changed()
        rec.event(0, "response.created", {"type": "response.created"})
        await sink.flush()
        # Later work of that writer went to the spool (the database was away), then it died.
        rec.event(1, "response.output_text.delta", {"type": "response.output_text.delta", "delta": "x"})
        rec.changed()
        batch: Any = rec.collect()
        rec.encode_some(batch)  # serialised before it is spooled (a batch is plain data)
        sink.spool.append([batch])
        store = ResponseStore(target.url, schema=target.schema)
        await asyncio.sleep(0.01)
        assert await store.recover(older_than=timedelta(0)) == ["resp_dead"]
        await sink.replay_spool()
        record = await store.get("resp_dead")
        history = await store.history("resp_dead")
        await store.aclose()
        await sink.aclose()
    assert record is not None
    assert record.status == "interrupted"
    assert history is not None
    assert len(history.attempts[0].events) == 2  # the replayed events are kept all the same
