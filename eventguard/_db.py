"""Database URLs and engines: the one place that knows SQLite and PostgreSQL apart.

Both the sink (writes) and the store (reads) get their engines here, so the pragmas,
the transaction mode and the pooler setting are the same everywhere.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path
from typing import Any

import orjson
from sqlalchemy import event
from sqlalchemy.engine import URL, make_url
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine
from sqlalchemy.pool import NullPool

ENV_URL = "EVENTGUARD_DATABASE_URL"
DEFAULT_SQLITE_FILE = "eventguard.db"

#: The execution option that picks SQLite's BEGIN flavour for one connection.
SQLITE_BEGIN_OPTION = "eventguard_sqlite_begin"


def resolve_url(url: str | URL | None) -> URL:
    """The argument, else ``EVENTGUARD_DATABASE_URL``, else an SQLite file in the working directory.

    Plain driver names are upgraded to their async drivers, so ``postgresql://`` and
    ``sqlite:///x.db`` copied from elsewhere work as written.
    """
    if url is None:
        url = os.environ.get(ENV_URL) or f"sqlite+aiosqlite:///{DEFAULT_SQLITE_FILE}"
    parsed = make_url(url) if isinstance(url, str) else url
    backend = parsed.get_backend_name()
    driver = parsed.get_driver_name()
    if backend == "sqlite" and driver != "aiosqlite":
        parsed = parsed.set(drivername="sqlite+aiosqlite")
    elif backend == "postgresql" and driver != "asyncpg":
        parsed = parsed.set(drivername="postgresql+asyncpg")
    elif backend not in ("sqlite", "postgresql"):
        raise ValueError(f"unsupported database {backend!r}: eventguard supports sqlite and postgresql")
    return parsed


def safe_url(url: URL) -> str:
    """The URL for logs and error messages: never the password."""
    return url.render_as_string(hide_password=True)


def is_sqlite(url: URL) -> bool:
    return url.get_backend_name() == "sqlite"


def sqlite_path(url: URL) -> Path | None:
    """The file behind an SQLite URL, or None for an in-memory database."""
    if not is_sqlite(url) or url.database in (None, "", ":memory:"):
        return None
    return Path(url.database)


def _json_serializer(value: Any) -> str:
    # The sink hands payloads over already serialised (it must measure them to truncate),
    # as a PreSerialised str; anything else (store queries, migrations) is serialised here.
    if isinstance(value, PreSerialised):
        return str(value)
    return orjson.dumps(value).decode()


def _json_deserializer(value: str | bytes) -> Any:
    return orjson.loads(value)


class PreSerialised(str):
    """JSON text that the JSON column stores as is instead of encoding it again."""

    __slots__ = ()


def create_engine(
    url: URL,
    *,
    schema: str | None = None,
    busy_timeout_ms: int = 30_000,
    pooler_safe: bool = False,
    connect_timeout: float = 10.0,
    statement_timeout: float | None = 60.0,
    application_name: str = "eventguard",
    pool_size: int = 5,
    echo: bool = False,
) -> AsyncEngine:
    """An async engine configured for eventguard's access pattern.

    SQLite: WAL (readers never block the writer), ``busy_timeout`` (wait, don't fail, when
    another process holds the write lock), foreign keys on, and ``BEGIN IMMEDIATE`` for every
    transaction, so the write lock is taken up front, where the busy handler applies, rather
    than on the first write, where a read->write upgrade fails with "database is locked".
    PostgreSQL: ``pool_pre_ping`` (replicas outlive server restarts), an optional ``schema``
    (a ``search_path``), a ``statement_timeout`` (a stuck write fails, so the sink spools it),
    and ``pooler_safe`` for PgBouncer-style poolers, which cannot keep server-side prepared
    statements across transactions.
    """
    kwargs: dict[str, Any] = {
        "echo": echo,
        "json_serializer": _json_serializer,
        "json_deserializer": _json_deserializer,
    }
    if is_sqlite(url):
        if schema is not None:
            raise ValueError("schema= is a PostgreSQL setting; an SQLite database has one schema")
        path = sqlite_path(url)
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
        # sqlite3's own transaction handling is switched off below; a connection timeout
        # still matters for the initial open.
        kwargs["connect_args"] = {"timeout": busy_timeout_ms / 1000}
        engine = create_async_engine(url, **kwargs)
        _install_sqlite_hooks(engine, busy_timeout_ms)
        return engine

    # application_name shows who holds a connection in pg_stat_activity.
    settings = {"application_name": application_name[:63]}
    if schema is not None:
        settings["search_path"] = schema
    connect_args: dict[str, Any] = {"timeout": connect_timeout, "server_settings": settings}
    if statement_timeout is not None:
        # A statement stuck behind a lock, or on a server that went silent, fails instead of
        # waiting for ever: the server's statement_timeout, and the driver's own command_timeout
        # (which a pooler cannot swallow) a little later as a backstop.
        settings["statement_timeout"] = str(max(1, int(statement_timeout * 1000)))
        connect_args["command_timeout"] = statement_timeout + 5.0
    if pooler_safe:
        # SQLAlchemy's asyncpg docs: no statement caches and unique statement names, because
        # a transaction-mode pooler may hand each transaction a different server connection.
        connect_args["prepared_statement_cache_size"] = 0
        connect_args["statement_cache_size"] = 0
        connect_args["prepared_statement_name_func"] = _statement_name
        kwargs["poolclass"] = NullPool
    else:
        kwargs["pool_size"] = pool_size
        kwargs["max_overflow"] = pool_size
    kwargs["connect_args"] = connect_args
    kwargs["pool_pre_ping"] = True
    return create_async_engine(url, **kwargs)


def _statement_name() -> str:
    return f"__eventguard_{uuid.uuid4().hex}__"


def _install_sqlite_hooks(engine: AsyncEngine, busy_timeout_ms: int) -> None:
    # The recipe from SQLAlchemy's SQLite docs ("Enabling Non-Legacy SQLite Transactional
    # Modes ... aiosqlite"): disable the driver's implicit BEGIN and emit our own.
    @event.listens_for(engine.sync_engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        try:
            cursor.execute(f"PRAGMA busy_timeout = {int(busy_timeout_ms)}")
            cursor.execute("PRAGMA journal_mode = WAL")
            cursor.execute("PRAGMA foreign_keys = ON")
            # WAL + NORMAL is durable against application crashes and much faster than FULL.
            cursor.execute("PRAGMA synchronous = NORMAL")
        finally:
            cursor.close()

    @event.listens_for(engine.sync_engine, "begin")
    def _on_begin(conn: Any) -> None:
        mode = conn.get_execution_options().get(SQLITE_BEGIN_OPTION, "IMMEDIATE")
        if mode not in ("IMMEDIATE", "DEFERRED"):
            raise ValueError(f"unknown SQLite BEGIN mode {mode!r}")
        conn.exec_driver_sql(f"BEGIN {mode}")
