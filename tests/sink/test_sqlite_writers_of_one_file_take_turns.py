"""Writer threads of one process on one SQLite file take turns on a lock of their own: the next
``BEGIN IMMEDIATE`` starts once the last ``COMMIT`` ended, instead of sleeping in SQLite's busy
handler (1, 2, 5 ... 100 ms) while a writer running back to back takes SQLite's lock again.

Shown without a clock: with ``busy_timeout`` 0 SQLite refuses a second writer at once
("database is locked"); taking turns, the second writer never meets the first one's lock."""

from __future__ import annotations

import asyncio
import json
import multiprocessing
import os
import sys
import threading
from pathlib import Path

import pytest

from eventguard.sql import sqlite_thread
from eventguard.sql.sqlite_thread import SqliteConnection, SqliteThread


def _thread(path: Path) -> SqliteThread:
    return SqliteThread(path, busy_timeout_ms=0, json_serializer=json.dumps, json_deserializer=json.loads)


def _create(conn: SqliteConnection) -> int:
    return conn.run("CREATE TABLE IF NOT EXISTS t (k INTEGER PRIMARY KEY, who TEXT NOT NULL)", ())


def _who(conn: SqliteConnection) -> list[tuple[str]]:
    return conn.raw.execute("SELECT who FROM t ORDER BY k").fetchall()


async def test_a_second_writer_thread_waits_its_turn_instead_of_meeting_sqlites_lock(tmp_path: Path) -> None:
    first, second = _thread(tmp_path / "t.db"), _thread(tmp_path / "." / "t.db")  # one file, two spellings
    inside, release = threading.Event(), threading.Event()

    def held(conn: SqliteConnection) -> int:
        changed = conn.run("INSERT INTO t (k, who) VALUES (1, 'first')", ())
        inside.set()
        release.wait(10)  # SQLite's write lock is held here, as in a long transaction
        return changed

    def then(conn: SqliteConnection) -> int:
        return conn.run("INSERT INTO t (k, who) VALUES (2, 'second')", ())

    try:
        async with asyncio.timeout(20):
            await first.transaction(_create)
            holding = asyncio.ensure_future(first.transaction(held))
            await asyncio.to_thread(inside.wait, 10)
            waiting = asyncio.ensure_future(second.transaction(then))
            await asyncio.sleep(0.05)
            assert not waiting.done()  # waiting its turn, not refused by SQLite
            release.set()
            assert await holding == 1
            assert await waiting == 1
            rows = await second.transaction(_who)
        assert rows == [("first",), ("second",)]
    finally:
        release.set()
        async with asyncio.timeout(10):
            await first.close()
            await second.close()


async def test_writers_of_different_files_do_not_wait_for_each_other(tmp_path: Path) -> None:
    first, other = _thread(tmp_path / "a.db"), _thread(tmp_path / "b.db")
    inside, release = threading.Event(), threading.Event()

    def held(conn: SqliteConnection) -> int:
        inside.set()
        release.wait(10)
        return _create(conn)

    try:
        async with asyncio.timeout(20):
            holding = asyncio.ensure_future(first.transaction(held))
            await asyncio.to_thread(inside.wait, 10)
            await other.transaction(_create)  # another file: answered while the first is held
            release.set()
            await holding
    finally:
        release.set()
        async with asyncio.timeout(10):
            await first.close()
            await other.close()


def _write_once(path: str) -> None:
    async def write() -> None:
        thread = SqliteThread(
            Path(path), busy_timeout_ms=1000, json_serializer=json.dumps, json_deserializer=json.loads
        )
        try:
            async with asyncio.timeout(10):
                await thread.transaction(_create)
        finally:
            await thread.close()

    asyncio.run(write())


@pytest.mark.skipif(sys.platform == "win32", reason="no fork() on Windows")
def test_a_child_forked_while_a_writer_held_the_files_lock_writes_all_the_same(tmp_path: Path) -> None:
    path = tmp_path / "t.db"
    held = sqlite_thread._file_lock(os.path.realpath(path))
    with held:  # as a writer thread of this process would, mid-transaction, at the fork
        child = multiprocessing.get_context("fork").Process(target=_write_once, args=(str(path),))
        child.start()
        child.join(30)
        if child.is_alive():
            child.kill()
            child.join()
    assert child.exitcode == 0  # it did not wait for a lock whose holder is not in the child
