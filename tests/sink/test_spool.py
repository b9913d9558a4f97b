"""The database goes away mid-stream: the stream carries on, the spool keeps everything, replay
restores it exactly once."""

from __future__ import annotations

import asyncio
import logging
import sqlite3
from collections.abc import AsyncIterator, Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import asyncpg  # type: ignore[import-untyped]
import orjson
import pytest
from sqlalchemy import func, select

from eventguard import ResponseStore, guard
from eventguard.lifecycle import Lifecycle, ResponseInfo, State
from eventguard.sink import SqlSink
from eventguard.sink.spool import Spool
from eventguard.sql.tables import events, responses
from tests._postgres import PG_DSN, PG_URL

from .conftest import Overflowing, Target
from .helpers import script


async def _hooked(evs: list[Any], hooks: dict[int, Callable[[], Any]]) -> AsyncIterator[Any]:
    for i, ev in enumerate(evs):
        hook = hooks.get(i)
        if hook is not None:
            result = hook()
            if asyncio.iscoroutine(result):
                await result
        await asyncio.sleep(0.001)
        yield ev


async def _drive(sink: SqlSink, evs: list[Any], hooks: dict[int, Callable[[], Any]]) -> list[Any]:
    seen: list[Any] = []
    g = guard(_hooked(evs, hooks), asyncio.Event(), sink=sink)
    async with g:
        async for ev in g:
            seen.append(ev)
    return seen


async def _counts(sink: SqlSink, rid: str) -> tuple[int, int, str | None]:
    async with sink.engine.connect() as conn:
        total = (
            await conn.execute(select(func.count()).select_from(events).where(events.c.response_id == rid))
        ).scalar_one()
        distinct = (
            await conn.execute(
                select(func.count(func.distinct(events.c.seq))).where(events.c.response_id == rid)
            )
        ).scalar_one()
        status = (
            await conn.execute(select(responses.c.status).where(responses.c.response_id == rid))
        ).scalar()
    return total, distinct, status


async def test_unreachable_database_spools_and_replay_restores(
    target: Target, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR, logger="eventguard.sink")
    if target.kind == "sqlite":
        blocker = tmp_path / "not-a-dir"
        blocker.write_text("x")
        bad_url = f"sqlite+aiosqlite:///{blocker / 'eg.db'}"
    else:
        bad_url = "postgresql+asyncpg://postgres:s3cret@127.0.0.1:1/test"
    evs = script("resp_spool", n_deltas=30)
    async with asyncio.timeout(60):
        down = SqlSink(bad_url, schema=target.schema, spool_path=target.spool, connect_timeout=2)
        seen = await _drive(down, evs, {})
        assert seen == evs  # the client never noticed
        seen2 = await _drive(down, script("resp_spool2", n_deltas=3), {})
        assert len(seen2) == 7
        await down.aclose()
    assert target.spool.exists()
    assert down.stats.batches_spooled >= 2
    errors = [r for r in caplog.records if "cannot write" in r.getMessage()]
    assert len(errors) == 1, "the outage is logged once"
    assert "s3cret" not in caplog.text

    up = SqlSink(target.url, schema=target.schema, spool_path=target.spool)
    async with asyncio.timeout(60):
        await up.start()
        result = await up.replay_spool()
        assert result.events == len(evs) + 7
        assert not target.spool.exists()
        again = await up.replay_spool()  # nothing left: harmless
        assert again.batches == 0
        assert await _counts(up, "resp_spool") == (len(evs), len(evs), "completed")
        assert await _counts(up, "resp_spool2") == (7, 7, "completed")
        await up.aclose()


async def test_replaying_twice_is_harmless(target: Target) -> None:
    evs = script("resp_twice", n_deltas=10)
    async with asyncio.timeout(60):
        sink = SqlSink(target.url, schema=target.schema, spool_path=target.spool)
        await sink.start()
        await _drive(sink, evs, {})
        await sink.flush()
        # Spool the very same batches again, as a timed-out close would, then replay them twice.
        rec_batches = []
        from eventguard.lifecycle import Lifecycle, ResponseInfo

        lc = Lifecycle(info=ResponseInfo(response_id="resp_twice"))
        from eventguard.sink.recorder import SqlRecorder

        rec = SqlRecorder(sink.writer, lc)
        for i, ev in enumerate(evs):
            rec.event(i, ev["type"], ev)
        batch = rec.collect()
        assert batch is not None
        rec.encode_some(batch)  # serialised before it is spooled (a batch is plain data)
        rec_batches.append(batch)
        sink.spool.append(rec_batches)
        sink.spool.append(rec_batches)
        await sink.replay_spool()
        assert await _counts(sink, "resp_twice") == (len(evs), len(evs), "completed")
        await sink.aclose()


