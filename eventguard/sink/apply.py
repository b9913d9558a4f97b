"""Applies batches to the database in one transaction: the only code that writes sink rows.

Every statement is idempotent: keyed inserts use ON CONFLICT DO NOTHING, and the row write is a
conditional upsert (never from a terminal state, never backwards). All of a cycle's response rows
go in one statement (a short cycle's on SQLite, one per piece), ``INSERT ... ON CONFLICT
(response_id) DO UPDATE ... WHERE status NOT IN (terminal states) AND <moves forward>``. When it
writes fewer rows than it was given, the rows are read back and judged one by one, as before. A
status change the database refuses becomes a :class:`Refusal` and an anomaly row, never a silent
no-op.

On SQLite, a short cycle's rows (at most :data:`SQLITE_VALUES_UP_TO` for a table: a short
response's start or end, the common case) go as multi-row ``VALUES`` of bound values, in pieces of
power-of-two sizes (:func:`sqlite_pieces`): no JSON for SQLite to parse, about half the writer
thread's time per row. More rows go as one JSON array that ``json_each`` unpacks: one statement,
so SQLite works through the whole cycle without the GIL, which the writer takes back from the
streams once per statement (a long stream's cycle in pieces took it back every 64 rows, and the
streams' p99 latency rose). Neither takes the GIL back once per row, as ``executemany`` would. On
PostgreSQL, one array per column through ``unnest``, the statement text the same whatever its row
count. Events on PostgreSQL take the driver's binary COPY into a session's TEMP table instead, then
one keyed insert from it (``unnest`` again with ``pooler_safe``). Values go through the column
types' own bind processors, so what is stored is exactly what SQLAlchemy would store.

**One response id, two streams.** A stream (one guarded response stream: one recorder, whose
``stream_id`` every batch carries) claims ``(response_id, attempt)`` when its row write lands
first: the upsert stores its ``stream_id`` in the row. The upsert leaves the row alone when it
holds another stream's id for the same attempt, and the read-back judges that batch a
:class:`Duplicate`: the second stream is refused as a whole. Its row update, events,
transitions and anomalies are not applied to the holder's history; each of its batches goes to
the quarantine (origin ``duplicate``, every event with its payload) in the same transaction, and
one ``duplicate_stream`` anomaly (source ``sink``) is written on the holder's response, once per
refused stream. The database decides (the conditional upsert, then the read-back), never a check
in Python alone, so two replicas racing for one id get one holder. Exceptions:

- a higher attempt (a recovered re-entry) is a new attempt: it takes the row over, as before;
- an attempt another stream left ``interrupted`` is taken over by the next stream that carries it
  (the host recovers a response more than once, and ``Lifecycle.for_recovery`` always says attempt
  2): that stream is stored under the next attempt number, so each run keeps its own events,
  transitions and anomalies (their keys hold the attempt) and the last run's ending is recorded.
  The row stores its stream id as ``<stream id>@+<shift>``: every attempt of that stream is stored
  ``<shift>`` higher than its lifecycle says. Its batches written before it knew (spooled, or in
  flight) are judged against that row and renumbered the same way in the write, and its recorder
  renumbers what it collects from then on. A second stream that carries the same lifecycle
  attempt while the new holder's row is not interrupted is renumbered the same way and is a
  duplicate of it, as above (two replicas recovering one response at once get one holder). The
  row names only its current stream: a batch of the interrupted stream itself, replayed from a
  spool after the takeover, cannot be told from such a second stream and is a duplicate too;
- a batch without a ``stream_id`` (a spool older than it) counts as the row's own stream, and
  a row without one (written before it) is claimed by the next stream that writes it;
- an attempt older than the row's is not comparable (the row only names the current attempt's
  stream): its row write is refused (it never moves the row back) and its keyed events,
  transitions and anomalies of that older attempt are applied, as before.

A stream's own writes keep the older rule: a terminal the database already holds refuses a
later status, which becomes a :class:`Refusal` and a ``sink_refused`` anomaly.
"""

from __future__ import annotations

import hashlib
import sqlite3
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import lru_cache
from itertools import chain
from typing import Any, TypeAlias
from weakref import WeakKeyDictionary, WeakSet

import orjson
from sqlalchemy import JSON, Column, Table, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Dialect
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncConnection
from sqlalchemy.pool import NullPool

from eventguard.lifecycle import AnomalyKind
from eventguard.sink import quarantine
from eventguard.sink.batch import Batch, sink_anomaly
from eventguard.sink.serialise import encode_value
from eventguard.sql.classify import reason
from eventguard.sql.engine import PreSerialised
from eventguard.sql.sqlite_thread import SqliteConnection
from eventguard.sql.tables import TERMINAL, anomalies, events, responses, sql_list, transitions

