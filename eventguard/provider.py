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
  turn n-1 added, so a 1,000-turn chain costs O(n) rows, not O(n^2).
- **Concurrency is the database's**: creation is one ``INSERT ... ON CONFLICT DO UPDATE ... WHERE
  deleted`` (two creators of one id: exactly one wins), updates and deletes are conditional on the
  row being live, and no process lock is taken, so several processes on one database agree.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from typing import Any, Literal

from azure.ai.agentserver.responses.store._base import (
    ResponseAlreadyExistsError,
    ResponseStoreCorruptionError,
)
from sqlalchemy import bindparam, delete, inspect, select, text, update
from sqlalchemy.dialects import postgresql as pg_dialect
from sqlalchemy.dialects import sqlite as sqlite_dialect
from sqlalchemy.engine import URL
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from eventguard.errors import ResponseStoreError, SchemaMismatchError, UnstorableError
from eventguard.records import EnvelopePruneResult, EnvelopeRecord
from eventguard.sql import engine as _db
from eventguard.sql import migrate as _migrate
from eventguard.sql import storable
from eventguard.sql.tables import (
    ID,
    provider_conversations,
    provider_history,
    provider_items,
    provider_links,
    provider_responses,
)

__all__ = ["ProviderStorageError", "SqlResponseProvider", "prune_store", "read_envelopes"]

log = logging.getLogger(__name__)

#: The partition of a call without a user (no context, or ``user_id_key`` None).
ANONYMOUS = "anonymous"
#: ``get_input_items`` clamps its limit to this range, as the host's own stores do.
MIN_PAGE, MAX_PAGE = 1, 100
#: Ids looked up per statement (both drivers bind at most ~32k parameters).
CHUNK = 500
#: Marks an id stored JSON-encoded because it is not storable as it is (see ``_enc_id``).
_ENCODED = "~"


class ProviderStorageError(ResponseStoreError, ResponseStoreCorruptionError):
    """The response store could not read or write the database (away, locked, wrong schema, a
    row that does not decode). Never a ``KeyError``: the host takes that for "not found" and, on
    recovery, drops the response for good.

    It is an :class:`eventguard.errors.ResponseStoreError` for users and the host's
    ``ResponseStoreCorruptionError`` for the host, which then answers 500 instead of 404 and keeps
    a resilient run for a later recovery.
    """


# -- encoding: exact values as text any column holds -------------------------------------------------


#: How a ``datetime`` travels in the stored JSON (the host's resilient checkpoints carry one in
#: ``created_at``): ``{TAG: isoformat}``, read back as the same ``datetime``. A real object spelt
#: like that would read back as a datetime: the round-trip check refuses it instead.
DATETIME_TAG = "$eventguard.datetime"


def _encode_other(value: object) -> object:
    if isinstance(value, datetime):
        return {DATETIME_TAG: value.isoformat()}
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


def _decode_object(obj: dict[str, Any]) -> object:
    if len(obj) == 1 and DATETIME_TAG in obj and isinstance(obj[DATETIME_TAG], str):
        return datetime.fromisoformat(obj[DATETIME_TAG])
    return obj


def _loads(text: str) -> Any:
    # The object hook costs a Python call per object: only text holding the tag needs it.
    if DATETIME_TAG in text:
        return json.loads(text, object_hook=_decode_object)
    return json.loads(text)


def _dump(value: object, what: str) -> str:
    """``value`` as ASCII JSON text that decodes to an equal value, or :class:`UnstorableError`.

    ASCII, so NUL and lone surrogates travel as ``\\u`` escapes (no column refuses them); a
    ``datetime`` travels tagged (:data:`DATETIME_TAG`); the round trip is checked (in C), so a
    tuple, a non-string key or a bool key is refused rather than stored as something else.
    """
    try:
        text = json.dumps(
            value, ensure_ascii=True, allow_nan=False, separators=(",", ":"), default=_encode_other
        )
    except (TypeError, ValueError, RecursionError) as exc:
        raise UnstorableError(f"{what} cannot be stored exactly as JSON: {exc}") from None
    if _loads(text) != value:
        raise UnstorableError(
            f"{what} would not read back equal to itself from JSON (a tuple, a non-string key, ...)"
        )
    return text


