"""One sink, several event loops one after the other (a module-level sink, two ``asyncio.run()``
calls, function-scoped test loops): each loop gets its own writer and engine, nothing is spooled,
nothing is lost, nothing is left to "Task exception was never retrieved". Plain (sync) tests: each
``asyncio.run()`` is a loop of its own. On SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
import gc
import logging
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, select

from eventguard.errors import SinkLoopError
from eventguard.sink import SqlSink
from eventguard.sql import engine as _db
from eventguard.sql.tables import events, responses
from tests._postgres import PG_URL, fresh_schema_sync

from .helpers import run_guarded, script


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def where(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[dict[str, Any]]:
    """Sync fixture (no event loop of its own): the sink's URL, schema and spool."""
    spool = tmp_path / "spool.jsonl"
    if request.param == "sqlite":
        yield {"url": f"sqlite+aiosqlite:///{tmp_path / 'eg.db'}", "schema": None, "spool_path": spool}
    else:
        with fresh_schema_sync("eg_test") as schema:
            yield {"url": PG_URL, "schema": schema, "spool_path": spool}


class _LoopErrors:
    """Whatever a loop reports through its exception handler ("Task exception was never
    retrieved", "Task was destroyed but it is pending", ...)."""

    def __init__(self) -> None:
        self.seen: list[str] = []

    def install(self) -> None:
        asyncio.get_running_loop().set_exception_handler(
            lambda _loop, ctx: self.seen.append(f"{ctx.get('message')}: {ctx.get('exception')!r}")
        )


async def _stored(where: dict[str, Any], rid: str) -> tuple[str | None, int]:
    engine = _db.create_engine(_db.resolve_url(where["url"]), schema=where["schema"])
    try:
        async with asyncio.timeout(30), engine.connect() as conn:
            status = (
                await conn.execute(select(responses.c.status).where(responses.c.response_id == rid))
            ).scalar()
            n = (
                await conn.execute(
                    select(func.count()).select_from(events).where(events.c.response_id == rid)
                )
            ).scalar_one()
    finally:
        await engine.dispose()
    return status, int(n)


def test_one_sink_serves_two_asyncio_runs(where: dict[str, Any], caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING)
    errors = _LoopErrors()
    sink = SqlSink(**where)  # made outside any loop, as a module-level sink is

    async def stream(rid: str, *, close: bool = False) -> None:
        errors.install()
        async with asyncio.timeout(30):
            await run_guarded(sink, script(rid, n_deltas=10))
            if close:
                await sink.aclose()

    asyncio.run(stream("resp_loop_1"))
    asyncio.run(stream("resp_loop_2"))
    asyncio.run(stream("resp_loop_3", close=True))
    gc.collect()  # a task's unretrieved exception is reported when it is collected
    n = len(script("x", n_deltas=10))
    assert [asyncio.run(_stored(where, f"resp_loop_{i}")) for i in (1, 2, 3)] == [("completed", n)] * 3
    assert errors.seen == []
    assert sink.stats.batches_spooled == 0
    assert not where["spool_path"].exists()
    assert "Task exception was never retrieved" not in caplog.text
    assert "different event loop" not in caplog.text
    assert not [r for r in caplog.records if r.name == "eventguard.sink" and r.levelno >= logging.ERROR]


def test_a_started_sink_moves_to_the_next_loop(where: dict[str, Any]) -> None:
    # start() in one loop (engine, pool, writer bound to it), streams in the next ones.
    errors = _LoopErrors()
    sink = SqlSink(**where)

    async def begin() -> None:
        errors.install()
        async with asyncio.timeout(30):
            await sink.start()

    async def stream(rid: str) -> None:
        errors.install()
        async with asyncio.timeout(30):
            await run_guarded(sink, script(rid, n_deltas=3))
            await sink.flush()

    asyncio.run(begin())
    asyncio.run(stream("resp_next_1"))
    asyncio.run(stream("resp_next_2"))

    async def end() -> None:
        errors.install()
        async with asyncio.timeout(30):
            await sink.aclose()

    asyncio.run(end())
    gc.collect()
    assert errors.seen == []
    assert asyncio.run(_stored(where, "resp_next_2")) == ("completed", 7)
    assert sink.stats.batches_spooled == 0


def test_a_sink_busy_in_another_threads_loop_says_what_to_do(tmp_path: Path) -> None:
    sink = SqlSink(f"sqlite+aiosqlite:///{tmp_path / 'eg.db'}", spool_path=tmp_path / "spool.jsonl")
    started, stop = threading.Event(), threading.Event()

    async def hold() -> None:
        async with asyncio.timeout(30):
            await sink.start()
            started.set()
            await asyncio.to_thread(stop.wait, 30)
            await sink.aclose()

    other = threading.Thread(target=asyncio.run, args=(hold(),))
    other.start()
    try:
        assert started.wait(30)

        async def use() -> None:
            async with asyncio.timeout(30):
                await run_guarded(sink, script("resp_thread", n_deltas=1))

        with pytest.raises(SinkLoopError, match="one SqlSink per event loop"):
            asyncio.run(use())
    finally:
        stop.set()
        other.join(30)
    assert not other.is_alive()
