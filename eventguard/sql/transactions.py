"""Read and write transactions on one database, and its dialect's INSERT: what the SQL stores share.

:class:`Transactions` opens one transaction at a time on an engine, in the mode a store asks for:
reads see one snapshot (SQLite: a deferred transaction under WAL; PostgreSQL: REPEATABLE READ);
writes take SQLite's write lock up front (``BEGIN IMMEDIATE``, the engine's default, see
:func:`eventguard.sql.engine.create_engine`). Its owner (the response store, ``eventguard.provider``)
supplies what the SQL layer does not know: the engine, what must happen before the first
transaction (the schema check) and what a failure means to its callers (its storage error). Other
stores on the same database (``eventguard.agent_sessions``) write through the owner's instance,
so they share its engine, its schema check and its errors without reaching into its privates.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any, Literal, TypeVar

from sqlalchemy import Table
from sqlalchemy.dialects import postgresql as pg_dialect
from sqlalchemy.dialects import sqlite as sqlite_dialect
from sqlalchemy.engine import URL
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from eventguard.sql import engine as _db

__all__ = ["Mode", "OnConflictInsert", "Transactions", "WriteBody", "dialect_insert"]

T = TypeVar("T")

#: What a transaction is for: one snapshot to read, or the write lock up front.
Mode = Literal["read", "write"]
#: A write transaction's statements: awaited with the open connection, its result the write's.
WriteBody = Callable[[AsyncConnection], Coroutine[Any, Any, T]]
#: An INSERT that can say what to do on a conflict (``on_conflict_do_nothing``/``_do_update``).
OnConflictInsert = sqlite_dialect.Insert | pg_dialect.Insert


def dialect_insert(url: URL) -> Callable[[Table], OnConflictInsert]:
    """The dialect's ``insert`` for this database: both SQLite's and PostgreSQL's take an
    ``ON CONFLICT`` clause, which the generic ``sqlalchemy.insert`` has not."""
    if _db.is_sqlite(url):
        return sqlite_dialect.insert
    return pg_dialect.insert


async def _nothing() -> None:
    return None


@asynccontextmanager
async def _unchanged() -> AsyncIterator[None]:
    yield


class Transactions:
    """One database's transactions (:meth:`open`) and its dialect's INSERT (:meth:`insert`).

    Parameters:
        engine: gives the engine to connect through, called once per transaction (an owner may
            build its engine on first use, or drop and rebuild it).
        url: the database's URL: it picks the read options and the INSERT.
        prepare: awaited at the start of each transaction, inside ``errors`` (the owner's schema
            check on first use).
        errors: wraps each whole transaction, ``prepare`` included (the owner's translation of a
            database's failure into its own error).
        writes: how the owner runs one write transaction (:meth:`write`), when it has a way of its
            own: the response store hands an SQLite file's whole transaction to its writer thread.
    """

    def __init__(
        self,
        engine: Callable[[], AsyncEngine],
        url: URL,
        *,
        prepare: Callable[[], Awaitable[None]] = _nothing,
        errors: Callable[[], AbstractAsyncContextManager[None]] = _unchanged,
        writes: Callable[[WriteBody[Any]], Awaitable[Any]] | None = None,
    ) -> None:
        self._engine = engine
        self._writes = writes
        self._prepare = prepare
        self._errors = errors
        self._read_options: dict[str, Any] = (
            {_db.SQLITE_BEGIN_OPTION: "DEFERRED"}
            if _db.is_sqlite(url)
            else {"isolation_level": "REPEATABLE READ"}
        )
        self._insert = dialect_insert(url)

    def insert(self, table: Table) -> OnConflictInsert:
        """``INSERT INTO table`` in the database's dialect (with ``on_conflict_do_*``)."""
        return self._insert(table)

    @asynccontextmanager
    async def open(self, mode: Mode) -> AsyncIterator[AsyncConnection]:
        """One transaction, committed when the block ends (rolled back when it raises)."""
        async with self._errors():
            await self._prepare()
            async with self._engine().connect() as conn:
                if mode == "read":
                    await conn.execution_options(**self._read_options)
                async with conn.begin():
                    yield conn

    async def write(self, body: WriteBody[T]) -> T:
        """``body(conn)`` in one write transaction, committed when this returns (rolled back when it
        raises): the owner's way when it has one (``writes``), else :meth:`open` ``("write")``.

        On an SQLite file the owner's way holds the write lock only while its thread runs the
        statements; through the engine each statement is a turn of the event loop, and a busy loop
        kept every other writer of the file waiting (issue 13).
        """
        if self._writes is not None:
            return await self._writes(body)  # type: ignore[no-any-return]
        async with self.open("write") as conn:
            return await body(conn)
