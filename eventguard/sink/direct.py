"""PostgreSQL's common write, straight on the asyncpg connection: no SQLAlchemy on the way.

Nearly every write cycle is the plain case: every batch's row upsert lands (no terminal in the
way, no other stream holding the attempt), so nothing is read back or judged. That case is done
here, on the asyncpg connection the pool lent (:func:`write_direct`): ``BEGIN``, one upsert per
chunk of rows (a statement asyncpg prepared once per connection and keeps), the events by
binary COPY into the session's staging table and one keyed insert from it (a cycle of fewer
than :data:`COPY_FROM` events: one ``unnest`` insert instead, one round trip less), the
transitions and anomalies by ``unnest``, ``COMMIT``: four to six round trips, where the general
path through SQLAlchemy with a ping per checkout took nine. The statements and their parameters are
:mod:`eventguard.sink.apply`'s own; only SQLAlchemy's per-statement machinery (its greenlet, its
cursor, its transaction bookkeeping) is left out, and so is the ping per checkout the engine
no longer does.

Anything else (an upsert that wrote fewer rows than it was given, a response with two batches
in one cycle, no staging table: ``pooler_safe``) rolls back and returns None, and the caller
writes the same batches through :func:`eventguard.sink.apply.write`, which judges each row.
Every statement is idempotent, so a write rolled back and done again changes nothing twice.
Errors are SQLAlchemy's (``DBAPIError``), as on the general path, so an outage still reads as
one; a connection found dead is dropped from the pool by the caller.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any

from sqlalchemy.ext.asyncio import AsyncConnection

from eventguard.sink import apply
from eventguard.sink.apply import (
    EVENTS_PER_STATEMENT,
    ROWS_PER_STATEMENT,
    Written,
    _dict_rows,
    _driver_call,
    _event_rows,
    _events_stage,
    _pg_insert,
    _pg_upsert,
    pg_row_arrays,
)
from eventguard.sink.batch import Batch
from eventguard.sql.tables import anomalies, events, transitions

__all__ = ["COPY_FROM", "write_direct"]

#: A cycle with at least this many events sends them by COPY (two round trips, the cheapest per
#: event); below it, by one ``unnest`` insert (one round trip: a short cycle is round trips).
COPY_FROM = 32


class _Judge(Exception):
    """An upsert left a row alone: the rows must be read back and judged (the general path)."""


async def write_direct(conn: AsyncConnection, batches: Sequence[Batch]) -> Written | None:
    """Write ``batches`` (serialised) in one transaction of the asyncpg connection under ``conn``
    (a connection with no transaction of SQLAlchemy's open); None when they need the general
    path (see the module docstring), with nothing written."""
    if len({b.response_id for b in batches}) != len(batches):
        return None  # one statement may touch a row once: the general path takes them in rounds
    driver = await _events_stage(conn)
    if driver is None:
        return None
    dialect = conn.dialect
    tx = driver.transaction()
    await _driver_call(conn, "BEGIN", tx.start())
    try:
        upsert = _pg_upsert()
        for start in range(0, len(batches), ROWS_PER_STATEMENT):
            chunk = batches[start : start + ROWS_PER_STATEMENT]
            status = await _driver_call(conn, upsert, driver.execute(upsert, *pg_row_arrays(dialect, chunk)))
            if _rowcount(status) != len(chunk):
                raise _Judge
        if sum(len(b.events) for b in batches) < COPY_FROM:
            # A short cycle (a short response's start or end): one keyed insert, one round trip,
            # instead of the COPY and the insert from the staging table.
            await _insert(conn, driver, events.name, _event_rows(dialect, batches))
        else:
            await apply._copy_events(conn, driver, batches)
        await _insert(conn, driver, transitions.name, _dict_rows(dialect, transitions, _all(batches, True)))
        await _insert(conn, driver, anomalies.name, _dict_rows(dialect, anomalies, _all(batches, False)))
        await _driver_call(conn, "COMMIT", tx.commit())
    except _Judge:
        await _driver_call(conn, "ROLLBACK", tx.rollback())
        return None
    except Exception:
        # (Cancelled: no await here; the caller drops a connection left inside a transaction.)
        if not driver.is_closed():
            with contextlib.suppress(Exception):  # the error that got us here is the one to raise
                await tx.rollback()
        raise
    return Written(events=sum(len(b.events) for b in batches))


def _all(batches: Sequence[Batch], of_transitions: bool) -> list[dict[str, Any]]:
    if of_transitions:
        return [t for b in batches for t in b.transitions]
    return [a for b in batches for a in b.anomalies]


async def _insert(conn: AsyncConnection, driver: Any, table: str, rows: list[tuple[Any, ...]]) -> None:
    sql = _pg_insert(table)
    for start in range(0, len(rows), EVENTS_PER_STATEMENT):
        chunk = rows[start : start + EVENTS_PER_STATEMENT]
        await _driver_call(conn, sql, driver.execute(sql, *map(list, zip(*chunk, strict=True))))


def _rowcount(status: str) -> int:
    """The rows an ``INSERT`` changed, from asyncpg's status string (``INSERT 0 3``)."""
    return int(status.rsplit(" ", 1)[-1])
