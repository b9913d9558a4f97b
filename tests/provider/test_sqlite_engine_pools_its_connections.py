"""The provider's own SQLite engine pools its connections on every SQLAlchemy release.

SQLAlchemy 2.0 (the lowest allowed: 2.0.30) gives a file-based aiosqlite engine a ``NullPool``: each
provider call opened a connection of its own (a new aiosqlite thread, the pragmas). 2.1 pools them
(``AsyncAdaptedQueuePool``); the provider does the same on 2.0, keeping the engine's hooks.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from sqlalchemy.pool import AsyncAdaptedQueuePool

from eventguard.provider import SqlResponseProvider

from .test_parity_with_the_hosts_store import envelope, item


async def test_the_providers_sqlite_file_engine_reuses_one_connection(tmp_path: Path) -> None:
    provider = SqlResponseProvider(f"sqlite:///{tmp_path / 'p.db'}")
    async with asyncio.timeout(30):
        await provider.create_response(envelope("resp_1"), [item("i1")], None)
        pool = provider.engine.sync_engine.pool
        assert isinstance(pool, AsyncAdaptedQueuePool)
        seen = set()
        for _ in range(3):
            assert (await provider.get_response("resp_1"))["id"] == "resp_1"
            raw = await provider.engine.raw_connection()
            seen.add(id(raw.driver_connection))
            # The engine's own connect hook ran on the pooled connection: WAL, foreign keys.
            assert (await raw.driver_connection.execute_fetchall("PRAGMA journal_mode")) == [("wal",)]
            assert (await raw.driver_connection.execute_fetchall("PRAGMA foreign_keys")) == [(1,)]
            raw.close()
        assert len(seen) == 1
        await provider.aclose()
