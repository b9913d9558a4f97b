"""ResponseStore: query what the sink stored, page through it, keep it tidy.

Reads run in deferred transactions (WAL readers never wait for the writer). Every argument
travels as a bound parameter; the store validates the ones it must interpret (statuses,
limits, cursors, time zones) and raises :class:`InvalidQueryError` for the rest.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

from sqlalchemy import ColumnElement, Select, delete, func, select, tuple_, update
from sqlalchemy.engine import URL
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from eventguard import _arguments as arguments
from eventguard._text import utf8_size
from eventguard.errors import InvalidQueryError, SchemaMismatchError
from eventguard.records import (
    AgentSessionRecord,
    AnomalyRecord,
    Attempt,
    EnvelopePruneResult,
    EnvelopeRecord,
    EventRecord,
    History,
    Page,
    PruneResult,
    ResponseRecord,
    Stats,
    TransitionRecord,
)
from eventguard.sql import engine as _db
from eventguard.sql import migrate as _migrate
from eventguard.sql import storable
from eventguard.sql.classify import ErrorKind, classify, unavailable
from eventguard.sql.pool_loop import PoolLoop
from eventguard.sql.tables import (
    ENDED,
    ID,
    STATES,
    agent_sessions,
    anomalies,
    events,
    provider_responses,
    responses,
    transitions,
)

__all__ = ["ResponseStore", "stored_id"]

MAX_LIMIT = 10_000
#: The response id column's length: a longer id is stored as a prefix and a hash.
ID_LENGTH = ID.length or 255
RECOVER_OWNER = "eventguard-recover"


class ResponseStore:
    """Queries over the sink's tables.

    :param url: as for :class:`eventguard.SqlSink`; default ``EVENTGUARD_DATABASE_URL``, else
        ``./eventguard.db``. Not with ``engine``.
    :param engine: the application's own ``AsyncEngine`` instead of a URL (PostgreSQL: its pool is
        shared; SQLite: the store opens its own connections to the same file); never disposed by
        :meth:`aclose`.
    :param schema: PostgreSQL only: the schema the tables live in.
    :param pooler_safe: PostgreSQL behind a transaction-mode pooler: no prepared statement caches.
    :param busy_timeout: SQLite: seconds to wait for another process's write lock (prune, recover).

    A store may be used from one ``asyncio.run()`` after another: its own engine's pool is let go
    (``dispose(close=False)``) when the loop changes. An application's PostgreSQL engine keeps its
    pool, the application's to dispose of between loops. On a database without eventguard's
    schema (or with another version of it) every method raises
    :class:`~eventguard.errors.SchemaMismatchError` naming the command to run.
    """

    def __init__(
        self,
        url: str | URL | None = None,
        *,
        engine: AsyncEngine | None = None,
        schema: str | None = None,
        pooler_safe: bool = False,
        busy_timeout: float = 30.0,
    ) -> None:
        pooler_safe = arguments.flag("pooler_safe", pooler_safe)
        busy_timeout = arguments.seconds("busy_timeout", busy_timeout)
        _db.valid_schema(schema)
        lender = engine
        if engine is not None:
            if url is not None:
                raise ValueError("give ResponseStore a url or an engine, not both")
            self.url = _db.resolve_url(engine.url if isinstance(engine, AsyncEngine) else None)
            engine = _db.borrow_engine(engine, schema=schema, busy_timeout_ms=int(busy_timeout * 1000))
        else:
            self.url = _db.resolve_url(url)
            _db.require_driver(self.url)
            engine = _db.create_engine(
                self.url, schema=schema, pooler_safe=pooler_safe, busy_timeout_ms=int(busy_timeout * 1000)
            )
        self._engine = engine
        # Reads need no write lock on SQLite; prune/recover use the engine's BEGIN IMMEDIATE.
        self._reader: AsyncEngine = engine.execution_options(**{_db.SQLITE_BEGIN_OPTION: "DEFERRED"})
        #: The event loop the pool's connections belong to (see :meth:`_on_this_loop`).
        self._loop = PoolLoop()
        #: The application's PostgreSQL engine whose pool the store shares (see borrow_engine).
        self._lender = lender if isinstance(engine, _db.BorrowedEngine) else None
        # The pool the store may let go of when the loop changes: not a lent one (the
        # application's), nor an in-memory SQLite database's one connection (a new pool would
        # open an empty database).
        self._owns_pool = self._lender is None and not (
            _db.is_sqlite(self.url) and _db.sqlite_path(self.url) is None
        )

    def __repr__(self) -> str:
        return f"ResponseStore({_db.safe_url(self.url)!r})"

    @property
    def engine(self) -> AsyncEngine:
        """The engine the store writes through (prune, recover; the replicas' reaper on the same
        database): with ``engine=``, eventguard's engine over the caller's pool on PostgreSQL
        (:func:`eventguard.sql.engine.borrow_engine`), its own on the same file on SQLite."""
        self._on_this_loop()
        return self._engine

    @property
    def reader(self) -> AsyncEngine:
        """The same engine for reads: on SQLite its transactions begin ``DEFERRED`` and take no
        write lock (``eventguard verify`` reads every table through it)."""
        self._on_this_loop()
        return self._reader

    async def __aenter__(self) -> ResponseStore:
        return self

    async def __aexit__(self, *_exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Release the store's connections (never the application's, when given ``engine=``)."""
        self._on_this_loop()  # another loop's connections are let go of, not closed from this one
        await self._engine.dispose()

    def _on_this_loop(self) -> None:
        """Let go of the store's own pool when the running event loop is not the one its connections
        were made on (see :mod:`eventguard.sql.pool_loop`). Nothing outside a running loop (a
        property read from synchronous code).

        A lent pool is never let go of: it is the application's, to dispose of between loops as
        SQLAlchemy advises, and its disposal gives its engine a new pool, which the store then
        shares (it kept the old one, with the old loop's connections, until this).
        """
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return
        self._loop.follow(self._engine if self._owns_pool else None)
        if self._lender is not None and self._engine.sync_engine.pool is not self._lender.sync_engine.pool:
            self._engine.sync_engine.pool = self._lender.sync_engine.pool

    @asynccontextmanager
    async def _transaction(self, engine: AsyncEngine) -> AsyncIterator[AsyncConnection]:
        """One transaction on ``engine`` (the store's reader or writer), on the running loop's pool.

        A statement that fails because the schema is not there (no such table or column: see
        :func:`eventguard.sql.classify.classify`) is a :class:`SchemaMismatchError` saying what to
        run, as the CLI and the provider say it: the schema's revision is read then, once, never on
        a healthy database's queries. A database that cannot be reached is a
        :class:`~eventguard.DatabaseUnavailableError`.
        """
        self._on_this_loop()
        try:
            async with engine.begin() as conn:
                yield conn
        except Exception as exc:
            away = unavailable(self.url, exc)
            if away is not None:
                raise away from exc
            if classify(exc) is not ErrorKind.SCHEMA or isinstance(exc, SchemaMismatchError):
                raise
            mismatch = await self._schema_mismatch()
            if mismatch is None:
                raise  # at eventguard's head, yet not there: not a migration's to mend
            raise mismatch from exc

    async def _schema_mismatch(self) -> SchemaMismatchError | None:
        """What the database's schema revision says is wrong (None: it is at this package's head, or
        cannot be read either)."""
        try:
            await _migrate.check(self._reader)
        except SchemaMismatchError as mismatch:
            return mismatch
        except Exception:  # the original error says more than this one
            return None
        return None

    # -- reads -----------------------------------------------------------------------------------
    async def get(self, response_id: str) -> ResponseRecord | None:
        """The response's row, by ``response_id`` as the host gave it or as stored (see
        :func:`stored_id`); None when no such response is stored."""
        async with self._transaction(self._reader) as conn:
            response_id = await _read_key(conn, responses.c.response_id, response_id)
            row = (
                await conn.execute(select(responses).where(responses.c.response_id == response_id))
            ).first()
        return None if row is None else ResponseRecord.model_validate(row)

    async def terminal_states(
        self,
        *,
        status: str | Iterable[str] | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
        limit: int = 100,
        after: int | None = None,
    ) -> Page[ResponseRecord]:
        """Ended responses (terminal or interrupted), oldest row first, ``limit`` per page.

        ``since``/``until`` bound ``finished_at`` (until is exclusive). The cursor ``after`` is the
        row key (``pk``), monotonic in insertion order: paging through the responses that had
        ended when the first page was read never repeats or skips a row. It is not a feed of new
        endings: ``pk`` is given when a response starts, so one that ends later can sit behind the
        cursor. To follow endings as they happen, poll with ``since=`` the last ``finished_at``
        seen (minus a little, for concurrent writers) and skip ids already read. ``status`` keeps only
        these ended statuses (one or several; default all).
        """
        wanted = _statuses(status, allowed=ENDED) if status is not None else ENDED
        r = responses.c
        query = select(responses).where(r.status.in_(wanted))
        query = _time_window(query, r.finished_at, since, until)
        return await self._page(query, r.pk, limit, after, ResponseRecord)

    async def recent(
        self,
        *,
        status: str | Iterable[str] | None = None,
        since: datetime | None = None,
        limit: int = 100,
        before: int | None = None,
    ) -> list[ResponseRecord]:
        """Responses of every status, those still in progress included, newest first.

        What ``eventguard responses list`` prints. For ended responses only, oldest first, with a
        page cursor, see :meth:`terminal_states`.

        Args:
            status: only these statuses (a :class:`eventguard.State` value or several); default all.
            since: only responses active since then: ended at or after it (``finished_at``), or, for
                one not ended, last written at or after it (``updated_at``). A naive time is UTC.
            limit: at most this many, 1 to 10,000.
            before: a row key (:attr:`ResponseRecord.pk <eventguard.records.ResponseRecord.pk>`): only
                responses stored before that one. For the next page, pass the last record's ``pk``;
                responses that start meanwhile are newer and never shift the pages.

        Raises:
            InvalidQueryError: an unknown status, a limit out of range, a ``since`` that is not a
                datetime, a ``before`` that is not a row key.
        """
        r = responses.c
        query = select(responses)
        if status is not None:
            query = query.where(r.status.in_(_statuses(status, allowed=STATES)))
        if since is not None:
            query = query.where(func.coalesce(r.finished_at, r.updated_at) >= _utc(since, "since"))
        if before is not None:
            if not _is_row_key(before):
                raise InvalidQueryError(f"before must be a row key (a record's pk), not {before!r:.40}")
            query = query.where(r.pk < before)
        query = query.order_by(r.pk.desc()).limit(_limit(limit))
        async with self._transaction(self._reader) as conn:
            rows = (await conn.execute(query)).all()
        return [ResponseRecord.model_validate(row) for row in rows]

    async def anomalies(
        self,
        *,
        response_id: str | None = None,
        kind: str | Iterable[str] | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
        limit: int = 100,
        after: int | None = None,
    ) -> Page[AnomalyRecord]:
        """Stored anomalies, oldest row first, ``limit`` per page (1 to 10,000).

        Args:
            response_id: only this response's (as the host gave it or as stored).
            kind: only these kinds (an :class:`eventguard.AnomalyKind` value or several).
            since: only anomalies noted at or after it; ``until``: before it (exclusive).
            until: see ``since``. A naive time is UTC.
            limit: at most this many per page.
            after: the cursor: the last page's ``next_after`` (a row key); None for the first page.
        """
        a = anomalies.c
        query = select(anomalies)
        if response_id is not None:
            key = stored_id(response_id)
            if key != response_id and _spells_a_stored_id(response_id):
                async with self._transaction(self._reader) as conn:
                    key = await _read_key(conn, responses.c.response_id, response_id)
            query = query.where(a.response_id == key)
        if kind is not None:
            query = query.where(a.kind.in_(_kinds(kind)))
        query = _time_window(query, a.at, since, until)
        return await self._page(query, a.pk, limit, after, AnomalyRecord)

    async def history(self, response_id: str) -> History | None:
        """The response ``response_id`` (as given or as stored) and, per attempt in order, its events,
        transitions and anomalies; None when no such response is stored."""
        async with self._transaction(self._reader) as conn:
            response_id = await _read_key(conn, responses.c.response_id, response_id)
            row = (
                await conn.execute(select(responses).where(responses.c.response_id == response_id))
            ).first()
            if row is None:
                return None
            evs = await _rows(conn, events, response_id, events.c.attempt, events.c.seq)
            trs = await _rows(conn, transitions, response_id, transitions.c.attempt, transitions.c.idx)
            ans = await _rows(conn, anomalies, response_id, anomalies.c.attempt, anomalies.c.pk)
        return _history(row, evs, trs, ans)

    async def stats(self, *, since: datetime | None = None) -> Stats:
        """Counts by status and cause, and duration percentiles, of responses active since ``since``."""
        r = responses.c
        active = func.coalesce(r.finished_at, r.updated_at)
        where = [] if since is None else [active >= _utc(since, "since")]
        async with self._transaction(self._reader) as conn:
            status_rows = await conn.execute(select(r.status, func.count()).where(*where).group_by(r.status))
            by_status: dict[str, int] = {s: k for s, k in status_rows.all()}
            by_cause_rows = (
                await conn.execute(
                    select(r.cause, func.count()).where(r.cause.is_not(None), *where).group_by(r.cause)
                )
            ).all()
            durations = [r.status.in_(ENDED), r.duration_ms.is_not(None), *where]
            n = (await conn.execute(select(func.count()).where(*durations))).scalar_one()
            pct: dict[int, float | None] = {}
            for p in (50, 90, 99):
                if n == 0:
                    pct[p] = None
                    continue
                # Nearest rank, with an index-friendly ORDER BY ... OFFSET on both databases.
                rank = max(0, -(-p * n // 100) - 1)
                pct[p] = (
                    await conn.execute(
                        select(r.duration_ms).where(*durations).order_by(r.duration_ms).offset(rank).limit(1)
                    )
                ).scalar_one()
        return Stats(
            since=since,
            total=sum(by_status.values()),
            by_status=by_status,
            by_cause={c: k for c, k in by_cause_rows},
            duration_ms_p50=pct[50],
            duration_ms_p90=pct[90],
            duration_ms_p99=pct[99],
        )

    # -- writes ----------------------------------------------------------------------------------
    async def prune(self, *, older_than: timedelta | datetime, keep_summary: bool = True) -> PruneResult:
        """Delete the history of responses that ended before ``older_than`` (an age or a time).

        With ``keep_summary`` the response rows stay (the view and stats still count them);
        without, they go too. Responses still in progress are never pruned.
        """
        cutoff = _cutoff(older_than)
        if not isinstance(keep_summary, bool):  # "false" is truthy, None falsy: either would surprise
            raise InvalidQueryError(f"keep_summary must be True or False, not {type(keep_summary).__name__}")
        r = responses.c
        old = select(r.response_id).where(r.status.in_(ENDED), r.finished_at < cutoff).scalar_subquery()
        async with self._transaction(self._engine) as conn:
            counts = [
                (await conn.execute(delete(t).where(t.c.response_id.in_(old)))).rowcount
                for t in (events, transitions, anomalies)
            ]
            gone = 0
            if not keep_summary:
                gone = (await conn.execute(delete(responses).where(r.response_id.in_(old)))).rowcount
        return PruneResult(responses=gone, events=counts[0], transitions=counts[1], anomalies=counts[2])

    async def envelopes(self, response_id: str) -> list[EnvelopeRecord]:
        """What the host's SQL response store holds for ``response_id``: one record per user
        partition that has it (none when the host's store is another one)."""
        from eventguard.provider import read_envelopes

        async with self._transaction(self._reader) as conn:
            key = await _read_key(conn, provider_responses.c.response_id, response_id)
            return await read_envelopes(conn, key)

    async def prune_envelopes(self, *, older_than: timedelta | datetime) -> EnvelopePruneResult:
        """Expire the host's response store (``SqlResponseProvider``) by age, in one transaction.

        Envelopes that ended (or were deleted) and were last written before ``older_than`` go, with
        their links; items last written before it go unless a kept response still names them (as
        input, output, or anywhere in its history); history nodes no kept response reaches go.
        Envelopes still in progress are never expired.
        """
        from eventguard.provider import prune_store

        async with self._transaction(self._engine) as conn:
            return await prune_store(conn, _cutoff(older_than))

    async def agent_sessions(self, *, limit: int = 50) -> list[AgentSessionRecord]:
        """The host's agent sessions in SQL (``SqlAgentSessionStoreProvider``), last written first,
        at most ``limit``; a row that cannot be read back as a session is a record with its
        ``problem`` (and no ``session``), not an error."""
        query = select(agent_sessions).order_by(agent_sessions.c.updated_at.desc()).limit(_limit(limit))
        async with self._transaction(self._reader) as conn:
            rows = (await conn.execute(query)).all()
        return [_agent_session(row) for row in rows]

    async def iter_agent_sessions(self, *, batch: int = 500) -> AsyncIterator[AgentSessionRecord]:
        """Every stored agent session (as :meth:`agent_sessions` reads them), ``batch`` rows a read,
        in key order (what ``eventguard verify`` checks)."""
        a = agent_sessions.c
        query = select(agent_sessions).order_by(a.partition, a.session_key).limit(_batch(batch))
        after: tuple[str, str] | None = None
        while True:
            page = query if after is None else query.where(tuple_(a.partition, a.session_key) > after)
            async with self._transaction(self._reader) as conn:
                rows = (await conn.execute(page)).all()
            for row in rows:
                yield _agent_session(row)
            if len(rows) < batch:
                return
            after = (rows[-1].partition, rows[-1].session_key)

    async def prune_agent_sessions(self, *, older_than: timedelta | datetime) -> int:
        """Delete the host's agent sessions last written before ``older_than`` (an age or a time);
        how many went."""
        cutoff = _cutoff(older_than)
        async with self._transaction(self._engine) as conn:
            done = await conn.execute(delete(agent_sessions).where(agent_sessions.c.updated_at < cutoff))
        return int(done.rowcount)

    async def recover(
        self,
        *,
        older_than: timedelta | datetime,
        policy: Literal["interrupted", "failed"] = "interrupted",
        limit: int = 1000,
    ) -> list[str]:
        """Mark responses stuck in a non-ended state since before ``older_than`` as ``policy``.

        For rows whose writer is gone (a crashed replica; a host that never resumed its handler).
        Idempotent, and safe beside live writers: each row is taken with an optimistic version
        check, and a live writer can still record its terminal over "interrupted". Returns the
        ids it marked, at most ``limit`` per call. Its transition is numbered below zero, outside the
        writer's own numbering.
        """
        if policy not in ("interrupted", "failed"):
            raise InvalidQueryError(f"policy must be 'interrupted' or 'failed', not {policy!r}")
        cutoff = _cutoff(older_than)
        cause = "abandoned" if policy == "interrupted" else "recover_policy"
        r = responses.c
        marked: list[str] = []
        async with self._transaction(self._engine) as conn:
            stuck = (
                await conn.execute(
                    select(r.response_id, r.status, r.attempt, r.version)
                    .where(r.status.not_in(ENDED), r.updated_at < cutoff)
                    .order_by(r.pk)
                    .limit(_limit(limit))
                )
            ).all()
            now = datetime.now(UTC)
            for row in stuck:
                taken = await conn.execute(
                    update(responses)
                    .where(r.response_id == row.response_id, r.version == row.version)
                    .values(
                        status=policy,
                        cause=cause,
                        finished_at=now,
                        updated_at=now,
                        owner=RECOVER_OWNER,
                        version=r.version + 1,
                    )
                )
                if taken.rowcount != 1:
                    continue  # its writer moved it meanwhile: it is not stuck
                lowest = (
                    await conn.execute(
                        select(func.min(transitions.c.idx)).where(
                            transitions.c.response_id == row.response_id, transitions.c.attempt == row.attempt
                        )
                    )
                ).scalar_one()
                await conn.execute(
                    transitions.insert().values(
                        response_id=row.response_id,
                        attempt=row.attempt,
                        idx=min(lowest or 0, 0) - 1,
                        from_state=row.status,
                        to_state=policy,
                        cause=cause,
                        reason=f"no writer since before {cutoff.isoformat()}; marked by recover()",
                        at=now,
                    )
                )
                marked.append(row.response_id)
        return marked

    async def _page(
        self, query: Select[Any], key: ColumnElement[int], limit: int, after: int | None, model: Any
    ) -> Page[Any]:
        size = _limit(limit)
        if after is not None:
            if not _is_row_key(after):
                raise InvalidQueryError(f"after must be a cursor from a previous page, not {after!r:.40}")
            query = query.where(key > after)
        async with self._transaction(self._reader) as conn:
            rows = (await conn.execute(query.order_by(key).limit(size + 1))).all()
        items = [model.model_validate(row) for row in rows[:size]]
        return Page(items=items, next_after=items[-1].pk if len(rows) > size else None)

    # --- whole-table reads, a page at a time (verify, and any caller that reads everything) ---------

    async def count(self) -> int:
        """How many responses are stored (every status)."""
        async with self._transaction(self._reader) as conn:
            return int((await conn.execute(select(func.count()).select_from(responses))).scalar_one())

    async def histories(self, *, batch: int = 500) -> AsyncIterator[History]:
        """Every stored response's :class:`History`, in insertion order, read ``batch`` responses at a time.

        Four queries per page (the rows, then their events, transitions and anomalies by
        ``response_id IN (...)``), not four per response; memory holds one page. A response written
        while this runs is included if its row comes after the page being read.

        Args:
            batch: responses per page, 1 to 500 (SQLite's bound-parameter limit allows that many ids).
        """
        async for row, evs, trs, ans in self.history_rows(batch):
            yield _history(row, evs, trs, ans)

    async def history_rows(
        self, batch: int, event_columns: Sequence[ColumnElement[Any]] = ()
    ) -> AsyncIterator[tuple[Any, Sequence[Any], Sequence[Any], Sequence[Any]]]:
        """What :meth:`histories` reads, as database rows: (response row, its events, transitions,
        anomalies), each group in order. ``eventguard.verify`` checks these directly (building a
        typed record per event was most of a 10,000-response verify), reading only the
        ``event_columns`` it needs (``response_id`` and ``attempt`` among them; default: all).

        Args:
            batch: responses per page, 1 to 500.
            event_columns: the events' columns to read (default: all of them).
        """
        _batch(batch)
        event_columns = _event_columns(event_columns)
        r = responses.c
        after = 0
        while True:
            async with self._transaction(self._reader) as conn:
                rows = (
                    await conn.execute(select(responses).where(r.pk > after).order_by(r.pk).limit(batch))
                ).all()
                if not rows:
                    return
                ids = [row.response_id for row in rows]
                evs = await _rows_of(conn, events, ids, events.c.attempt, events.c.seq, columns=event_columns)
                trs = await _rows_of(conn, transitions, ids, transitions.c.attempt, transitions.c.idx)
                ans = await _rows_of(conn, anomalies, ids, anomalies.c.attempt, anomalies.c.pk)
            for row in rows:
                rid = row.response_id
                yield row, evs.get(rid, ()), trs.get(rid, ()), ans.get(rid, ())
            after = rows[-1].pk


def stored_id(response_id: str) -> str:
    """The id under which the sink stores ``response_id``.

    An id that no column can hold as it is (a NUL, a lone surrogate, longer than 255 characters),
    or one spelt as such a stored form is (ending ``~`` and 16 hex digits), is stored as
    ``<escaped prefix>~<hash>`` (see :mod:`eventguard.sql.storable`); every other id is its own
    key. The store's reads take an id spelt as a stored form as its own response's first, else as
    the stored form it spells (copied from a listing). Anything but a ``str`` is an
    :class:`~eventguard.errors.InvalidQueryError`.
    """
    if not isinstance(response_id, str):  # an id of another type is a question no row answers
        raise InvalidQueryError(f"response_id must be a str, not {type(response_id).__name__}")
    fix = storable.identifier(response_id, ID_LENGTH)
    return response_id if fix is None else fix.stored


def _spells_a_stored_id(response_id: str) -> bool:
    """Whether ``response_id`` is changed only because it is spelt as a stored form is."""
    return (
        len(response_id) <= ID_LENGTH
        and storable.storable(response_id)
        and storable.looks_stored(response_id)
    )


async def _read_key(conn: AsyncConnection, column: ColumnElement[str], response_id: str) -> str:
    """The key to read ``response_id`` under: :func:`stored_id`; for an id spelt as a stored form,
    the row of its own where ``column`` has one, else the stored form it spells (one more look, for
    such an id only)."""
    key = stored_id(response_id)
    if key == response_id or not _spells_a_stored_id(response_id):
        return key
    own = (await conn.execute(select(column).where(column == key).limit(1))).first()
    return key if own is not None else response_id


async def _rows(
    conn: AsyncConnection, table: Any, response_id: str, *order: ColumnElement[Any]
) -> Sequence[Any]:
    return (
        await conn.execute(select(table).where(table.c.response_id == response_id).order_by(*order))
    ).all()


def _event_columns(columns: object) -> tuple[ColumnElement[Any], ...]:
    """``history_rows(event_columns=)`` as given, if it is column expressions over the events table
    alone (``eventguard.verify`` reads a terminal's payload only) with ``response_id`` and
    ``attempt`` among them (the rows are grouped and their attempts told apart by them); empty means
    all of them. Anything else was an error from inside SQLAlchemy, rows grouped by nothing, or
    another table's column joined to every event without a word (a cartesian product)."""
    if isinstance(columns, str | bytes) or not isinstance(columns, Iterable):
        raise _not_event_columns(columns)
    chosen = tuple(columns)
    for column in chosen:
        if not isinstance(column, ColumnElement) or any(
            table is not events for table in select(column).get_final_froms()
        ):
            raise _not_event_columns(column)
    names = {getattr(column, "name", None) for column in chosen}
    if chosen and not {"response_id", "attempt"} <= names:
        raise InvalidQueryError("event_columns must include events.c.response_id and events.c.attempt")
    return chosen


def _not_event_columns(value: object) -> InvalidQueryError:
    return InvalidQueryError(
        f"event_columns must be columns of the events table, not {type(value).__name__} {value!r:.60}"
    )


async def _rows_of(
    conn: AsyncConnection,
    table: Any,
    response_ids: list[str],
    *order: ColumnElement[Any],
    columns: Sequence[ColumnElement[Any]] = (),
) -> dict[str, list[Any]]:
    """The rows of ``table`` (its ``columns``, default all) for these responses, grouped by response
    id, each group in ``order``."""
    query = (
        (select(*columns) if columns else select(table))
        .where(table.c.response_id.in_(response_ids))
        .order_by(table.c.response_id, *order)
    )
    grouped: dict[str, list[Any]] = {}
    for row in (await conn.execute(query)).all():
        grouped.setdefault(row.response_id, []).append(row)
    return grouped


def _history(row: Any, evs: Sequence[Any], trs: Sequence[Any], ans: Sequence[Any]) -> History:
    """A response row and its rows (each in order) as a :class:`History`, attempt by attempt."""
    numbers = sorted({x.attempt for x in (*evs, *trs, *ans)} | {row.attempt})
    attempts = [
        Attempt(
            attempt=n,
            events=[EventRecord.model_validate(e) for e in evs if e.attempt == n],
            transitions=[TransitionRecord.model_validate(t) for t in trs if t.attempt == n],
            anomalies=[AnomalyRecord.model_validate(x) for x in ans if x.attempt == n],
        )
        for n in numbers
    ]
    return History(response=ResponseRecord.model_validate(row), attempts=attempts)


def _batch(batch: object) -> int:
    """Rows a read, for the methods that iterate the whole store (1 to 500)."""
    if isinstance(batch, bool) or not isinstance(batch, int) or not 1 <= batch <= 500:
        raise InvalidQueryError(f"batch must be an integer from 1 to 500, not {batch!r:.40}")
    return batch


def _is_row_key(value: object) -> bool:
    """A row key (``pk``): an int from 0 to the largest a BIGINT holds (past it, the driver's
    OverflowError, or PostgreSQL's out-of-range error, not a question)."""
    return not isinstance(value, bool) and isinstance(value, int) and 0 <= value <= _INT64_MAX


_INT64_MAX = 2**63 - 1


def _strings(value: object, name: str) -> list[str]:
    """A ``str``, or an iterable of them (not bytes, not a mapping): as a list."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, bytes | Mapping) or not isinstance(value, Iterable):
        raise InvalidQueryError(f"{name} must be a str or an iterable of str, not {type(value).__name__}")
    values = list(value)
    for v in values:
        if not isinstance(v, str):
            raise InvalidQueryError(
                f"{name} must be a str or an iterable of str, not one holding {type(v).__name__}"
            )
    return values


def _kinds(kind: object) -> list[str]:
    """Anomaly kinds to look for: any text a driver can send (a NUL, or a lone surrogate, which no
    stored kind holds, is refused by the drivers: a database error for a question); text that names
    no kind matches nothing."""
    values = _strings(kind, "kind")
    for v in values:
        if "\x00" in v or utf8_size(v) is None:
            raise InvalidQueryError(f"kind must be text without a NUL or a lone surrogate, not {v!r:.80}")
    return values


def _statuses(status: str | Iterable[str], *, allowed: Sequence[str]) -> list[str]:
    values = _strings(status, "status")
    bad = [v for v in values if v not in allowed]
    if bad:
        known = [s for s in STATES if s in allowed]
        raise InvalidQueryError(f"unknown status {bad[0]!r:.80}: expected one of {', '.join(known)}")
    return values


def _agent_session(row: Any) -> AgentSessionRecord:
    """One stored agent session row, read back as the host's store reads it, or what is wrong with it."""
    # Imported here: envelopes imports the host's protocol module, which only these reads need.
    from eventguard.envelopes import ProviderStorageError, decode_id, key, load

    problem: str | None = None
    try:
        session_id = decode_id(row.session_id)
    except (ValueError, ProviderStorageError) as exc:
        session_id, problem = row.session_id, f"its stored id does not decode: {exc}"
    else:
        if key(session_id) != row.session_key:
            problem = "its stored id is not the one its row is keyed by"
    session: dict[str, Any] | None = None
    try:
        value = load(row.value, "the stored session")
    except ProviderStorageError as exc:
        problem = problem or str(exc)
    else:
        shape = _session_shape(value)
        if shape is not None:
            problem = problem or shape
        elif problem is None:
            session = value
    return AgentSessionRecord(
        partition=row.partition,
        session_id=session_id,
        version=row.version,
        updated_at=row.updated_at,
        size=len(row.value),
        session=session,
        problem=problem,
    )


_JSON_KINDS = {dict: "an object", list: "an array", str: "a string", bool: "a boolean", type(None): "null"}


def _session_shape(value: Any) -> str | None:
    """What keeps ``value`` from being an ``AgentSession.to_dict()`` that ``from_dict`` reads back."""
    if not isinstance(value, dict):
        return f"the stored session is {_JSON_KINDS.get(type(value), 'a number')}, not an object"
    if not isinstance(value.get("session_id"), str):
        return "the stored session's session_id is not a string"
    service = value.get("service_session_id")
    if service is not None and not isinstance(service, str):
        return "the stored session's service_session_id is neither a string nor null"
    if not isinstance(value.get("state", {}), dict):
        return "the stored session's state is not an object"
    return None


def _limit(limit: int) -> int:
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_LIMIT:
        raise InvalidQueryError(f"limit must be an integer from 1 to {MAX_LIMIT}, not {limit!r}")
    return limit


def _utc(value: datetime, name: str) -> datetime:
    if not isinstance(value, datetime):
        raise InvalidQueryError(f"{name} must be a datetime, not {type(value).__name__}")
    # Stored times are UTC; a naive argument is taken as UTC too.
    try:
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)
    except OverflowError:  # year 1 or 9999 at an offset that takes it past the calendar's edge
        raise InvalidQueryError(f"{name} {value.isoformat()} is past the calendar's edge in UTC") from None


def _cutoff(older_than: timedelta | datetime) -> datetime:
    """The time ``older_than`` names: an age back from now (zero or more: a negative one would take
    what ended a moment ago, or is still running, for old), or a time as given."""
    if isinstance(older_than, timedelta):
        if older_than < timedelta(0):
            raise InvalidQueryError(f"older_than must be an age of zero or more, not {older_than}")
        try:
            return datetime.now(UTC) - older_than
        except OverflowError:  # an age reaching back before the year 1: a bad argument, not the database's
            raise InvalidQueryError(f"older_than {older_than} reaches back before the year 1") from None
    return _utc(older_than, "older_than")


def _time_window(
    query: Select[Any], column: ColumnElement[Any], since: datetime | None, until: datetime | None
) -> Select[Any]:
    if since is not None:
        query = query.where(column >= _utc(since, "since"))
    if until is not None:
        query = query.where(column < _utc(until, "until"))
    return query