def _load(text: str | None, what: str) -> Any:
    if text is None:
        raise ProviderStorageError(f"{what} has no stored body")
    try:
        return _loads(text)
    except ValueError as exc:
        raise ProviderStorageError(f"{what} does not decode: {exc}") from exc


def _key(value: str) -> str:
    """The row key of an exact string: its SHA-256 (lone surrogates kept by surrogatepass)."""
    return hashlib.sha256(value.encode("utf-8", "surrogatepass")).hexdigest()


def _partition(context: object) -> str:
    user = getattr(context, "user_id_key", None) if context is not None else None
    if user is None:
        return ANONYMOUS
    if not isinstance(user, str):
        raise UnstorableError(f"context.user_id_key must be a str or None, not {type(user).__name__}")
    return _key(user)


def _shown(value: str) -> str:
    """The sink's storable form of an id (for people, and joins with ``eventguard_responses``)."""
    fix = storable.identifier(value, ID.length or 255)
    return value if fix is None else fix.stored


def _enc_id(value: str) -> str:
    """An exact id in a text column: as it is when storable, else ``~`` and its ASCII JSON."""
    if storable.storable(value) and not value.startswith(_ENCODED):
        return value
    return _ENCODED + json.dumps(value, ensure_ascii=True)


def _dec_id(text: str) -> str:
    if text.startswith(_ENCODED):
        decoded = json.loads(text[1:])
        if isinstance(decoded, str):
            return decoded
        raise ProviderStorageError("a stored item id does not decode to a string")
    return text


def _id_of(value: object, what: str) -> str:
    if not isinstance(value, str):
        raise UnstorableError(f"{what} must be a str, not {type(value).__name__}")
    return value


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


def _history_nodes(ids: Sequence[str]) -> list[tuple[str, str | None, int, str]]:
    """The nodes of a history list: ``(node, parent, depth, id)``, each keyed by the hash of the
    whole list up to it, so equal prefixes are the same rows."""
    nodes: list[tuple[str, str | None, int, str]] = []
    parent: str | None = None
    digest = b""
    for depth, item_id in enumerate(ids, start=1):
        digest = hashlib.sha256(digest + item_id.encode("utf-8", "surrogatepass")).digest()
        node = digest.hex()
        nodes.append((node, parent, depth, item_id))
        parent = node
    return nodes


