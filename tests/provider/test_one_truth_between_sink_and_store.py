"""One truth: ``eventguard verify`` compares each response's verified status with the status of the
envelope the host's SQL response store serves, and reports the two that contradict each other."""

from __future__ import annotations

import asyncio
from pathlib import Path

from eventguard import ResponseStore, SqlSink, guard
from eventguard.testing import Scripted, stream_events
from eventguard.verify import verify

from .conftest import Database, Store
from .test_parity_with_the_hosts_store import envelope

T = 60


async def _recorded(db: Database, spool: Path, rid: str, final: str) -> None:
    """A guarded stream ending ``final``, recorded by a sink on the same database."""
    events = [
        {**e, "response": {**e["response"], "id": rid}} if "response" in e else e
        for e in stream_events(2, final)
    ]
    sink = SqlSink(db.url, schema=db.schema, spool_path=spool)
    async with sink, guard(Scripted(events), asyncio.Event(), sink=sink) as g:
        async for _ in g:
            pass


async def test_verify_reports_a_verified_status_the_envelope_contradicts(
    sql_store: Store, sql_database: Database, tmp_path: Path
) -> None:
    p = sql_store.provider
    async with asyncio.timeout(T):
        for rid, recorded, served in [
            ("resp_agree", "completed", "completed"),
            ("resp_lie", "completed", "failed"),
            ("resp_lag", "failed", "in_progress"),  # the host's terminal write has not landed yet
            ("resp_gone", "completed", "cancelled"),  # deleted envelopes are not compared
        ]:
            await _recorded(sql_database, tmp_path / f"{rid}.jsonl", rid, recorded)
            await p.create_response(envelope(rid), None, None)
            await p.update_response(envelope(rid, status=served))
        await p.delete_response("resp_gone")
        async with ResponseStore(sql_database.url, schema=sql_database.schema) as store:
            report = await verify(store)
    assert [(d.response_id, d.problem) for d in report.disagreements] == [
        ("resp_lie", "recorded completed, but the host's stored envelope says failed")
    ]
