"""On SQLite every write transaction is one hand-off to the sink's own sqlite3 thread, and nothing more.

Each trip to a driver thread is a hand-off between the event loop the host serves requests on and
that thread: under load it waits for the GIL and a turn of the loop (issue 13). The sink's writes
go to its writer thread (:mod:`eventguard.sql.sqlite_thread`) as one job per transaction; the
engine's own transactions (schema, quarantine, reads) still begin with one trip to aiosqlite
(``BEGIN IMMEDIATE``, not SQLAlchemy's cursor, execute, close), and a connection handed back inside
a transaction is rolled back. A database locked at ``BEGIN`` is an outage, not refused content.
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import threading
from pathlib import Path

import aiosqlite
import pytest
from sqlalchemy.exc import OperationalError

from eventguard.sink import SqlSink
from eventguard.sql import engine as _db
from eventguard.sql.classify import ErrorKind, classify
from eventguard.sql.tables import events, responses
from tests._sqlite_trips import hand_offs, trips

from .conftest import Target
from .helpers import run_guarded, script


async def test_a_write_cycle_is_one_hand_off_to_the_writer_thread_and_none_to_aiosqlite(
    sqlite_target: Target, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The whole transaction (BEGIN IMMEDIATE, the statements, COMMIT) is one job on the sink's
    # own sqlite3 thread: the event loop hands it over once, and aiosqlite's thread (with
    # SQLAlchemy's Python on the loop for each of its trips) is not used by the write at all.
    sink = SqlSink(sqlite_target.url, spool_path=sqlite_target.spool)
    async with asyncio.timeout(60):
        await sink.start()
        await run_guarded(sink, script("resp_warm"))  # the schema check, the thread's connection
        await sink.flush()
        written = sink.stats.batches_written
        with trips(monkeypatch) as seen, hand_offs(monkeypatch) as ran_on:
            await run_guarded(sink, script("resp_counted"))
            await sink.flush()
        cycles = sink.stats.batches_written - written
        await sink.aclose()

    assert cycles >= 1
    assert seen == [], seen  # no trip to aiosqlite's thread
    assert len(ran_on) == cycles, ran_on  # one hand-off per transaction
    assert threading.get_ident() not in {h.thread for h in ran_on}  # never on the event loop's thread


async def test_a_database_locked_by_another_process_spools_the_batch_from_the_writer_thread(
    sqlite_target: Target,
) -> None:
    # The writer thread's BEGIN IMMEDIATE waits busy_timeout for the lock, then the batch is an
    # outage's (spooled, nothing lost), not refused content; once the lock is free it is replayed.
    sink = SqlSink(sqlite_target.url, spool_path=sqlite_target.spool, busy_timeout=0.05)
    path = _db.sqlite_path(sink.url)
    assert path is not None
    async with asyncio.timeout(60):
        await sink.start()
        with contextlib.closing(sqlite3.connect(path, isolation_level=None)) as holder:
            holder.execute("BEGIN IMMEDIATE")
            await run_guarded(sink, script("resp_locked", n_deltas=2))
            await sink.flush()
            holder.execute("ROLLBACK")
        assert sink.stats.batches_spooled >= 1
        assert sink.stats.quarantined == 0
        result = await sink.replay_spool()
        await sink.aclose()
    assert result.events >= 1
    with contextlib.closing(sqlite3.connect(path)) as check:
        stored = check.execute(
            f"SELECT count(*) FROM {events.name} WHERE response_id = 'resp_locked'"
        ).fetchone()
        status = check.execute(
            f"SELECT status FROM {responses.name} WHERE response_id = 'resp_locked'"
        ).fetchone()
    assert status == ("completed",)
    assert stored[0] >= 4


async def test_a_connection_handed_back_inside_a_transaction_is_rolled_back(tmp_path: Path) -> None:
    path = tmp_path / "eg.db"
    engine = _db.create_engine(_db.resolve_url(f"sqlite:///{path}"), busy_timeout_ms=100)
    try:
        async with asyncio.timeout(30):
            async with engine.connect() as conn:
                await conn.exec_driver_sql("CREATE TABLE t (x INTEGER)")
                await conn.commit()
                # Behind SQLAlchemy's back: it does not know a transaction is open, the driver does.
                driver = (await conn.get_raw_connection()).driver_connection
                assert isinstance(driver, aiosqlite.Connection)
                await driver.execute("BEGIN IMMEDIATE")
                await driver.execute("INSERT INTO t VALUES (1)")
                assert driver.in_transaction
            # Handed back: the pool's reset rolled it back, so the write lock is free again.
            with contextlib.closing(sqlite3.connect(path, timeout=0.1, isolation_level=None)) as other:
                other.execute("BEGIN IMMEDIATE")
                assert other.execute("SELECT count(*) FROM t").fetchone() == (0,)
                other.execute("ROLLBACK")
    finally:
        await engine.dispose()


async def test_a_database_locked_at_begin_is_an_outage(tmp_path: Path) -> None:
    path = tmp_path / "eg.db"
    engine = _db.create_engine(_db.resolve_url(f"sqlite:///{path}"), busy_timeout_ms=50)
    try:
        async with asyncio.timeout(30), engine.begin() as conn:  # connected, in WAL mode
            await conn.exec_driver_sql("CREATE TABLE t (x INTEGER)")
        with contextlib.closing(sqlite3.connect(path, isolation_level=None)) as holder:
            holder.execute("BEGIN IMMEDIATE")  # another process holds the write lock
            async with asyncio.timeout(30):
                with pytest.raises(OperationalError) as caught:
                    async with engine.begin() as conn:
                        await conn.exec_driver_sql("INSERT INTO t VALUES (1)")
            holder.execute("ROLLBACK")
        assert "locked" in str(caught.value)
        assert "BEGIN IMMEDIATE" in str(caught.value)  # refused at BEGIN, before any statement
        assert classify(caught.value) is ErrorKind.OUTAGE
    finally:
        await engine.dispose()


async def test_a_transaction_cancelled_while_its_begin_waits_for_the_lock_leaves_the_lock_free(
    tmp_path: Path,
) -> None:
    # A task cancelled while its BEGIN IMMEDIATE waits (behind another writer) on aiosqlite's thread:
    # the connection goes back to the pool before that BEGIN has run, so the driver says "no
    # transaction" then. Skipping the pool's rollback on that answer left the connection to take
    # the write lock a moment later and keep it, idle in the pool, for good: every later writer
    # waited busy_timeout and failed (seen as a replica's stop() that timed out in CI).
    path = tmp_path / "eg.db"
    engine = _db.create_engine(_db.resolve_url(f"sqlite:///{path}"), busy_timeout_ms=5_000)
    try:
        async with asyncio.timeout(30), engine.begin() as conn:
            await conn.exec_driver_sql("CREATE TABLE t (x INTEGER)")
        with contextlib.closing(sqlite3.connect(path, isolation_level=None)) as holder:
            holder.execute("BEGIN IMMEDIATE")

            async def write() -> None:
                async with engine.begin() as conn:
                    await conn.exec_driver_sql("INSERT INTO t VALUES (1)")

            task = asyncio.create_task(write())
            await asyncio.sleep(0.3)  # its BEGIN IMMEDIATE is waiting on the driver's thread
            task.cancel()
            async with asyncio.timeout(30):
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            holder.execute("ROLLBACK")  # the waiting BEGIN takes the lock now
        await asyncio.sleep(0.3)  # and the rollback queued behind it (the fix) gives it back
        with contextlib.closing(sqlite3.connect(path, timeout=1.0, isolation_level=None)) as other:
            other.execute("BEGIN IMMEDIATE")  # "database is locked" when the lock was kept
            assert other.execute("SELECT count(*) FROM t").fetchone() == (0,)
            other.execute("ROLLBACK")
    finally:
        async with asyncio.timeout(30):
            await engine.dispose()
