"""On SQLite, ``get_response`` is one trip to aiosqlite's thread: one SELECT, no transaction.

The read's cost was trips, not SQL (issue 15's benchmark: 4.8x the host's file store at p50 with
six trips: ``BEGIN``, SQLAlchemy's cursor, ``COMMIT``). Not a timing: the trips are counted.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Any

import aiosqlite
import pytest

from eventguard.provider import ProviderStorageError, SqlResponseProvider

from .test_parity_with_the_hosts_store import envelope, item


@contextmanager
def trips(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """The name of every function aiosqlite runs in its thread while inside."""
    seen: list[str] = []
    real: Any = aiosqlite.Connection._execute

    async def counted(self: aiosqlite.Connection, fn: Any, *args: Any, **kwargs: Any) -> Any:
        seen.append(fn.func.__name__ if isinstance(fn, partial) else getattr(fn, "__name__", repr(fn)))
        return await real(self, fn, *args, **kwargs)

    monkeypatch.setattr(aiosqlite.Connection, "_execute", counted)
    try:
        yield seen
    finally:
        monkeypatch.setattr(aiosqlite.Connection, "_execute", real)


#: SQLAlchemy 2.0.30 (the lowest allowed) gives a file-based aiosqlite engine a NullPool; the provider
#: pools its own engine's connections on every release (``_pool_sqlite_file``), so one trip holds.


async def test_get_response_on_sqlite_is_one_trip_to_the_driver(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    provider = SqlResponseProvider(f"sqlite:///{tmp_path / 'p.db'}")
    async with asyncio.timeout(30):
        await provider.start()
        response = envelope("resp_one", metadata={"k": "v"})
        await provider.create_response(response, [item("i1")], None)
        await provider.get_response("resp_one")  # the pool's connection is open
        with trips(monkeypatch) as seen:
            assert await provider.get_response("resp_one") == response
            with pytest.raises(KeyError):
                await provider.get_response("resp_missing")
        assert seen == ["_execute_fetchall", "_execute_fetchall"]
        await provider.aclose()


async def test_get_response_on_sqlite_with_its_table_gone_is_a_storage_error_not_key_error(
    tmp_path: Path,
) -> None:
    """The one-trip path keeps the rule: a database that fails is never "not found"."""
    provider = SqlResponseProvider(f"sqlite:///{tmp_path / 'p.db'}")
    async with asyncio.timeout(30):
        await provider.start()
        async with provider.engine.begin() as conn:
            await conn.exec_driver_sql("DROP TABLE eventguard_provider_links")
            await conn.exec_driver_sql("DROP TABLE eventguard_provider_responses")
        with pytest.raises(ProviderStorageError):
            await provider.get_response("resp_any")
        await provider.aclose()
