"""The redaction hook: masked values reach neither the database nor the spool, anomalies included."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from sqlalchemy import text

from eventguard import SqlSink

from .conftest import Target
from .helpers import delta, run_guarded, script, terminal

SECRET = "s3cr3t-user-input"


def mask(event_type: str | None, payload: Any) -> Any:
    """Drops every value that holds the secret, wherever it is nested."""
    if isinstance(payload, dict):
        return {k: mask(event_type, v) for k, v in payload.items()}
    if isinstance(payload, list):
        return [mask(event_type, v) for v in payload]
    if isinstance(payload, str) and SECRET in payload:
        return "***"
    return payload


def secret_script(rid: str) -> list[Any]:
    events = script(rid, n_deltas=2)
    events.insert(2, {**delta(9), "delta": SECRET})
    # A second terminal is dropped by the guard and kept as an anomaly's payload: mask that too.
    late = terminal(rid)
    late["response"]["instructions"] = SECRET
    return [*events, late]


async def test_masked_values_never_reach_the_database(target: Target) -> None:
    sink = SqlSink(target.url, schema=target.schema, spool_path=target.spool, redact=mask)
    async with asyncio.timeout(30):
        await sink.migrate()
        await run_guarded(sink, secret_script("resp_redact"))
        await sink.aclose()
        async with sink.engine.connect() as conn:
            events = (await conn.execute(text("SELECT payload FROM eventguard_events"))).scalars().all()
            anomalies = (await conn.execute(text("SELECT payload FROM eventguard_anomalies"))).scalars().all()
    assert len(events) == len(secret_script("x")) - 1  # all but the dropped second terminal
    assert any(p is not None for p in anomalies)
    assert SECRET not in repr(events)
    assert SECRET not in repr(anomalies)
    assert "***" in repr(events) and "***" in repr(anomalies)


async def test_masked_values_never_reach_the_spool(tmp_path: Path) -> None:
    spool = tmp_path / "spool.jsonl"
    # Nothing listens on port 9: every write goes to the spool.
    sink = SqlSink(
        "postgresql+asyncpg://postgres@127.0.0.1:9/none", spool_path=spool, redact=mask, connect_timeout=1
    )
    async with asyncio.timeout(30):
        await run_guarded(sink, secret_script("resp_spooled"))
        await sink.aclose()
    written = "".join(p.read_text() for p in sorted(tmp_path.glob("spool*")))  # noqa: ASYNC240
    assert "resp_spooled" in written
    assert SECRET not in written
