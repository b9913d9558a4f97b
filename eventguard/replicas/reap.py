"""What the reaper writes when it takes an expired lease: the envelope and the lifecycle, ended by
the policy, in the transaction that took the lease (so exactly once across replicas)."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import func, select, update
from sqlalchemy.dialects import postgresql as pg_dialect
from sqlalchemy.dialects import sqlite as sqlite_dialect
from sqlalchemy.ext.asyncio import AsyncConnection

from eventguard.envelopes import dump as _dump
from eventguard.envelopes import load as _load
from eventguard.envelopes import shown as _shown
from eventguard.lifecycle import Cause
from eventguard.sql.tables import ENDED, provider_responses, responses, transitions

#: The cause the reaper records: the replica that ran the response is gone (its lease expired).
OWNER_LOST = Cause.OWNER_LOST.value


def failed_envelope(body: dict[str, Any], reaper: str) -> dict[str, Any]:
    """The stored envelope, ended ``failed`` with an error saying the owner was lost."""
    ended = dict(body)
    ended["status"] = "failed"
    ended["error"] = {
        "code": "server_error",
        "message": f"the replica running this response was lost (lease expired); ended by {reaper}",
    }
    return ended


async def end_envelope(conn: AsyncConnection, partition: str, key: str, reaper: str) -> bool:
    """End a live, unended envelope ``failed``; False when there is none to end."""
    r = provider_responses.c
    row = (
        await conn.execute(
            select(r.pk, r.body, r.status).where(
                r.partition == partition, r.response_key == key, r.deleted.is_(False)
            )
        )
    ).first()
    if row is None or row.body is None or row.status in ENDED:
        return False
    body = failed_envelope(_load(row.body, "a reaped envelope"), reaper)
    await conn.execute(
        update(provider_responses)
        .where(r.pk == row.pk)
        .values(body=_dump(body, "a reaped envelope"), status="failed", updated_at=datetime.now(UTC),
                version=r.version + 1)
    )  # fmt: skip
    return True


async def end_lifecycle(conn: AsyncConnection, response_id: str, status: str, reaper: str) -> bool:
    """End the sink's row of the response (``status``, cause ``owner_lost``) with its transition;
    False when it has none or it already ended (the sink never moves an ended row)."""
    shown = _shown(response_id)
    r = responses.c
    row = (await conn.execute(select(r.status, r.attempt, r.version).where(r.response_id == shown))).first()
    now = datetime.now(UTC)
    if row is None:
        # The owner died before its sink flushed the row: the reaper's verdict is the first row,
        # so the owner's own rows, should they arrive later (a paused replica), find it ended.
        row = await _first_row(conn, shown, now)
        if row is None:
            return False
    if row.status in ENDED:
        return False
    taken = await conn.execute(
        update(responses)
        .where(r.response_id == shown, r.version == row.version)
        .values(status=status, cause=OWNER_LOST, finished_at=now, updated_at=now, owner=reaper,
                version=r.version + 1)
    )  # fmt: skip
    if taken.rowcount != 1:
        return False
    t = transitions.c
    lowest = (
        await conn.execute(select(func.min(t.idx)).where(t.response_id == shown, t.attempt == row.attempt))
    ).scalar_one()
    await conn.execute(
        transitions.insert().values(
            response_id=shown,
            attempt=row.attempt,
            idx=min(lowest or 0, 0) - 1,
            from_state=row.status,
            to_state=status,
            cause=OWNER_LOST,
            reason=json.dumps({"reaper": reaper, "why": "lease expired"}),
            at=now,
        )
    )
    return True


async def _first_row(conn: AsyncConnection, shown: str, now: datetime) -> Any:
    """Insert an ``in_progress`` row for a response the sink never recorded (None: one appeared)."""
    insert = (sqlite_dialect if conn.dialect.name == "sqlite" else pg_dialect).insert(responses)
    done = await conn.execute(
        insert.values(
            response_id=shown, status="in_progress", attempt=1, owner=None, updated_at=now
        ).on_conflict_do_nothing()
    )
    r = responses.c
    if done.rowcount != 1:
        return None
    return (await conn.execute(select(r.status, r.attempt, r.version).where(r.response_id == shown))).first()
