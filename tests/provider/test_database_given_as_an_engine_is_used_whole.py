"""``GuardedResponses(database=engine, schema=S)`` keeps everything in the application's engine and
in ``S``: the sink borrows the engine's pool (it rebuilt an engine from ``engine.url`` and lost the
engine's ``async_creator`` and connection settings: a token-authenticated engine's URL names no
database), and the response store and agent sessions take ``schema=`` too (they used the engine's
own ``search_path``: half the data in another schema). On PostgreSQL."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.ext.asyncio import create_async_engine

from eventguard import guard
from eventguard.foundry import Storage
from eventguard.testing.streams import host_context, stream_events
from tests._postgres import execute, fresh_schema

pytestmark = pytest.mark.postgres

STEP = 30.0


@pytest.fixture
async def schemas() -> AsyncIterator[tuple[str, str]]:
    async with fresh_schema("eg_engine_own") as own, fresh_schema("eg_engine_asked") as asked:
        yield own, asked


async def aiter_of(events: list[Any]) -> AsyncIterator[Any]:
    for event in events:
        yield event


async def tables_in(schema: str) -> set[str]:
    rows = await execute("SELECT table_name FROM information_schema.tables WHERE table_schema = $1", schema)
    return {r["table_name"] for r in rows}


async def test_an_engine_and_a_schema_put_the_sink_the_store_and_the_sessions_in_that_schema(
    schemas: tuple[str, str], tmp_path: Path
) -> None:
    own, asked = schemas
    import asyncpg  # type: ignore[import-untyped]

    async def connect() -> Any:  # as a token-authenticating application connects: the URL says nothing
        return await asyncpg.connect(
            host="127.0.0.1", user="postgres", database="test", server_settings={"search_path": own}
        )

    app = create_async_engine("postgresql+asyncpg://", async_creator=connect)
    spool = tmp_path / "spool.jsonl"  # its URL names no database: the default cannot be told apart
    storage = Storage.build(app, schema=asked, migrate=None, sink=True, provider=True, spool_path=spool)
    storage.sessions(app, asked, None)
    try:
        async with asyncio.timeout(STEP):
            await storage.start()
            try:
                events, ctx = aiter_of(stream_events(1)), host_context()
                async with guard(events, asyncio.Event(), context=ctx, sink=storage.sink) as g:
                    async for _ in g:
                        pass
                assert storage.provider is not None
                envelope = {"id": "resp_engine", "object": "response", "status": "completed", "output": []}
                await storage.provider.create_response(envelope, None, None)
            finally:
                await storage.aclose()
            assert await tables_in(own) == set()
            stored = await tables_in(asked)
            wanted = {"eventguard_responses", "eventguard_provider_responses", "eventguard_agent_sessions"}
            assert wanted <= stored
            (count,) = await execute(f'SELECT count(*) AS n FROM "{asked}".eventguard_responses')
            assert count["n"] == 1
    finally:
        await app.dispose()