async def test_sqlite_locked_past_the_timeout(sqlite_target: Target) -> None:
    db_path = sqlite_target.url.split("///", 1)[1]
    holder: list[sqlite3.Connection] = []

    def take_lock() -> None:
        conn = sqlite3.connect(db_path, isolation_level=None, timeout=10, check_same_thread=False)
        conn.execute("BEGIN EXCLUSIVE")
        holder.append(conn)

    def lock() -> Any:
        # Off the event loop: the sink's writer may be mid-transaction and needs the loop to commit;
        # waiting for the lock on the loop itself would deadlock until sqlite gives up.
        return asyncio.to_thread(take_lock)

    def unlock() -> None:
        holder[0].execute("COMMIT")
        holder[0].close()

    evs = script("resp_locked", n_deltas=40)
    async with asyncio.timeout(60):
        sink = SqlSink(
            sqlite_target.url, spool_path=sqlite_target.spool, busy_timeout=0.2, flush_interval=0.01
        )
        await sink.start()
        seen = await _drive(sink, evs, {10: lock})
        assert seen == evs
        unlock()
        assert sink.stats.batches_spooled >= 1
        assert "locked" in (sink.stats.last_error or "")
        await sink.replay_spool()
        assert await _counts(sink, "resp_locked") == (len(evs), len(evs), "completed")
        await sink.aclose()


@pytest.mark.postgres
async def test_postgres_connection_killed_mid_stream(pg_target: Target) -> None:
    sink = SqlSink(pg_target.url, schema=pg_target.schema, spool_path=pg_target.spool, flush_every=5)

    async def kill() -> None:
        conn = await asyncpg.connect(PG_DSN)
        try:
            await conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = $1",
                f"eventguard {sink.owner}"[:63],
            )
        finally:
            await conn.close()

    evs = script("resp_killed", n_deltas=60)
    async with asyncio.timeout(60):
        await sink.start()
        seen = await _drive(sink, evs, {10: kill, 25: kill, 40: kill})
        assert seen == evs
        await sink.flush()
        await sink.replay_spool()
        assert await _counts(sink, "resp_killed") == (len(evs), len(evs), "completed")
        await sink.aclose()


@pytest.mark.postgres
async def test_postgres_stuck_write_spools_at_statement_timeout(pg_target: Target) -> None:
    sink = SqlSink(pg_target.url, schema=pg_target.schema, spool_path=pg_target.spool, statement_timeout=0.5)
    evs = script("resp_stuck", n_deltas=8)
    async with asyncio.timeout(60):
        await sink.start()
        blocker = await asyncpg.connect(PG_DSN, server_settings={"search_path": pg_target.schema or "public"})
        tx = blocker.transaction()
        await tx.start()
        await blocker.execute("LOCK TABLE eventguard_events IN ACCESS EXCLUSIVE MODE")
        seen = await _drive(sink, evs, {})
        assert seen == evs
        assert pg_target.spool.exists()  # the stuck write failed at statement_timeout: kept locally
        await tx.rollback()
        await blocker.close()
        await sink.flush()
        await sink.replay_spool()
        assert await _counts(sink, "resp_stuck") == (len(evs), len(evs), "completed")
        await sink.aclose()
    assert PG_URL


async def test_full_buffer_spills_to_the_spool(sqlite_target: Target, overflow: Overflowing) -> None:
    sink = SqlSink(sqlite_target.url, spool_path=sqlite_target.spool, max_buffered=50, flush_every=10)
    async with asyncio.timeout(30):
        await sink.start()
        full = overflow(sink, "resp_full", 500)
        assert sink.stats.overflows > 0
        assert sqlite_target.spool.exists()
        await full.complete()
        await sink.replay_spool()
        assert await _counts(sink, "resp_full") == (500, 500, "completed")
        await sink.aclose()


