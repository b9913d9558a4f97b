"""``--schema`` reaches the schema a ``SqlSink(schema=...)`` wrote to, on every command that reads or
writes eventguard's tables (issue 14: a schema sink's spool could only be replayed into the wrong one)."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import asyncpg  # type: ignore[import-untyped]
import pytest

from eventguard import guard
from eventguard.sink import SqlSink
from eventguard.sql.migrate import expected_heads

from .conftest import STEP, Cli, script

pytestmark = pytest.mark.postgres

PG_URL = "postgresql+asyncpg://postgres@127.0.0.1:5432/test"
PG_DSN = "postgresql://postgres@127.0.0.1:5432/test"


async def _admin(sql: str) -> None:
    async with asyncio.timeout(STEP):
        conn = await asyncpg.connect(PG_DSN)
        try:
            await conn.execute(sql)
        finally:
            await conn.close()


@pytest.fixture
def pg_schema() -> Iterator[str]:
    schema = f"eg_cli_{uuid.uuid4().hex[:12]}"
    try:
        asyncio.run(_admin(f'CREATE SCHEMA "{schema}"'))
    except (OSError, asyncpg.PostgresError, TimeoutError) as exc:
        pytest.skip(f"no PostgreSQL at {PG_DSN}: {type(exc).__name__}: {exc}")
    try:
        yield schema
    finally:
        asyncio.run(_admin(f'DROP SCHEMA "{schema}" CASCADE'))


async def _record_into(schema: str, spool: Path, response_id: str) -> None:
    """One completed response, guarded into ``schema``'s tables."""
    async with asyncio.timeout(STEP):
        sink = SqlSink(PG_URL, schema=schema, spool_path=spool, auto_migrate=False)
        await sink.start()
        try:

            async def stream() -> AsyncIterator[dict[str, Any]]:
                for event in script(response_id, "completed"):
                    yield event

            async with guard(stream(), asyncio.Event(), sink=sink) as events:
                async for _ in events:
                    pass
        finally:
            await sink.aclose()


def test_every_command_reads_and_writes_the_schema_it_is_given(pg_schema: str, tmp_path: Path) -> None:
    cli = Cli(PG_URL)
    up = cli("db", "upgrade", "--schema", pg_schema, "--json")
    assert up.exit_code == 0, up.output
    assert json.loads(up.stdout)["after"] == list(expected_heads())
    current = cli("db", "current", "--schema", pg_schema, "--json")
    assert json.loads(current.stdout)["up_to_date"] is True

    rid = f"resp_schema_{uuid.uuid4().hex[:8]}"
    asyncio.run(_record_into(pg_schema, tmp_path / "spool.jsonl", rid))

    listed = cli("responses", "list", "--schema", pg_schema, "--json")
    assert listed.exit_code == 0, listed.output
    assert [r["response_id"] for r in json.loads(listed.stdout)] == [rid]
    shown = cli("responses", "show", rid, "--schema", pg_schema, "--json")
    assert shown.exit_code == 0 and json.loads(shown.stdout)["response"]["status"] == "completed"
    verified = cli("verify", "--schema", pg_schema, "--json")
    assert verified.exit_code == 0 and json.loads(verified.stdout)["checked"] == 1
    stats = cli("stats", "--schema", pg_schema, "--json")
    assert json.loads(stats.stdout)["total"] == 1
    replay = cli("spool", "replay", "--schema", pg_schema, "--spool", str(tmp_path / "spool.jsonl"), "--json")
    assert replay.exit_code == 0, replay.output
    for command in (["prune", "--older-than", "1d"], ["recover", "--older-than", "1d"]):
        done = cli(*command, "--schema", pg_schema, "--json")
        assert done.exit_code == 0, done.output
    stamped = cli("db", "stamp", "--schema", pg_schema, "--json")
    assert stamped.exit_code == 0, stamped.output
    down = cli("db", "downgrade", "base", "--schema", pg_schema, "--json")
    assert down.exit_code == 0 and json.loads(down.stdout)["after"] == []


def test_the_demo_stores_its_responses_in_the_schema_it_is_given(pg_schema: str) -> None:
    """Issue 14: every other command had --schema; the demo wrote to the search path's schema."""
    cli = Cli(PG_URL)
    demo = cli("demo", "--schema", pg_schema, "--json")
    assert demo.exit_code == 0, demo.output
    ids = [row["response_id"] for row in json.loads(demo.stdout)["responses"]]
    assert len(ids) == 5

    async def stored() -> list[str]:
        async with asyncio.timeout(STEP):
            conn = await asyncpg.connect(PG_DSN)
            try:
                query = f'SELECT response_id FROM "{pg_schema}".eventguard_responses ORDER BY pk'
                rows = await conn.fetch(query)
            finally:
                await conn.close()
        return [row["response_id"] for row in rows]

    assert asyncio.run(stored()) == ids
    verified = cli("verify", "--schema", pg_schema, "--json")
    assert verified.exit_code == 0 and json.loads(verified.stdout)["checked"] == 5
