"""Alembic environment for eventguard: one file for SQLite and PostgreSQL, from code or the CLI.

From code (``SqlSink.migrate``, ``eventguard db upgrade``) the caller opens an async connection
and hands its sync facade over in ``config.attributes["connection"]`` (Alembic cookbook:
"Programmatic API use (connection sharing) with asyncio"). From the command line::

    alembic -c migrations/alembic.ini -x url=postgresql://... [-x schema=...] upgrade head

falls back to ``EVENTGUARD_DATABASE_URL`` (then the default SQLite file) when no url is given.
"""

from __future__ import annotations

import asyncio
from logging.config import fileConfig

from alembic import context
from sqlalchemy.engine import Connection

from eventguard.sql.engine import create_engine, resolve_url
from eventguard.sql.migrate import hold_migration_lock
from eventguard.sql.tables import VERSION_TABLE, metadata

config = context.config

if config.config_file_name is not None and config.attributes.get("configure_logging", True):
    fileConfig(config.config_file_name, disable_existing_loggers=False)


def _options(connection: Connection | None = None) -> dict[str, object]:
    return {
        "target_metadata": metadata,
        "version_table": VERSION_TABLE,
        # SQLite cannot ALTER most things: future migrations use batch mode there.
        "render_as_batch": connection is None or connection.dialect.name == "sqlite",
        "compare_type": True,
        # Our engines emit BEGIN themselves on SQLite (see eventguard.sql.engine), so DDL is
        # transactional there too: a failed migration leaves nothing half done.
        "transactional_ddl": True,
    }


def _url_argument() -> str | None:
    x = context.get_x_argument(as_dictionary=True)
    return x.get("url") or config.attributes.get("url") or config.get_main_option("sqlalchemy.url")


def _schema_argument() -> str | None:
    schema = context.get_x_argument(as_dictionary=True).get("schema") or config.attributes.get("schema")
    return schema or None


def run_migrations_offline() -> None:
    url = resolve_url(_url_argument())
    context.configure(url=url, literal_binds=True, dialect_opts={"paramstyle": "named"}, **_options())
    schema = _schema_argument()
    with context.begin_transaction():
        if schema is not None:  # what create_engine(schema=) does per connection, said once
            quoted = url.get_dialect()().identifier_preparer.quote_identifier(schema)
            context.execute(f"SET search_path TO {quoted}")
        context.run_migrations()


def do_run_migrations(connection: Connection) -> None:
    # Before anything is read: two processes' migrations of one database run one after the
    # other (eventguard.sql.migrate.hold_migration_lock; a no-op if the caller holds it already).
    hold_migration_lock(connection)
    context.configure(connection=connection, **_options(connection))
    with context.begin_transaction():
        context.run_migrations()


async def run_async_migrations() -> None:
    engine = create_engine(resolve_url(_url_argument()), schema=_schema_argument())
    try:
        async with engine.begin() as connection:
            await connection.run_sync(do_run_migrations)
    finally:
        await engine.dispose()


def run_migrations_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        do_run_migrations(connection)
    else:
        asyncio.run(run_async_migrations())


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