def _down_url(target: Target, tmp_path: Path) -> str:
    if target.kind == "sqlite":
        blocker = tmp_path / "not-a-dir"
        blocker.touch()
        return f"sqlite+aiosqlite:///{blocker / 'eg.db'}"
    return "postgresql+asyncpg://postgres@127.0.0.1:1/test"


async def test_a_torn_spool_line_takes_no_batch_with_it(target: Target, tmp_path: Path) -> None:
    # Issue 11, defect 3: a crash leaves half a line; the restarted sink appends its next batch
    # after it. Both the batches before and the one after replay; the fragment is a bad record.
    async with asyncio.timeout(60):
        first = SqlSink(_down_url(target, tmp_path), schema=target.schema, spool_path=target.spool)
        await _drive(first, script("resp_before", n_deltas=3), {})
        await first.aclose()
        with target.spool.open("ab") as fh:
            fh.write(b'EG1 900 0badc0de {"response_id": "resp_cut", "att')  # the process died here
        again = SqlSink(_down_url(target, tmp_path), schema=target.schema, spool_path=target.spool)
        await _drive(again, script("resp_after", n_deltas=3), {})
        await again.aclose()

        up = SqlSink(target.url, schema=target.schema, spool_path=target.spool)
        await up.start()
        result = await up.replay_spool()
        assert result.bad_lines == 1
        assert await _counts(up, "resp_before") == (7, 7, "completed")
        assert await _counts(up, "resp_after") == (7, 7, "completed")
        await up.aclose()
    assert not list(target.spool.parent.glob("*.replaying-*"))


async def test_an_entry_of_the_wrong_shape_does_not_stop_the_replay(target: Target) -> None:
    # Issue 11, defect 3: valid JSON of the wrong shape ("row": null) made replay raise
    # AttributeError, which left the whole file behind as .replaying-*.
    from .test_spool_format import framed, make_batch

    good = [make_batch("resp_shape_1"), make_batch("resp_shape_2")]
    wrong = orjson.loads(good[0].to_json())
    wrong["row"] = None
    spool = Spool(target.spool)
    spool.append([good[0]])
    with target.spool.open("ab") as fh:
        fh.write(framed(orjson.dumps(wrong)) + orjson.dumps({**wrong, "response_id": "v0"}) + b"\n")
    spool.append([good[1]])
    async with asyncio.timeout(60):
        sink = SqlSink(target.url, schema=target.schema, spool_path=target.spool)
        await sink.start()
        result = await sink.replay_spool()
        assert (result.batches, result.bad_lines) == (2, 2)
        for rid in ("resp_shape_1", "resp_shape_2"):
            assert await _counts(sink, rid) == (3, 3, "failed")
        await sink.aclose()
    assert not sink.spool.pending()


async def test_a_lone_surrogate_is_spooled_not_lost(
    sqlite_target: Target, caplog: pytest.LogCaptureFixture
) -> None:
    # Issue 11, defect 2: a lone surrogate anywhere in a batch made to_json raise, and the sink,
    # which only expects OSError from the spool, lost the batch.
    from .test_spool_format import make_batch

    caplog.set_level(logging.ERROR, logger="eventguard.sink")
    batch = make_batch("resp_\udcff", text="undecodable \udcff byte")
    sink = SqlSink(sqlite_target.url, spool_path=sqlite_target.spool)
    sink.writer.to_spool([batch], None)
    assert sink.stats.batches_spooled == 1
    assert "lost" not in caplog.text
    (file,) = sink.spool.take()
    assert list(file.entries()) == [batch]
    sink.spool.done(file)


async def test_replaying_the_spool_of_a_sink_that_died_does_not_undo_recover(target: Target) -> None:
    """A sink spooled a response's later work and died; ``recover()`` marked the response
    interrupted; replaying that spool keeps the events but not the older status. From review
    (reproduced before the fix)."""
    async with asyncio.timeout(30):
        sink = SqlSink(target.url, schema=target.schema, spool_path=target.spool)
        await sink.migrate()
        lc = Lifecycle(info=ResponseInfo(response_id="resp_dead"))
        rec = sink.recorder(lc)
        lc.transition(State.IN_PROGRESS, reason="response.in_progress")
        rec.changed()
        rec.event(0, "response.created", {"type": "response.created"})
        await sink.flush()
        # Later work of that sink went to the spool (the database was away), then it died.
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
