"""A PostgreSQL URL with libpq's ``?application_name=`` connects, under that name: asyncpg takes it
only as a server setting, and passed on as a keyword every connection failed with a ``TypeError``
that the sink took for an outage (spooling every response "until the database is back")."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from sqlalchemy import text

from eventguard.sink import SqlSink
from tests._postgres import PG_URL

from .helpers import run_guarded, script, stored_events

pytestmark = pytest.mark.postgres


async def test_a_url_with_an_application_name_records_under_that_name(pg_schema: str, tmp_path: Path) -> None:
    sink = SqlSink(
        f"{PG_URL}?application_name=billing-api", schema=pg_schema, spool_path=tmp_path / "s.jsonl"
    )
    async with asyncio.timeout(30):
        await sink.start()
        try:
            await run_guarded(sink, script("resp_named", n_deltas=2))
            await sink.flush()
            assert await stored_events(sink, "resp_named") == len(script("resp_named", n_deltas=2))
            async with sink.engine.connect() as conn:
                name = (await conn.execute(text("SELECT current_setting('application_name')"))).scalar_one()
            assert name == "billing-api"
        finally:
            await sink.aclose()
    assert sink.stats.batches_spooled == 0
