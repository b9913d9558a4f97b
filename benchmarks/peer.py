"""(6) The peer: the OpenAI Agents SDK's ``SQLAlchemySession.add_items`` persisting the same events.

All three consume the same socket-like stream and write to the same SQLite file: eventguard
through ``guard(..., sink=SqlSink(...))``, the peer with one ``add_items`` call per event (what a
wrapper around a stream naturally does) and with one call for the whole batch at the end.
"""

from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path
from typing import Any

from eventguard.sink import SqlSink

from ._common import Row, Sizes, collect, median, network_stream, now, script
from ._sinks import lost, sqlite_count, timed_guarded

NAME = "peer"


async def _peer(path: Path, n: int, per_event: bool) -> float:
    from agents.extensions.memory.sqlalchemy_session import SQLAlchemySession
    from sqlalchemy.ext.asyncio import create_async_engine

    engine = create_async_engine(f"sqlite+aiosqlite:///{path}")
    try:
        session = SQLAlchemySession(f"peer-{per_event}", engine=engine, create_tables=True)
        await session.get_items()  # creates the tables, outside the timing
        t = now()
        batch: list[Any] = []
        async for ev in network_stream(script("resp_peer", n - 3)):
            if per_event:
                await session.add_items([ev])
            else:
                batch.append(ev)
        if batch:
            await session.add_items(batch)
        return now() - t
    finally:
        await engine.dispose()


async def run(sizes: Sizes) -> list[Row]:
    try:
        import agents.extensions.memory.sqlalchemy_session  # noqa: F401
    except ImportError as exc:
        why = f"openai-agents is not installed ({exc}); pip install 'openai-agents>=0.24'"
        return [Row("6 peer", "OpenAI Agents SQLAlchemySession", None, "", skipped=why)]
    n = sizes.peer_events
    eg: list[float] = []
    one: list[float] = []
    many: list[float] = []
    missing = 0
    for rep in range(sizes.reps):
        with tempfile.TemporaryDirectory(prefix="eg-bench-") as d:
            path = Path(d) / "shared.db"
            collect()
            sink = SqlSink(f"sqlite+aiosqlite:///{path}", spool_path=Path(d) / "spool.jsonl")
            await sink.start()
            try:
                eg.append(n / await timed_guarded(sink, f"resp_peer_eg_{rep}", n))
            finally:
                await sink.aclose()
            missing += lost(n, sqlite_count(path))
            collect()
            one.append(n / await _peer(path, n, per_event=True))
            collect()
            many.append(n / await _peer(path, n, per_event=False))
            await asyncio.sleep(0)
    note = f"{n:,} events, same SQLite file; {missing} eventguard events not in the database"
    return [
        Row(
            "6 peer",
            "guard + SqlSink vs add_items per event",
            median(eg),
            "ev/s",
            "SQLAlchemySession.add_items, 1 call/event",
            median(one),
            note=note,
        ),
        Row(
            "6 peer",
            "guard + SqlSink vs add_items per batch",
            median(eg),
            "ev/s",
            "SQLAlchemySession.add_items, 1 call/batch",
            median(many),
        ),
    ]
