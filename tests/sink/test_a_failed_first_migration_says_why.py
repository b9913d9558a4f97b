"""A sink whose first use cannot create its schema says why, in the error and as its cause: a
PostgreSQL schema that does not exist was reported only as "the database has no eventguard schema;
run eventguard db upgrade", a command that then fails the same way."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import pytest

from eventguard.errors import SchemaMismatchError
from eventguard.sink import SqlSink
from tests._postgres import PG_URL, unreachable

pytestmark = pytest.mark.postgres


async def test_a_schema_that_does_not_exist_is_said_to_be_why(tmp_path: Path) -> None:
    why = await unreachable()
    if why is not None:
        pytest.skip(why)
    sink = SqlSink(PG_URL, schema=f"eg_absent_{uuid.uuid4().hex[:12]}", spool_path=tmp_path / "spool.jsonl")
    async with asyncio.timeout(30):
        with pytest.raises(
            SchemaMismatchError, match=r"creating it here failed: .*no schema has been selected"
        ):
            await sink.start()
        await sink.aclose()
    assert isinstance(sink, SqlSink)
