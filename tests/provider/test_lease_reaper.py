"""The reaper's pass on a real database: an expired lease is ended exactly once, however many reapers
race for it; a live lease is left alone (``eventguard.replicas``; the processes are in
tests/upstream/test_replicas.py)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from eventguard.envelopes import ANONYMOUS
from eventguard.envelopes import key as row_key
from eventguard.provider import SqlResponseProvider
from eventguard.replicas import leases as lease_sql
from eventguard.replicas.replica import reap
from tests._postgres import PG_URL


async def _leased(provider: SqlResponseProvider, response_id: str, lease: float) -> None:
    async with provider.engine.begin() as conn:
        token = await lease_sql.claim(
            conn, partition=ANONYMOUS, key=row_key(response_id), response_id=response_id,
            owner="dead-replica", lease=lease, takeover=False,
        )  # fmt: skip
    assert token == 1
    envelope = {"id": response_id, "object": "response", "status": "in_progress", "output": []}
    await provider.create_response(envelope, [], [])


async def test_an_expired_lease_is_ended_once_by_racing_reapers_and_a_live_one_is_left(
    sqlite_provider: SqlResponseProvider,
) -> None:
    provider = sqlite_provider
    async with asyncio.timeout(60):
        await _leased(provider, "resp_expired", -1.0)
        await _leased(provider, "resp_live", 3600.0)
        passes = await asyncio.gather(*(reap(provider.engine, reaper=f"r{i}") for i in range(4)))
        assert sorted(r for one in passes for r in one) == ["resp_expired"]
        ended = await provider.get_response("resp_expired")
        assert ended["status"] == "failed" and ended["error"]["code"] == "server_error"
        assert (await provider.get_response("resp_live"))["status"] == "in_progress"
        async with provider.engine.begin() as conn:
            lease = await lease_sql.lease_of(conn, ANONYMOUS, row_key("resp_expired"))
        assert lease is not None and (lease.state, lease.fencing_token) == ("ended", 2)
        assert await reap(provider.engine) == []  # idempotent


async def test_a_second_claim_of_an_id_is_refused_and_a_deleted_one_can_be_claimed_again(
    sqlite_provider: SqlResponseProvider,
) -> None:
    provider = sqlite_provider
    async with asyncio.timeout(60):
        await _leased(provider, "resp_one", 3600.0)
        key = row_key("resp_one")
        async with provider.engine.begin() as conn:
            kwargs = {"partition": ANONYMOUS, "key": key, "response_id": "resp_one", "lease": 10.0}
            assert await lease_sql.claim(conn, owner="other", takeover=False, **kwargs) is None
            assert await lease_sql.claim(conn, owner="dead-replica", takeover=False, **kwargs) is None
            assert await lease_sql.claim(conn, owner="other", takeover=True, **kwargs) is None  # live
        await provider.delete_response("resp_one")  # the plain provider: no fence
        async with provider.engine.begin() as conn:
            assert await lease_sql.mark_deleted(conn, ANONYMOUS, key, "dead-replica")
            assert await lease_sql.claim(conn, owner="other", takeover=False, **kwargs) == 2


ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.postgres
async def test_the_recover_command_ends_an_expired_lease_on_postgresql_and_leaves_a_live_one(
    pg_schema: str,
) -> None:
    """``eventguard recover --expired-leases``, the real command in its own process."""
    provider = SqlResponseProvider(PG_URL, schema=pg_schema)
    command = [
        sys.executable, "-c", "from eventguard.cli import main; main()", "recover", "--older-than", "1h",
        "--expired-leases", "--policy", "failed", "--database-url", PG_URL, "--schema", pg_schema, "--json",
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200"}

    async def run() -> list[str]:
        done = await asyncio.to_thread(
            subprocess.run, command, env=env, capture_output=True, text=True, timeout=120, check=False
        )
        assert done.returncode == 0, done.stderr
        answer = json.loads(done.stdout)
        assert answer["policy"] == "failed"
        return list(answer["marked"])

    async with asyncio.timeout(240):
        await provider.start()
        try:
            await _leased(provider, "resp_expired", -1.0)
            await _leased(provider, "resp_live", 3600.0)
            assert await run() == ["resp_expired"]
            ended = await provider.get_response("resp_expired")
            assert ended["status"] == "failed" and "lease expired" in ended["error"]["message"]
            assert (await provider.get_response("resp_live"))["status"] == "in_progress"
            async with provider.engine.begin() as conn:
                lease = await lease_sql.lease_of(conn, ANONYMOUS, row_key("resp_expired"))
                live = await lease_sql.lease_of(conn, ANONYMOUS, row_key("resp_live"))
            assert lease is not None and (lease.state, lease.fencing_token) == ("ended", 2)
            assert live is not None and (live.state, live.fencing_token) == ("running", 1)
            assert await run() == []  # exactly once
        finally:
            await provider.aclose()
