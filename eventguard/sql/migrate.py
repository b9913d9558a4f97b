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

import asyncio
import io
import threading
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from alembic.script.revision import RangeNotAncestorError, RevisionError
from sqlalchemy import inspect
from sqlalchemy.engine import Connection
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncEngine

from eventguard.errors import SchemaMismatchError
from eventguard.sql.classify import reason
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


#: One migration at a time in this process, whatever its engine, event loop or thread: Alembic's
#: ``alembic.context`` is one process-global proxy, so two runs at once (two first calls of a
#: provider, a sink and a provider starting together) replace each other's context mid-run
#: (``KeyError: 'config'``) or interleave their DDL. A thread lock, taken by polling so that
#: waiting never blocks an event loop (see :func:`_one_in_this_process`).
_IN_PROCESS = threading.Lock()

#: PostgreSQL: the advisory lock two processes' migrations of one schema take, inside the
#: migration's transaction (released by its commit or rollback). Keyed by eventguard's class and
#: the schema the transaction writes to, so migrations of different schemas do not wait for each
#: other. ``coalesce``: ``hashtext(NULL)`` would make the call a no-op (the function is strict).
_PG_MIGRATION_LOCK = (
    "SELECT pg_advisory_xact_lock("
    "hashtext('eventguard migrations'), hashtext(coalesce(current_schema(), '')))"
)


@asynccontextmanager
async def _one_in_this_process() -> AsyncIterator[None]:
    # Polled, not an asyncio primitive: the holder may be on another event loop, in another thread.
    while True:
        if _IN_PROCESS.acquire(blocking=False):
            break
        await asyncio.sleep(0.005)
    try:
        yield
    finally:
        _IN_PROCESS.release()


def hold_migration_lock(connection: Connection) -> None:
    """Serialise this transaction's migration with every other one of the same database, from any
    process: call it first in the transaction, before the schema's revision is read.

    PostgreSQL: a transaction-level advisory lock (:data:`_PG_MIGRATION_LOCK`), so two processes'
    upgrades never interleave their DDL, and the second reads the revision the first committed.
    SQLite: nothing more is needed: eventguard's engines begin every transaction ``IMMEDIATE``, so
    the migration already holds the database's one write lock (another process waits for it,
    ``busy_timeout``) before it reads anything.
    """
    if connection.dialect.name == "postgresql":
        connection.exec_driver_sql(_PG_MIGRATION_LOCK)


def _locked_run(connection: Connection, direction: str, revision: str) -> None:
    hold_migration_lock(connection)
    _run(connection, direction, revision)


def check_revision(revision: object, name: str = "revision") -> str:
    """``revision`` itself if Alembic can take it as one (printable text, not empty), else a
    ValueError naming ``name``: Alembic failed on such a value deep inside (TypeError,
    AssertionError), after a live migration had taken its lock."""
    if not isinstance(revision, str) or not revision or not revision.isprintable():
        raise ValueError(
            f"{name} must be a revision id, a step such as -1, 'head' or 'base', not {revision!r:.80}"
        )
    return revision


async def _migrate(engine: AsyncEngine, direction: str, revision: str) -> None:
    check_revision(revision)
    # One transaction around the whole run: on both databases DDL is transactional, so a
    # failed migration leaves the schema as it was.
    async with _one_in_this_process(), engine.begin() as conn:
        await conn.run_sync(_locked_run, direction, revision)


async def upgrade(engine: AsyncEngine, revision: str = "head") -> None:
    """Upgrade to ``revision``, one migration at a time (this process's and other processes')."""
    await _migrate(engine, "upgrade", revision)


async def downgrade(engine: AsyncEngine, revision: str) -> None:
    """Downgrade to ``revision``: an id, a relative step such as ``-1``, or ``base`` (drops every table)."""
    await _migrate(engine, "downgrade", revision)


async def stamp(engine: AsyncEngine, revision: str = "head") -> None:
    """Record ``revision`` as the database's schema revision without running any migration.

    For a database whose tables were made another way (restored from a dump, created by hand).
    """
    await _migrate(engine, "stamp", revision)