#: Response rows per upsert statement, and events (transitions, anomalies) per insert. Each
#: statement binds a fixed number of values whatever its row count (one array per column on
#: PostgreSQL, one JSON array on SQLite past :data:`SQLITE_VALUES_UP_TO` rows): the bounds only
#: keep one statement's work, and the event loop's share of it, in proportion. Fewer statements
#: mean fewer round trips, and under load every round trip waits for a whole turn of the event loop.
ROWS_PER_STATEMENT = 2_000
EVENTS_PER_STATEMENT = 10_000
#: On SQLite, the rows of one table a cycle writes as bound ``VALUES`` at the most; more go as one
#: ``json_each`` array (see the module docstring).
SQLITE_VALUES_UP_TO = 64
#: Rows in one SQLite ``VALUES`` statement at the most, and the values one statement may bind
#: (``SQLITE_MAX_VARIABLE_NUMBER`` was 999 before SQLite 3.32): a wide table's pieces are smaller.
#: A statement's text holds its row count, so the sizes are powers of two: at most seven texts
#: per table, each prepared once and kept in ``sqlite3``'s statement cache (128 by default).
SQLITE_MAX_PIECE = 64
SQLITE_MAX_VALUES = 999


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


@dataclass(frozen=True, slots=True)
class Duplicate:
    """A batch of a stream that carried a response id and attempt another stream holds."""

    response_id: str
    attempt: int
    stream_id: str
    #: The stream that holds the attempt (the anomaly payload's ``owner_stream`` key, kept as it was).
    holder_stream: str

    @property
    def reason(self) -> str:
        return (
            f"stream {self.stream_id} carried response {self.response_id!r} attempt {self.attempt}, "
            f"which stream {self.holder_stream} holds: refused as a whole, kept in the quarantine"
        )


@dataclass(slots=True)
class Written:
    """What one :func:`write` did."""

    refusals: list[Refusal] = field(default_factory=list)
    duplicates: list[Duplicate] = field(default_factory=list)
    #: Events handed to the database (duplicates' excluded; a replayed event is a no-op there).
    events: int = 0
    #: Quarantine rows written (duplicates' batches).
    quarantined: int = 0


#: The row values a batch carries in ``batch.row``: every column but the key, the version (the
#: database keeps those), the id and the stream (the batch's own fields).
_ROW_DATA: tuple[Column[Any], ...] = tuple(
    c for c in responses.columns if c.name not in ("pk", "version", "response_id", "stream_id")
)
#: The row columns the sink writes, in statement order.
_ROW_COLUMNS: tuple[Column[Any], ...] = (responses.c.response_id, *_ROW_DATA, responses.c.stream_id)
_ROW_VALUES = tuple(c.name for c in _ROW_DATA)
#: For spelling statements (quoting, type names): the driver makes no difference there.
_DIALECTS: dict[str, Dialect] = {
    "sqlite": sqlite.dialect(),
    "postgresql": postgresql.dialect(),  # type: ignore[no-untyped-call]
}


#: Told that a batch is stored under other attempt numbers: ``(batch, the stream's own
#: attempt, the new shift, the new stream id)``; the writer renumbers the recorder with it.
Renumbered: TypeAlias = Callable[[Batch, int, int, str], None]


async def write(
    conn: AsyncConnection,
    batches: Sequence[Batch],
    *,
    rows: bool = True,
    replay: bool = False,
    renumbered: Renumbered | None = None,
    own_transaction: bool = False,
) -> Written:
    """Write ``batches`` inside the caller's transaction; what it did (refusals, duplicates).

    ``own_transaction`` (PostgreSQL, a connection with no transaction open): the write opens its
    own, straight on asyncpg for the common case (:mod:`eventguard.sink.direct`), else one of
    SQLAlchemy's for the general path below.

    The batches' events must be serialised already (:meth:`Batch.serialised`). ``rows=False``
    writes only their events, transitions and anomalies (the row is known to be there: the
    writer isolating refused content within a batch). ``replay``: the batches come from the
    spool, and a duplicate's quarantine record already there is not inserted again.
    ``renumbered``: called for each batch stored under other attempt numbers than it carried
    (see "One response id, two streams").
    """
    if own_transaction:
        from eventguard.sink.direct import write_direct  # (it builds on this module)

        written = await write_direct(conn, batches) if rows else None
        if written is not None:
            return written
        async with conn.begin():
            return await write(conn, batches, rows=rows, replay=replay, renumbered=renumbered)
    # Before the first statement: SQLAlchemy has not begun the transaction yet. Without the
    # row upsert, no statement through SQLAlchemy would begin it before the COPY (asyncpg's
    # transaction starts on the first one): the events take the keyed insert then.
    stage = await _events_stage(conn) if rows else None
    out = Written()
    extra_anomalies: list[dict[str, Any]] = []
    kept_transitions: list[dict[str, Any]] = []
    kept: list[Batch] = []
    refused_streams: list[tuple[Batch, Duplicate]] = []
    verdicts = await _write_rows(conn, batches, renumbered) if rows else [None] * len(batches)
    for batch, verdict in zip(batches, verdicts, strict=True):
        if isinstance(verdict, Duplicate):
            out.duplicates.append(verdict)
            refused_streams.append((batch, verdict))
            continue
        kept.append(batch)
        if verdict is None:
            kept_transitions.extend(batch.transitions)
            continue
        out.refusals.append(verdict)
        # A refused terminal transition is not history: it goes into the anomaly instead.
        refused = [t for t in batch.transitions if t["to_state"] in TERMINAL]
        kept_transitions.extend(t for t in batch.transitions if t["to_state"] not in TERMINAL)
        if batch.refusal_idx is not None:
            extra_anomalies.append(_refusal_anomaly(batch, verdict, refused))
    # Children after their rows (foreign keys); one statement per table (per chunk) per cycle.
    if stage is not None:
        await copy_events(conn, stage, kept)
    else:
        await _insert(conn, events, _event_rows(conn.dialect, kept))
    out.events = sum(len(b.events) for b in kept)
    await _insert(conn, transitions, _dict_rows(conn.dialect, transitions, kept_transitions))
    found = [a for b in kept for a in b.anomalies] + extra_anomalies
    if refused_streams:
        records = [quarantine.of_batch(b, "duplicate", d.reason) for b, d in refused_streams]
        out.quarantined = await quarantine.insert(conn, records, once=replay)
        # One anomaly per refused stream, however many of its batches this write saw, on that
        # stream's span.
        streams = {(d.response_id, d.stream_id): (d, b.span) for b, d in refused_streams}
        found.extend(_duplicate_anomaly(d, span) for d, span in streams.values())
    await _insert(conn, anomalies, _dict_rows(conn.dialect, anomalies, found))
    return out


