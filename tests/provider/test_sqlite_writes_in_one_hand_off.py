"""On an SQLite file, each write of the response store is one hand-off to the provider's writer
thread (:mod:`eventguard.sql.sqlite_thread`) and no trip to aiosqlite's thread.

Through aiosqlite an ``update_response`` was five trips to the driver's thread, each a turn of the
event loop (issue 15's benchmark: 1.14x the host's file store at p50). Not a timing: the hand-offs
and the trips are counted. The guarantees stay: ``KeyError`` only for not found, a database that
fails is a :class:`ProviderStorageError`, and a write is on disk when it returns.
"""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

import pytest
from azure.ai.agentserver.responses.store._base import ResponseAlreadyExistsError

from eventguard.provider import ProviderStorageError, SqlResponseProvider
from tests._sqlite_trips import hand_offs, trips

from .test_parity_with_the_hosts_store import envelope, item, out


async def test_each_write_on_sqlite_is_one_hand_off_and_no_driver_trip(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    provider = SqlResponseProvider(f"sqlite:///{tmp_path / 'p.db'}")
    async with asyncio.timeout(30):
        await provider.start()
        with hand_offs(monkeypatch) as handed, trips(monkeypatch) as driver:
            await provider.create_response(envelope("resp_1"), [item("i1"), item("i2")], ["h1"])
            await provider.update_response(envelope("resp_1", status="completed", output=[out("o1")]))
            await provider.delete_response("resp_1")
        assert [h.file for h in handed] == ["p.db"] * 3
        assert driver == []
        # ... and every one of them is on disk, read by another connection.
        with sqlite3.connect(tmp_path / "p.db") as raw:
            rows = raw.execute(
                "SELECT deleted, status FROM eventguard_provider_responses WHERE response_id = 'resp_1'"
            ).fetchall()
        assert rows == [(1, "completed")]
        await provider.aclose()


async def test_sqlite_writes_keep_not_found_and_already_exists_apart_from_storage_errors(
    tmp_path: Path,
) -> None:
    provider = SqlResponseProvider(f"sqlite:///{tmp_path / 'p.db'}")
    async with asyncio.timeout(30):
        await provider.start()
        with pytest.raises(KeyError):
            await provider.update_response(envelope("resp_missing", status="completed"))
        with pytest.raises(KeyError):
            await provider.delete_response("resp_missing")
        await provider.create_response(envelope("resp_1"), [item("i1")], None)
        with pytest.raises(ResponseAlreadyExistsError):
            await provider.create_response(envelope("resp_1"), [item("i1")], None)
        # An update is atomic: when its second statement fails, its first is rolled back too.
        async with provider.engine.begin() as conn:
            await conn.exec_driver_sql("DROP TABLE eventguard_provider_links")
        with pytest.raises(ProviderStorageError) as failed:
            await provider.update_response(envelope("resp_1", status="completed", output=[out("o1")]))
        assert not isinstance(failed.value, KeyError)
        assert (await provider.get_response("resp_1"))["status"] == "in_progress"
        async with provider.engine.begin() as conn:
            await conn.exec_driver_sql("DROP TABLE eventguard_provider_responses")
        with pytest.raises(ProviderStorageError) as failed:
            await provider.update_response(envelope("resp_1", status="completed"))
        assert not isinstance(failed.value, KeyError)
        await provider.aclose()


async def test_a_closed_provider_writes_again_on_a_new_writer_thread(tmp_path: Path) -> None:
    provider = SqlResponseProvider(f"sqlite:///{tmp_path / 'p.db'}")
    async with asyncio.timeout(30):
        await provider.create_response(envelope("resp_1"), [item("i1")], None)
        await provider.aclose()
        await provider.update_response(envelope("resp_1", status="completed"))
        assert (await provider.get_response("resp_1"))["status"] == "completed"
        await provider.aclose()
