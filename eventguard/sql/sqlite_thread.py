"""The sink's SQLite writes on a thread of their own, through the stdlib ``sqlite3`` module.

The event loop that serves a host's requests hands a whole transaction over in one trip (a
callable, a future back) and does nothing more for it: building the rows, binding them, SQLite's
work and the commit all happen on the writer thread, and ``sqlite3`` releases the GIL while SQLite
runs. Through SQLAlchemy's aiosqlite adapter the same transaction was five trips to aiosqlite's
thread, each one a turn of the event loop and SQLAlchemy's own Python on it (issue 13).

Only the sink's hot write path comes here (:mod:`eventguard.sink.commit`). The schema, the
migrations, the quarantine's own writes and every read stay on SQLAlchemy's engine; both open the
same file, with the same pragmas (WAL, ``busy_timeout``, foreign keys, ``synchronous=NORMAL``),
and every write transaction begins ``IMMEDIATE``, so the two never upgrade a read lock into a
failed write. The statements are the ones the aiosqlite path ran (:mod:`eventguard.sink.apply`):
the database enforces the same constraints, whichever connection sends them.

Errors from SQLite are raised as SQLAlchemy's ``DBAPIError`` (as the engine raises them), so the
sink tells refused content from an absent database the same way. A connection that saw an
``OperationalError`` (a locked, missing or full database) is closed and opened again for the
next transaction.

**Checkpoints off the caller's path.** In WAL mode SQLite copies the log back into the database (a
checkpoint) inside the ``COMMIT`` that takes the log past ``wal_autocheckpoint`` pages: that commit,
and the response waiting for it, took 6-8 ms instead of 0.2 (one in every 30 to 50 short responses
of a real host, its p99). Here the thread's connection checkpoints by itself: once its transactions
have changed :data:`CHECKPOINT_ROWS` rows since the last one, it runs ``PRAGMA
wal_checkpoint(PASSIVE)`` after the caller has its answer, before it takes the next job (or with
one waiting, once twice as many rows are due). That keeps the log well under SQLite's own
``wal_autocheckpoint`` (1,000 pages, left as it is on every connection), so a commit seldom reaches
it; past it a commit still checkpoints itself, as before: the log stays as bounded as SQLite keeps
it (a few huge rows, readers that hold the log back), and without this thread too.

**Back-pressure.** The writer submits one transaction at a time (it holds its lock around each
write), so at most one job waits in the queue per event loop; what the streams buffer meanwhile
is bounded by the sink's ``max_buffered`` (past it, the spool). A job whose caller stopped
waiting (cancelled, timed out) still runs to its end: every statement is idempotent, so the
same batches written again from the spool change nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import queue
import sqlite3
import threading
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, TypeVar

from sqlalchemy import create_engine as _sync_engine
from sqlalchemy.engine import Connection, Dialect, Engine
from sqlalchemy.exc import DBAPIError
from sqlalchemy.pool import StaticPool

__all__ = ["CHECKPOINT_ROWS", "SqliteConnection", "SqliteThread", "drive"]

T = TypeVar("T")

#: Rows changed (inserted, updated, deleted) by the thread's transactions that make a checkpoint
#: due: about sixteen short responses (a 28-event response changes about 31 rows and writes about
#: 20 pages to the log), well inside SQLite's own ``wal_autocheckpoint`` of 1,000 pages.
CHECKPOINT_ROWS = 500

_CHECKPOINT = "PRAGMA wal_checkpoint(PASSIVE)"

#: One lock per database file for this process's writer threads (see :func:`_file_lock`).
_FILE_LOCKS: dict[str, threading.Lock] = {}
_FILE_LOCKS_LOCK = threading.Lock()


def _file_lock(path: str) -> threading.Lock:
    """The lock every writer thread of this process takes around a write transaction on ``path``
    (the file's real path, so that two spellings of one file share it).

    SQLite's own write lock is not a queue: a ``BEGIN IMMEDIATE`` that finds it taken sleeps (1, 2,
    5, 10 ... 100 ms, SQLite's busy handler) and looks again, while a writer that runs transactions
    back to back takes it again at once. The sink's thread and the response store's on one file
    (``database=``) left each other waiting 80-200 ms at the p99 under 16 concurrent responses.
    Waiting here instead wakes the next writer as soon as the lock is let go; other processes
    still meet SQLite's lock and its ``busy_timeout``.
    """
    with _FILE_LOCKS_LOCK:
        return _FILE_LOCKS.setdefault(path, threading.Lock())


def _forget_file_locks() -> None:
    # A child process made by fork() while a writer held a lock would wait for it for ever: the
    # writer's thread is not in the child. Its writers start again with locks of their own.
    global _FILE_LOCKS_LOCK
    _FILE_LOCKS_LOCK = threading.Lock()
    _FILE_LOCKS.clear()


if hasattr(os, "register_at_fork"):  # not on Windows, which has no fork()
    os.register_at_fork(after_in_child=_forget_file_locks)


#: What the thread's queue holds: a job and where its outcome goes, or None to stop.
_Job = tuple[Callable[["SqliteConnection"], Any], asyncio.AbstractEventLoop, "asyncio.Future[Any]"]


def drive(coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` to its end here, synchronously: the sink's statements are written as
    coroutines (the PostgreSQL path awaits its driver), and on the writer thread every await
    they make returns at once (:class:`SqliteConnection` never suspends). An await that would
    suspend is a bug, said as one."""
    try:
        coro.send(None)
    except StopIteration as stop:
        return stop.value  # type: ignore[no-any-return]
    coro.close()
    raise RuntimeError("a statement on the SQLite writer thread awaited something that suspends")


class SqliteConnection:
    """What the sink's statements see on the writer thread, in place of an ``AsyncConnection``:
    ``dialect``, ``execute`` (a SQLAlchemy construct, for the rare reads and quarantine rows)
    and :meth:`run` (one SQL text, the hot path)."""

    def __init__(self, raw: sqlite3.Connection, engine: Engine) -> None:
        self.raw = raw
        self._engine = engine
        self._conn: Connection | None = None
        #: The dialect the bind processors come from (pysqlite's: the same formats as aiosqlite's).
        self.dialect: Dialect = engine.dialect

    def run(self, sql: str, params: tuple[Any, ...]) -> int:
        """Run one statement in the open transaction; the rows it changed."""
        before = self.raw.total_changes
        try:
            self.raw.execute(sql, params).close()
        except sqlite3.Error as exc:
            raise DBAPIError.instance(sql, None, exc, sqlite3.Error) from exc
        return self.raw.total_changes - before

    async def execute(self, statement: Any, parameters: Any = None) -> Any:
        """A SQLAlchemy construct through a sync connection over the same ``sqlite3`` connection
        (inside the open transaction: SQLAlchemy's own BEGIN is a no-op in autocommit mode)."""
        if self._conn is None:
            self._conn = self._engine.connect()
        return self._conn.execute(statement, parameters)

    def release(self) -> None:
        """Let go of the sync connection (after the commit or the rollback: its own rollback on
        close then finds nothing open)."""
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(Exception):
                conn.close()


class SqliteThread:
    """One thread, one ``sqlite3`` connection to ``path``: runs write transactions handed over
    from any event loop. ``busy_timeout_ms``: how long a transaction waits for another process's
    write lock; ``json_serializer`` / ``json_deserializer``: the engine's, for JSON columns."""

    def __init__(
        self,
        path: Path,
        *,
        busy_timeout_ms: int,
        json_serializer: Callable[[Any], str],
        json_deserializer: Callable[[Any], Any],
    ) -> None:
        self.path = path
        self._busy_timeout_ms = busy_timeout_ms
        self._json = (json_serializer, json_deserializer)
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        #: The file as every writer thread of this process names it (see _file_lock).
        self._file = os.path.realpath(path)
        self._conn: SqliteConnection | None = None
        #: The connection's ``total_changes`` at its last checkpoint (or when it opened).
        self._changes_at_checkpoint = 0
        #: Checkpoints the thread ran itself (read by tests and diagnostics).
        self.checkpoints = 0

    async def transaction(self, job: Callable[[SqliteConnection], T]) -> T:
        """``job(conn)`` inside ``BEGIN IMMEDIATE`` ... ``COMMIT`` on the writer thread (rolled
        back if it raises, and its error raised here)."""
        return await self.call(lambda conn: _in_transaction(conn, job, _file_lock(self._file)))

    async def call(self, job: Callable[[SqliteConnection], T]) -> T:
        """``job(conn)`` on the writer thread, its result (or error) back here."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        self._start()
        self._jobs.put((job, loop, future))
        return await future

    def _start(self) -> None:
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._work, name=f"eventguard-sqlite {self.path.name}", daemon=True
                )
                self._thread.start()

    async def close(self) -> None:
        """Stop the thread once its queued jobs are done, and close its connection."""
        with self._lock:
            thread, self._thread = self._thread, None
        if thread is None:
            return
        self._jobs.put(None)
        await asyncio.to_thread(thread.join)

    # -- on the thread -------------------------------------------------------------------------
    def _work(self) -> None:
        try:
            while (item := self._jobs.get()) is not None:
                self._run(item)
                # The job (its batches, their events) must not stay alive while the thread waits
                # for the next one: a held stream's events would look kept per event.
                del item
                # The caller has its answer (settled above): the log's copy-back costs it nothing.
                self._checkpoint_if_due()
        finally:
            self._drop()

    def _run(self, item: _Job) -> None:
        job, loop, future = item
        try:
            result = job(self._connection())
        except BaseException as exc:
            if isinstance(exc, sqlite3.OperationalError | DBAPIError):
                self._drop()  # locked, missing, full: a fresh connection next time
            _settle(loop, future, None, exc)
        else:
            _settle(loop, future, result, None)

    def _checkpoint_if_due(self) -> None:
        """A passive checkpoint once enough rows changed: at once when no job waits, else only
        when twice as many are due (a busy writer still keeps its log short)."""
        conn = self._conn
        if conn is None:
            return
        due = conn.raw.total_changes - self._changes_at_checkpoint
        if due < CHECKPOINT_ROWS or (due < 2 * CHECKPOINT_ROWS and not self._jobs.empty()):
            return
        self._changes_at_checkpoint = conn.raw.total_changes
        try:
            # PASSIVE: copies what no reader still needs and waits for nobody; a checkpoint by
            # another connection at the same time makes this one a no-op (said in its result row,
            # not raised).
            conn.raw.execute(_CHECKPOINT).close()
        except sqlite3.Error:
            # The log stays as it is (SQLite's own bound still holds); the next write tells
            # whether the connection is still good.
            return
        self.checkpoints += 1

    def _connection(self) -> SqliteConnection:
        if self._conn is not None:
            return self._conn
        try:
            raw = sqlite3.connect(
                self.path, timeout=self._busy_timeout_ms / 1000, isolation_level=None, check_same_thread=False
            )
        except sqlite3.Error as exc:
            raise DBAPIError.instance("connect", None, exc, sqlite3.Error) from exc
        try:
            # The engine's pragmas (eventguard.sql.engine.create_engine), on this connection too.
            raw.execute(f"PRAGMA busy_timeout = {int(self._busy_timeout_ms)}")
            raw.execute("PRAGMA journal_mode = WAL")
            raw.execute("PRAGMA foreign_keys = ON")
            raw.execute("PRAGMA synchronous = NORMAL")
        except sqlite3.Error as exc:
            raw.close()
            raise DBAPIError.instance("PRAGMA", None, exc, sqlite3.Error) from exc
        self._changes_at_checkpoint = 0  # a new connection counts from zero
        serializer, deserializer = self._json
        engine = _sync_engine(
            "sqlite://",
            creator=lambda: raw,
            poolclass=StaticPool,
            pool_reset_on_return=None,
            json_serializer=serializer,
            json_deserializer=deserializer,
        )
        # Its first connect initialises the dialect and then rolls back: here, outside any
        # transaction of ours, not inside the first one that needs it.
        with contextlib.suppress(Exception):
            engine.connect().close()
        self._conn = SqliteConnection(raw, engine)
        return self._conn

    def _drop(self) -> None:
        conn, self._conn = self._conn, None
        if conn is None:
            return
        conn.release()
        with contextlib.suppress(Exception):
            conn.raw.close()


def _in_transaction(conn: SqliteConnection, job: Callable[[SqliteConnection], T], lock: threading.Lock) -> T:
    with lock:
        conn.run("BEGIN IMMEDIATE", ())
        try:
            result = job(conn)
            conn.run("COMMIT", ())
        except BaseException:
            with contextlib.suppress(sqlite3.Error, DBAPIError):
                if conn.raw.in_transaction:
                    conn.raw.execute("ROLLBACK")
            raise
        finally:
            conn.release()
    return result


def _settle(
    loop: asyncio.AbstractEventLoop, future: asyncio.Future[Any], result: Any, error: BaseException | None
) -> None:
    def settle() -> None:
        if future.done():
            return  # its caller stopped waiting (cancelled, timed out)
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)

    with contextlib.suppress(RuntimeError):  # the caller's loop is closed: nobody waits
        loop.call_soon_threadsafe(settle)