# -- the response rows --------------------------------------------------------------------------


async def _write_rows(
    conn: AsyncConnection, batches: Sequence[Batch], renumbered: Renumbered | None
) -> list[Refusal | Duplicate | None]:
    """Upsert every batch's row; per batch, the refusal or the duplicate (None: written, or
    nothing to write)."""
    out: list[Refusal | Duplicate | None] = [None] * len(batches)
    tries = [0] * len(batches)
    todo = list(range(len(batches)))
    while todo:
        # One statement may touch a row once (PostgreSQL refuses more): a response that has
        # several batches here (a spool replay, a recovered attempt) takes several rounds, in order.
        seen: set[str] = set()
        now: list[int] = []
        later: list[int] = []
        again: list[int] = []
        for i in todo:
            rid = batches[i].response_id
            (later if rid in seen else now).append(i)
            seen.add(rid)
        # Rows locked in one order by every writer: two replicas' cycles over the same responses
        # then wait for each other instead of deadlocking (each locks a row the other needs next).
        now.sort(key=lambda i: batches[i].response_id)
        for start in range(0, len(now), ROWS_PER_STATEMENT):
            ids = now[start : start + ROWS_PER_STATEMENT]
            chunk = [batches[i] for i in ids]
            if await _upsert(conn, chunk) == len(chunk):
                continue  # every row written: nothing was refused
            # Some row was left alone. Judging a row this statement did write always finds
            # nothing to report (its stored state is the batch's own), so judge them all. The
            # conflicting rows are locked (or, on SQLite, the database is) until the commit:
            # what is read here is what the next round's statement finds.
            found = await _stored(conn, {b.response_id for b in chunk})
            for i, b in zip(ids, chunk, strict=True):
                row = found.get(b.response_id)
                if tries[i] < _RENUMBER_TRIES and _renumber(b, row, renumbered):
                    tries[i] += 1
                    again.append(i)  # stored under another attempt now: its row is written again
                    continue
                out[i] = _judge(b, row)
        todo = sorted(later + again)
    return out


async def _upsert(conn: AsyncConnection, chunk: list[Batch]) -> int:
    """One conditional upsert for ``chunk`` (distinct response ids); how many rows it wrote.

    The row count (inserted + updated) rather than ``RETURNING``: on SQLite every returned row
    is one more step of the driver's thread, and each step takes the GIL back from the streams.
    """
    dialect = conn.dialect
    if dialect.name == "postgresql":
        return await _execute(conn, _pg_upsert(), pg_row_arrays(dialect, chunk))
    procs = _processors(dialect, _ROW_COLUMNS)
    pairs = list(zip(_ROW_VALUES, procs[1:-1], strict=True))
    rows = [
        (b.response_id, *(b.row[n] if p is None else p(b.row[n]) for n, p in pairs), b.stream_id)
        for b in chunk
    ]
    return await _sqlite_rows(conn, _sqlite_upsert, _sqlite_upsert_json(), rows)


def pg_row_arrays(dialect: Dialect, chunk: Sequence[Batch]) -> tuple[list[Any], ...]:
    """The PostgreSQL upsert's parameters for ``chunk``'s rows: one array per column (the
    statement text is the same whatever the number of rows), through the columns' bind processors."""
    procs = _processors(dialect, _ROW_COLUMNS)
    columns: list[list[Any]] = [[b.response_id for b in chunk]]
    for name, proc in zip(_ROW_VALUES, procs[1:-1], strict=True):
        values = [b.row[name] for b in chunk]
        columns.append(values if proc is None else [proc(v) for v in values])
    columns.append([b.stream_id for b in chunk])
    return tuple(columns)


