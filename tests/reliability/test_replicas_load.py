"""Issue 16's load and failover runs, bounded for CI (PostgreSQL, real replica processes).

The full sizes are the documented command (README "Several replicas"):

    PYTHONPATH=$PWD python -m tests.reliability.replicas              # 500 responses, 3 replicas
    PYTHONPATH=$PWD python -m tests.reliability.replicas --kills 20   # 20 SIGKILLs

Here: 60 responses over 3 replicas (6 cancelled through another replica, a third of the GETs
elsewhere, a third of the responses with a platform user) and 2 SIGKILLs at random points, with the
same checks as the command.
"""

from __future__ import annotations

import asyncio
import json

import asyncpg  # type: ignore[import-untyped]
import pytest

from tests.reliability import replicas as runs
from tests.reliability._common import report

pytestmark = [pytest.mark.upstream, pytest.mark.postgres, pytest.mark.slow]

ADMIN = "postgresql://postgres@127.0.0.1:5432/test"


@pytest.fixture(autouse=True)
async def _database() -> None:
    """The ``h_r16`` database the runs use (created when missing); skip when no server answers."""
    try:
        async with asyncio.timeout(5):
            admin = await asyncpg.connect(ADMIN)
    except (OSError, asyncpg.PostgresError, TimeoutError) as exc:
        pytest.skip(f"no PostgreSQL server reachable at {ADMIN}: {type(exc).__name__}: {exc}")
    try:
        async with asyncio.timeout(30):
            if not await admin.fetchval("SELECT 1 FROM pg_database WHERE datname = 'h_r16'"):
                await admin.execute('CREATE DATABASE "h_r16"')
    finally:
        await admin.close()


async def test_a_load_over_three_replicas_loses_nothing_and_every_replica_agrees() -> None:
    async with asyncio.timeout(300):
        figures = await runs.run(60, 3, 5.0)
    report("replicas_load", **figures)
    shown = json.dumps(figures)
    assert figures["replicas_disagreeing"] == 0, shown
    assert figures["lifecycles_not_ended"] == figures["events_lost"] == 0, shown
    assert figures["cancels_relayed"]["cancelled"] == figures["cancels_relayed"]["asked"] == 6, shown
    assert figures["leases_still_running"] == 0 and figures["gets_on_another_replica"] > 0, shown
    # A third carry a platform user: their leases must sit in their envelopes' partition.
    assert figures["responses_with_a_user"] == 20, shown
    assert figures["leases_outside_their_partition"] == 0, shown


async def test_sigkills_at_random_points_end_every_response_once_and_keep_what_was_flushed() -> None:
    async with asyncio.timeout(300):
        figures = await runs.kills(2, 1.5)
    report("replicas_failover", **figures)
    shown = json.dumps(figures)
    assert figures["responses"] == 8 and figures["ended_once"] == 8, shown
    assert figures["ended_twice"] == figures["not_ended"] == figures["events_lost"] == 0, shown
