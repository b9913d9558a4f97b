"""Alembic, driven from code: find the shipped migrations, upgrade, downgrade, stamp, check; and the
filter that keeps an application's own Alembic autogenerate away from eventguard's tables.

An application that migrates the same database with its own Alembic adds one line to its ``env.py``::

    context.configure(..., include_object=eventguard.include_object)

(or, with a filter of its own, ``include_object=lambda *a: eventguard.include_object(*a) and mine(*a)``),
and its autogenerate drafts nothing for eventguard's tables, their indexes or eventguard's version table.

The migrations live in the repository's top-level ``migrations/`` and are force-included in
the wheel as ``eventguard/_migrations``; both places are looked up, the installed one first.
"""

from __future__ import annotations

import io
from collections.abc import Iterator
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import AsyncEngine

from eventguard.errors import SchemaMismatchError
from eventguard.sql.tables import VERSION_TABLE, metadata

UPGRADE_COMMAND = "eventguard db upgrade"


def migrations_dir() -> Path:
    """The directory holding ``env.py`` and ``versions/``."""
    shipped = resources.files("eventguard").joinpath("_migrations")
    if isinstance(shipped, Path) and (shipped / "env.py").is_file():
        return shipped
    source = Path(__file__).resolve().parents[2] / "migrations"
    if (source / "env.py").is_file():
        return source
    raise FileNotFoundError(
        "eventguard's migrations are missing: neither eventguard/_migrations nor ./migrations"
    )


def alembic_config() -> Config:
    """A file-less Alembic config pointing at the shipped migrations."""
    cfg = Config()
    cfg.set_main_option("script_location", str(migrations_dir()))
    # Callers configure logging; env.py must not replace it with alembic.ini's.
    cfg.attributes["configure_logging"] = False
    return cfg


def expected_heads() -> tuple[str, ...]:
    return tuple(ScriptDirectory.from_config(alembic_config()).get_heads())


def _current(connection: Connection) -> tuple[str, ...]:
    ctx = MigrationContext.configure(connection, opts={"version_table": VERSION_TABLE})
    return tuple(ctx.get_current_heads())


async def current_revision(engine: AsyncEngine) -> tuple[str, ...]:
    async with engine.connect() as conn:
        return await conn.run_sync(_current)


def _run(connection: Connection, direction: str, revision: str) -> None:
    cfg = alembic_config()
    cfg.attributes["connection"] = connection
    if direction == "upgrade":
        command.upgrade(cfg, revision)
    elif direction == "stamp":
        command.stamp(cfg, revision)
    else:
        command.downgrade(cfg, revision)


async def upgrade(engine: AsyncEngine, revision: str = "head") -> None:
    # One transaction around the whole run: on both databases DDL is transactional, so a
    # failed migration leaves the schema as it was.
    async with engine.begin() as conn:
        await conn.run_sync(_run, "upgrade", revision)


async def downgrade(engine: AsyncEngine, revision: str) -> None:
    """Downgrade to ``revision``: an id, a relative step such as ``-1``, or ``base`` (drops every table)."""
    async with engine.begin() as conn:
        await conn.run_sync(_run, "downgrade", revision)


async def stamp(engine: AsyncEngine, revision: str = "head") -> None:
    """Record ``revision`` as the database's schema revision without running any migration.

    For a database whose tables were made another way (restored from a dump, created by hand).
    """
    async with engine.begin() as conn:
        await conn.run_sync(_run, "stamp", revision)


def upgrade_sql(
    url: str, revision: str = "head", *, start: str | None = None, schema: str | None = None
) -> str:
    """The SQL an upgrade to ``revision`` would run, as text for a DBA (Alembic's offline mode).

    Nothing connects to the database: ``url`` only chooses the dialect.

    Args:
        url: a database URL (sqlite or postgresql); only its dialect matters.
        revision: the target revision.
        start: the revision the database is at (None: an empty database).
        schema: a PostgreSQL schema; the script starts with ``SET search_path`` to it.
    """
    buffer = io.StringIO()
    cfg = alembic_config()
    cfg.output_buffer = buffer
    cfg.attributes["url"] = url
    if schema is not None:
        cfg.attributes["schema"] = schema
    command.upgrade(cfg, revision if start is None else f"{start}:{revision}", sql=True)
    return buffer.getvalue()