async def _stored(conn: AsyncConnection, ids: set[str]) -> dict[str, Any]:
    r = responses.c
    rows = await conn.execute(
        select(r.response_id, r.status, r.owner, r.attempt, r.state_seq, r.stream_id).where(
            r.response_id.in_(ids)
        )
    )
    return {row.response_id: row for row in rows}


#: The marker between a stream's id and the shift of its stored attempts (see the module docstring).
_SHIFT = "@+"
#: How many times one batch may be renumbered in one write (once, or twice when a takeover follows).
_RENUMBER_TRIES = 3


def split_stream(stream_id: str) -> tuple[str, int]:
    """``(the stream's own id, the shift of its stored attempts)`` of a stored stream id."""
    base, sep, shift = stream_id.rpartition(_SHIFT)
    if sep and base and shift.isascii() and shift.isdigit():
        return base, int(shift)
    return stream_id, 0


def _renumber(batch: Batch, found: Any, renumbered: Renumbered | None) -> bool:
    """Store ``batch`` under the attempt its stream has (or takes) in the row ``found``: whether
    that changed it (its row is then written again). See "One response id, two streams".

    A stream's own attempts are its lifecycle's, plus the shift its stored id carries. A batch
    of the attempt the row's stream holds (by its own count) takes the row's shift: the row's own
    stream (a batch it sent before it knew), or another stream of that attempt (a duplicate of
    it); a later attempt takes it too. And when the row is ``interrupted`` and another stream
    carries its attempt, that stream takes the next attempt number. An earlier attempt is left
    as it is (not comparable, as before), and so is a batch or a row without a stream id.
    """
    if found is None or batch.stream_id is None:
        return False
    base, shift = split_stream(batch.stream_id)
    own = batch.attempt - shift  # the attempt as the stream's lifecycle counts it
    if found.stream_id is None:
        row_base, row_shift = None, 0
    else:
        row_base, row_shift = split_stream(found.stream_id)
    row_own = found.attempt - row_shift
    if own < row_own:
        return False
    new = row_shift
    if base != row_base and own + new == found.attempt and found.status == "interrupted":
        new += 1  # takes over the attempt another stream left interrupted: the next number
    if new == shift:
        return False
    stream = f"{base}{_SHIFT}{new}" if new else base
    _shift_batch(batch, new - shift, stream)
    if renumbered is not None:
        renumbered(batch, own, new, stream)
    return True


def _shift_batch(batch: Batch, by: int, stream: str) -> None:
    """``batch`` stored ``by`` attempts higher (its items of an earlier attempt stay), as ``stream``."""
    first = batch.attempt

    def move(attempt: int) -> int:
        return attempt + by if attempt >= first else attempt

    batch.attempt = move(first)
    batch.stream_id = stream
    if "attempt" in batch.row:
        batch.row["attempt"] = move(batch.row["attempt"])
    batch.events = [(move(a), s, t, p) for a, s, t, p in batch.events]
    batch.raw = [(move(a), s, t, e) for a, s, t, e in batch.raw]
    for item in (*batch.transitions, *batch.anomalies):
        if isinstance(item.get("attempt"), int):
            item["attempt"] = move(item["attempt"])


def _judge(batch: Batch, found: Any) -> Refusal | Duplicate | None:
    """Why the upsert left ``batch``'s row alone: another stream owns the attempt, a refusal, or
    None when that was right."""
    if found is None:
        return None
    if (
        found.attempt == batch.attempt
        and batch.stream_id is not None
        and found.stream_id is not None
        and found.stream_id != batch.stream_id
    ):
        return Duplicate(batch.response_id, batch.attempt, batch.stream_id, found.stream_id)
    if found.status not in TERMINAL:
        return None  # an older write replayed after a newer one: nothing to do
    row = batch.row
    if found.owner == batch.owner and (found.attempt, found.state_seq) >= (batch.attempt, row["state_seq"]):
        return None  # this very write (or, just now, this cycle's own), replayed (spool, retry)
    return Refusal(batch.response_id, batch.attempt, row["status"], found.status, found.owner)


