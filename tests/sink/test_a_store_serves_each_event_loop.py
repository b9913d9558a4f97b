"""A ResponseStore used in one ``asyncio.run()`` answers in the next, its first call included.

Its pooled asyncpg connections belong to the loop that opened them: from the next loop the first
call failed with a raw ``RuntimeError: Event loop is closed`` (the one after that worked, on a
connection the pool had dropped). The store now lets go of its own pool when the loop changes
(``dispose(close=False)``, as the sink and the provider do). An application's engine keeps its
pool: the application disposes of it between loops, as SQLAlchemy advises, and the store shares
the new one. PostgreSQL only: aiosqlite's connections answer on any loop, so SQLite never failed.

Real PostgreSQL, a schema per test, real event loops one after the other (as a CLI, a test runner
or a worker's restart makes them).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from datetime import timedelta

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from eventguard.sql import migrate
from eventguard.store import ResponseStore
from tests._postgres import PG_URL, fresh_schema_sync

pytestmark = pytest.mark.postgres

T = 30


@pytest.fixture
def schema() -> Iterator[str]:
    """A fresh PostgreSQL schema, made and dropped outside any test loop."""
    with fresh_schema_sync("eg_store_loops") as name:
        yield name


def test_a_store_answers_every_call_in_each_new_loop(schema: str) -> None:
    store = ResponseStore(PG_URL, schema=schema)

    async def first() -> None:
        async with asyncio.timeout(T):
            await migrate.upgrade(store.engine)
            assert await store.count() == 0

    async def second() -> None:
        async with asyncio.timeout(T):
            assert await store.count() == 0  # the first call on this loop
            assert await store.recent() == []
            assert await store.get("resp_1") is None

    async def third() -> None:
        async with asyncio.timeout(T):
            assert await store.recover(older_than=timedelta(0)) == []  # a write, first on its loop
            assert (await store.stats()).total == 0

    asyncio.run(first())
    asyncio.run(second())
    asyncio.run(third())
    asyncio.run(store.aclose())  # in a loop that made no connection: the third loop's are let go of


def test_a_store_on_the_applications_engine_shares_its_pool_in_each_loop(schema: str) -> None:
    app: AsyncEngine = create_async_engine(PG_URL)
    store = ResponseStore(engine=app, schema=schema)
    pools = []

    async def first() -> None:
        async with asyncio.timeout(T):
            await migrate.upgrade(store.engine)
            assert await store.count() == 0
            pools.append(app.sync_engine.pool)
            assert store.engine.sync_engine.pool is app.sync_engine.pool

    async def second() -> None:
        async with asyncio.timeout(T):
            # The application's part between loops, as SQLAlchemy advises.
            await app.dispose(close=False)
            pools.append(app.sync_engine.pool)
            assert await store.count() == 0
            assert store.engine.sync_engine.pool is app.sync_engine.pool  # shared, not a copy
            await store.aclose()  # never the application's pool
            assert app.sync_engine.pool is pools[1]
            async with app.connect() as conn:
                assert (await conn.execute(text("SELECT 1"))).scalar_one() == 1
            await app.dispose()

    asyncio.run(first())
    asyncio.run(second())
    assert pools[0] is not pools[1]