async def prepare(engine: AsyncEngine, *, auto_migrate: bool | None, marker_table: str) -> None:
    """Make sure the schema is at this package's head, as a store's first use decides it.

    ``auto_migrate`` ``None``: create the schema in an empty database, never upgrade an existing
    one; ``True``: also upgrade; ``False``: only check. An empty database is one with neither a
    revision nor ``marker_table`` (tables made another way are not overwritten). Raises
    :class:`SchemaMismatchError` when the schema is not at head and may not be changed.

    The decision is taken again under the migration lock (:func:`hold_migration_lock`, in the
    transaction that migrates): two processes' first calls on one empty database create it once,
    and the second finds it made, instead of reading a half-made schema, interleaving a second
    upgrade, or taking the first one's tables for someone else's.
    """
    try:
        await check(engine)
        return
    except SchemaMismatchError as exc:
        if auto_migrate is False or (exc.current and auto_migrate is not True):
            raise
    async with _one_in_this_process(), engine.begin() as conn:
        await conn.run_sync(_prepare_locked, auto_migrate, marker_table)


async def first_use(
    engine: AsyncEngine,
    *,
    auto_migrate: bool | None,
    marker_table: str,
    attempts: int = 10,
    pause: float = 0.2,
) -> None:
    """A store's first use of its database: :func:`prepare`, and, when the migration itself fails
    in the database, a look again for a while (``attempts`` checks, ``pause`` seconds apart).

    Every eventguard store (the sink, the response store) opens its database through this, so
    they decide alike. The look again is for a migrator that takes no lock (an older eventguard,
    DDL run by hand) creating the same tables at that moment: its transaction commits, and the
    check then finds the schema at head. Raises :class:`SchemaMismatchError` as :func:`prepare`
    does, or when the schema is still not at head after the last look.
    """
    try:
        await prepare(engine, auto_migrate=auto_migrate, marker_table=marker_table)
        return
    except SQLAlchemyError as exc:
        if attempts < 1:
            raise
        failed = exc
    for attempt in range(attempts):
        try:
            await check(engine)
            return
        except SchemaMismatchError as mismatch:
            if attempt == attempts - 1:
                # Say why the schema could not be made here (a PostgreSQL schema that does not
                # exist, a role that may not create tables): "run eventguard db upgrade" alone sends
                # the reader to a command that fails the same way.
                raise SchemaMismatchError(
                    f"{mismatch}; creating it here failed: {reason(failed)}",
                    current=mismatch.current,
                    expected=mismatch.expected,
                    command=mismatch.command,
                ) from failed
            await asyncio.sleep(pause)


def _prepare_locked(connection: Connection, auto_migrate: bool | None, marker_table: str) -> None:
    hold_migration_lock(connection)
    current = _current(connection)
    error = classify(current, expected_heads())
    if error is None:
        return  # another process made it while this one waited
    if current and auto_migrate is not True:
        raise error
    if not current and inspect(connection).has_table(marker_table):
        raise error  # tables without eventguard's revision: not ours to create
    _run(connection, "upgrade", "head")


def upgrade_range_problem(revision: str, start: str) -> str | None:
    """Why an upgrade from ``start`` cannot reach ``revision`` (``start`` is after it: a downgrade);
    None when it can, or when Alembic's own upgrade is the one to say what is wrong. Offline,
    Alembic printed an empty script for such a range (``BEGIN; COMMIT;``), as if nothing were to run."""
    try:
        list(ScriptDirectory.from_config(alembic_config()).iterate_revisions(revision, start))
    except RangeNotAncestorError:
        return f"is not before {revision!r}: an upgrade cannot go there (that is a downgrade)"
    except RevisionError:
        return None  # an unknown or relative revision: Alembic's upgrade says so in its words
    return None


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
    check_revision(revision)
    if start is not None:
        check_revision(start, "start")
    buffer = io.StringIO()
    cfg = alembic_config()
    problem = None if start is None else upgrade_range_problem(revision, start)
    if problem is not None:
        raise ValueError(f"start {start!r}: {problem}")
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
