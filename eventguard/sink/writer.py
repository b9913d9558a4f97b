"""Applies batches to the database in one transaction: the only code that writes sink rows.

Every statement is idempotent: keyed inserts use ON CONFLICT DO NOTHING, and the row write is a
conditional upsert (never from a terminal state, never backwards). All of a cycle's response rows
go in one statement per dialect, ``INSERT ... ON CONFLICT (response_id) DO UPDATE ... WHERE status
NOT IN (terminal states) AND <moves forward> RETURNING response_id``: a row it does not return was
neither inserted nor updated, and only those are looked at again. A status change the database
refuses becomes a :class:`Refusal` and an anomaly row, never a silent no-op.

Events, the bulk of every cycle, are bound as tuples straight to the driver: ``executemany`` on
SQLite, one ``INSERT ... SELECT FROM unnest(...)`` per chunk on PostgreSQL. Values go through the
column types' own bind processors, so what is stored is exactly what SQLAlchemy would store.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import lru_cache
from typing import Any
from weakref import WeakKeyDictionary

import orjson
from sqlalchemy import Column, Insert, Table, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Dialect
from sqlalchemy.ext.asyncio import AsyncConnection

from eventguard.lifecycle import AnomalyKind
from eventguard.sink.batch import Batch
from eventguard.sink.serialise import encode_value
from eventguard.sink.tables import TERMINAL, anomalies, events, responses, sql_list, transitions

#: Response rows per upsert statement. SQLite binds 30 values a row (its limit is 32,766 per
#: statement); PostgreSQL takes one array per column, so the bound is only there to keep each
#: statement's work (and the event loop's share of it) small.
ROWS_PER_STATEMENT = 500
#: Events per statement (PostgreSQL) or per ``executemany`` (SQLite).
EVENTS_PER_STATEMENT = 2_000


@dataclass(frozen=True, slots=True)
class Refusal:
    """A status the database would not take, because the row already holds a terminal."""

    response_id: str
    attempt: int
    wanted: str
    stored: str
    stored_by: str | None

    @property
    def reason(self) -> str:
        by = f" (written by {self.stored_by})" if self.stored_by else ""
        return f"refused {self.wanted!r} for attempt {self.attempt}: the row is already {self.stored!r}{by}"


def _insert(conn: AsyncConnection, table: Table) -> Insert:
    if conn.dialect.name == "postgresql":
        return postgresql.insert(table).on_conflict_do_nothing()
    return sqlite.insert(table).on_conflict_do_nothing()


#: The row columns the sink writes: all but the key and the version (the database keeps those).
_ROW_COLUMNS: tuple[Column[Any], ...] = tuple(c for c in responses.columns if c.name not in ("pk", "version"))
_ROW_VALUES = tuple(c.name for c in _ROW_COLUMNS if c.name != "response_id")
_EVENT_COLUMNS: tuple[Column[Any], ...] = tuple(events.columns)
#: For spelling statements (quoting, type names): the driver makes no difference there.
_DIALECTS: dict[str, Dialect] = {
    "sqlite": sqlite.dialect(),
    "postgresql": postgresql.dialect(),  # type: ignore[no-untyped-call]
}


async def write(conn: AsyncConnection, batches: Sequence[Batch]) -> list[Refusal]:
    """Write ``batches`` inside the caller's transaction; return the refusals found.

    The batches' events must be serialised already (:meth:`Batch.serialise`).
    """
    refusals: list[Refusal] = []
    extra_anomalies: list[dict[str, Any]] = []
    kept_transitions: list[dict[str, Any]] = []
    for batch, refusal in zip(batches, await _write_rows(conn, batches), strict=True):
        if refusal is None:
            kept_transitions.extend(batch.transitions)
            continue
        refusals.append(refusal)
        # A refused terminal transition is not history: it goes into the anomaly instead.
        refused = [t for t in batch.transitions if t["to_state"] in TERMINAL]
        kept_transitions.extend(t for t in batch.transitions if t["to_state"] not in TERMINAL)
        if batch.refusal_idx is not None:
            extra_anomalies.append(_refusal_anomaly(batch, refusal, refused))
    # Children after their rows (foreign keys); one statement per table (per chunk) per cycle.
    await _insert_events(conn, batches)
    await _insert_many(conn, transitions, kept_transitions)
    await _insert_many(conn, anomalies, [a for b in batches for a in b.anomalies] + extra_anomalies)
    return refusals


async def _insert_many(conn: AsyncConnection, table: Table, rows: list[dict[str, Any]]) -> None:
    if rows:
        await conn.execute(_insert(conn, table), rows)


# -- the response rows --------------------------------------------------------------------------


async def _write_rows(conn: AsyncConnection, batches: Sequence[Batch]) -> list[Refusal | None]:
    """Upsert every batch's row; per batch, the refusal (None: written, or nothing to write)."""
    out: list[Refusal | None] = [None] * len(batches)
    todo = list(range(len(batches)))
    while todo:
        # One statement may touch a row once (PostgreSQL refuses more): a response that has
        # several batches here (a spool replay, a recovered attempt) takes several rounds, in order.
        seen: set[str] = set()
        now: list[int] = []
        later: list[int] = []
        for i in todo:
            rid = batches[i].response_id
            (later if rid in seen else now).append(i)
            seen.add(rid)
        for start in range(0, len(now), ROWS_PER_STATEMENT):
            chunk = [batches[i] for i in now[start : start + ROWS_PER_STATEMENT]]
            written = await _upsert(conn, chunk)
            ids = now[start : start + ROWS_PER_STATEMENT]
            missed = [(i, b) for i, b in zip(ids, chunk, strict=True) if b.response_id not in written]
            if missed:
                found = await _stored(conn, {b.response_id for _, b in missed})
                for i, b in missed:
                    out[i] = _judge(b, found.get(b.response_id))
        todo = later
    return out


