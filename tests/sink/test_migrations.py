"""Alembic: upgrade, downgrade, the schema check, and migrations == tables.py."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import inspect, text
from sqlalchemy.engine import Connection

from eventguard import State
from eventguard.errors import SchemaMismatchError
from eventguard.lifecycle import ENDED_STATES, TERMINAL_STATES
from eventguard.sink import SqlSink
from eventguard.sql import migrate as mig
from eventguard.sql.tables import ENDED, STATES, TERMINAL, VERSION_TABLE, metadata

from .conftest import Target


def test_state_strings_mirror_the_lifecycle() -> None:
    assert set(STATES) == {s.value for s in State}
    assert set(TERMINAL) == {s.value for s in TERMINAL_STATES}
    assert set(ENDED) == {s.value for s in ENDED_STATES}


def test_the_migrations_and_their_head_are_found() -> None:
    assert (mig.migrations_dir() / "env.py").is_file()
    # 0006 (a lease says background), 0007 (agent sessions), then 0008 (events lose the type index)
    assert mig.expected_heads() == ("0008",)


async def test_upgrade_downgrade_and_check(target: Target) -> None:
    sink = SqlSink(target.url, schema=target.schema, spool_path=target.spool, auto_migrate=False)
    async with asyncio.timeout(60):
        with pytest.raises(SchemaMismatchError) as err:
            await sink.start()
        assert "eventguard db upgrade" in str(err.value)
        assert err.value.command == "eventguard db upgrade"
        await sink.migrate()
        await mig.check(sink.engine)
        await sink.downgrade("base")
        assert await mig.current_revision(sink.engine) == ()
        async with sink.engine.connect() as conn:
            left = await conn.run_sync(lambda c: inspect(c).get_table_names())
        assert not [t for t in left if t.startswith("eventguard_") and t != VERSION_TABLE]
        await sink.migrate()
        await sink.aclose()


async def test_events_carry_no_type_index_from_0008_and_get_it_back_below(target: Target) -> None:
    # Every event row paid for that index on every write, and no query filters by type (0008).
    sink = SqlSink(target.url, schema=target.schema, spool_path=target.spool, auto_migrate=False)

    def indexed_columns(conn: Connection) -> list[list[str | None]]:
        indexes = inspect(conn).get_indexes("eventguard_events", schema=target.schema)
        return [ix["column_names"] for ix in indexes]

    async with asyncio.timeout(60):
        await sink.migrate()
        async with sink.engine.connect() as conn:
            assert ["type"] not in await conn.run_sync(indexed_columns)
        await sink.downgrade("0007")
        async with sink.engine.connect() as conn:
            assert ["type"] in await conn.run_sync(indexed_columns)
        await sink.migrate()
        await mig.check(sink.engine)
        await sink.aclose()


async def test_schema_ahead_fails_fast_with_the_command(target: Target) -> None:
    sink = SqlSink(target.url, schema=target.schema, spool_path=target.spool)
    async with asyncio.timeout(60):
        await sink.migrate()
        async with sink.engine.begin() as conn:
            await conn.execute(text(f"UPDATE {VERSION_TABLE} SET version_num = 'ffff_future'"))
        with pytest.raises(SchemaMismatchError) as err:
            await sink.start()
        assert "newer" in str(err.value)
        await sink.aclose()


async def test_migrations_match_the_tables(target: Target) -> None:
    sink = SqlSink(target.url, schema=target.schema, spool_path=target.spool)

    def diff(conn: Connection) -> list[Any]:
        ctx = MigrationContext.configure(conn, opts={"version_table": VERSION_TABLE, "compare_type": True})
        return list(compare_metadata(ctx, metadata))

    async with asyncio.timeout(60):
        await sink.migrate()
        async with sink.engine.connect() as conn:
            assert await conn.run_sync(diff) == []
        await sink.aclose()


async def test_auto_migrate_creates_an_empty_database_only(target: Target) -> None:
    async with asyncio.timeout(60):
        sink = SqlSink(target.url, schema=target.schema, spool_path=target.spool)
        await sink.start()  # empty database: created
        await mig.check(sink.engine)
        await sink.aclose()


@pytest.mark.parametrize("revision", [123, None, "", ["base"], "\x1b[2J", "he\x00ad"])
async def test_a_revision_that_is_not_one_is_refused_before_anything_runs(
    revision: Any, tmp_path: Path
) -> None:
    """Before, Alembic failed on it deep inside (TypeError: argument of type 'int' is not iterable,
    an AssertionError for a list), after the migration lock was taken."""
    async with asyncio.timeout(60):
        sink = SqlSink(f"sqlite:///{tmp_path / 'eg.db'}", spool_path=tmp_path / "spool.jsonl")
        for run in (sink.migrate, sink.downgrade):
            with pytest.raises(ValueError, match=r"^revision must be a revision id"):
                await run(revision)
        await sink.migrate("head")  # the sink is still usable
        await sink.aclose()
