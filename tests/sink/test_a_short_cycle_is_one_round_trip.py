"""PostgreSQL: a short write cycle (a short response's start or end) is one statement on the wire,
its own transaction: not BEGIN, a statement per table and COMMIT (issue 13: at concurrency 1 a
short response is its round trips). The statements are counted by asyncpg's own query logger on
every connection the sink's pool hands out."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from sqlalchemy import event

from eventguard.sink import SqlSink
from tests._postgres import execute

from .conftest import Target
from .helpers import run_guarded, script

pytestmark = pytest.mark.postgres


def _log_queries(sink: SqlSink) -> list[str]:
    """Every query the sink's pooled connections send from now on (asyncpg's query logger)."""
    sent: list[str] = []
    logged: set[int] = set()

    def log(record: Any) -> None:
        sent.append(record.query)

    def checkout(dbapi_conn: Any, _record: Any, _proxy: Any) -> None:
        driver = dbapi_conn.driver_connection
        if id(driver) not in logged:
            logged.add(id(driver))
            driver.add_query_logger(log)

    event.listen(sink.engine.sync_engine.pool, "checkout", checkout)
    return sent


async def test_a_short_response_is_written_in_one_statement(pg_target: Target) -> None:
    schema = pg_target.schema
    assert schema is not None
    # No timer: the response's end alone wakes the writer, so its whole write is one cycle.
    sink = SqlSink(pg_target.url, schema=schema, spool_path=pg_target.spool, flush_interval=3600)
    events = script("resp_short", n_deltas=5)
    async with asyncio.timeout(60):
        await sink.start()
        await run_guarded(sink, script("resp_warm", n_deltas=5))  # the staging table, the prepare
        sent = _log_queries(sink)
        await run_guarded(sink, events)
        writes = list(sent)
        await sink.aclose()
        stored = await execute(
            f'SELECT count(*) FROM "{schema}".eventguard_events WHERE response_id = $1', "resp_short"
        )
        rows = await execute(
            f'SELECT status FROM "{schema}".eventguard_responses WHERE response_id = $1', "resp_short"
        )
        transitions = await execute(
            f'SELECT count(*) FROM "{schema}".eventguard_transitions WHERE response_id = $1', "resp_short"
        )
    assert len(writes) == 1, writes
    assert writes[0].startswith("WITH up AS (INSERT INTO")
    assert int(stored[0][0]) == len(events)
    assert rows[0][0] == "completed"
    assert int(transitions[0][0]) >= 2  # in_progress, completed: written in the same statement
