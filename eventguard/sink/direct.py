"""PostgreSQL's common write, straight on the asyncpg connection: no SQLAlchemy on the way.

Nearly every write cycle is the plain case: every batch's row upsert lands (no terminal in the
way, no other stream holding the attempt), so nothing is read back or judged. That case is done
here, on the asyncpg connection the pool lent (:func:`write_direct`): ``BEGIN``, one upsert per
chunk of rows (a statement asyncpg prepared once per connection and keeps), the events by
binary COPY into the session's staging table and one keyed insert from it (a cycle of fewer
than :data:`COPY_FROM` events: one ``unnest`` insert instead, one round trip less), the
transitions and anomalies by ``unnest``, ``COMMIT``: four to six round trips, where the general
path through SQLAlchemy with a ping per checkout took nine. A cycle of fewer than
:data:`COPY_FROM` events (a short response's start or end: the common case at low concurrency) is
one round trip: the upsert and the three inserts as parts of one statement, in its own implicit
transaction (:func:`_one_statement`). The statements and their parameters are
:mod:`eventguard.sink.apply`'s own; only SQLAlchemy's per-statement machinery (its greenlet, its
cursor, its transaction bookkeeping) is left out, and so is the ping per checkout the engine
no longer does.

Anything else (an upsert that wrote fewer rows than it was given: the one statement then fails
as a whole; a response with two batches in one cycle; no staging table: ``pooler_safe``) rolls
back and returns None, and the caller
writes the same batches through :func:`eventguard.sink.apply.write`, which judges each row.
Every statement is idempotent, so a write rolled back and done again changes nothing twice.
Errors are SQLAlchemy's (``DBAPIError``), as on the general path, so an outage still reads as
one; a connection found dead is dropped from the pool by the caller.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Sequence
from functools import lru_cache
from typing import Any

from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncConnection

from eventguard.sink import apply
from eventguard.sink.apply import (
    _ROW_COLUMNS,
    EVENTS_PER_STATEMENT,
    ROWS_PER_STATEMENT,
    Written,
    _columns,
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
    # Rows locked in one order by every writer (as apply's rounds do): two replicas' cycles over
    # the same responses wait for each other instead of deadlocking.
    batches = sorted(batches, key=lambda b: b.response_id)
    driver = await _events_stage(conn)
    if driver is None:
        return None
    dialect = conn.dialect
    if _fits_one_statement(batches):
        return await _write_in_one_statement(conn, driver, batches)
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
            await apply.copy_events(conn, driver, batches)
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


def _fits_one_statement(batches: Sequence[Batch]) -> bool:
    """A short cycle (a short response's start or end, or a few of them): few enough rows for
    :func:`_one_statement`'s one statement."""
    if len(batches) > ROWS_PER_STATEMENT or sum(len(b.events) for b in batches) >= COPY_FROM:
        return False
    return (
        sum(len(b.transitions) for b in batches) <= EVENTS_PER_STATEMENT
        and sum(len(b.anomalies) for b in batches) <= EVENTS_PER_STATEMENT
    )


async def _write_in_one_statement(
    conn: AsyncConnection, driver: Any, batches: Sequence[Batch]
) -> Written | None:
    """Rows, events, transitions and anomalies in :func:`_one_statement`: one round trip, in the
    statement's own (implicit) transaction, where BEGIN, a statement per table and COMMIT took
    four to six. Short responses are round trips: at concurrency 1 a 28-event response is one
    to three cycles, each of them this one statement now (issue 13)."""
    dialect = conn.dialect
    params = [
        *pg_row_arrays(dialect, batches),
        *_arrays(_event_rows(dialect, batches), len(_columns(events))),
        *_arrays(_dict_rows(dialect, transitions, _all(batches, True)), len(_columns(transitions))),
        *_arrays(_dict_rows(dialect, anomalies, _all(batches, False)), len(_columns(anomalies))),
        len(batches),
    ]
    sql = _one_statement()
    try:
        await _driver_call(conn, sql, driver.execute(sql, *params))
    except DBAPIError as exc:
        if _JUDGE in str(exc.orig):
            return None  # the statement failed as a whole: nothing was written
        raise
    return Written(events=sum(len(b.events) for b in batches))


#: What :func:`_one_statement` fails with when an upsert left a row alone (a terminal in the way,
#: another stream's attempt): the statement's own transaction is then rolled back as a whole,
#: and the batches take the general path, which reads the rows back and judges each.
_JUDGE = "eventguard: a row to judge"


@lru_cache(maxsize=1)
def _one_statement() -> str:
    """The upsert and the three keyed inserts as data-modifying ``WITH`` parts of one statement.

    Every part runs once, on one snapshot; the foreign keys are checked at the end of the
    statement, when the rows the upsert inserted are there. The final ``SELECT`` counts the rows
    the upsert wrote: fewer than it was given (the last parameter) casts :data:`_JUDGE` to an
    integer, which fails the statement (a ``CASE`` over an aggregate: evaluated when it runs,
    never folded by the planner), so nothing of it is kept.
    """
    n = len(_ROW_COLUMNS)
    parts = [f"up AS ({_pg_upsert()} RETURNING 1)"]
    for alias, table in (("ev", events), ("tr", transitions), ("an", anomalies)):
        parts.append(f"{alias} AS ({_shifted(_pg_insert(table.name), n)})")
        n += len(_columns(table))
    check = f"CAST(CASE WHEN count(*) = ${n + 1} THEN '0' ELSE '{_JUDGE}' END AS integer)"
    return f"WITH {', '.join(parts)} SELECT {check} FROM up"


def _shifted(sql: str, by: int) -> str:
    """``sql`` with its parameters ``$1``, ``$2``... numbered ``by`` higher."""
    return re.sub(r"\$(\d+)", lambda m: f"${int(m[1]) + by}", sql)


def _arrays(rows: list[tuple[Any, ...]], width: int) -> list[list[Any]]:
    """``rows`` as one list per column (``unnest``'s arrays), ``width`` of them when there are none."""
    if not rows:
        return [[] for _ in range(width)]
    return [list(column) for column in zip(*rows, strict=True)]


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