@dataclass(frozen=True)
class Revision:
    """One shipped migration, as ``eventguard db history`` lists it.

    Attributes:
        revision: its id.
        down_revision: the id it follows (None for the first).
        message: what it does.
        is_head: whether it is this package's newest.
    """

    revision: str
    down_revision: str | None
    message: str
    is_head: bool


def history() -> list[Revision]:
    """Every shipped migration, newest first."""
    script = ScriptDirectory.from_config(alembic_config())
    heads = set(script.get_heads())
    return [
        Revision(
            revision=rev.revision,
            down_revision=_one(rev.down_revision),
            message=(rev.doc or "").strip(),
            is_head=rev.revision in heads,
        )
        for rev in script.walk_revisions()
    ]


def _one(value: Any) -> str | None:
    if value is None or isinstance(value, str):
        return value
    return ", ".join(value)


def _tables() -> Iterator[str]:
    yield from (table.name for table in metadata.tables.values())
    yield VERSION_TABLE


#: Every table eventguard creates, its Alembic version table included.
TABLE_NAMES: frozenset[str] = frozenset(_tables())


def include_object(obj: Any, name: str | None, type_: str, reflected: bool, compare_to: Any) -> bool:
    """Alembic's ``include_object`` hook for an application's own ``env.py``: False for eventguard's.

    Its tables, their columns, indexes and constraints, and eventguard's version table are left
    out of the application's autogenerate (eventguard migrates them itself: ``eventguard db upgrade``
    or ``SqlSink.migrate()``); everything else is the application's and is included.

    Args:
        obj: the schema item Alembic compares (a table, column, index, constraint...).
        name: its name.
        type_: ``"table"``, ``"column"``, ``"index"``, ``"unique_constraint"``,
            ``"foreign_key_constraint"``...
        reflected: whether it was read from the database (rather than the application's metadata).
        compare_to: its counterpart on the other side, or None.
    """
    if type_ == "table":
        return name not in TABLE_NAMES
    table = getattr(obj, "table", None)
    return getattr(table, "name", None) not in TABLE_NAMES


def classify(current: tuple[str, ...], expected: tuple[str, ...]) -> SchemaMismatchError | None:
    """None when the schema matches, else the error that says what to do."""
    if set(current) == set(expected):
        return None
    script = ScriptDirectory.from_config(alembic_config())
    known = {rev.revision for rev in script.walk_revisions()}
    if not current:
        msg = (
            f"the database has no eventguard schema (expected revision {', '.join(expected)}); "
            f"run `{UPGRADE_COMMAND}`"
        )
        cmd = UPGRADE_COMMAND
    elif any(rev not in known for rev in current):
        msg = (
            f"the database schema (revision {', '.join(current)}) is newer than this eventguard "
            f"(head {', '.join(expected)}); upgrade the eventguard package, or run "
            f"`eventguard db downgrade` with the newer version"
        )
        cmd = "pip install -U eventguard"
    else:
        msg = (
            f"the database schema (revision {', '.join(current)}) is behind this eventguard "
            f"(head {', '.join(expected)}); run `{UPGRADE_COMMAND}`"
        )
        cmd = UPGRADE_COMMAND
    return SchemaMismatchError(msg, current=current, expected=expected, command=cmd)


async def check(engine: AsyncEngine) -> None:
    """Raise SchemaMismatchError unless the database is at this package's head."""
    error = classify(await current_revision(engine), expected_heads())
    if error is not None:
        raise error
