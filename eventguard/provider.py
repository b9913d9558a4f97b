"""The host's response store in SQL: what ``ResponsesHostServer`` serves GET, input items and history from.

:class:`SqlResponseProvider` implements the host's ``ResponseProviderProtocol`` (the same seven
methods in azure-ai-agentserver-responses 2.2.0b1 and 2.4.0b1) on SQLite and PostgreSQL, in the
same database and migration chain as the event sink::

    from eventguard import SqlResponseProvider

    provider = SqlResponseProvider("postgresql://.../agents")   # or an AsyncEngine it borrows
    server = ResponsesHostServer(agent, response_store=provider)  # store= on 1.0.0b260918

What the host relies on, and how it holds here (each checked against the installed host):

- **Not found is ``KeyError``, and only not found.** ``get_response``, ``update_response`` and
  ``delete_response`` of a missing (or deleted) response raise ``KeyError``; ``get_input_items``
  raises ``KeyError`` when missing and ``ValueError`` when deleted; a second ``create_response``
  of a live id raises the host's ``ResponseAlreadyExistsError``. Anything the database does wrong
  (away, locked, schema missing, a row that does not decode) is a :class:`ProviderStorageError`:
  an :class:`eventguard.errors.ResponseStoreError`, and to the host a
  ``ResponseStoreCorruptionError`` (its "stored, but unreadable now" signal: GET answers 500, not
  404, and recovery keeps the response instead of dropping it).
- **Durable when it returns**: every write is one transaction, committed before the method
  returns; nothing is buffered (unlike the sink, there is no spool on this path). On SQLite the
  engine runs WAL with ``synchronous=NORMAL``: durable against a crash of the process, not of the
  machine's power.
- **Atomic, copied, exact**: an update is one transaction (the envelope row first, so two writers
  of one response are serialised by its row lock); values are serialised at call time (the host
  mutates what it passed) and every getter decodes a fresh copy. Envelopes and items are stored as
  ASCII JSON text, so any JSON value round-trips exactly, ``metadata["_internal_metadata"]``, item
  ``internal_metadata``, NUL and lone surrogates included, and the ``datetime`` the host's
  resilient checkpoints carry in ``created_at``; a value JSON cannot hold exactly (a tuple, a
  non-string key, NaN, another object) is refused with :class:`UnstorableError`, never silently
  changed.
- **Partitioned by ``context.user_id_key``**: ``None`` (or no context), ``""`` and each named user
  are separate partitions, on both upstream ends. (2.4.0b1's own stores do the same; 2.2.0b1's
  in-memory store ignored the context and kept one partition. The host passes the same context on
  both, so a database written under 2.2.0b1 reads the same under 2.4.0b1.) Items are keyed by id
  within a partition and outlive their response; delete is soft; re-creating a deleted id is
  allowed and keeps its row (and so its place in a conversation).
- **History**: ``get_history_item_ids`` returns the previous response's history + input + output
  ids, or every conversation member's in membership order, de-duplicated keeping the first
  occurrence; ``-1`` means all, otherwise the last ``limit``. History ids are stored as shared,
  content-addressed nodes (``eventguard_provider_history``): turn n of a chain adds only the ids
  turn n-1 added, so a 1,000-turn chain costs O(n) rows, not O(n^2). Nodes are grouped in runs
  (a chain without branches is one), so a history is read as one index range per run, in one
  statement, not node by node.
- **Concurrency is the database's**: creation is one ``INSERT ... ON CONFLICT DO UPDATE ... WHERE
  deleted`` (two creators of one id: exactly one wins), updates and deletes are conditional on the
  row being live, and no process lock is taken, so several processes on one database agree.
- **SQLite writes off the event loop, in one hand-off**: on an SQLite file each write transaction
  runs on the provider's stdlib ``sqlite3`` writer thread (:mod:`eventguard.sql.sqlite_thread`;
  ``BEGIN IMMEDIATE`` ... ``COMMIT`` there), not as five trips to aiosqlite's thread. Retention's
  prune on PostgreSQL locks the envelope table against writes (``SHARE ROW EXCLUSIVE``) so it never
  takes what a create in flight is naming; a prune that commits between the host's history read and
  its create (the previous response expired, and items its history named with it) makes that create
  fail with :class:`ProviderStorageError` rather than store a history whose items are gone.
- **SQLite reads a response on the loop, without waiting**: ``get_response``'s one indexed SELECT
  runs on the event loop's thread through a ``sqlite3`` connection that never waits for a lock
  (``busy_timeout`` 0, ``query_only``), as the host's file store reads its file there; when the
  database cannot answer at once it is read the ordinary way, on aiosqlite's thread, which waits.
- **Event loops**: a provider may be used from one ``asyncio.run()`` after another; its own engine's
  pool is let go (``dispose(close=False)``) when the loop changes. A borrowed engine's pool is its
  owner's: dispose of it yourself between loops, as SQLAlchemy advises.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import sqlite3
import threading
from collections.abc import AsyncIterator, Callable, Coroutine, Iterable, Mapping, Sequence
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar, cast

import aiosqlite
from azure.ai.agentserver.responses.store._base import (
    ResponseAlreadyExistsError,
)
from sqlalchemy import (
    Select,
    bindparam,
    case,
    delete,
    exists,
    func,
    literal,
    select,
    union_all,
    update,
)
from sqlalchemy.engine import URL
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from eventguard import _arguments as arguments
from eventguard.envelopes import ENCODED_ID, ProviderStorageError
from eventguard.envelopes import decode_id as _dec_id
from eventguard.envelopes import dump as _dump
from eventguard.envelopes import encode_id as _enc_id
from eventguard.envelopes import key as _key
from eventguard.envelopes import load as _load
from eventguard.envelopes import partition as _partition
from eventguard.envelopes import shown as _shown
from eventguard.errors import ResponseStoreError, UnstorableError
from eventguard.records import EnvelopePruneResult, EnvelopeRecord
from eventguard.sql import engine as _db
from eventguard.sql import migrate as _migrate
from eventguard.sql import storable
from eventguard.sql.classify import outages_as_unavailable
from eventguard.sql.pool_loop import PoolLoop
from eventguard.sql.sqlite_thread import SqliteConnection, SqliteThread, drive
from eventguard.sql.tables import (
    provider_conversations,
    provider_history,
    provider_items,
    provider_links,
    provider_responses,
)
from eventguard.sql.transactions import Transactions

__all__ = ["ProviderStorageError", "SqlResponseProvider", "prune_store", "read_envelopes"]

log = logging.getLogger(__name__)

#: ``get_input_items`` clamps its limit to this range, as the host's own stores do.
MIN_PAGE, MAX_PAGE = 1, 100
#: Ids looked up per statement (both drivers bind at most ~32k parameters).
CHUNK = 500
#: Times a history write looks again after another writer took the slot it wanted (each look
#: finds more stored: only a storm of writers on one chain could need more than two).
HISTORY_ATTEMPTS = 8

T = TypeVar("T")


# -- encoding: exact values as text any column holds -------------------------------------------------


def _dec_ids(stored: Sequence[str]) -> list[str]:
    """Many stored ids at once (a history's thousands): only the escaped ones cost a call. Read
    with ``scalars().all()``, not row by row: per-row fetching was most of a 2,000-id read."""
    return [_dec_id(text) if text.startswith(ENCODED_ID) else text for text in stored]


def _id_of(value: object, what: str) -> str:
    if not isinstance(value, str):
        raise UnstorableError(f"{what} must be a str, not {type(value).__name__}")
    return value


def _int_of(value: object, what: str) -> int:
    """An int argument, checked before any transaction: inside one, a wrong type would read as a
    database that cannot be used (``ProviderStorageError``), which the host takes for a broken store."""
    if not isinstance(value, int) or isinstance(value, bool):
        raise UnstorableError(f"{what} must be an int, not {type(value).__name__}")
    return value


def _many(values: object, what: str) -> Iterable[object]:
    """An iterable of values, but not a string (each of its characters would be taken for an id)
    nor a mapping (one item given where a list was meant: its keys would be taken, it lost)."""
    if isinstance(values, str | bytes | Mapping) or not isinstance(values, Iterable):
        raise UnstorableError(f"{what} must be an iterable of values, not {type(values).__name__}")
    return values


def _item_id(item: object) -> str | None:
    """An item's id as the host's in-memory store reads it (``None``: the item has none)."""
    value = item.get("id") if isinstance(item, Mapping) else getattr(item, "id", None)
    return None if value is None else str(value)


def _conversation_id(response: Mapping[str, Any]) -> str | None:
    """The conversation a response belongs to (the host's ``get_conversation_id``)."""
    conv = response.get("conversation")
    if conv is None:
        return None
    if isinstance(conv, str):
        return conv or None
    cid = conv.get("id") if isinstance(conv, Mapping) else getattr(conv, "id", None)
    return str(cid) if cid else None


#: One history node as written: ``(node, parent, depth, id)``.
Node = tuple[str, str | None, int, str]


def _history_nodes(ids: Sequence[str]) -> list[Node]:
    """The nodes of a history list: ``(node, parent, depth, id)``, each keyed by the hash of the
    whole list up to it, so equal prefixes are the same rows."""
    nodes: list[Node] = []
    parent: str | None = None
    digest = b""
    for depth, item_id in enumerate(ids, start=1):
        digest = hashlib.sha256(digest + item_id.encode("utf-8", "surrogatepass")).digest()
        node = digest.hex()
        nodes.append((node, parent, depth, item_id))
        parent = node
    return nodes


def _probes(count: int) -> list[int]:
    """Positions of a history list to look up first, to find how much of it is stored: the last
    ones, then doubling steps back to the start (a new turn adds a few ids at the end)."""
    found: list[int] = []
    step = 1
    at = count - 1
    while at > 0:
        found.append(at)
        at -= step
        step *= 2
    found.append(0)
    return found


class _Prepared:
    """One ``create_response``/``update_response`` argument set, serialised at call time."""

    __slots__ = (
        "body",
        "conversation",
        "history",
        "inputs",
        "outputs",
        "previous",
        "response_id",
        "status",
    )

    def __init__(
        self,
        response: object,
        input_items: Iterable[object] | None,
        history_item_ids: Iterable[object] | None,
    ) -> None:
        if not isinstance(response, Mapping):
            raise UnstorableError(f"a response must be a mapping, not {type(response).__name__}")
        self.response_id = _id_of(response.get("id"), "the response's id")
        self.body = _dump(response, f"response {self.response_id!a}")
        status = response.get("status")
        self.status = status[:32] if isinstance(status, str) and storable.storable(status) else None
        self.conversation = _conversation_id(response)
        previous = response.get("previous_response_id")
        self.previous = previous if isinstance(previous, str) and previous else None
        self.inputs = self._items(_many(input_items or (), "input_items"), "input")
        output = response.get("output")
        self.outputs = self._items(output if isinstance(output, list) else (), "output")
        self.history = [
            _id_of(i, "a history item id") for i in _many(history_item_ids or (), "history_item_ids")
        ]

    def _items(self, items: Iterable[object], role: str) -> list[tuple[str, str]]:
        out = []
        for index, item in enumerate(items):
            item_id = _item_id(item)
            if item_id is not None:  # an item without an id is not indexed (the host's stores skip it)
                out.append((item_id, _dump(item, f"{role} item {index} ({item_id!a})")))
        return out


class SqlResponseProvider:
    """The host's response store (``ResponseProviderProtocol``) in eventguard's SQL database.

    Parameters:
        url: a database URL (``postgresql://...``, ``sqlite:///file.db``; default
            ``EVENTGUARD_DATABASE_URL``, else ``./eventguard.db``), or an ``AsyncEngine`` to borrow
            (the application's, or the sink's: ``SqlSink.engine``). An engine built from a URL is
            the provider's own and :meth:`aclose` disposes of it; a borrowed one is left open.
        schema: PostgreSQL schema (``search_path``); with a PostgreSQL engine, set per transaction
            on the engine's connections.
        auto_migrate: ``None`` (default) creates the schema in an empty database but never upgrades
            an existing one; ``True`` also upgrades; ``False`` only checks.
        statement_timeout: seconds after which a PostgreSQL statement fails (a storage error, not a
            hang); ``busy_timeout``: seconds SQLite waits for another writer's lock.
        connect_timeout: seconds to wait for a connection (PostgreSQL) before failing with a
            storage error.

    The seven ``ResponseProviderProtocol`` methods take the host's arguments; each one's ``context``
    is the host's ``PlatformContext`` (a ``ResponseContext`` reads as its ``platform_context``),
    whose ``user_id_key`` names the partition (``None``, ``""`` and a named user are distinct, on
    2.2.0b1 too, whose own stores ignore the user). A database that fails raises
    :class:`~eventguard.ProviderStorageError`, never ``KeyError``.

    Every method is safe to call from several tasks and processes at once. The schema is checked
    (and created, per ``auto_migrate``) by :meth:`start`, or on the first call.
    """

    def __init__(
        self,
        url: str | URL | AsyncEngine | None = None,
        *,
        schema: str | None = None,
        auto_migrate: bool | None = None,
        statement_timeout: float | None = 60.0,
        busy_timeout: float = 30.0,
        connect_timeout: float = 10.0,
    ) -> None:
        _db.valid_schema(schema)
        auto_migrate = arguments.flag("auto_migrate", auto_migrate, none=True)
        statement_timeout = arguments.seconds("statement_timeout", statement_timeout, zero=False, none=True)
        busy_timeout = arguments.seconds("busy_timeout", busy_timeout)
        connect_timeout = arguments.seconds("connect_timeout", connect_timeout, zero=False)
        if isinstance(url, AsyncEngine):
            self._engine: AsyncEngine | None = url
            postgresql = url.url.get_backend_name() == "postgresql"
            if postgresql:
                # Its writes are transactions of several rows. (On SQLite the provider writes
                # through a connection of its own to the file, and the engine's level is moot.)
                _db.refuse_autocommit(url)
            if postgresql and (schema is not None or url.url.get_driver_name() == "asyncpg"):
                # The application's pool with the schema and statement_timeout set per transaction,
                # as SqlSink(engine=) and ResponseStore(engine=) take it: used as it is, the engine's
                # own search_path put these tables in another schema than the sink's, the timeout
                # was never set, and a replica's settings went onto the application's connections.
                # (Another driver is used as it is, without schema=: borrowing raises for it.)
                self._engine = _db.borrow_engine(
                    url,
                    schema=schema,
                    busy_timeout_ms=int(busy_timeout * 1000),
                    statement_timeout=statement_timeout,
                )
            self._owns_engine = False
            self.url = url.url
        else:
            self._engine = None
            self._owns_engine = True
            self.url = _db.resolve_url(url)
            _db.require_driver(self.url)
        self.schema = schema
        self.auto_migrate = auto_migrate
        self._statement_timeout = statement_timeout
        self._busy_timeout = busy_timeout
        self._connect_timeout = connect_timeout
        self._secrets = _db.url_secrets(self.url)
        self._ready = False
        # The host calls a provider it was given without start(): its first requests arrive together,
        # and two Alembic upgrades interleaved in one process fail both. One start at a time.
        self._starting = asyncio.Lock()
        self._sqlite = self.url.get_backend_name() == "sqlite"
        #: Read and write transactions on the provider's database (the schema checked on first use,
        #: every failure a :class:`ProviderStorageError`) and its dialect's INSERT: what the
        #: provider and :class:`~eventguard.SqlAgentSessionStoreProvider` write through.
        self.transactions = Transactions(
            lambda: self.engine,
            self.url,
            prepare=self._ready_on_this_loop,
            errors=self._storage_errors,
            writes=self._write,
        )
        #: SQLite file: every write transaction is one hand-off to a stdlib ``sqlite3`` thread (see
        #: :meth:`_write`). Not for a subclass that fences its writes: its hooks run on the event
        #: loop (a replica's lease bookkeeping is the loop's), so those go through the engine.
        self._writer: SqliteThread | None = None
        if self._sqlite and not self._fences_writes():
            self._writer = _db.sqlite_writer(self.url, busy_timeout_ms=int(busy_timeout * 1000))
        #: SQLite file: ``get_response``'s one SELECT on the event loop's own thread (see
        #: :class:`_LoopReader`); None where only the engine knows how to open the database.
        path = _db.sqlite_path(self.url) if self._sqlite and not self.url.query else None
        self._reader = None if path is None else _LoopReader(path)
        #: The event loop the engine's pooled connections belong to (see :meth:`_on_this_loop`).
        self._pool_loop = PoolLoop()

    def __repr__(self) -> str:
        return f"SqlResponseProvider({_db.safe_url(self.url)!r})"

    @property
    def owns_engine(self) -> bool:
        """True when the provider built its engine from a URL (and may change and dispose of its
        pool); False for an engine it was given, whose pool is the application's."""
        return self._owns_engine

    @property
    def engine(self) -> AsyncEngine:
        """The engine the provider writes through (built on first use from a URL)."""
        if self._engine is None:
            self._engine = _db.create_engine(
                self.url,
                schema=self.schema,
                busy_timeout_ms=int(self._busy_timeout * 1000),
                connect_timeout=self._connect_timeout,
                statement_timeout=self._statement_timeout,
                application_name="eventguard response store",
            )
        return self._engine

    def _fences_writes(self) -> bool:
        cls = type(self)
        return (
            cls._fence_update is not SqlResponseProvider._fence_update
            or cls._fence_delete is not SqlResponseProvider._fence_delete
        )

    def _on_this_loop(self) -> None:
        """Let go of the pool when the running event loop is not the one its connections were made
        on (a provider started in one ``asyncio.run()`` and used in the next): see
        :mod:`eventguard.sql.pool_loop`. Only the provider's own engine: a borrowed one's pool is its
        owner's to manage."""
        own = self._engine if self._owns_engine else None
        if self._pool_loop.follow(own) and not self._starting.locked():
            self._starting = asyncio.Lock()  # an asyncio.Lock binds to the loop it first waits on

    # -- lifecycle --------------------------------------------------------------------------------

    async def start(self) -> None:
        """Check the schema (creating or upgrading it per ``auto_migrate``): fails fast with
        :class:`~eventguard.errors.SchemaMismatchError` naming the command to run, and a database that
        cannot be reached a :class:`~eventguard.DatabaseUnavailableError`. Concurrent calls check once."""
        self._on_this_loop()
        with outages_as_unavailable(self.url):
            async with self._starting:
                if not self._ready:
                    await self._start()

    async def _start(self) -> None:
        # The check, and the creation or upgrade it calls for, decided under the migration lock
        # (one migration at a time in this process; across processes PostgreSQL's advisory lock,
        # SQLite's write lock): concurrent first calls, here or in another process, create the
        # schema once and the others find it made. (The sink opens its database the same way.)
        await _migrate.first_use(
            self.engine, auto_migrate=self.auto_migrate, marker_table=provider_responses.name
        )
        self._ready = True

    async def migrate(self, revision: str = "head") -> None:
        """Upgrade the database schema to ``revision`` (what ``eventguard db upgrade`` runs)."""
        await _migrate.upgrade(self.engine, revision)

    async def aclose(self) -> None:
        """Dispose of the engine if the provider built it (a borrowed engine is left open), and stop
        the SQLite writer thread."""
        if self._writer is not None:
            await self._writer.close()  # a later call starts it again
        if self._reader is not None:
            self._reader.close()  # a later call opens it again
        if self._owns_engine and self._engine is not None:
            engine, self._engine = self._engine, None
            await engine.dispose()

    async def __aenter__(self) -> SqlResponseProvider:
        await self.start()
        return self

    async def __aexit__(self, *_exc: object) -> None:
        await self.aclose()

    async def _ready_on_this_loop(self) -> None:
        """Before each transaction: the pool on the running loop, the schema checked once."""
        self._on_this_loop()
        if not self._ready:
            await self.start()

    async def _write(self, body: Callable[[AsyncConnection], Coroutine[Any, Any, T]]) -> T:
        """``body(conn)`` in one write transaction, committed when this returns; every failure of the
        database a :class:`ProviderStorageError`.

        On an SQLite file the whole transaction is one hand-off to the provider's writer thread
        (:class:`eventguard.sql.sqlite_thread.SqliteThread`: stdlib ``sqlite3``, ``BEGIN IMMEDIATE``
        ... ``COMMIT`` there, the engine's pragmas): through aiosqlite an update was five trips to the
        driver's thread, each a turn of the event loop. ``body``'s awaits never suspend there (the
        thread's connection answers at once), so it is driven to its end on the thread; the
        statements, and so the database's guarantees, are the same on both paths. A call whose
        caller stops waiting (cancelled) still runs to its end on the thread, commit included, as
        a statement already sent to a server would.
        """
        writer = self._writer
        if writer is None:
            async with self.transactions.open("write") as conn:
                return await body(conn)

        def job(conn: SqliteConnection) -> T:
            return drive(body(cast(AsyncConnection, conn)))

        async with self._storage_errors():
            await self._ready_on_this_loop()
            return await writer.transaction(job)

    @asynccontextmanager
    async def _storage_errors(self) -> AsyncIterator[None]:
        """Every failure of the database, its driver or the pool as a :class:`ProviderStorageError`."""
        try:
            yield
        except (ResponseStoreError, UnstorableError):
            raise
        except Exception as exc:  # never a KeyError to the host
            raise ProviderStorageError(
                f"the response store could not use the database: {_db.scrub(_reason(exc), self._secrets)}"
            ) from exc

    async def _read_sqlite(self, sql: str, params: tuple[str, ...]) -> list[Any]:
        """One SELECT on SQLite straight to aiosqlite: one hop to its thread, no transaction.

        The read path's cost was hops, not SQL: ``BEGIN``, SQLAlchemy's cursor (open, execute,
        fetch, close), ``COMMIT`` were six trips to the driver's thread for one indexed row. A
        single statement outside a transaction is its own snapshot (WAL), so nothing is lost.
        """
        async with self._storage_errors():
            await self._ready_on_this_loop()
            if not self._owns_engine:
                # A borrowed engine's pool resets a returned connection with a rollback, which
                # must run where SQLAlchemy can await it (a plain close() logged MissingGreenlet at
                # ERROR on every read); ours skips that reset (create_engine's hooks).
                async with self.engine.connect() as conn:
                    return await _fetch_all(await conn.get_raw_connection(), sql, params)
            raw = await self.engine.raw_connection()
            try:
                return await _fetch_all(raw, sql, params)
            finally:
                raw.close()

    # -- ResponseProviderProtocol -----------------------------------------------------------------

    async def create_response(
        self,
        response: Any,
        input_items: Iterable[Any] | None,
        history_item_ids: Iterable[str] | None,
        *,
        context: Any = None,
    ) -> None:
        """Store a new response envelope with its input items and history item ids.

        Parameters:
            response: the envelope (a dict); its ``output`` items are stored as items too.
            input_items: the resolved input items (those without an ``id`` are not indexed).
            history_item_ids: the ids the response's history holds (the host resolves them).
            context: the host's ``PlatformContext`` (its ``user_id_key`` picks the partition).

        Raises the host's ``ResponseAlreadyExistsError`` when a live response has this id (a
        deleted one is replaced), :class:`UnstorableError` for a value JSON cannot hold exactly.
        """
        part = _partition(context)
        prepared = _Prepared(response, input_items, history_item_ids)
        nodes = _history_nodes(prepared.history)
        now = datetime.now(UTC)
        r = provider_responses
        values = {
            "partition": part,
            "response_key": _key(prepared.response_id),
            "response_id": _shown(prepared.response_id),
            "status": prepared.status,
            "conversation_id": None if prepared.conversation is None else _shown(prepared.conversation),
            "body": prepared.body,
            "history_node": nodes[-1][0] if nodes else None,
            "deleted": False,
            "created_at": now,
            "updated_at": now,
            "deleted_at": None,
        }
        insert = self.transactions.insert(r).values(**values, version=1)
        revive = {k: insert.excluded[k] for k in values if k not in ("partition", "response_key")}
        stmt = insert.on_conflict_do_update(
            index_elements=[r.c.partition, r.c.response_key],
            set_={**revive, "version": r.c.version + 1},
            where=r.c.deleted.is_(True),
        ).returning(r.c.pk, r.c.version)

        async def body(conn: AsyncConnection) -> bool:
            row = (await conn.execute(stmt)).first()
            if row is None:
                return False
            await self._fence_update(conn, part, prepared.response_id, prepared.status)  # replicas
            await self._refuse_a_pruned_history(conn, part, prepared)
            pk, version = row
            if version > 1:  # re-created: the old life's links go
                await conn.execute(delete(provider_links).where(provider_links.c.response_pk == pk))
            await self._write_history(conn, nodes)
            await self._write_links(conn, pk, "input", prepared.inputs)
            await self._write_links(conn, pk, "output", prepared.outputs)
            await self._write_items(conn, part, [*prepared.inputs, *prepared.outputs], now)
            if prepared.conversation is not None:
                await conn.execute(
                    self.transactions.insert(provider_conversations)
                    .values(
                        partition=part,
                        conversation_key=_key(prepared.conversation),
                        response_key=values["response_key"],
                    )
                    .on_conflict_do_nothing()
                )
            return True

        if not await self._write(body):
            raise ResponseAlreadyExistsError(prepared.response_id)

    async def get_response(self, response_id: str, *, context: Any = None) -> Any:
        """The stored envelope of ``response_id`` (a fresh copy) in ``context``'s partition.
        ``KeyError`` when missing or deleted."""
        part = _partition(context)
        key = _key(_id_of(response_id, "response_id"))
        r = provider_responses
        body: str | None
        if self._sqlite:
            rows = None
            if self._reader is not None and self._ready:
                rows = self._reader.fetch(_SQLITE_GET_BODY, (part, key))
            if rows is None:  # not started yet, or the database did not answer at once
                rows = await self._read_sqlite(_SQLITE_GET_BODY, (part, key))
            body = rows[0][0] if rows else None
        else:
            async with self.transactions.open("read") as conn:
                body = (
                    await conn.execute(
                        select(r.c.body).where(
                            r.c.partition == part, r.c.response_key == key, r.c.deleted.is_(False)
                        )
                    )
                ).scalar_one_or_none()
        if body is None:
            raise KeyError(f"response '{response_id}' not found")
        return _load(body, f"response {response_id!a}")

    async def update_response(self, response: Any, *, context: Any = None) -> None:
        """Replace a live response's envelope (``response``, keyed by its ``id``, in ``context``'s
        partition), and its output items, in one transaction.

        ``KeyError`` when the response is missing or deleted (never an upsert).
        """
        part = _partition(context)
        prepared = _Prepared(response, None, None)
        now = datetime.now(UTC)
        r = provider_responses
        stmt = (
            update(r)
            .where(
                r.c.partition == part,
                r.c.response_key == _key(prepared.response_id),
                r.c.deleted.is_(False),
            )
            .values(body=prepared.body, status=prepared.status, updated_at=now, version=r.c.version + 1)
            .returning(r.c.pk)
        )

        async def body(conn: AsyncConnection) -> bool:
            if isinstance(conn, SqliteConnection):  # the writer thread: the same statements, as text
                return _sqlite_update(conn, part, _key(prepared.response_id), prepared, now)
            # The envelope first: its row lock serialises two writers of one response, links and all.
            pk = (await conn.execute(stmt)).scalar_one_or_none()
            if pk is None:
                return False
            await self._fence_update(conn, part, prepared.response_id, prepared.status)  # replicas
            await conn.execute(
                delete(provider_links).where(
                    provider_links.c.response_pk == pk, provider_links.c.role == "output"
                )
            )
            await self._write_links(conn, pk, "output", prepared.outputs)
            await self._write_items(conn, part, prepared.outputs, now)
            return True

        if not await self._write(body):
            raise KeyError(f"response '{prepared.response_id}' not found")

    async def delete_response(self, response_id: str, *, context: Any = None) -> None:
        """Soft-delete the live response ``response_id`` in ``context``'s partition (its items stay).
        ``KeyError`` when missing or deleted."""
        part = _partition(context)
        now = datetime.now(UTC)
        r = provider_responses
        stmt = (
            update(r)
            .where(
                r.c.partition == part,
                r.c.response_key == _key(_id_of(response_id, "response_id")),
                r.c.deleted.is_(False),
            )
            .values(deleted=True, body=None, deleted_at=now, updated_at=now, version=r.c.version + 1)
            .returning(r.c.pk)
        )

        async def body(conn: AsyncConnection) -> bool:
            await self._fence_delete(conn, part, response_id)  # replicas
            pk = (await conn.execute(stmt)).scalar_one_or_none()
            if pk is None:
                return False
            await conn.execute(delete(provider_links).where(provider_links.c.response_pk == pk))
            return True

        if not await self._write(body):
            raise KeyError(f"response '{response_id}' not found")

    # -- eventguard.replicas: fencing hooks, run inside the write transaction (no-ops here) ------

    async def _fence_update(
        self, conn: AsyncConnection, part: str, response_id: str, status: str | None
    ) -> None:
        """Called after an envelope's row is written (created or updated), before commit: raise to
        refuse the write."""

    async def _fence_delete(self, conn: AsyncConnection, part: str, response_id: str) -> None:
        """Called before an envelope is deleted, in its transaction: raise to refuse the delete."""

    async def get_input_items(
        self,
        response_id: str,
        limit: int = 20,
        ascending: bool = False,
        after: str | None = None,
        before: str | None = None,
        *,
        context: Any = None,
    ) -> list[Any]:
        """The history then input items of ``response_id`` (in ``context``'s partition), newest first
        unless ``ascending``.

        ``after``/``before`` are item ids (ignored when not in the list); ``limit`` is clamped to
        1..100; ids whose item was never stored are skipped. ``KeyError`` when the response is
        missing, ``ValueError`` when it was deleted.
        """
        part = _partition(context)
        page = max(MIN_PAGE, min(MAX_PAGE, _int_of(limit, "limit")))
        r = provider_responses
        async with self.transactions.open("read") as conn:
            row = (
                await conn.execute(
                    select(r.c.pk, r.c.deleted, r.c.history_node).where(
                        r.c.partition == part, r.c.response_key == _key(_id_of(response_id, "response_id"))
                    )
                )
            ).first()
            if row is None or row.deleted:
                ids: list[str] = []
            else:
                ids = await self._history(conn, row.history_node)
                ids += (await self._links(conn, [row.pk]))[row.pk][0]
                ordered = ids if ascending else ids[::-1]
                if after is not None and after in ordered:
                    ordered = ordered[ordered.index(after) + 1 :]
                if before is not None and before in ordered:
                    ordered = ordered[: ordered.index(before)]
                ids = ordered[:page]
                bodies = await self._item_bodies(conn, part, ids)
        if row is None:
            raise KeyError(f"response '{response_id}' not found")
        if row.deleted:
            raise ValueError(f"response '{response_id}' has been deleted")
        return [_load(bodies[i], f"item {i!a}") for i in ids if i in bodies]

    async def get_items(self, item_ids: Iterable[str], *, context: Any = None) -> list[Any | None]:
        """The items of ``item_ids`` (in ``context``'s partition), in the order asked (``None`` for an
        id with no stored item)."""
        part = _partition(context)
        ids = [_id_of(i, "an item id") for i in _many(item_ids, "item_ids")]
        if not ids:
            return []
        async with self.transactions.open("read") as conn:
            bodies = await self._item_bodies(conn, part, ids)
        return [_load(bodies[i], f"item {i!a}") if i in bodies else None for i in ids]

    async def get_history_item_ids(
        self,
        previous_response_id: str | None,
        conversation_id: str | None,
        limit: int,
        *,
        context: Any = None,
    ) -> list[str]:
        """The item ids a new response's history holds (in ``context``'s partition).

        The ``previous_response_id``'s history + input + output ids, then each live ``conversation_id``
        member's (in the order they joined), de-duplicated keeping the first occurrence; the last
        ``limit`` of them (``-1``: all; ``0`` or less: none). A missing or deleted previous
        response contributes nothing.
        """
        part = _partition(context)
        _int_of(limit, "limit")
        r = provider_responses
        members: list[tuple[int, str | None]] = []
        if conversation_id is None:
            # The chain case (every turn of a previous_response_id chat): one statement.
            if previous_response_id is None:
                return []
            key = _key(_id_of(previous_response_id, "previous_response_id"))
            async with self.transactions.open("read") as conn:
                chained = _dec_ids(
                    (await conn.execute(_CHAIN_QUERY, {"part": part, "key": key})).scalars().all()
                )
            return _last(list(dict.fromkeys(chained)), limit)
        async with self.transactions.open("read") as conn:
            if previous_response_id is not None:
                row = (
                    await conn.execute(
                        select(r.c.pk, r.c.history_node).where(
                            r.c.partition == part,
                            r.c.response_key == _key(_id_of(previous_response_id, "previous_response_id")),
                            r.c.deleted.is_(False),
                        )
                    )
                ).first()
                if row is not None:
                    members.append((row.pk, row.history_node))
            if conversation_id is not None:
                c = provider_conversations
                query = (
                    select(r.c.pk, r.c.history_node)
                    .join(c, (c.c.partition == r.c.partition) & (c.c.response_key == r.c.response_key))
                    .where(
                        c.c.partition == part,
                        c.c.conversation_key == _key(_id_of(conversation_id, "conversation_id")),
                        r.c.deleted.is_(False),
                    )
                    .order_by(c.c.seq)
                )
                members += [(m.pk, m.history_node) for m in await conn.execute(query)]
            links = await self._links(conn, [pk for pk, _node in members])
            resolved: list[str] = []
            for pk, node in members:
                resolved += await self._history(conn, node)
                inputs, outputs = links[pk]
                resolved += inputs
                resolved += outputs
        return _last(list(dict.fromkeys(resolved)), limit)

    # -- statements -------------------------------------------------------------------------------

    async def _refuse_a_pruned_history(self, conn: AsyncConnection, part: str, prepared: _Prepared) -> None:
        """Refuse a create whose history was expired by a prune after the host read it.

        The host reads a turn's history (``get_history_item_ids`` of the previous response) and
        creates the turn a moment later, in another transaction: a prune that commits in between
        takes the previous response and the items only it named, and the new response would name
        items that are gone (every read of it skipping them in silence). Run after the envelope's
        row is written, so no prune runs beside the rest of this transaction (PostgreSQL: the
        prune's table lock waits for the row's; SQLite: one writer), this looks at what the
        history came from: the envelope's ``previous_response_id``. Still live: nothing it
        reaches was pruned (retention keeps every item and node a kept response names), and ids
        without an item are the caller's, accepted as the host's stores accept them. Gone or
        deleted, and an id of the history has no stored item: the history named items that
        existed (the host's history of a response it could not find is empty) and lost them, so
        the create is refused with :class:`ProviderStorageError`, as the turn would have been had
        the prune come first. A history of ids that all still have their items is stored as given.
        """
        if not prepared.history or prepared.previous is None:
            return
        r, it = provider_responses, provider_items
        live = (
            await conn.execute(
                select(r.c.pk).where(
                    r.c.partition == part,
                    r.c.response_key == _key(prepared.previous),
                    r.c.deleted.is_(False),
                )
            )
        ).first()
        if live is not None:
            return
        keys = sorted({_key(i) for i in prepared.history})
        stored = len(await self._items_by_key(conn, part, keys, it.c.item_key))
        if stored < len(keys):
            raise ProviderStorageError(
                f"response {prepared.response_id!a} was not stored: its previous response "
                f"{prepared.previous!a} and {len(keys) - stored} items its history names are gone "
                "(expired by a prune after the history was read)"
            )

    async def _write_history(self, conn: AsyncConnection, nodes: list[Node]) -> None:
        """Store the nodes of a history list that are not stored yet, in runs (see
        ``eventguard.sql.tables.provider_history``).

        The first new node continues the run of the node before it when that node ends its run,
        else starts a run of its own; the rest follow in that run. The run's slot is taken by the
        insert itself (unique ``(run, depth)``, ``ON CONFLICT DO NOTHING``), so two writers
        extending one run at once (several processes, PostgreSQL) cannot both take it: the one
        that did not look again, finds the other's nodes or branches off.
        """
        for _attempt in range(HISTORY_ATTEMPTS):
            stored, base_run = await self._stored_prefix(conn, nodes)
            if stored == len(nodes):
                return
            first, *rest = nodes[stored:]
            for run in ([base_run] if base_run is not None else []) + [first[0]]:
                if await self._insert_nodes(conn, [first], run, returning=True):
                    await self._insert_nodes(conn, rest, run, returning=False)
                    return
                if await self._has_node(conn, first[0]):
                    break  # another writer stored it: look again from there
        raise ProviderStorageError(
            f"history nodes could not be written in {HISTORY_ATTEMPTS} attempts (other writers took them)"
        )

    async def _stored_prefix(self, conn: AsyncConnection, nodes: list[Node]) -> tuple[int, str | None]:
        """How many leading nodes of ``nodes`` are stored, and the run of the last of them.

        Stored nodes are closed under "parent of" (a node is written after its parent, and
        retention keeps every ancestor of a kept node), so the stored ones are a prefix: a few
        probes bound it, one range query finds it.
        """
        h = provider_history
        if not nodes:
            return 0, None
        probes = _probes(len(nodes))
        runs: dict[str, str] = {}
        query = select(h.c.node, h.c.run).where(h.c.node.in_(bindparam("nodes", expanding=True)))
        for node, run in await conn.execute(query, {"nodes": [nodes[i][0] for i in probes]}):
            runs[node] = run
        present = [i for i in probes if nodes[i][0] in runs]
        lo = max(present, default=-1)
        hi = min((i for i in probes if i > lo), default=len(nodes))
        for start in range(lo + 1, hi, CHUNK):
            chunk = [n[0] for n in nodes[start : min(hi, start + CHUNK)]]
            for node, run in await conn.execute(query, {"nodes": chunk}):
                runs[node] = run
        stored = lo + 1
        while stored < hi and nodes[stored][0] in runs:
            stored += 1
        return stored, (runs[nodes[stored - 1][0]] if stored else None)

    async def _insert_nodes(
        self, conn: AsyncConnection, nodes: list[Node], run: str, *, returning: bool
    ) -> int:
        """Insert nodes into ``run``; with ``returning``, how many were inserted (0: a conflict)."""
        if not nodes:
            return 0
        stmt = self.transactions.insert(provider_history).on_conflict_do_nothing()
        rows = [
            {"node": n, "parent": p, "depth": d, "item_id": _enc_id(i), "run": run, "item_key": _key(i)}
            for n, p, d, i in nodes
        ]
        if returning:
            return len((await conn.execute(stmt.values(rows[0]).returning(provider_history.c.node))).all())
        await conn.execute(stmt, rows)
        return len(rows)

    async def _has_node(self, conn: AsyncConnection, node: str) -> bool:
        h = provider_history
        return (await conn.execute(select(h.c.node).where(h.c.node == node))).first() is not None

    async def _write_links(
        self, conn: AsyncConnection, pk: int, role: str, items: list[tuple[str, str]]
    ) -> None:
        if items:
            await conn.execute(
                provider_links.insert(),
                [
                    {
                        "response_pk": pk,
                        "role": role,
                        "position": n,
                        "item_key": _key(i),
                        "item_id": _enc_id(i),
                    }
                    for n, (i, _body) in enumerate(items)
                ],
            )

    async def _write_items(
        self, conn: AsyncConnection, part: str, items: list[tuple[str, str]], now: datetime
    ) -> None:
        """Upsert items by id; the last of one id wins (one statement cannot touch a row twice)."""
        latest = dict(items)
        if not latest:
            return
        stmt = self.transactions.insert(provider_items)
        stmt = stmt.on_conflict_do_update(
            index_elements=[provider_items.c.partition, provider_items.c.item_key],
            set_={"body": stmt.excluded.body, "updated_at": stmt.excluded.updated_at},
        )
        await conn.execute(
            stmt,
            [
                {
                    "partition": part,
                    "item_key": _key(i),
                    "item_id_shown": _shown(i),
                    "body": b,
                    "updated_at": now,
                }
                for i, b in latest.items()
            ],
        )

    async def _history(self, conn: AsyncConnection, node: str | None) -> list[str]:
        """The ids of a history list, from its last node: one query, one index range per run.

        The recursive part walks runs, not nodes (the run the list ends in, then each run it
        branched from); a chain with no branches is one run.
        """
        if node is None:
            return []
        return _dec_ids((await conn.execute(_HISTORY_QUERY, {"node": node})).scalars().all())

    async def _links(self, conn: AsyncConnection, pks: list[int]) -> dict[int, tuple[list[str], list[str]]]:
        """Each response's input and output ids, in order."""
        found: dict[int, tuple[list[str], list[str]]] = {pk: ([], []) for pk in pks}
        if not pks:
            return found
        lk = provider_links
        rows = await conn.execute(
            select(lk.c.response_pk, lk.c.role, lk.c.item_id)
            .where(lk.c.response_pk.in_(bindparam("pks", expanding=True)))
            .order_by(lk.c.response_pk, lk.c.role, lk.c.position),
            {"pks": sorted(set(pks))},
        )
        for pk, role, stored in rows:
            found[pk][0 if role == "input" else 1].append(_dec_id(stored))
        return found

    async def _item_bodies(self, conn: AsyncConnection, part: str, ids: list[str]) -> dict[str, str]:
        """Stored item bodies by id (ids with no item are absent)."""
        by_key = {_key(i): i for i in ids}
        it = provider_items
        rows = await self._items_by_key(conn, part, list(by_key), it.c.item_key, it.c.body)
        return {by_key[key]: body for key, body in rows}

    async def _items_by_key(
        self, conn: AsyncConnection, part: str, keys: list[str], *columns: Any
    ) -> list[Any]:
        """``columns`` of the stored items among ``keys`` (item keys) in ``part``, ``CHUNK`` keys a
        statement (ids with no item have no row)."""
        it = provider_items
        query = select(*columns).where(
            it.c.partition == part, it.c.item_key.in_(bindparam("keys", expanding=True))
        )
        rows: list[Any] = []
        for start in range(0, len(keys), CHUNK):
            rows += (await conn.execute(query, {"keys": keys[start : start + CHUNK]})).all()
        return rows


async def read_envelopes(conn: AsyncConnection, shown_id: str) -> list[EnvelopeRecord]:
    """Every partition's envelope stored under the sink's id ``shown_id``, with its items (see
    :meth:`eventguard.ResponseStore.envelopes`), in the caller's transaction."""
    r = provider_responses
    rows = (
        await conn.execute(
            select(r.c.pk, r.c.partition, r.c.status, r.c.deleted, r.c.updated_at, r.c.body, r.c.history_node)
            .where(r.c.response_id == shown_id)
            .order_by(r.c.pk)
        )
    ).all()
    reader = SqlResponseProvider.__new__(SqlResponseProvider)  # its statements only: no engine
    reader._sqlite = conn.dialect.name == "sqlite"
    found = []
    for row in rows:
        inputs: list[str] = []
        outputs: list[str] = []
        if not row.deleted:
            inputs = await reader._history(conn, row.history_node)
            own, outputs = (await reader._links(conn, [row.pk]))[row.pk]
            inputs += own
        bodies = await reader._item_bodies(conn, row.partition, [*inputs, *outputs])
        found.append(
            EnvelopeRecord(
                partition=row.partition,
                status=row.status,
                deleted=row.deleted,
                updated_at=row.updated_at,
                envelope=None if row.body is None else _load(row.body, f"response {shown_id!a}"),
                input_items=[_load(bodies[i], f"item {i!a}") for i in inputs if i in bodies],
                output_items=[_load(bodies[i], f"item {i!a}") for i in outputs if i in bodies],
            )
        )
    return found


async def prune_store(conn: AsyncConnection, cutoff: datetime) -> EnvelopePruneResult:
    """Expire the response store's rows last written before ``cutoff`` (see
    :meth:`eventguard.ResponseStore.prune_envelopes`), in the caller's transaction.

    Five set-based statements, nothing read into Python (on PostgreSQL after a table lock that
    keeps the store's writes out until it commits): the old envelopes, the links and the
    conversation memberships left without a response (the links' ``ON DELETE CASCADE`` does it
    already where foreign keys are enforced; SQLite enforces them per connection), the
    history nodes no remaining response reaches (found run by run, as ``_history`` reads them),
    and the old items that no link and no remaining history node names.
    """
    r, lk, it, h, c = (
        provider_responses,
        provider_links,
        provider_items,
        provider_history,
        provider_conversations,
    )
    if conn.dialect.name == "postgresql":
        # Every write of the store begins by writing its envelope's row (ROW EXCLUSIVE on the
        # table): this lock waits for the writes in flight to commit and holds new ones until the
        # prune does, so no response the prune cannot see yet names the nodes and items it takes
        # (READ COMMITTED: each statement below sees what committed before it). Reads go on; a
        # second prune waits (the mode conflicts with itself). SQLite needs nothing: the prune's
        # BEGIN IMMEDIATE already waits for the one writer.
        table = conn.dialect.identifier_preparer.format_table(r)
        await conn.exec_driver_sql(f"LOCK TABLE {table} IN SHARE ROW EXCLUSIVE MODE")
    old = r.c.updated_at < cutoff, r.c.deleted.is_(True) | r.c.status.in_(_ENDED_ENVELOPE)
    envelopes = (await conn.execute(delete(r).where(*old))).rowcount
    await conn.execute(delete(lk).where(~exists().where(r.c.pk == lk.c.response_pk)))
    await conn.execute(
        delete(c).where(~exists().where(r.c.partition == c.c.partition, r.c.response_key == c.c.response_key))
    )
    reach = _reach()
    # Counted, not the DELETE's rowcount: Python's sqlite3 reports -1 for a statement that starts
    # with WITH (it reads the first keyword).
    count_nodes = select(func.count()).select_from(h)
    before = (await conn.execute(count_nodes)).scalar_one()
    await conn.execute(delete(h).where(~exists().where(reach.c.run == h.c.run, h.c.depth <= reach.c.upto)))
    nodes = before - (await conn.execute(count_nodes)).scalar_one()
    items = (
        await conn.execute(
            delete(it).where(
                it.c.updated_at < cutoff,
                ~exists().where(lk.c.item_key == it.c.item_key),
                ~exists().where(h.c.item_key == it.c.item_key),
            )
        )
    ).rowcount
    return EnvelopePruneResult(envelopes=envelopes, items=items, history_nodes=nodes)


def _reach() -> Any:
    """For each run, the deepest node any response's history reaches in it (``run``, ``upto``):
    the nodes of a run at or above that depth are kept. (A deleted, not yet expired response
    still counts: its row, and so its history, may be re-created.)"""
    h, r = provider_history, provider_responses
    seg = (
        select(h.c.run, h.c.depth.label("upto"))
        .select_from(r.join(h, h.c.node == r.c.history_node))
        .cte("reach_seg", recursive=True)
    )
    first, before = h.alias("first_node"), h.alias("branch_point")
    seg = seg.union(
        select(before.c.run, before.c.depth).select_from(
            seg.join(first, first.c.node == seg.c.run).join(before, before.c.node == first.c.parent)
        )
    )
    return select(seg.c.run, func.max(seg.c.upto).label("upto")).group_by(seg.c.run).cte("reach")


def _runs_from(anchor: Select[Any]) -> Any:
    """The recursive CTE ``(run, upto)`` of the runs a history list passes through, from the
    ``(run, depth)`` of its last node (``anchor``): the run it ends in, then each it branched from."""
    h = provider_history
    seg = anchor.cte("seg", recursive=True)
    first, before = h.alias("first_node"), h.alias("branch_point")
    return seg.union_all(
        select(before.c.run, before.c.depth).select_from(
            seg.join(first, first.c.node == seg.c.run).join(before, before.c.node == first.c.parent)
        )
    )


def _history_query() -> Select[Any]:
    """Every id of the history list ending at node ``:node``, in order (see ``_history``)."""
    h = provider_history
    seg = _runs_from(select(h.c.run, h.c.depth.label("upto")).where(h.c.node == bindparam("node")))
    n = h.alias("n")
    return (
        select(n.c.item_id)
        .select_from(seg.join(n, (n.c.run == seg.c.run) & (n.c.depth <= seg.c.upto)))
        .order_by(n.c.depth)
    )


def _chain_query() -> Select[Any]:
    """What ``get_history_item_ids(previous, None, ...)`` resolves, in one statement: the live
    previous response's (``:part``, ``:key``) history ids, then its input and output ids, in order
    (not de-duplicated). One round trip instead of a lookup, a history read and a links read."""
    r, h, lk = provider_responses, provider_history, provider_links
    prev = (
        select(r.c.pk, r.c.history_node)
        .where(
            r.c.partition == bindparam("part"), r.c.response_key == bindparam("key"), r.c.deleted.is_(False)
        )
        .cte("prev")
    )
    seg = _runs_from(
        select(h.c.run, h.c.depth.label("upto")).select_from(prev.join(h, h.c.node == prev.c.history_node))
    )
    n = h.alias("n")
    history = select(literal(0).label("part"), n.c.depth.label("pos"), n.c.item_id).select_from(
        seg.join(n, (n.c.run == seg.c.run) & (n.c.depth <= seg.c.upto))
    )
    links = select(
        case((lk.c.role == "input", 1), else_=2).label("part"), lk.c.position.label("pos"), lk.c.item_id
    ).where(lk.c.response_pk.in_(select(prev.c.pk)))
    both = union_all(history, links).subquery("ids")
    return select(both.c.item_id).order_by(both.c.part, both.c.pos)


_HISTORY_QUERY = _history_query()
_CHAIN_QUERY = _chain_query()

#: ``get_response`` on SQLite in one statement (see ``_LoopReader``, and ``_read_sqlite`` when it cannot).
_SQLITE_GET_BODY = (
    f"SELECT body FROM {provider_responses.name} WHERE partition = ? AND response_key = ? AND deleted = 0"
)

#: Envelope statuses that have ended (the host's terminal statuses).
_ENDED_ENVELOPE = ("completed", "incomplete", "failed", "cancelled")


async def _fetch_all(raw: Any, sql: str, params: tuple[str, ...]) -> list[Any]:
    """``sql``'s rows, straight from the aiosqlite connection under the pooled ``raw`` one."""
    driver = raw.driver_connection
    if not isinstance(driver, aiosqlite.Connection):  # pragma: no cover - another driver
        raise ProviderStorageError(f"an SQLite engine must use aiosqlite, not {type(driver).__name__}")
    return list(await driver.execute_fetchall(sql, params))


class _LoopReader:
    """``get_response``'s one indexed SELECT on an SQLite file, run on the event loop's own thread
    through a stdlib ``sqlite3`` connection of its own: no hand-off to a driver thread at all.

    Why: the read is a few B-tree pages (tens of microseconds), while a hand-off to aiosqlite's
    thread and back is two thread wake-ups. Since the provider's writes moved to the writer thread
    (a connection of their own), aiosqlite's thread sleeps between reads, and waking it was most of
    a read's time (issue 15's benchmark: 1.2 to 2.5x the host's file store, which reads its JSON
    file on the loop as well). This connection never waits: ``busy_timeout`` 0, so a database it
    cannot read at once (another connection holding it exclusively, a WAL being recovered) raises
    at once, and :meth:`fetch` answers None: the caller then reads the ordinary way, off the loop,
    waiting as the engine waits. Any other ``sqlite3`` error does the same (and drops the
    connection), so a broken database is still reported by the engine's path, as before.
    ``query_only``: nothing is ever written through it. Under WAL, reading never blocks a writer.
    """

    __slots__ = ("_conn", "_lock", "_path")

    def __init__(self, path: Path) -> None:
        self._path = path
        self._conn: sqlite3.Connection | None = None
        # Two loops on two threads may share a provider: one sqlite3 connection is used by one
        # thread at a time; the other reads the ordinary way meanwhile (never waits here).
        self._lock = threading.Lock()

    def fetch(self, sql: str, params: tuple[str, ...]) -> list[Any] | None:
        """Every row of ``sql`` (one statement, its own snapshot), or None: read it another way."""
        if not self._lock.acquire(blocking=False):
            return None
        try:
            conn = self._conn if self._conn is not None else self._open()
            # fetchall, not fetchone: a statement stepped to its end is reset, which ends its read
            # transaction; one left open would pin its WAL snapshot (no checkpoint past it).
            return conn.execute(sql, params).fetchall()
        except sqlite3.Error:
            self._drop()
            return None
        finally:
            self._lock.release()

    def _open(self) -> sqlite3.Connection:
        conn = sqlite3.connect(self._path, timeout=0, isolation_level=None, check_same_thread=False)
        try:
            conn.execute("PRAGMA query_only = ON")
        except BaseException:
            conn.close()
            raise
        self._conn = conn
        return conn

    def _drop(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(sqlite3.Error):
                conn.close()

    def close(self) -> None:
        """Close the connection (the next :meth:`fetch` opens another)."""
        with self._lock:
            self._drop()


def _sqlite_update(conn: SqliteConnection, part: str, key: str, prepared: _Prepared, now: datetime) -> bool:
    """``update_response``'s statements on the SQLite writer thread, as SQL text straight to
    ``sqlite3`` (SQLAlchemy's execution of the same four constructs was most of the thread's time):
    the envelope (conditional on a live row), its output links replaced, its output items upserted.
    False: no live response. The transaction is the caller's (``SqliteThread.transaction``)."""
    at = provider_responses.c.updated_at.type.bind_processor(conn.dialect)
    stamp = now if at is None else at(now)
    raw = conn.raw
    row = raw.execute(_SQLITE_UPDATE, (prepared.body, prepared.status, stamp, part, key)).fetchone()
    if row is None:
        return False
    pk = row[0]
    raw.execute(_SQLITE_DROP_OUTPUTS, (pk,))
    if prepared.outputs:
        raw.executemany(
            _SQLITE_LINK, [(pk, n, _key(i), _enc_id(i)) for n, (i, _body) in enumerate(prepared.outputs)]
        )
        latest = dict(prepared.outputs)  # the last of one id wins, as in _write_items
        raw.executemany(
            _SQLITE_UPSERT_ITEM, [(part, _key(i), _shown(i), b, stamp) for i, b in latest.items()]
        )
    return True


_SQLITE_UPDATE = (
    f"UPDATE {provider_responses.name} SET body = ?, status = ?, updated_at = ?, version = version + 1 "
    "WHERE partition = ? AND response_key = ? AND deleted = 0 RETURNING pk"
)
_SQLITE_DROP_OUTPUTS = f"DELETE FROM {provider_links.name} WHERE response_pk = ? AND role = 'output'"
_SQLITE_LINK = (
    f"INSERT INTO {provider_links.name} (response_pk, role, position, item_key, item_id) "
    "VALUES (?, 'output', ?, ?, ?)"
)
_SQLITE_UPSERT_ITEM = (
    f"INSERT INTO {provider_items.name} (partition, item_key, item_id_shown, body, updated_at) "
    "VALUES (?, ?, ?, ?, ?) ON CONFLICT (partition, item_key) "
    "DO UPDATE SET body = excluded.body, updated_at = excluded.updated_at"
)


def _last(ids: list[str], limit: int) -> list[str]:
    """The host's ``limit``: ``-1`` all, ``0`` or less none, else the last ``limit``."""
    if limit == -1:
        return ids
    if limit <= 0:
        return []
    return ids[-limit:]


def _reason(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"
