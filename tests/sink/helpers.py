"""Scripted streams and a runner for sink tests."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlalchemy import func, select

from eventguard import guard
from eventguard.lifecycle import Lifecycle, ResponseInfo, State
from eventguard.sink import SqlSink
from eventguard.sink.recorder import SqlRecorder
from eventguard.sql.tables import events
from tests._postgres import PG_DSN

if TYPE_CHECKING:  # conftest imports this module
    from .conftest import Target


def created(rid: str) -> dict[str, Any]:
    return {"type": "response.created", "response": {"id": rid, "status": "in_progress"}}


def in_progress(rid: str) -> dict[str, Any]:
    return {"type": "response.in_progress", "response": {"id": rid, "status": "in_progress"}}


def delta(i: int) -> dict[str, Any]:
    return {"type": "response.output_text.delta", "delta": f"d{i}", "output_index": 0}


def item_done() -> dict[str, Any]:
    return {"type": "response.output_item.done", "item": {"type": "message", "content": "hello"}}


def terminal(rid: str, status: str = "completed") -> dict[str, Any]:
    etype = {"completed": "response.completed", "incomplete": "response.incomplete"}.get(
        status, "response.failed"
    )
    resp: dict[str, Any] = {
        "id": rid,
        "status": status,
        "usage": {"input_tokens": 3, "output_tokens": 5, "total_tokens": 8},
    }
    if status == "failed":
        resp["error"] = {"code": "server_error", "message": "boom"}
    return {"type": etype, "response": resp}


def script(rid: str, n_deltas: int = 5, final: str | None = "completed") -> list[Any]:
    evs: list[Any] = [created(rid), in_progress(rid), *(delta(i) for i in range(n_deltas)), item_done()]
    if final is not None:
        evs.append(terminal(rid, final))
    return evs


async def aiter_of(events: list[Any], pause: float = 0.0) -> AsyncIterator[Any]:
    for ev in events:
        if pause:
            await asyncio.sleep(pause)
        else:
            await asyncio.sleep(0)
        yield ev


async def stored_in_progress(sink: SqlSink, rid: str) -> tuple[Lifecycle, SqlRecorder]:
    """A stream of ``rid`` whose row is stored ``in_progress``: its lifecycle and recorder."""
    lc = Lifecycle(info=ResponseInfo(response_id=rid))
    rec = sink.recorder(lc)
    lc.transition(State.IN_PROGRESS)
    rec.changed()
    await sink.flush()
    return lc, rec


async def run_guarded(sink: SqlSink, events: list[Any], **kwargs: Any) -> list[Any]:
    """Drive one guarded stream to its end; return what the client saw."""
    seen: list[Any] = []
    async with asyncio.timeout(30):
        g = guard(aiter_of(events), asyncio.Event(), sink=sink, **kwargs)
        async with g:
            async for ev in g:
                seen.append(ev)
    return seen


async def stored_events(sink: SqlSink, rid: str) -> int:
    """The events of ``rid`` in the sink's database, read now."""
    async with sink.engine.connect() as conn:
        stmt = select(func.count()).select_from(events).where(events.c.response_id == rid)
        return int((await conn.execute(stmt)).scalar_one())


@asynccontextmanager
async def database_busy(target: Target) -> AsyncIterator[None]:
    """Another client holds a lock that makes the sink's next write wait, until the block ends."""
    if target.kind == "sqlite":
        path = Path(target.url.removeprefix("sqlite+aiosqlite:///"))
        conn = sqlite3.connect(path, isolation_level=None)
        try:
            conn.execute("BEGIN IMMEDIATE")  # the one write lock: the writer's BEGIN waits for it
            yield
            conn.execute("COMMIT")
        finally:
            conn.close()
        return
    import asyncpg  # type: ignore[import-untyped]  # the postgres extra

    pg = await asyncpg.connect(PG_DSN)
    try:
        tr = pg.transaction()
        await tr.start()
        # EXCLUSIVE lets readers read and makes every INSERT into the table wait.
        await pg.execute(f'LOCK TABLE "{target.schema}".{events.name} IN EXCLUSIVE MODE')
        yield
        await tr.commit()
    finally:
        await pg.close()


async def until_in_flight(rec: SqlRecorder) -> None:
    """Waits (5 s at most) until the writer has taken ``rec``'s work into a write."""
    loop = asyncio.get_running_loop()
    give_up = loop.time() + 5.0
    while not rec.inflight and loop.time() < give_up:  # noqa: ASYNC110 - the writer task's state
        await asyncio.sleep(0.005)
    assert rec.inflight, "the writer never took the events"
