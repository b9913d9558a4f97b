"""On SQLite every write is one trip to aiosqlite's thread per statement, and nothing more.

Each trip is a hand-off between the event loop the host serves requests on and the driver's
thread: under load it waits for the GIL and a turn of the loop (issue 13). A transaction is
``BEGIN IMMEDIATE`` (one trip, not SQLAlchemy's three: cursor, execute, close), its statements,
``COMMIT``, and no rollback after the commit (the pool's reset rolls back only a transaction that
is still open). The locks and errors stay what they were: a connection handed back inside a
transaction is rolled back, and a database locked at ``BEGIN`` is an outage, not refused content.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.metadata
import sqlite3
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import aiosqlite
import pytest
from sqlalchemy.exc import OperationalError

from eventguard.sink import SqlSink
from eventguard.sql import engine as _db
from eventguard.sql.classify import ErrorKind, classify

from .conftest import Target
from .helpers import run_guarded, script


@contextlib.contextmanager
def trips(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """The name of every function aiosqlite runs in its thread, in order, while inside."""
    seen: list[str] = []
    real = aiosqlite.Connection._execute

    async def counted(self: aiosqlite.Connection, fn: Any, *args: Any, **kwargs: Any) -> Any:
        name = fn.func.__name__ if isinstance(fn, partial) else getattr(fn, "__name__", repr(fn))
        seen.append(name)
        return await real(self, fn, *args, **kwargs)

    monkeypatch.setattr(aiosqlite.Connection, "_execute", counted)
    try:
        yield seen
    finally:
        monkeypatch.setattr(aiosqlite.Connection, "_execute", real)


_SQLALCHEMY = tuple(int(p) for p in importlib.metadata.version("sqlalchemy").split(".")[:2])


@pytest.mark.skipif(
    _SQLALCHEMY < (2, 1),
    reason="the trip counts are SQLAlchemy 2.1's aiosqlite adapter (one _execute_fetchall per statement); "
    "2.0's adapter (seen on 2.0.30, the lowest allowed) runs each statement as cursor, execute, fetchall, "
    "close, so the shape asserted here does not apply",
)
async def test_a_write_cycle_is_begin_its_statements_and_commit_one_trip_each(
    sqlite_target: Target, monkeypatch: pytest.MonkeyPatch
) -> None:
    sink = SqlSink(sqlite_target.url, spool_path=sqlite_target.spool)
    async with asyncio.timeout(60):
        await sink.start()
        await run_guarded(sink, script("resp_warm"))  # the pool's first connection, the schema check
        await sink.flush()
        written = sink.stats.batches_written
        with trips(monkeypatch) as seen:
            await run_guarded(sink, script("resp_counted"))
            await sink.flush()
        cycles = sink.stats.batches_written - written
        await sink.aclose()

    assert cycles >= 1
    assert seen.count("execute") == cycles, seen  # BEGIN IMMEDIATE, straight to the driver
    assert seen.count("commit") == cycles, seen
    assert "rollback" not in seen, seen  # nothing is open after a commit: no reset trip
    assert "cursor" not in seen and "close" not in seen, seen  # no SQLAlchemy cursor around BEGIN
    statements = [name for name in seen if name not in ("execute", "commit")]
    assert set(statements) == {"_execute_fetchall"}, seen
    assert len(statements) <= 3 * cycles, seen  # the row upsert, events, transitions


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