class _Prepared:
    """One ``create_response``/``update_response`` argument set, serialised at call time."""

    __slots__ = ("body", "conversation", "history", "inputs", "outputs", "response_id", "status")

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
        self.inputs = self._items(input_items or (), "input")
        output = response.get("output")
        self.outputs = self._items(output if isinstance(output, list) else (), "output")
        self.history = [_id_of(i, "a history item id") for i in (history_item_ids or ())]

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
        schema: PostgreSQL schema (``search_path``) for an engine built from a URL.
        auto_migrate: ``None`` (default) creates the schema in an empty database but never upgrades
            an existing one; ``True`` also upgrades; ``False`` only checks.
        statement_timeout: seconds after which a PostgreSQL statement fails (a storage error, not a
            hang); ``busy_timeout``: seconds SQLite waits for another writer's lock.

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
        if isinstance(url, AsyncEngine):
            self._engine: AsyncEngine | None = url
            self._owns_engine = False
            self.url = url.url
        else:
            self._engine = None
            self._owns_engine = True
            self.url = _db.resolve_url(url)
        self.schema = schema
        self.auto_migrate = auto_migrate
        self._statement_timeout = statement_timeout
        self._busy_timeout = busy_timeout
        self._connect_timeout = connect_timeout
        self._secrets = _db.url_secrets(self.url)
        self._ready = False
        self._sqlite = self.url.get_backend_name() == "sqlite"
        insert = sqlite_dialect.insert if self._sqlite else pg_dialect.insert
        self._insert = insert

    def __repr__(self) -> str:
        return f"SqlResponseProvider({_db.safe_url(self.url)!r})"

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

    # -- lifecycle --------------------------------------------------------------------------------

    async def start(self) -> None:
        """Check the schema (creating or upgrading it per ``auto_migrate``): fails fast with
        :class:`SchemaMismatchError` naming the command to run."""
        try:
            await _migrate.check(self.engine)
        except SchemaMismatchError as exc:
            if not exc.current and self.auto_migrate is not False and not await self._has_tables():
                try:
                    await _migrate.upgrade(self.engine)
                except SQLAlchemyError:
                    # Another process (the sink, a replica) may be creating it at this moment:
                    # look again once its transaction has had time to commit.
                    await self._check_soon()
            elif exc.current and self.auto_migrate is True:
                await _migrate.upgrade(self.engine)
            else:
                raise
        self._ready = True

    async def _check_soon(self, attempts: int = 10, pause: float = 0.2) -> None:
        for attempt in range(attempts):
            try:
                await _migrate.check(self.engine)
                return
            except SchemaMismatchError:
                if attempt == attempts - 1:
                    raise
                await asyncio.sleep(pause)

    async def _has_tables(self) -> bool:
        async with self.engine.connect() as conn:
            return await conn.run_sync(lambda c: inspect(c).has_table(provider_responses.name))

    async def migrate(self, revision: str = "head") -> None:
        """Upgrade the database schema (what ``eventguard db upgrade`` runs)."""
        await _migrate.upgrade(self.engine, revision)

    async def aclose(self) -> None:
        """Dispose of the engine if the provider built it (a borrowed engine is left open)."""
        if self._owns_engine and self._engine is not None:
            engine, self._engine = self._engine, None
            await engine.dispose()

    async def __aenter__(self) -> SqlResponseProvider:
        await self.start()
        return self

    async def __aexit__(self, *_exc: object) -> None:
        await self.aclose()

    @asynccontextmanager
    async def _tx(self, mode: Literal["read", "write"]) -> AsyncIterator[AsyncConnection]:
        """One transaction; every failure of the database in it is a :class:`ProviderStorageError`.

        Reads see one snapshot (SQLite: a deferred transaction under WAL; PostgreSQL: REPEATABLE
        READ); writes take SQLite's write lock up front (``BEGIN IMMEDIATE``, the engine's default).
        """
        try:
            if not self._ready:
                await self.start()
            options: dict[str, Any] = {}
            if mode == "read":
                options = (
                    {_db.SQLITE_BEGIN_OPTION: "DEFERRED"}
                    if self._sqlite
                    else {"isolation_level": "REPEATABLE READ"}
                )
            async with self.engine.connect() as conn:
                if options:
                    await conn.execution_options(**options)
                async with conn.begin():
                    yield conn
        except (ResponseStoreError, UnstorableError):
            raise
        except Exception as exc:  # the database, its driver, the pool: never a KeyError to the host
            raise ProviderStorageError(
                f"the response store could not use the database: {_db.scrub(_reason(exc), self._secrets)}"
            ) from exc

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
        insert = self._insert(r).values(**values, version=1)
        revive = {k: insert.excluded[k] for k in values if k not in ("partition", "response_key")}
        stmt = insert.on_conflict_do_update(
            index_elements=[r.c.partition, r.c.response_key],
            set_={**revive, "version": r.c.version + 1},
            where=r.c.deleted.is_(True),
        ).returning(r.c.pk, r.c.version)
        async with self._tx("write") as conn:
            row = (await conn.execute(stmt)).first()
            if row is not None:
                await self._fence_update(conn, part, prepared.response_id, prepared.status)  # replicas
                pk, version = row
                if version > 1:  # re-created: the old life's links go
                    await conn.execute(delete(provider_links).where(provider_links.c.response_pk == pk))
                await self._write_history(conn, part, nodes, response)
                await self._write_links(conn, pk, "input", prepared.inputs)
                await self._write_links(conn, pk, "output", prepared.outputs)
                await self._write_items(conn, part, [*prepared.inputs, *prepared.outputs], now)
                if prepared.conversation is not None:
                    await conn.execute(
                        self._insert(provider_conversations)
                        .values(
                            partition=part,
                            conversation_key=_key(prepared.conversation),
                            response_key=values["response_key"],
                        )
                        .on_conflict_do_nothing()
                    )
        if row is None:
            raise ResponseAlreadyExistsError(prepared.response_id)

    async def get_response(self, response_id: str, *, context: Any = None) -> Any:
        """The stored envelope (a fresh copy). ``KeyError`` when missing or deleted."""
        part = _partition(context)
        r = provider_responses
        async with self._tx("read") as conn:
            body = (
                await conn.execute(
                    select(r.c.body).where(
                        r.c.partition == part,
                        r.c.response_key == _key(_id_of(response_id, "response_id")),
                        r.c.deleted.is_(False),
                    )
                )
            ).scalar_one_or_none()
        if body is None:
            raise KeyError(f"response '{response_id}' not found")
        return _load(body, f"response {response_id!a}")

    async def update_response(self, response: Any, *, context: Any = None) -> None:
        """Replace a live response's envelope, and its output items, in one transaction.

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
        async with self._tx("write") as conn:
            # The envelope first: its row lock serialises two writers of one response, links and all.
            pk = (await conn.execute(stmt)).scalar_one_or_none()
            if pk is not None:
                await self._fence_update(conn, part, prepared.response_id, prepared.status)  # replicas
                await conn.execute(
                    delete(provider_links).where(
                        provider_links.c.response_pk == pk, provider_links.c.role == "output"
                    )
                )
                await self._write_links(conn, pk, "output", prepared.outputs)
                await self._write_items(conn, part, prepared.outputs, now)
        if pk is None:
            raise KeyError(f"response '{prepared.response_id}' not found")

    async def delete_response(self, response_id: str, *, context: Any = None) -> None:
        """Soft-delete a live response (its items stay). ``KeyError`` when missing or deleted."""
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
        async with self._tx("write") as conn:
            await self._fence_delete(conn, part, response_id)  # replicas
            pk = (await conn.execute(stmt)).scalar_one_or_none()
            if pk is not None:
                await conn.execute(delete(provider_links).where(provider_links.c.response_pk == pk))
        if pk is None:
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
        """A response's history then input items, newest first unless ``ascending``.

        ``after``/``before`` are item ids (ignored when not in the list); ``limit`` is clamped to
        1..100; ids whose item was never stored are skipped. ``KeyError`` when the response is
        missing, ``ValueError`` when it was deleted.
        """
        part = _partition(context)
        r = provider_responses
        async with self._tx("read") as conn:
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
                ids = ordered[: max(MIN_PAGE, min(MAX_PAGE, int(limit)))]
                bodies = await self._item_bodies(conn, part, ids)
        if row is None:
            raise KeyError(f"response '{response_id}' not found")
        if row.deleted:
            raise ValueError(f"response '{response_id}' has been deleted")
        return [_load(bodies[i], f"item {i!a}") for i in ids if i in bodies]

    async def get_items(self, item_ids: Iterable[str], *, context: Any = None) -> list[Any | None]:
        """The items by id, in the order asked (``None`` for an id with no stored item)."""
        part = _partition(context)
        ids = [_id_of(i, "an item id") for i in item_ids]
        if not ids:
            return []
        async with self._tx("read") as conn:
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
        """The item ids a new response's history holds.

        The previous response's history + input + output ids, then each live conversation
        member's (in the order they joined), de-duplicated keeping the first occurrence; the last
        ``limit`` of them (``-1``: all; ``0`` or less: none). A missing or deleted previous
        response contributes nothing.
        """
        part = _partition(context)
        r = provider_responses
        members: list[tuple[int, str | None]] = []
        async with self._tx("read") as conn:
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
        unique = list(dict.fromkeys(resolved))
        if limit == -1:
            return unique
        if limit <= 0:
            return []
        return unique[-limit:]

    # -- statements -------------------------------------------------------------------------------

    async def _write_history(
        self, conn: AsyncConnection, part: str, nodes: list[tuple[str, str | None, int, str]], response: Any
    ) -> None:
        """Insert the nodes of a history list that are not stored yet.

        A chained response's history starts with the previous response's (the host builds it so):
        those nodes exist, and only the ones after it are written.
        """
        if not nodes:
            return
        start = 0
        previous = response.get("previous_response_id")
        if isinstance(previous, str):
            r = provider_responses
            known = (
                await conn.execute(
                    select(r.c.history_node).where(r.c.partition == part, r.c.response_key == _key(previous))
                )
            ).scalar_one_or_none()
            if known is not None:
                at = {node: depth for node, _parent, depth, _id in nodes}.get(known)
                start = at if at is not None else 0
        fresh = nodes[start:]
        if fresh:
            await conn.execute(
                self._insert(provider_history).on_conflict_do_nothing(),
                [{"node": n, "parent": p, "depth": d, "item_id": _enc_id(i)} for n, p, d, i in fresh],
            )

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
        stmt = self._insert(provider_items)
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
        """The ids of a history list, from its last node up its parents (one recursive query)."""
        if node is None:
            return []
        if not self._sqlite:
            # Each step of the walk is one primary-key lookup; without statistics on a young table
            # PostgreSQL plans a hash join over the whole table per step (O(n^2): 23 ms for 200
            # nodes). This transaction only: no sequential scans.
            await conn.execute(text("SET LOCAL enable_seqscan = off"))
        h = provider_history
        chain = select(h.c.node, h.c.parent, h.c.depth, h.c.item_id).where(h.c.node == node)
        walk = chain.cte("chain", recursive=True)
        up = h.alias("up")
        walk = walk.union_all(
            select(up.c.node, up.c.parent, up.c.depth, up.c.item_id).where(up.c.node == walk.c.parent)
        )
        rows = await conn.execute(select(walk.c.item_id).order_by(walk.c.depth))
        return [_dec_id(stored) for (stored,) in rows]

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
        keys = list(by_key)
        found: dict[str, str] = {}
        it = provider_items
        for start in range(0, len(keys), CHUNK):
            rows = await conn.execute(
                select(it.c.item_key, it.c.body).where(
                    it.c.partition == part, it.c.item_key.in_(bindparam("keys", expanding=True))
                ),
                {"keys": keys[start : start + CHUNK]},
            )
            for key, body in rows:
                found[by_key[key]] = body
        return found


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
    :meth:`eventguard.ResponseStore.prune_envelopes`), in the caller's transaction."""
    r, lk, it, h, c = (
        provider_responses,
        provider_links,
        provider_items,
        provider_history,
        provider_conversations,
    )
    old = (
        await conn.execute(
            select(r.c.pk, r.c.partition, r.c.response_key).where(
                r.c.updated_at < cutoff, r.c.deleted.is_(True) | r.c.status.in_(_ENDED_ENVELOPE)
            )
        )
    ).all()
    for start in range(0, len(old), CHUNK):
        chunk = old[start : start + CHUNK]
        pks = [row.pk for row in chunk]
        await conn.execute(delete(lk).where(lk.c.response_pk.in_(pks)))
        for row in chunk:
            await conn.execute(
                delete(c).where(c.c.partition == row.partition, c.c.response_key == row.response_key)
            )
        await conn.execute(delete(r).where(r.c.pk.in_(pks)))
    # What the kept responses still name: their links, and every node of their histories.
    named = {key for (key,) in await conn.execute(select(lk.c.item_key).distinct())}
    starts = select(h.c.node, h.c.parent, h.c.item_id).where(
        h.c.node.in_(select(r.c.history_node).where(r.c.history_node.is_not(None)))
    )
    walk = starts.cte("reach", recursive=True)
    up = h.alias("up")
    walk = walk.union(select(up.c.node, up.c.parent, up.c.item_id).where(up.c.node == walk.c.parent))
    reached: set[str] = set()
    for node, stored in await conn.execute(select(walk.c.node, walk.c.item_id)):
        reached.add(node)
        named.add(_key(_dec_id(stored)))
    stale = (await conn.execute(select(it.c.partition, it.c.item_key).where(it.c.updated_at < cutoff))).all()
    gone_items = [stale_item for stale_item in stale if stale_item.item_key not in named]
    for item_row in gone_items:
        await conn.execute(
            delete(it).where(it.c.partition == item_row.partition, it.c.item_key == item_row.item_key)
        )
    unreached = [n for (n,) in await conn.execute(select(h.c.node)) if n not in reached]
    for start in range(0, len(unreached), CHUNK):
        await conn.execute(delete(h).where(h.c.node.in_(unreached[start : start + CHUNK])))
    return EnvelopePruneResult(envelopes=len(old), items=len(gone_items), history_nodes=len(unreached))


#: Envelope statuses that have ended (the host's terminal statuses).
_ENDED_ENVELOPE = ("completed", "incomplete", "failed", "cancelled")


def _reason(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"
