"""The SQLite writer thread lets go of a transaction once it is done: the batches it wrote (and the
events they keep alive) are not held while the thread waits for the next one."""

from __future__ import annotations

import asyncio
import gc
import json
import weakref
from pathlib import Path

from eventguard.sql.sqlite_thread import SqliteConnection, SqliteThread


class _Job:
    """Stands for a write transaction: a callable holding what it writes."""

    def __init__(self) -> None:
        self.rows = [{"payload": "x" * 100} for _ in range(100)]

    def __call__(self, conn: SqliteConnection) -> int:
        return conn.run("CREATE TABLE IF NOT EXISTS t (x INTEGER)", ())


async def test_a_finished_transaction_is_not_kept_alive_by_the_thread(tmp_path: Path) -> None:
    thread = SqliteThread(
        tmp_path / "t.db", busy_timeout_ms=1000, json_serializer=json.dumps, json_deserializer=json.loads
    )
    try:
        job = _Job()
        gone = weakref.ref(job)
        async with asyncio.timeout(10):
            await thread.transaction(job)
        del job
        # The thread drops its reference just after it settles the future: wait for that, bounded.
        async with asyncio.timeout(5):
            while gone() is not None:
                gc.collect()
                await asyncio.sleep(0.01)
    finally:
        async with asyncio.timeout(10):
            await thread.close()
