"""On an SQLite file, ``get_response`` is one SELECT on the event loop's own thread: no trip to
aiosqlite's thread, no transaction.

The read's cost was hand-offs, not SQL. It was six trips to the driver's thread (``BEGIN``,
SQLAlchemy's cursor, ``COMMIT``: 4.8x the host's file store at p50), then one; and once the writes
moved to the writer thread, waking aiosqlite's idle thread for that one trip was most of a read
(issue 15's benchmark: 1.2 to 2.5x the file store, which reads its JSON file on the loop). Not a
timing: the trips are counted. The rules stay: a database that fails is never "not found", and the
read holds nothing open behind it.
"""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

import pytest

from eventguard.provider import ProviderStorageError, SqlResponseProvider
from tests._sqlite_trips import trips

from .test_parity_with_the_hosts_store import envelope, item


async def test_get_response_on_sqlite_makes_no_trip_to_the_drivers_thread(
    sqlite_provider: SqlResponseProvider, monkeypatch: pytest.MonkeyPatch
) -> None:
    provider = sqlite_provider
    async with asyncio.timeout(30):
        response = envelope("resp_one", metadata={"k": "v"})
        await provider.create_response(response, [item("i1")], None)
        with trips(monkeypatch) as seen:
            assert await provider.get_response("resp_one") == response
            with pytest.raises(KeyError):
                await provider.get_response("resp_missing")
        assert seen == []


async def test_get_response_on_sqlite_with_its_table_gone_is_a_storage_error_not_key_error(
    sqlite_provider: SqlResponseProvider,
) -> None:
    """A read the loop's connection cannot make goes the ordinary way, which says why."""
    provider = sqlite_provider
    async with asyncio.timeout(30):
        await provider.create_response(envelope("resp_any"), [], None)
        await provider.get_response("resp_any")  # the loop's connection is open
        async with provider.engine.begin() as conn:
            await conn.exec_driver_sql("DROP TABLE eventguard_provider_links")
            await conn.exec_driver_sql("DROP TABLE eventguard_provider_responses")
        with pytest.raises(ProviderStorageError):
            await provider.get_response("resp_any")


async def test_a_response_read_on_the_loop_leaves_no_read_transaction_open(
    sqlite_provider: SqlResponseProvider,
) -> None:
    """An open read would pin its snapshot of the WAL: no checkpoint could get past it, and the
    WAL would grow for as long as the provider lives."""
    provider = sqlite_provider
    path = Path(str(provider.url.database))
    async with asyncio.timeout(30):
        for n in range(3):
            await provider.create_response(envelope(f"resp_{n}"), [item(f"i{n}")], None)
            assert (await provider.get_response(f"resp_{n}"))["id"] == f"resp_{n}"
        other = sqlite3.connect(path, timeout=0, isolation_level=None)
        try:
            # TRUNCATE must wait for every reader; with no wait allowed, busy=1 names one still open.
            busy, _log, _done = other.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
        finally:
            other.close()
        assert busy == 0
        assert path.with_name(path.name + "-wal").stat().st_size == 0
