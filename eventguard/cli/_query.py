"""A read the store does not offer yet: listing responses of every status, newest first.

``ResponseStore.terminal_states`` lists ended responses only, oldest first; ``responses list`` also
needs responses still in progress, newest first. It runs on the store's own read-only engine.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import func, select

from eventguard.records import ResponseRecord
from eventguard.sql.tables import responses
from eventguard.store import ResponseStore


async def list_responses(
    store: ResponseStore, *, status: str | None, since: datetime | None, limit: int
) -> list[ResponseRecord]:
    """Newest first; ``since`` bounds the last activity (``finished_at``, else ``updated_at``)."""
    r = responses.c
    query = select(responses)
    if status is not None:
        query = query.where(r.status == status)
    if since is not None:
        query = query.where(func.coalesce(r.finished_at, r.updated_at) >= since)
    query = query.order_by(r.pk.desc()).limit(limit)
    async with store._reader.begin() as conn:  # the store's engine for reads (deferred on SQLite)
        rows = (await conn.execute(query)).all()
    return [ResponseRecord.model_validate(row) for row in rows]
