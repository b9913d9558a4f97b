"""(2) and (3): events per second through ``guard(..., sink=SqlSink(...))`` against the raw driver.

The guarded stream yields to the event loop before each event (as a socket-fed stream does), so
the sink's writer task runs alongside it; the figure runs from the first event to the last row
written. The raw baselines write the same rows (the events serialised with orjson) into the same
table, created by the same migration: sqlite3 ``executemany`` in WAL mode, one transaction; asyncpg
``copy_records_to_table``.
"""

from __future__ import annotations

import contextlib
import sqlite3
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import asyncpg  # type: ignore[import-untyped]
import orjson

from ._common import PG_DSN, Row, Sizes, collect, drain, median, network_stream, now, script
from ._sinks import (
    lost,
    pg_count,
    pg_sink,
    pg_unreachable,
    sqlite_count,
    sqlite_sink,
    timed_guarded,
)

NAME = "throughput"
_COLUMNS = ["response_id", "attempt", "seq", "type", "payload", "recorded_at"]


def _rows(rid: str, events: list[dict[str, Any]], at: Any) -> list[tuple[Any, ...]]:
    return [(rid, 1, seq, ev["type"], orjson.dumps(ev).decode(), at) for seq, ev in enumerate(events)]


def _raw_sqlite(path: Path, rid: str, events: list[dict[str, Any]]) -> float:
    at = datetime.now(UTC)
    with contextlib.closing(sqlite3.connect(path, isolation_level=None)) as conn:
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("PRAGMA synchronous = NORMAL")
        conn.execute("PRAGMA foreign_keys = ON")
        conn.execute(
            "INSERT INTO eventguard_responses (response_id, status, updated_at) VALUES (?, 'in_progress', ?)",
            (rid, at.isoformat(" ")),
        )
        t = now()
        rows = _rows(rid, events, at.isoformat(" "))
        conn.execute("BEGIN")
        conn.executemany(f"INSERT INTO eventguard_events ({', '.join(_COLUMNS)}) VALUES (?,?,?,?,?,?)", rows)
        conn.execute("COMMIT")
        return now() - t


async def _raw_pg(schema: str, rid: str, events: list[dict[str, Any]]) -> float:
    at = datetime.now(UTC)
    conn = await asyncpg.connect(PG_DSN)
    try:
        await conn.execute(
            f'INSERT INTO "{schema}".eventguard_responses (response_id, status, updated_at) '
            "VALUES ($1, 'in_progress', $2)",
            rid,
            at,
        )
        t = now()
        rows = _rows(rid, events, at)
        async with conn.transaction():
            await conn.copy_records_to_table(
                "eventguard_events", records=rows, columns=_COLUMNS, schema_name=schema
            )
        return now() - t
    finally:
        await conn.close()


async def _stream_alone(n: int) -> float:
    t = now()
    await drain(network_stream(script("resp_alone", n - 3)))
    return now() - t


async def run_sqlite(sizes: Sizes) -> list[Row]:
    n = sizes.sink_events
    eg: list[float] = []
    raw: list[float] = []
    alone: list[float] = []
    missing = 0
    for rep in range(sizes.reps):
        events = list(script(f"resp_raw_{rep}", n - 3))
        collect()
        async with sqlite_sink() as (_sink, path):
            raw.append(n / _raw_sqlite(path, f"resp_raw_{rep}", events))
        del events
        collect()
        async with sqlite_sink() as (sink, path):
            eg.append(n / await timed_guarded(sink, f"resp_eg_{rep}", n))
            missing += lost(n, sqlite_count(path))
        alone.append(n / await _stream_alone(n))
    return [
        Row(
            "2 SQLite",
            "guard + SqlSink throughput",
            median(eg),
            "ev/s",
            "raw sqlite3 executemany, WAL",
            median(raw),
            ">=",
            0.5,
            note=f"{n:,} events in one stream; {missing} not in the database over {sizes.reps} runs",
        ),
        Row(
            "2 SQLite",
            "the stream alone (no guard, no sink)",
            median(alone),
            "ev/s",
            "raw sqlite3 executemany, WAL",
            median(raw),
            note="the ceiling for any layer on this stream",
        ),
    ]


async def run_pg(sizes: Sizes) -> list[Row]:
    why = await pg_unreachable()
    if why is not None:
        return [Row("3 PostgreSQL", "guard + SqlSink throughput", None, "ev/s", skipped=why)]
    n = sizes.sink_events
    eg: list[float] = []
    raw: list[float] = []
    missing = 0
    for rep in range(sizes.reps):
        events = list(script(f"resp_raw_{rep}", n - 3))
        collect()
        async with pg_sink() as (_sink, schema):
            raw.append(n / await _raw_pg(schema, f"resp_raw_{rep}", events))
        del events
        collect()
        async with pg_sink() as (sink, schema):
            eg.append(n / await timed_guarded(sink, f"resp_eg_{rep}", n))
            missing += lost(n, await pg_count(schema))
    return [
        Row(
            "3 PostgreSQL",
            "guard + SqlSink throughput",
            median(eg),
            "ev/s",
            "raw asyncpg copy_records_to_table",
            median(raw),
            ">=",
            0.5,
            note=f"{n:,} events in one stream; {missing} not in the database over {sizes.reps} runs",
        )
    ]