def _upsert_tail(dialect: Dialect, distinct: str) -> str:
    q = dialect.identifier_preparer.quote
    t = q(responses.name)
    sets = ", ".join(f"{q(n)} = excluded.{q(n)}" for n in _ROW_VALUES)
    # A batch without a stream (an old spool) never takes the row's stream away.
    sets += f", stream_id = coalesce(excluded.stream_id, {t}.stream_id)"
    # Never from a terminal state. Within one sink's own attempt (its owner), never backwards (a replayed
    # spool after a newer write); another sink's state is not comparable with ours, so only the
    # terminal guard applies to it.
    moves_forward = (
        f"{t}.owner {distinct} excluded.owner OR {t}.attempt < excluded.attempt"
        f" OR ({t}.attempt = excluded.attempt AND {t}.state_seq <= excluded.state_seq)"
    )
    # An interrupted row (the guard's own, or recover()'s verdict on a dead writer) moves on only
    # to a terminal or to a recovered attempt: a stale in-progress write (a dead writer's spool,
    # replayed later) must not bring it back to life.
    leaves_interrupted = (
        f"{t}.status <> 'interrupted' OR excluded.status IN ({sql_list(TERMINAL)})"
        f" OR {t}.attempt < excluded.attempt"
    )
    # The attempt belongs to the stream whose write landed first; a newer attempt takes it over.
    own_stream = (
        f"{t}.stream_id IS NULL OR excluded.stream_id IS NULL OR {t}.stream_id = excluded.stream_id"
        f" OR {t}.attempt < excluded.attempt"
    )
    # The one change a terminal row takes: its own stream counting, at the same state, an event
    # forwarded after the guard recorded its own ending (the terminal it owed a consumer that
    # resumed). Without it the row's event_count stayed one short of the stored events.
    # The same status too: a stream's own write at one state_seq always carries it, while a row
    # another writer ended under the same owner name (a replica's reaper that is also the sink's
    # owner) keeps that state_seq with its own terminal, which a live stream must not move back.
    counts_on = (
        f"{t}.status IN ({sql_list(TERMINAL)}) AND {t}.status = excluded.status"
        f" AND {t}.owner = excluded.owner AND {t}.attempt = excluded.attempt"
        f" AND {t}.state_seq = excluded.state_seq AND {t}.stream_id = excluded.stream_id"
        f" AND {t}.event_count < excluded.event_count"
    )
    return (
        f" ON CONFLICT (response_id) DO UPDATE SET {sets}, version = {t}.version + 1"
        f" WHERE ({t}.status NOT IN ({sql_list(TERMINAL)}) AND ({moves_forward}) AND ({leaves_interrupted})"
        f" AND ({own_stream})) OR ({counts_on})"
    )


@lru_cache(maxsize=1)
def _sqlite_upsert_json() -> str:
    """The upsert of the response rows in one bound JSON array, on SQLite."""
    dialect = _DIALECTS["sqlite"]
    q = dialect.identifier_preparer.quote
    names = ", ".join(q(c.name) for c in _ROW_COLUMNS)
    return f"INSERT INTO {q(responses.name)} ({names}) {_from_json_each(len(_ROW_COLUMNS))}" + (
        _upsert_tail(dialect, "IS NOT")
    )


def _from_json_each(width: int) -> str:
    values = ", ".join(f"json_extract(value, '$[{i}]')" for i in range(width))
    # "WHERE true": SQLite's documented way to end an INSERT ... SELECT before ON CONFLICT.
    return f"SELECT {values} FROM json_each(?) WHERE true"