async def _upsert(conn: AsyncConnection, chunk: list[Batch]) -> set[str]:
    """One conditional upsert for ``chunk`` (distinct response ids); the ids it wrote."""
    dialect = conn.dialect
    procs = _processors(dialect, _ROW_COLUMNS)
    if dialect.name == "postgresql":
        # One array per column: the statement text is the same whatever the number of rows.
        columns = [[b.response_id for b in chunk]]
        for name, proc in zip(_ROW_VALUES, procs[1:], strict=True):
            values = [b.row[name] for b in chunk]
            columns.append(values if proc is None else [proc(v) for v in values])
        result = await conn.exec_driver_sql(_pg_upsert(), tuple(columns))
    else:
        params: list[Any] = []
        extend = params.extend
        pairs = list(zip(_ROW_VALUES, procs[1:], strict=True))
        for b in chunk:
            row = b.row
            extend((b.response_id, *(row[n] if p is None else p(row[n]) for n, p in pairs)))
        result = await conn.exec_driver_sql(_sqlite_upsert(len(chunk)), tuple(params))
    return {r[0] for r in result.all()}


async def _stored(conn: AsyncConnection, ids: set[str]) -> dict[str, Any]:
    r = responses.c
    rows = await conn.execute(
        select(r.response_id, r.status, r.owner, r.attempt, r.state_seq).where(r.response_id.in_(ids))
    )
    return {row.response_id: row for row in rows}


def _judge(batch: Batch, found: Any) -> Refusal | None:
    """Why the upsert left ``batch``'s row alone: a refusal, or None when that was right."""
    if found is None or found.status not in TERMINAL:
        return None  # an older write replayed after a newer one: nothing to do
    row = batch.row
    if found.owner == batch.owner and (found.attempt, found.state_seq) >= (batch.attempt, row["state_seq"]):
        return None  # this very write, replayed (spool, retry)
    return Refusal(batch.response_id, batch.attempt, row["status"], found.status, found.owner)


def _upsert_tail(dialect: Dialect, distinct: str) -> str:
    q = dialect.identifier_preparer.quote
    t = q(responses.name)
    sets = ", ".join(f"{q(n)} = excluded.{q(n)}" for n in _ROW_VALUES)
    # Never from a terminal state. Within one writer's own attempt, never backwards (a replayed
    # spool after a newer write); another writer's state is not comparable with ours, so only the
    # terminal guard applies to it.
    moves_forward = (
        f"{t}.owner {distinct} excluded.owner OR {t}.attempt < excluded.attempt"
        f" OR ({t}.attempt = excluded.attempt AND {t}.state_seq <= excluded.state_seq)"
    )
    return (
        f" ON CONFLICT (response_id) DO UPDATE SET {sets}, version = {t}.version + 1"
        f" WHERE {t}.status NOT IN ({sql_list(TERMINAL)}) AND ({moves_forward})"
        " RETURNING response_id"
    )


@lru_cache(maxsize=64)
def _sqlite_upsert(n: int) -> str:
    dialect = _DIALECTS["sqlite"]
    q = dialect.identifier_preparer.quote
    names = ", ".join(q(c.name) for c in _ROW_COLUMNS)
    one = "(" + ", ".join("?" * len(_ROW_COLUMNS)) + ")"
    return f"INSERT INTO {q(responses.name)} ({names}) VALUES {', '.join([one] * n)}" + _upsert_tail(
        dialect, "IS NOT"
    )


