"""Alembic, driven from code: find the shipped migrations, upgrade, downgrade, check.

The migrations live in the repository's top-level ``migrations/`` and are force-included in
the wheel as ``eventguard/_migrations``; both places are looked up, the installed one first.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import AsyncEngine

from eventguard.errors import SchemaMismatchError
from eventguard.sql.tables import VERSION_TABLE

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
    else:
        command.downgrade(cfg, revision)


async def upgrade(engine: AsyncEngine, revision: str = "head") -> None:
    # One transaction around the whole run: on both databases DDL is transactional, so a
    # failed migration leaves the schema as it was.
    async with engine.begin() as conn:
        await conn.run_sync(_run, "upgrade", revision)


async def downgrade(engine: AsyncEngine, revision: str) -> None:
    async with engine.begin() as conn:
        await conn.run_sync(_run, "downgrade", revision)


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
