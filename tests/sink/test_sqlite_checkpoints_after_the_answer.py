"""The SQLite writer thread checkpoints the log itself, after the caller has its answer: a commit
does not wait for the copy-back it made due, and a busy writer's log stays short, far from where
SQLite would checkpoint inside a commit."""

from __future__ import annotations

import asyncio
import itertools
import json
import sqlite3
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from eventguard.sql import sqlite_thread
from eventguard.sql.sqlite_thread import CHECKPOINT_ROWS, SqliteConnection, SqliteThread


def _thread(path: Path) -> SqliteThread:
    return SqliteThread(path, busy_timeout_ms=1000, json_serializer=json.dumps, json_deserializer=json.loads)


def _create(conn: SqliteConnection) -> int:
    return conn.run("CREATE TABLE IF NOT EXISTS t (k INTEGER PRIMARY KEY, v TEXT NOT NULL)", ())


def _insert(first: int, n: int, size: int = 10) -> object:
    def job(conn: SqliteConnection) -> int:
        changed = 0
        for k in range(first, first + n):
            changed += conn.run("INSERT INTO t (k, v) VALUES (?, ?)", (k, "x" * size))
        return changed

    return job


async def _until(done: Callable[[], bool]) -> None:
    """Polls what the writer thread makes true (bounded by the caller's ``asyncio.timeout``)."""
    for _ in itertools.count():
        if done():
            return
        await asyncio.sleep(0.001)


def _pages(path: Path) -> int:
    """Pages the log holds on disk (its high-water mark: SQLite reuses the file after a checkpoint)."""
    wal = path.with_name(path.name + "-wal")
    return wal.stat().st_size // 4096 if wal.exists() else 0


async def test_a_commit_is_answered_before_the_checkpoint_it_made_due(tmp_path: Path) -> None:
    thread = _thread(tmp_path / "t.db")
    under_way, release = threading.Event(), threading.Event()
    checkpoint = thread._checkpoint_if_due

    def held() -> None:
        under_way.set()
        release.wait(10)
        checkpoint()

    thread._checkpoint_if_due = held  # type: ignore[method-assign]

    def create_and_fill(conn: SqliteConnection) -> object:
        _create(conn)
        return _insert(0, CHECKPOINT_ROWS)(conn)  # type: ignore[operator]

    try:
        async with asyncio.timeout(5):
            # The answer comes while the checkpoint it made due is held on the thread.
            assert await thread.transaction(create_and_fill) == CHECKPOINT_ROWS
            await _until(under_way.is_set)
        assert thread.checkpoints == 0
        release.set()
        async with asyncio.timeout(10):
            await _until(lambda: thread.checkpoints > 0)
        assert thread.checkpoints == 1
    finally:
        release.set()
        async with asyncio.timeout(10):
            await thread.close()


async def test_rows_under_the_threshold_make_no_checkpoint(tmp_path: Path) -> None:
    thread = _thread(tmp_path / "t.db")
    try:
        async with asyncio.timeout(10):
            await thread.transaction(_create)
            for i in range(4):
                await thread.transaction(_insert(i * 100, 100))
        assert thread.checkpoints == 0  # 400 rows: not yet due
        async with asyncio.timeout(10):
            await thread.transaction(_insert(400, 100))
            await _until(lambda: thread.checkpoints > 0)  # the 500th row made it due: after the answer
        assert thread.checkpoints == 1
    finally:
        async with asyncio.timeout(10):
            await thread.close()


async def test_a_busy_writer_keeps_its_log_short(tmp_path: Path) -> None:
    path = tmp_path / "t.db"
    thread = _thread(path)
    rows, size = 40 * 100, 1000  # over 1,000 pages of rows
    try:
        async with asyncio.timeout(60):
            await thread.transaction(_create)
            jobs = [thread.transaction(_insert(i * 100, 100, size)) for i in range(rows // 100)]
            await asyncio.gather(*jobs)
        # Measured while the thread's connection is open (the last one to close checkpoints anyway).
        pages = _pages(path)
    finally:
        async with asyncio.timeout(10):
            await thread.close()
    # Without the thread's checkpoints SQLite checkpoints inside the commit that passes 1,000 pages,
    # and the log reaches that far (1,098 pages); with them 279.
    assert pages < 400
    assert thread.checkpoints >= rows // (2 * CHECKPOINT_ROWS)
    with sqlite3.connect(path) as check:
        assert check.execute("SELECT count(*) FROM t").fetchone()[0] == rows


async def test_a_failed_checkpoint_leaves_the_writer_writing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    thread = _thread(tmp_path / "t.db")
    monkeypatch.setattr(sqlite_thread, "_CHECKPOINT", "PRAGMA no_such_mode_wal_checkpoint(")
    try:
        async with asyncio.timeout(10):
            await thread.transaction(_create)
            await thread.transaction(_insert(0, CHECKPOINT_ROWS))
            assert await thread.transaction(_insert(CHECKPOINT_ROWS, 10)) == 10
        assert thread.checkpoints == 0
    finally:
        async with asyncio.timeout(10):
            await thread.close()
