"""A replica on ``database=engine`` (PostgreSQL) bounds its own idle transactions and leaves the
application's pool as it was.

A replica bounds how long a session of its may sit idle inside a transaction (a paused replica must
not hold the lease rows the survivors need). On an engine of its own it sets that on every new
connection and empties the pool; on the application's engine it did the same to the application:
every connection the application opened afterwards carried eventguard's timeout, and the pool's idle
connections were closed under it (with ``schema=``, the borrowed engine was given a new pool of its
own instead, which nothing ever closed: the connections outlived ``aclose()`` and the application's
own ``dispose()``). Its LISTEN connection was opened from ``engine.url``, which names nothing for a
token-authenticated engine, so relayed cancels fell back to polling. Now the bound is set per
transaction of eventguard's, and LISTEN opens its connection the way the engine does.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import create_async_engine

from eventguard.foundry import Storage
from eventguard.replicas import ReplicaOptions
from eventguard.replicas import leases as lease_sql
from eventguard.replicas.replica import CHANNEL
from tests._postgres import execute, fresh_schema

pytestmark = pytest.mark.postgres

STEP = 30.0
LEASE = 3.0


@pytest.fixture
async def schema() -> AsyncIterator[str]:
    async with fresh_schema("eg_replica_engine") as name:
        yield name


async def backends_named(name: str) -> int:
    rows = await execute("SELECT count(*) AS n FROM pg_stat_activity WHERE application_name = $1", name)
    return int(rows[0]["n"])


async def setting_of(conn: Any) -> str:
    return str((await conn.execute(text("SHOW idle_in_transaction_session_timeout"))).scalar_one())


@pytest.mark.parametrize("with_schema", [True, False], ids=["schema", "engine-search-path"])
async def test_a_replica_bounds_its_own_transactions_and_not_the_applications(
    schema: str,
    with_schema: bool,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import asyncpg  # type: ignore[import-untyped]

    name = f"app_{uuid.uuid4().hex[:12]}"

    async def connect() -> Any:  # a token-authenticating application: the URL says nothing
        return await asyncpg.connect(
            host="127.0.0.1",
            user="postgres",
            database="test",
            server_settings={"search_path": schema, "application_name": name},
        )

    app = create_async_engine("postgresql+asyncpg://", async_creator=connect)
    looked = asyncio.Event()
    take_cancels = lease_sql.take_cancels

    async def taking_cancels(conn: Any, identity: str) -> Any:
        looked.set()
        return await take_cancels(conn, identity)

    monkeypatch.setattr(lease_sql, "take_cancels", taking_cancels)
    storage = Storage.build(
        app,
        schema=schema if with_schema else None,
        migrate=None,
        sink=True,
        provider=True,
        replicas=ReplicaOptions(identity="engine-replica", lease=LEASE, cancel_poll=60.0),
        spool_path=tmp_path / "spool.jsonl",  # the URL names no database
    )
    replica = storage.replica
    assert replica is not None
    try:
        async with asyncio.timeout(STEP):
            # The application's idle connections, two in its pool (LISTEN may take one of them).
            async with app.connect() as one, app.connect() as two:
                before = [(await c.execute(text("SELECT pg_backend_pid()"))).scalar_one() for c in (one, two)]
            await storage.start()
            with caplog.at_level(logging.WARNING, logger="eventguard.replicas.replica"):
                await replica.start(app=None)
            try:
                assert not [r for r in caplog.records if "LISTEN" in r.getMessage()]
                # LISTEN hears the database the engine connects to (not the one its URL names):
                # with polling a minute apart, only the NOTIFY makes the replica look for cancels.
                await execute(f"NOTIFY {CHANNEL}, 'engine-replica'")
                async with asyncio.timeout(5):
                    await looked.wait()
                async with replica._tx() as conn:  # the replica's transactions: bounded
                    assert await setting_of(conn) == "3s"
                async with app.connect() as conn:  # the application's: untouched
                    assert await setting_of(conn) == "0"
                # and its idle connections were not closed under it
                alive = await execute("SELECT pid FROM pg_stat_activity WHERE pid = ANY($1::int[])", before)
                assert sorted(r["pid"] for r in alive) == sorted(before)
            finally:
                await replica.stop()
                await storage.aclose()
        await app.dispose()
        async with asyncio.timeout(STEP):
            while await backends_named(name):  # noqa: ASYNC110 - the server's, seen a moment after the close
                await asyncio.sleep(0.05)
    finally:
        await app.dispose()