@lru_cache(maxsize=8)
def _sqlite_upsert(n: int) -> str:
    """The upsert of ``n`` response rows on SQLite."""
    dialect = _DIALECTS["sqlite"]
    q = dialect.identifier_preparer.quote
    names = ", ".join(q(c.name) for c in _ROW_COLUMNS)
    return f"INSERT INTO {q(responses.name)} ({names}) VALUES {_placeholders(len(_ROW_COLUMNS), n)}" + (
        _upsert_tail(dialect, "IS NOT")
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


# -- events, transitions, anomalies: keyed inserts that ignore what is already there ----------


def _event_rows(dialect: Dialect, batches: Sequence[Batch]) -> list[tuple[Any, ...]]:
    at_proc = _processors(dialect, (events.c.recorded_at,))[0]
    rows: list[tuple[Any, ...]] = []
    for b in batches:
        if not b.events:
            continue
        rid = b.response_id
        at: Any = b.recorded_at
        if at_proc is not None:
            at = at_proc(at)  # once per batch: every event of a batch shares it
        rows.extend([(rid, a, s, t, p, at) for a, s, t, p in b.events])
    return rows


def _dict_rows(dialect: Dialect, table: Table, rows: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    columns = _columns(table)
    pairs = list(zip((c.name for c in columns), _processors(dialect, columns), strict=True))
    return [tuple(r.get(n) if p is None else p(r.get(n)) for n, p in pairs) for r in rows]


async def _insert(conn: AsyncConnection, table: Table, rows: list[tuple[Any, ...]]) -> None:
    """``INSERT ... ON CONFLICT DO NOTHING`` of ``rows`` (tuples in ``_columns(table)`` order).

    PostgreSQL: ``INSERT ... SELECT FROM unnest($1::type[], ...)``, one array per column, one
    statement text whatever the count. SQLite: ``INSERT ... VALUES (...), (...)``, in the pieces
    of :func:`sqlite_pieces`, or one ``INSERT ... SELECT FROM json_each(?)`` (see
    :func:`_sqlite_rows`).
    """
    if not rows:
        return
    if conn.dialect.name != "postgresql":
        await _sqlite_rows(
            conn, lambda n: _sqlite_insert(table.name, n), _sqlite_insert_json(table.name), rows
        )
        return
    for start in range(0, len(rows), EVENTS_PER_STATEMENT):
        chunk = rows[start : start + EVENTS_PER_STATEMENT]
        await _execute(conn, _pg_insert(table.name), tuple(map(list, zip(*chunk, strict=True))))


def sqlite_pieces(rows: Sequence[tuple[Any, ...]]) -> Iterator[Sequence[tuple[Any, ...]]]:
    """``rows`` in order, in pieces of power-of-two sizes, each at most :data:`SQLITE_MAX_PIECE`
    rows and :data:`SQLITE_MAX_VALUES` values (28 rows: 16, 8, 4)."""
    if not rows:
        return
    size = SQLITE_MAX_PIECE
    while size > 1 and size * len(rows[0]) > SQLITE_MAX_VALUES:
        size //= 2
    start = 0
    while start < len(rows):
        while size > len(rows) - start:
            size //= 2
        yield rows[start : start + size]
        start += size


async def _sqlite_rows(
    conn: AsyncConnection, values: Callable[[int], str], json_each: str, rows: Sequence[tuple[Any, ...]]
) -> int:
    """Write ``rows`` in the caller's transaction; the rows it changed. Up to
    :data:`SQLITE_VALUES_UP_TO` rows: ``values(n)`` (a multi-row ``VALUES`` of ``n`` rows), piece by
    piece; more: the statement ``json_each``, up to :data:`EVENTS_PER_STATEMENT` rows in each
    bound JSON array."""
    changed = 0
    if len(rows) > SQLITE_VALUES_UP_TO:
        for start in range(0, len(rows), EVENTS_PER_STATEMENT):
            chunk = rows[start : start + EVENTS_PER_STATEMENT]
            changed += await _execute(conn, json_each, (orjson.dumps(chunk).decode(),))
        return changed
    for piece in sqlite_pieces(rows):
        changed += await _execute(conn, values(len(piece)), tuple(chain.from_iterable(piece)))
    return changed


def _placeholders(width: int, n: int) -> str:
    row = "(" + ", ".join("?" * width) + ")"
    return ", ".join([row] * n)


async def _execute(conn: AsyncConnection, sql: str, params: tuple[Any, ...]) -> int:
    """Run one statement in the caller's transaction; the rows it changed.

    On the SQLite writer thread (:mod:`eventguard.sql.sqlite_thread`) straight to ``sqlite3``.
    Else, on SQLite, straight through aiosqlite: one hop to the driver's thread instead of three
    (cursor, execute, close). Under load each hop waits for the GIL and a turn of the event loop.
    Its errors are wrapped as SQLAlchemy's, so the sink tells bad data from an absent database.
    """
    if isinstance(conn, SqliteConnection):
        return conn.run(sql, params)  # on the SQLite writer thread, in its transaction
    if conn.dialect.name != "sqlite":
        return int((await conn.exec_driver_sql(sql, params)).rowcount)
    driver = (await conn.get_raw_connection()).driver_connection
    assert driver is not None
    before = driver.total_changes
    try:
        await driver.execute_fetchall(sql, params)
    except sqlite3.Error as exc:
        raise DBAPIError.instance(sql, None, exc, sqlite3.Error) from exc
    return int(driver.total_changes - before)


_TABLES = {t.name: t for t in (events, transitions, anomalies)}


# -- events on PostgreSQL: COPY into a session's staging table, then one keyed insert --------

#: The staging table: a TEMP table of the session, emptied by every commit.
_STAGE = "eventguard_events_stage"
#: The asyncpg connections (server sessions) that hold the staging table.
_STAGED: WeakSet[Any] = WeakSet()


async def _events_stage(conn: AsyncConnection) -> Any:
    """The asyncpg connection to COPY events through, or None for the ``unnest`` insert.

    Events on PostgreSQL go through the driver's binary COPY (``copy_records_to_table``) into a
    session-local TEMP table (``ON COMMIT DELETE ROWS``), then ``INSERT INTO events SELECT ...
    ON CONFLICT DO NOTHING``, in the caller's transaction: COPY itself cannot skip the rows
    already there, and the array encoder that ``unnest`` needs costs far more per event.

    The table is created once per server session, in autocommit before the caller's
    transaction begins, so that transaction's rollback cannot take it away. Not with a
    ``NullPool`` (``pooler_safe``): a transaction-mode pooler hands each transaction any server
    session, and without a pool each write would create the table again.
    """
    if conn.dialect.name != "postgresql" or isinstance(conn.engine.pool, NullPool):
        return None
    raw = await conn.get_raw_connection()
    driver = raw.driver_connection
    if driver is None:
        return None
    if driver in _STAGED:
        return driver
    if driver.is_in_transaction():
        return None  # created inside a transaction, a rollback would drop it: next time
    sql = _pg_stage_ddl()
    await _driver_call(conn, sql, driver.execute(sql))
    _STAGED.add(driver)
    return driver


async def copy_events(conn: AsyncConnection, driver: Any, batches: Sequence[Batch]) -> None:
    """``batches``' events into the table on PostgreSQL: asyncpg's binary COPY into the session's
    staging table (``driver``, from the events stage), then one keyed insert from it that ignores
    events already stored. Also the direct write's path (:mod:`eventguard.sink.direct`)."""
    if not any(b.events for b in batches):
        return
    at_proc = _processors(conn.dialect, (events.c.recorded_at,))[0]
    # Rows made as COPY takes them: no list of every event's tuple, held until the end.
    records = (
        (b.response_id, a, s, t, p, b.recorded_at if at_proc is None else at_proc(b.recorded_at))
        for b in batches
        for a, s, t, p in b.events
    )
    names = [c.name for c in _columns(events)]
    copy = driver.copy_records_to_table(_STAGE, records=records, columns=names, schema_name="pg_temp")
    await _driver_call(conn, f"COPY pg_temp.{_STAGE}", copy)
    sql = _pg_from_stage()
    await _driver_call(conn, sql, driver.execute(sql))


async def _driver_call(conn: AsyncConnection, sql: str, call: Any) -> Any:
    """Await a call on the asyncpg connection itself, its errors wrapped as SQLAlchemy's."""
    dbapi = conn.dialect.loaded_dbapi
    try:
        return await call
    except Exception as exc:
        adapted = (await conn.get_raw_connection()).dbapi_connection
        try:
            adapted._handle_exception(exc)  # type: ignore[union-attr]  # raises it translated
        except dbapi.Error as translated:
            raise DBAPIError.instance(sql, None, translated, dbapi.Error) from exc
        raise


@lru_cache(maxsize=1)
def _pg_stage_ddl() -> str:
    dialect = _DIALECTS["postgresql"]
    q = dialect.identifier_preparer.quote
    # JSON as text: asyncpg's text codec is in C, SQLAlchemy's jsonb codec is a Python call per
    # event. The server parses it once, in the insert below, as it does for the unnest insert.
    columns = ", ".join(
        f"{q(c.name)} {'text' if _is_json(c) else c.type.compile(dialect=dialect)}" for c in _columns(events)
    )
    return f"CREATE TEMP TABLE IF NOT EXISTS {_STAGE} ({columns}) ON COMMIT DELETE ROWS"


@lru_cache(maxsize=1)
def _pg_from_stage() -> str:
    q = _DIALECTS["postgresql"].identifier_preparer.quote
    columns = _columns(events)
    names = ", ".join(q(c.name) for c in columns)
    values = ", ".join(f"{q(c.name)}::jsonb" if _is_json(c) else q(c.name) for c in columns)
    # The commit empties the table; until then a second pass would only find its rows stored.
    stage = f"pg_temp.{_STAGE}"
    return f"INSERT INTO {q(events.name)} ({names}) SELECT {values} FROM {stage} ON CONFLICT DO NOTHING"


@lru_cache(maxsize=8)
def _columns(table: Table) -> tuple[Column[Any], ...]:
    # Every column but a generated key. Cached: every write asks for each table's, and walking them
    # through SQLAlchemy each time was work for nothing (a few µs a write; see the README).
    return tuple(c for c in table.columns if not (c.primary_key and c.autoincrement is True))


@lru_cache(maxsize=4)
def _sqlite_insert_json(name: str) -> str:
    """The keyed insert of rows of table ``name`` in one bound JSON array, on SQLite."""
    columns = _columns(_TABLES[name])
    q = _DIALECTS["sqlite"].identifier_preparer.quote
    names = ", ".join(q(c.name) for c in columns)
    return f"INSERT INTO {q(name)} ({names}) {_from_json_each(len(columns))} ON CONFLICT DO NOTHING"


@lru_cache(maxsize=32)
def _sqlite_insert(name: str, n: int) -> str:
    """The keyed insert of ``n`` rows of table ``name`` on SQLite."""
    columns = _columns(_TABLES[name])
    q = _DIALECTS["sqlite"].identifier_preparer.quote
    names = ", ".join(q(c.name) for c in columns)
    return f"INSERT INTO {q(name)} ({names}) VALUES {_placeholders(len(columns), n)} ON CONFLICT DO NOTHING"


@lru_cache(maxsize=4)
def _pg_insert(name: str) -> str:
    columns = _columns(_TABLES[name])
    dialect = _DIALECTS["postgresql"]
    q = dialect.identifier_preparer.quote
    names = ", ".join(q(c.name) for c in columns)
    # JSON travels as text (the column's bind processor made it) and is parsed once, by the
    # server, as it is through SQLAlchemy's JSON type.
    json = [isinstance(c.type.dialect_impl(dialect), JSON) for c in columns]
    arrays = ", ".join(
        f"${i}::{'text[]' if j else _pg_array(dialect, c)}"
        for i, (c, j) in enumerate(zip(columns, json, strict=True), 1)
    )
    aliases = ", ".join(f"c{i}" for i in range(len(columns)))
    values = ", ".join(f"c{i}::jsonb" if j else f"c{i}" for i, j in enumerate(json))
    return (
        f"INSERT INTO {q(name)} ({names}) SELECT {values} FROM unnest({arrays}) AS u({aliases})"
        " ON CONFLICT DO NOTHING"
    )


# -- helpers ------------------------------------------------------------------------------------


def _is_json(column: Column[Any]) -> bool:
    return isinstance(column.type.dialect_impl(_DIALECTS["postgresql"]), JSON)


def _pg_array(dialect: Dialect, column: Column[Any]) -> str:
    return f"{column.type.compile(dialect=dialect)}[]"


_Processor = Callable[[Any], Any]


_PROCESSORS: WeakKeyDictionary[Dialect, dict[tuple[Column[Any], ...], list[_Processor | None]]] = (
    WeakKeyDictionary()
)


def _processors(dialect: Dialect, columns: tuple[Column[Any], ...]) -> list[_Processor | None]:
    """The columns' bind processors for the engine's own dialect (SQLite's datetime format, ...).

    Keyed by the columns themselves (each a table's own object: hashed and matched by identity),
    so that a lookup builds nothing; a key of their names cost a generator step per column."""
    cache = _PROCESSORS.get(dialect)
    if cache is None:
        cache = _PROCESSORS.setdefault(dialect, {})
    procs = cache.get(columns)
    if procs is None:
        procs = [c.type.dialect_impl(dialect).bind_processor(dialect) for c in columns]
        cache[columns] = procs
    return procs


def sink_idx(key: str) -> int:
    """An index for an anomaly the writer itself adds: below zero (the recorder numbers its own
    from zero up), the same for the same ``key`` in every process, so writing it twice (a replay,
    a second batch of the same stream) finds it there and does nothing."""
    digest = hashlib.blake2b(key.encode("utf-8", "surrogatepass"), digest_size=4).digest()
    return -1 - int.from_bytes(digest, "big") % (2**31 - 2)


async def note_refused(conn: AsyncConnection, batch: Batch, reason: str, key: str) -> bool:
    """A ``sink_refused`` anomaly on ``batch``'s response, saying what went to the quarantine,
    if the response's row is there (the anomaly needs it). Written once per ``key``."""
    if quarantine.text(batch.response_id) != batch.response_id:
        return False  # an id no column can hold has no row either
    r = responses.c
    found = await conn.execute(select(r.attempt).where(r.response_id == batch.response_id))
    if found.first() is None:
        return False
    reason = f"{reason}; kept in the quarantine table"
    idx = sink_idx(f"sink_refused:{key}")
    row = sink_anomaly(
        batch.response_id,
        batch.attempt,
        AnomalyKind.SINK_REFUSED,
        reason,
        idx,
        datetime.now(UTC),
        span=batch.span,
    )
    await _insert(conn, anomalies, _dict_rows(conn.dialect, anomalies, [row]))
    return True


def _duplicate_anomaly(dup: Duplicate, span: object | None) -> dict[str, Any]:
    text = quarantine.text
    return sink_anomaly(
        dup.response_id,
        dup.attempt,
        AnomalyKind.DUPLICATE_STREAM,
        text(dup.reason),
        sink_idx(f"duplicate_stream:{dup.stream_id}"),
        datetime.now(UTC),
        payload=PreSerialised(
            orjson.dumps({"stream_id": text(dup.stream_id), "owner_stream": text(dup.holder_stream)}).decode()
        ),
        span=span,
    )


def _refusal_anomaly(batch: Batch, refusal: Refusal, refused: list[dict[str, Any]]) -> dict[str, Any]:
    return sink_anomaly(
        batch.response_id,
        batch.attempt,
        AnomalyKind.SINK_REFUSED,
        refusal.reason,
        batch.refusal_idx,
        datetime.now(UTC),
        payload=encode_value(refused) if refused else None,
        span=batch.span,
    )


# -- what applying came to, across writes ------------------------------------------------------------
@dataclass(slots=True)
class Tally:
    """What applying batches came to, summed over writes (a cycle, a replay)."""

    batches: int = 0
    events: int = 0
    quarantined: int = 0
    #: Spool entries that could not be read (a replay's).
    bad: int = 0
    refusals: list[Refusal] = field(default_factory=list)

    def add(self, other: Tally) -> None:
        """Add ``other``'s counts to these."""
        self.batches += other.batches
        self.events += other.events
        self.quarantined += other.quarantined
        self.bad += other.bad
        self.refusals.extend(other.refusals)


class Stopped(Exception):
    """An outage stopped a write: ``batches`` are not known to be written; ``cause`` is why."""

    def __init__(self, cause: BaseException, batches: list[Batch]) -> None:
        super().__init__(reason(cause))
        self.cause = cause
        self.batches = batches
