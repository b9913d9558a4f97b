"""(2) and (3): events per second through ``guard(..., sink=SqlSink(...))`` against the raw driver.

The guarded stream yields to the event loop before each event (as a socket-fed stream does), so
the sink's writer task runs alongside it; the figure runs from the first event to the last row
written. The raw baselines write the same rows (the events serialised with orjson) into the same
table, created by the same migration: sqlite3 ``executemany`` in WAL mode, one transaction; asyncpg
``copy_records_to_table``.

Many short responses (issue 13): ``short_streams`` guarded streams of ``short_events`` events each,
all at once, from the first event to the last row written, against the raw driver writing the same
response rows and events in one transaction (``executemany`` into both tables on SQLite, a COPY
into each on PostgreSQL), the events serialised inside the timing as in the one-stream baseline.
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import asyncpg  # type: ignore[import-untyped]
import orjson

from ._common import PG_DSN, Row, Sizes, collect, drain, median, network_stream, now, script
from ._sinks import (
    guarded,
    lost,
    pg_count,
    pg_sink,
    pg_unreachable,
    sqlite_count,
    sqlite_sink,
    timed_guarded,
)

NAME = "throughput"
#: Issue 13: at least 0.7x the raw driver on one long stream, 0.5x for many short responses.
LONG_TARGET = 0.7
SHORT_TARGET = 0.5
_COLUMNS = ["response_id", "attempt", "seq", "type", "payload", "recorded_at"]


def _rows(rid: str, events: list[dict[str, Any]], at: Any) -> list[tuple[Any, ...]]:
    return [(rid, 1, seq, ev["type"], orjson.dumps(ev).decode(), at) for seq, ev in enumerate(events)]


async def _raw_sqlite(path: Path, rid: str, events: list[dict[str, Any]]) -> float:
    # A coroutine (with no await) only so that both databases share _measure; sqlite3 blocks the loop,
    # as the baseline did when it was a plain call.
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


def _short_rows(streams: int, events: int, at: Any) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    """The response rows and the events of ``streams`` short responses, serialised."""
    responses = [(f"r{i}", "completed", at, at, events) for i in range(streams)]
    rows: list[tuple[Any, ...]] = []
    for i in range(streams):
        rows += _rows(f"r{i}", list(script(f"r{i}", events - 3)), at)
    return responses, rows


_RESPONSE_COLUMNS = ["response_id", "status", "finished_at", "updated_at", "event_count"]


async def _raw_sqlite_short(path: Path, streams: int, events: int) -> float:
    at = datetime.now(UTC).isoformat(" ")
    with contextlib.closing(sqlite3.connect(path, isolation_level=None)) as conn:
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("PRAGMA synchronous = NORMAL")
        conn.execute("PRAGMA foreign_keys = ON")
        t = now()
        responses, rows = _short_rows(streams, events, at)
        conn.execute("BEGIN")
        conn.executemany(
            f"INSERT INTO eventguard_responses ({', '.join(_RESPONSE_COLUMNS)}) VALUES (?,?,?,?,?)", responses
        )
        conn.executemany(f"INSERT INTO eventguard_events ({', '.join(_COLUMNS)}) VALUES (?,?,?,?,?,?)", rows)
        conn.execute("COMMIT")
        return now() - t


async def _raw_pg_short(schema: str, streams: int, events: int) -> float:
    conn = await asyncpg.connect(PG_DSN)
    try:
        t = now()
        responses, rows = _short_rows(streams, events, datetime.now(UTC))
        async with conn.transaction():
            await conn.copy_records_to_table(
                "eventguard_responses", records=responses, columns=_RESPONSE_COLUMNS, schema_name=schema
            )
            await conn.copy_records_to_table(
                "eventguard_events", records=rows, columns=_COLUMNS, schema_name=schema
            )
        return now() - t
    finally:
        await conn.close()


async def _short_guarded(sink: Any, streams: int, events: int) -> float:
    t = now()
    await asyncio.gather(*(guarded(sink, f"r{i}", events) for i in range(streams)))
    await sink.flush()
    return now() - t


def _short_row(label: str, sizes: Sizes, eg: list[float], raw: list[float], missing: int, what: str) -> Row:
    s, e = sizes.short_streams, sizes.short_events
    return Row(
        label,
        f"guard + SqlSink, {s:,} streams x {e} events at once",
        median(eg),
        "ev/s",
        what,
        median(raw),
        ">=",
        SHORT_TARGET,
        note=(
            "the baseline writes the response rows and events in one transaction; "
            f"{missing} not in the database over {sizes.reps} runs"
        ),
    )


async def _stream_alone(n: int) -> float:
    t = now()
    await drain(network_stream(script("resp_alone", n - 3)))
    return now() - t


@dataclass(frozen=True)
class _Database:
    """What the measurements need of one database; ``where`` is its file (SQLite) or schema (PostgreSQL)."""

    label: str
    baseline: str
    sink: Callable[[], AbstractAsyncContextManager[tuple[Any, Any]]]
    raw: Callable[[Any, str, list[dict[str, Any]]], Awaitable[float]]
    raw_short: Callable[[Any, int, int], Awaitable[float]]
    count: Callable[[Any], Awaitable[int]]


async def _sqlite_count(path: Path) -> int:
    return sqlite_count(path)


_SQLITE = _Database(
    "2 SQLite", "raw sqlite3 executemany, WAL", sqlite_sink, _raw_sqlite, _raw_sqlite_short, _sqlite_count
)
_PG = _Database(
    "3 PostgreSQL", "raw asyncpg copy_records_to_table", pg_sink, _raw_pg, _raw_pg_short, pg_count
)


async def _measure(db: _Database, sizes: Sizes, alone: list[float] | None = None) -> tuple[Row, Row, float]:
    """The one-stream row, the short-streams row and the raw one-stream median; each run on a fresh
    database, the raw baseline first. ``alone``, when given, gets the bare stream's rate of each rep."""
    n = sizes.sink_events
    eg: list[float] = []
    raw: list[float] = []
    missing = 0
    for rep in range(sizes.reps):
        events = list(script(f"resp_raw_{rep}", n - 3))
        collect()
        async with db.sink() as (_sink, where):
            raw.append(n / await db.raw(where, f"resp_raw_{rep}", events))
        del events
        collect()
        async with db.sink() as (sink, where):
            eg.append(n / await timed_guarded(sink, f"resp_eg_{rep}", n))
            missing += lost(n, await db.count(where))
        if alone is not None:
            alone.append(n / await _stream_alone(n))
    short_n = sizes.short_streams * sizes.short_events
    short_eg: list[float] = []
    short_raw: list[float] = []
    short_missing = 0
    for _rep in range(sizes.reps):
        collect()
        async with db.sink() as (_sink, where):
            short_raw.append(short_n / await db.raw_short(where, sizes.short_streams, sizes.short_events))
        collect()
        async with db.sink() as (sink, where):
            short_eg.append(short_n / await _short_guarded(sink, sizes.short_streams, sizes.short_events))
            short_missing += lost(short_n, await db.count(where))
    long = Row(
        db.label,
        "guard + SqlSink throughput",
        median(eg),
        "ev/s",
        db.baseline,
        median(raw),
        ">=",
        LONG_TARGET,
        note=f"{n:,} events in one stream; {missing} not in the database over {sizes.reps} runs",
    )
    return long, _short_row(db.label, sizes, short_eg, short_raw, short_missing, db.baseline), median(raw)


async def run_sqlite(sizes: Sizes) -> list[Row]:
    alone: list[float] = []
    long, short, raw = await _measure(_SQLITE, sizes, alone)
    ceiling = Row(
        _SQLITE.label,
        "the stream alone (no guard, no sink)",
        median(alone),
        "ev/s",
        _SQLITE.baseline,
        raw,
        note="the ceiling for any layer on this stream",
    )
    return [long, ceiling, short]


async def run_pg(sizes: Sizes) -> list[Row]:
    why = await pg_unreachable()
    if why is not None:
        return [Row(_PG.label, "guard + SqlSink throughput", None, "ev/s", skipped=why)]
    long, short, _raw = await _measure(_PG, sizes)
    return [long, short]
