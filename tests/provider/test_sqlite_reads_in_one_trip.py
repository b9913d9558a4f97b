"""On SQLite, ``get_response`` is one trip to aiosqlite's thread: one SELECT, no transaction.

The read's cost was trips, not SQL (issue 15's benchmark: 4.8x the host's file store at p50 with
six trips: ``BEGIN``, SQLAlchemy's cursor, ``COMMIT``). Not a timing: the trips are counted.
"""

from __future__ import annotations

import asyncio

import pytest

from eventguard.provider import ProviderStorageError, SqlResponseProvider
from tests._sqlite_trips import trips

from .test_parity_with_the_hosts_store import envelope, item

#: SQLAlchemy 2.0.30 (the lowest allowed) gives a file-based aiosqlite engine a NullPool; eventguard's
#: engines pool a file's connections on every release (sql.engine), so one trip holds.


async def test_get_response_on_sqlite_is_one_trip_to_the_driver(
    sqlite_provider: SqlResponseProvider, monkeypatch: pytest.MonkeyPatch
) -> None:
    provider = sqlite_provider
    async with asyncio.timeout(30):
        response = envelope("resp_one", metadata={"k": "v"})
        await provider.create_response(response, [item("i1")], None)
        await provider.get_response("resp_one")  # the pool's connection is open
        with trips(monkeypatch) as seen:
            assert await provider.get_response("resp_one") == response
            with pytest.raises(KeyError):
                await provider.get_response("resp_missing")
        assert seen == ["_execute_fetchall", "_execute_fetchall"]


async def test_get_response_on_sqlite_with_its_table_gone_is_a_storage_error_not_key_error(
    sqlite_provider: SqlResponseProvider,
) -> None:
    """The one-trip path keeps the rule: a database that fails is never "not found"."""
    provider = sqlite_provider
    async with asyncio.timeout(30):
        async with provider.engine.begin() as conn:
            await conn.exec_driver_sql("DROP TABLE eventguard_provider_links")
            await conn.exec_driver_sql("DROP TABLE eventguard_provider_responses")
        with pytest.raises(ProviderStorageError):
            await provider.get_response("resp_any")