@lru_cache(maxsize=1)
def _pg_upsert() -> str:
    dialect = _DIALECTS["postgresql"]
    q = dialect.identifier_preparer.quote
    names = ", ".join(q(c.name) for c in _ROW_COLUMNS)
    arrays = ", ".join(f"${i}::{_pg_array(dialect, c)}" for i, c in enumerate(_ROW_COLUMNS, 1))
    return f"INSERT INTO {q(responses.name)} ({names}) SELECT * FROM unnest({arrays})" + _upsert_tail(
        dialect, "IS DISTINCT FROM"
    )


# -- the events ---------------------------------------------------------------------------------


async def _insert_events(conn: AsyncConnection, batches: Sequence[Batch]) -> None:
    dialect = conn.dialect
    at_proc = _processors(dialect, (events.c.recorded_at,))[0]
    rows: list[tuple[Any, ...]] = []
    for b in batches:
        if not b.events:
            continue
        rid = b.response_id
        at = b.recorded_at
        if at_proc is not None:
            at = at_proc(at)  # once per batch: every event of a batch shares it
        rows.extend([(rid, a, s, t, p, at) for a, s, t, p in b.events])
    if not rows:
        return
    for start in range(0, len(rows), EVENTS_PER_STATEMENT):
        chunk = rows[start : start + EVENTS_PER_STATEMENT]
        if dialect.name == "postgresql":
            await conn.exec_driver_sql(_pg_events(), tuple(map(list, zip(*chunk, strict=True))))
        else:
            # One bound value (a JSON array of rows) instead of six a row: SQLite unpacks it in C,
            # in the driver's thread, without taking the GIL from the streams once per row.
            await conn.exec_driver_sql(_sqlite_events(), (orjson.dumps(chunk).decode(),))


@lru_cache(maxsize=1)
def _sqlite_events() -> str:
    dialect = _DIALECTS["sqlite"]
    q = dialect.identifier_preparer.quote
    names = ", ".join(q(c.name) for c in _EVENT_COLUMNS)
    values = ", ".join(f"json_extract(value, '$[{i}]')" for i in range(len(_EVENT_COLUMNS)))
    # "WHERE true": SQLite's documented way to end an INSERT ... SELECT before ON CONFLICT.
    return (
        f"INSERT INTO {q(events.name)} ({names}) SELECT {values} FROM json_each(?) WHERE true"
        " ON CONFLICT DO NOTHING"
    )


@lru_cache(maxsize=1)
def _pg_events() -> str:
    dialect = _DIALECTS["postgresql"]
    q = dialect.identifier_preparer.quote
    names = ", ".join(q(c.name) for c in _EVENT_COLUMNS)
    # The payload travels as text and is parsed once, by the server (JSONB), as it would be
    # through SQLAlchemy's JSON type.
    arrays = ", ".join(
        f"${i}::{'text[]' if c.name == 'payload' else _pg_array(dialect, c)}"
        for i, c in enumerate(_EVENT_COLUMNS, 1)
    )
    cols = ", ".join(f"c{i}" for i in range(len(_EVENT_COLUMNS)))
    values = ", ".join(
        f"c{i}::jsonb" if c.name == "payload" else f"c{i}" for i, c in enumerate(_EVENT_COLUMNS)
    )
    return (
        f"INSERT INTO {q(events.name)} ({names}) SELECT {values} FROM unnest({arrays}) AS u({cols})"
        " ON CONFLICT DO NOTHING"
    )


# -- helpers ------------------------------------------------------------------------------------


def _pg_array(dialect: Dialect, column: Column[Any]) -> str:
    return f"{column.type.compile(dialect=dialect)}[]"


_Processor = Callable[[Any], Any]


_PROCESSORS: WeakKeyDictionary[Dialect, dict[tuple[str, ...], list[_Processor | None]]] = WeakKeyDictionary()


def _processors(dialect: Dialect, columns: Sequence[Column[Any]]) -> list[_Processor | None]:
    """The columns' bind processors for the engine's own dialect (SQLite's datetime format, ...)."""
    cache = _PROCESSORS.setdefault(dialect, {})
    key = (columns[0].table.name, *(c.name for c in columns))
    procs = cache.get(key)
    if procs is None:
        procs = [c.type.dialect_impl(dialect).bind_processor(dialect) for c in columns]
        cache[key] = procs
    return procs


def _refusal_anomaly(batch: Batch, refusal: Refusal, refused: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "response_id": batch.response_id,
        "attempt": batch.attempt,
        "source": "sink",
        "idx": batch.refusal_idx,
        "kind": AnomalyKind.SINK_REFUSED.value,
        "reason": refusal.reason,
        "at": datetime.now(UTC),
        "event_type": None,
        "event_index": None,
        "payload": encode_value(refused) if refused else None,
    }
