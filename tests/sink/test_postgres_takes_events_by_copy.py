"""PostgreSQL: events go through COPY into a session's staging table, unless pooler_safe."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import pytest
from sqlalchemy import text

from eventguard.sink import SqlSink, apply, direct
from eventguard.sink import commit as commit_module
from eventguard.sink.batch import Batch
from eventguard.sql import engine as _db

from .conftest import Target
from .helpers import run_guarded, script

pytestmark = pytest.mark.postgres


def _spy(monkeypatch: pytest.MonkeyPatch) -> tuple[list[int], list[Batch]]:
    """Count the COPY passes and keep every batch the sink writes."""
    copies: list[int] = []
    batches: list[Batch] = []
    copy_events = apply.copy_events
    write = commit_module.write

    async def counting_copy(conn: Any, driver: Any, todo: Sequence[Batch]) -> None:
        copies.append(sum(len(b.events) for b in todo))
        await copy_events(conn, driver, todo)

    async def keeping_write(conn: Any, todo: Sequence[Batch], **kw: Any) -> apply.Written:
        batches.extend(todo)
        return await write(conn, todo, **kw)

    monkeypatch.setattr(apply, "copy_events", counting_copy)
    monkeypatch.setattr(commit_module, "write", keeping_write)
    return copies, batches


async def _stored(sink: SqlSink, rid: str) -> tuple[int, int, int]:
    async with sink.engine.connect() as conn:
        row = (
            await conn.execute(
                text(
                    "SELECT count(*), count(*) FILTER (WHERE jsonb_typeof(payload) = 'object'),"
                    " count(DISTINCT recorded_at) FROM eventguard_events WHERE response_id = :rid"
                ),
                {"rid": rid},
            )
        ).one()
    return int(row[0]), int(row[1]), int(row[2])


@pytest.mark.parametrize("pooler_safe", [False, True])
async def test_events_are_copied_unless_pooler_safe(
    pg_target: Target, monkeypatch: pytest.MonkeyPatch, pooler_safe: bool
) -> None:
    copies, batches = _spy(monkeypatch)
    evs = script("resp_copy", n_deltas=50)
    evs[3] = {**evs[3], "delta": 'é ☃ \\ " \t'}
    async with asyncio.timeout(30):
        sink = SqlSink(
            pg_target.url,
            schema=pg_target.schema,
            spool_path=pg_target.spool,
            pooler_safe=pooler_safe,
            flush_every=1_000,
        )
        await sink.start()
        try:
            await run_guarded(sink, evs)
            await sink.flush()
            # Stored once, as jsonb objects, one recorded_at per batch.
            with_events = sum(1 for b in batches if b.events)
            assert await _stored(sink, "resp_copy") == (len(evs), len(evs), with_events)
            async with sink.engine.connect() as conn:
                delta = await conn.scalar(
                    text(
                        "SELECT payload->>'delta' FROM eventguard_events"
                        " WHERE response_id = 'resp_copy' AND seq = 3"
                    )
                )
            assert delta == 'é ☃ \\ " \t'
        finally:
            await sink.aclose()
    # A cycle of fewer than COPY_FROM events takes one keyed insert instead (one round trip).
    copied = sum(len(b.events) for b in batches if len(b.events) >= direct.COPY_FROM)
    assert copied > 0 and sum(copies) == (0 if pooler_safe else copied)
    assert not pg_target.spool.exists()


async def test_staging_table_survives_a_rollback_and_is_emptied_by_commit(
    pg_target: Target, monkeypatch: pytest.MonkeyPatch
) -> None:
    copies, batches = _spy(monkeypatch)
    async with asyncio.timeout(30):
        sink = SqlSink(pg_target.url, schema=pg_target.schema, spool_path=pg_target.spool)
        await sink.start()
        try:
            await run_guarded(sink, script("resp_stage", n_deltas=20))
            await sink.flush()
            assert (await _stored(sink, "resp_stage"))[:2] == (24, 24)
        finally:
            await sink.aclose()
        assert batches
        copies.clear()

        engine = _db.create_engine(_db.resolve_url(pg_target.url), schema=pg_target.schema, pool_size=1)
        try:
            async with engine.connect() as conn:
                await conn.execute(text("DELETE FROM eventguard_events"))
                await conn.commit()
                # The first write on this session creates the table, then its transaction fails.
                with pytest.raises(RuntimeError):
                    async with conn.begin():
                        await apply.write(conn, batches)
                        raise RuntimeError("after the write")
                assert await conn.scalar(text("SELECT count(*) FROM eventguard_events")) == 0
                await conn.commit()
                # The table is still there: the next write on the same session uses it.
                async with conn.begin():
                    await apply.write(conn, batches)
                    assert await conn.scalar(text(f"SELECT count(*) FROM pg_temp.{apply._STAGE}")) == 24
                assert await conn.scalar(text(f"SELECT count(*) FROM pg_temp.{apply._STAGE}")) == 0
                assert await conn.scalar(text("SELECT count(*) FROM eventguard_events")) == 24
                await conn.commit()
                # Written again (a replay): nothing changes, nothing fails.
                async with conn.begin():
                    await apply.write(conn, batches)
                assert await conn.scalar(text("SELECT count(*) FROM eventguard_events")) == 24
        finally:
            await engine.dispose()
        assert copies == [24, 24, 24]


class _ExitForRecovery(BaseException):
    """Stands in for the host's ResponseExitForRecovery: a BaseException, like CancelledError."""


@pytest.mark.parametrize(
    "raised", [asyncio.CancelledError(), TimeoutError("a driver timeout"), _ExitForRecovery()]
)
async def test_a_driver_call_translates_driver_errors_only(pg_target: Target, raised: BaseException) -> None:
    # _driver_call catches Exception to translate asyncpg's errors into SQLAlchemy's; anything else,
    # cancellation and timeouts included, must come out as it went in.
    from sqlalchemy.exc import DBAPIError

    engine = _db.create_engine(_db.resolve_url(pg_target.url), schema=pg_target.schema)
    try:
        async with asyncio.timeout(30), engine.connect() as conn:
            driver = (await conn.get_raw_connection()).driver_connection
            assert driver is not None
            with pytest.raises(DBAPIError):
                await apply._driver_call(conn, "SELECT 1/0", driver.execute("SELECT 1/0"))

            async def fails() -> None:
                raise raised

            with pytest.raises(type(raised)) as caught:
                await apply._driver_call(conn, "SELECT 1", fails())
            assert caught.value is raised
    finally:
        await engine.dispose()
