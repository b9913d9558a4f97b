"""Driving guarded streams into a real SqlSink, and counting what reached the database."""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import tempfile
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import asyncpg  # type: ignore[import-untyped]

from eventguard import guard
from eventguard.sink import SqlSink

from ._common import PG_DSN, PG_URL, drain, network_stream, now, script


async def guarded(sink: SqlSink, rid: str, n_events: int) -> int:
    """One guarded stream of ``n_events`` events (lifecycle included) through ``sink``."""
    async with guard(network_stream(script(rid, n_events - 3)), asyncio.Event(), sink=sink) as g:
        return await drain(g)


async def timed_guarded(sink: SqlSink, rid: str, n_events: int) -> float:
    """Seconds from the first event to everything written (the stream's end plus a flush)."""
    t = now()
    await guarded(sink, rid, n_events)
    await sink.flush()
    return now() - t


def sqlite_count(path: Path, table: str = "eventguard_events") -> int:
    with contextlib.closing(sqlite3.connect(path)) as conn:
        return int(conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0])


@contextlib.asynccontextmanager
async def sqlite_sink() -> AsyncIterator[tuple[SqlSink, Path]]:
    with tempfile.TemporaryDirectory(prefix="eg-bench-") as d:
        path = Path(d) / "bench.db"
        sink = SqlSink(f"sqlite+aiosqlite:///{path}", spool_path=Path(d) / "spool.jsonl")
        await sink.start()
        try:
            yield sink, path
        finally:
            await sink.aclose()


async def pg_unreachable() -> str | None:
    try:
        async with asyncio.timeout(5):
            conn = await asyncpg.connect(PG_DSN)
            await conn.close()
    except (OSError, asyncpg.PostgresError, TimeoutError) as exc:
        return f"no PostgreSQL at {PG_DSN} ({type(exc).__name__}: {exc})"
    return None


@contextlib.asynccontextmanager
async def pg_schema() -> AsyncIterator[str]:
    """A fresh schema, dropped afterwards."""
    schema = f"eg_bench_{uuid.uuid4().hex[:10]}"
    conn = await asyncpg.connect(PG_DSN)
    try:
        await conn.execute(f'CREATE SCHEMA "{schema}"')
    finally:
        await conn.close()
    try:
        yield schema
    finally:
        conn = await asyncpg.connect(PG_DSN)
        try:
            await conn.execute(f'DROP SCHEMA "{schema}" CASCADE')
        finally:
            await conn.close()


@contextlib.asynccontextmanager
async def pg_sink() -> AsyncIterator[tuple[SqlSink, str]]:
    async with pg_schema() as schema:
        with tempfile.TemporaryDirectory(prefix="eg-bench-") as d:
            sink = SqlSink(PG_URL, schema=schema, spool_path=Path(d) / "spool.jsonl")
            await sink.start()
            try:
                yield sink, schema
            finally:
                await sink.aclose()


async def pg_count(schema: str, table: str = "eventguard_events") -> int:
    conn = await asyncpg.connect(PG_DSN)
    try:
        return int(await conn.fetchval(f'SELECT count(*) FROM "{schema}".{table}'))
    finally:
        await conn.close()


def lost(expected: int, stored: int) -> int:
    return max(expected - stored, 0)
