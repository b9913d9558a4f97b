"""Reads the store does not offer yet (see the report in the CLI's docs): listing every status.

``ResponseStore.terminal_states`` lists ended responses only, oldest first; ``responses list`` and
``verify`` also need responses still in progress, and the list shows the newest first.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import datetime

from sqlalchemy import func, select
from sqlalchemy.engine import URL
from sqlalchemy.ext.asyncio import AsyncEngine

from eventguard import _db
from eventguard._records import ResponseRecord
from eventguard.sink.tables import STATES, responses


@asynccontextmanager
async def reader(url: URL) -> AsyncIterator[AsyncEngine]:
    """An engine for reads: on SQLite, deferred transactions (never the write lock)."""
    engine = _db.create_engine(url)
    try:
        yield engine.execution_options(**{_db.SQLITE_BEGIN_OPTION: "DEFERRED"})
    finally:
        await engine.dispose()


def check_status(status: str) -> str:
    if status not in STATES:
        raise ValueError(f"unknown status {status!r}: expected one of {', '.join(STATES)}")
    return status


async def list_responses(
    url: URL, *, status: str | None, since: datetime | None, limit: int
) -> list[ResponseRecord]:
    """Newest first; ``since`` bounds the last activity (``finished_at``, else ``updated_at``)."""
    r = responses.c
    query = select(responses)
    if status is not None:
        query = query.where(r.status == check_status(status))
    if since is not None:
        query = query.where(func.coalesce(r.finished_at, r.updated_at) >= since)
    query = query.order_by(r.pk.desc()).limit(limit)
    async with reader(url) as engine, engine.connect() as conn:
        rows = (await conn.execute(query)).all()
    return [ResponseRecord.model_validate(row) for row in rows]


async def all_response_ids(url: URL, *, batch: int = 1000) -> AsyncIterator[str]:
    """Every stored response id, in insertion order, in pages of ``batch``."""
    r = responses.c
    async with reader(url) as engine:
        after = 0
        while True:
            async with engine.connect() as conn:
                rows = (
                    await conn.execute(
                        select(r.pk, r.response_id).where(r.pk > after).order_by(r.pk).limit(batch)
                    )
                ).all()
            if not rows:
                return
            for row in rows:
                yield row.response_id
            after = rows[-1].pk
