"""``schema=`` names one PostgreSQL schema, exactly as written, or is refused where it is given.

Before, an engine eventguard built put the name into ``search_path`` unquoted: ``EgMixed`` named the
schema ``egmixed`` (the offline migration script and a borrowed engine quoted it: three readings of
one setting), and ``a, public`` named a list, where tables could land in ``public``. A name PostgreSQL
cannot hold (empty, a NUL, longer than 63 bytes, which it cuts without a word) failed late, inside the
driver: a lone surrogate as an ``AttributeError`` from its startup.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from eventguard import ResponseStore, SqlResponseProvider, SqlSink, guard
from tests._postgres import PG_URL, execute, unreachable

STEP = 60.0

TAKERS: dict[str, Callable[[str], object]] = {
    "SqlSink": lambda schema: SqlSink(PG_URL, schema=schema),
    "ResponseStore": lambda schema: ResponseStore(PG_URL, schema=schema),
    "SqlResponseProvider": lambda schema: SqlResponseProvider(PG_URL, schema=schema),
}


@pytest.mark.parametrize("taker", sorted(TAKERS))
@pytest.mark.parametrize(
    "schema",
    ["", "a\x00b", "\udcff", "x" * 64, "é" * 32, "\x00" * 10_000],
    ids=["empty", "nul", "lone-surrogate", "64-ascii", "64-bytes-of-utf8", "long-nul"],
)
def test_a_schema_name_postgresql_cannot_hold_is_refused_where_it_is_given(taker: str, schema: str) -> None:
    with pytest.raises(ValueError, match=r"^schema must be a PostgreSQL name: 1 to 63 bytes") as caught:
        TAKERS[taker](schema)
    assert str(caught.value).isprintable()
    assert not schema or schema not in str(caught.value)


@pytest.mark.parametrize("taker", sorted(TAKERS))
def test_the_longest_schema_name_postgresql_holds_is_taken(taker: str) -> None:
    made = TAKERS[taker]("é" * 31 + "x")  # 63 bytes
    if isinstance(made, ResponseStore):
        asyncio.run(made.aclose())


async def _tables_in(schema: str) -> set[str]:
    rows = await execute("SELECT table_name FROM information_schema.tables WHERE table_schema = $1", schema)
    return {row["table_name"] for row in rows}


def _quoted(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


async def _stream() -> AsyncIterator[dict[str, Any]]:
    yield {"type": "response.created", "response": {"id": "resp_schema", "status": "in_progress"}}
    yield {"type": "response.output_text.delta", "delta": "hi"}
    yield {"type": "response.completed", "response": {"id": "resp_schema", "status": "completed"}}


async def _write_and_read(schema: str) -> None:
    public_before = await _tables_in("public")
    folded_before = await _tables_in(schema.lower())
    sink = SqlSink(PG_URL, schema=schema, auto_migrate=True)
    await sink.start()
    async with guard(_stream(), asyncio.Event(), sink=sink, cancel_grace=None) as g:
        async for _ in g:
            pass
    await sink.aclose()
    assert {"eventguard_responses", "eventguard_events"} <= await _tables_in(schema)
    assert await _tables_in("public") == public_before
    if schema.lower() != schema:
        assert await _tables_in(schema.lower()) == folded_before
    async with ResponseStore(PG_URL, schema=schema) as store:
        record = await store.get("resp_schema")
    assert record is not None and record.status == "completed"


@pytest.mark.parametrize("prefix", ["EgMixedCase", "eg list, public", 'eg "quoted"'])
def test_the_tables_and_rows_land_in_the_schema_as_written(prefix: str) -> None:
    """Mixed case, a comma and a space, a double quote: one schema each, the one created under that
    exact name; nothing lands in ``public`` or in a folded name."""

    async def main() -> None:
        why = await unreachable()
        if why is not None:
            pytest.skip(why)
        schema = f"{prefix}_{uuid.uuid4().hex[:8]}"
        await execute(f"CREATE SCHEMA {_quoted(schema)}")
        try:
            async with asyncio.timeout(STEP):
                await _write_and_read(schema)
        finally:
            await execute(f"DROP SCHEMA {_quoted(schema)} CASCADE")

    asyncio.run(main())


@pytest.mark.parametrize("schema", ["", "x" * 64, "\udcff", "\x1b[2J" * 20])
def test_the_cli_says_a_bad_schema_is_a_bad_argument(schema: str) -> None:
    """Not "cannot use the database ...: ValueError": the database was never asked."""
    from typer.testing import CliRunner

    from eventguard.cli import app

    argv = ["responses", "list", "--database-url", PG_URL, "--schema", schema]
    result = CliRunner().invoke(app, argv)
    assert result.exit_code == 2, result.output
    line = result.output.strip()
    assert line.startswith("eventguard: error: --schema ") and "cannot use the database" not in line, line
    assert "must be a PostgreSQL name" in line and "\x1b" not in line
