"""PostgreSQL: the sink does not ping a connection before each transaction (two round trips
each); a connection the server killed while it sat in the pool fails its write instead, is
dropped from the pool, and the batches go to the spool and are replayed: nothing is lost."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from eventguard.sink import SqlSink
from tests._postgres import execute

from .conftest import Target
from .helpers import run_guarded, script

pytestmark = pytest.mark.postgres


async def _kill_backends(application_name: str) -> int:
    rows = await execute(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
        " WHERE application_name = $1 AND pid <> pg_backend_pid()",
        application_name,
    )
    return len(rows)


async def _events_stored(schema: str) -> int:
    rows = await execute(f'SELECT count(*) FROM "{schema}".eventguard_events')
    return int(rows[0][0])


async def test_a_connection_killed_in_the_pool_loses_nothing(pg_target: Target) -> None:
    assert pg_target.schema is not None
    owner = f"killed-connection-{uuid.uuid4().hex[:12]}"  # only this test's connections die
    sink = SqlSink(pg_target.url, schema=pg_target.schema, spool_path=pg_target.spool, owner=owner)
    before, after, later = script("resp_before", 10), script("resp_after", 10), script("resp_later", 10)
    async with asyncio.timeout(120):
        await sink.start()
        try:
            await run_guarded(sink, before)
            await sink.flush()
            assert await _events_stored(pg_target.schema) == len(before)
            # Every connection the sink holds dies while it sits in the pool.
            assert await _kill_backends(f"eventguard {owner}") >= 1
            await run_guarded(sink, after)
            await sink.flush()
            spooled = sink.stats.batches_spooled
            # The write on the dead connection failed and was spooled (or, had the pool held a
            # live one, went straight in); the next ones go through a fresh connection.
            await run_guarded(sink, later)
            await sink.flush()
            expected = len(before) + len(after) + len(later)
            # A write within the back-off goes to the spool too; the replay takes it once the
            # database answers again (bounded by the timeout above, never a wait for ever).
            while sink.spool.pending() or await _events_stored(pg_target.schema) < expected:
                await asyncio.sleep(0.25)
                await sink.replay_spool()
        finally:
            await sink.aclose()
    assert await _events_stored(pg_target.schema) == len(before) + len(after) + len(later)
    assert not sink.spool.pending()
    assert spooled >= 1, "no ping: the dead connection's write was spooled, then replayed"
