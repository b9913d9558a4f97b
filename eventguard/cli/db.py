"""``eventguard db upgrade | downgrade | current``: the schema, through the shipped Alembic migrations."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Annotated

import typer
from sqlalchemy.engine import URL
from sqlalchemy.ext.asyncio import AsyncEngine

from eventguard.cli._common import (
    DatabaseUrl,
    Json,
    command,
    emit_json,
    ensure_exists,
    resolve,
    run,
    say,
)
from eventguard.sql import engine as _db
from eventguard.sql import migrate as _migrate

Revisions = tuple[str, ...]


async def _move(
    url: URL,
    step: Callable[[AsyncEngine, str], Awaitable[None]],
    revision: str,
    *,
    skip_empty: bool = False,
) -> tuple[Revisions, Revisions]:
    """Apply one migration step; the revisions before and after it."""
    engine = _db.create_engine(url)
    try:
        before = await _migrate.current_revision(engine)
        if skip_empty and not before:
            return before, before  # nothing to downgrade: an empty database stays empty
        await step(engine, revision)
        return before, await _migrate.current_revision(engine)
    finally:
        await engine.dispose()


app = typer.Typer(
    help="Create, upgrade, downgrade or inspect the eventguard schema.",
    no_args_is_help=True,
    rich_markup_mode=None,
)


@command(app)
def upgrade(
    revision: Annotated[str, typer.Argument(metavar="REVISION", help="Target revision.")] = "head",
    database_url: DatabaseUrl = None,
    json: Json = False,
) -> None:
    """Create the schema, or upgrade it to this eventguard's version (idempotent)."""
    url = resolve(database_url)

    before, after = run(lambda: _move(url, _migrate.upgrade, revision))
    if json:
        emit_json({"database_url": _db.safe_url(url), "before": list(before), "after": list(after)})
        return
    if before == after:
        say(f"{_db.safe_url(url)}: already at {_rev(after)}")
    else:
        say(f"{_db.safe_url(url)}: upgraded {_rev(before)} -> {_rev(after)}")


@command(app)
def downgrade(
    revision: Annotated[
        str, typer.Argument(metavar="REVISION", help="A revision id, -1, or base (drops every table).")
    ],
    database_url: DatabaseUrl = None,
    json: Json = False,
) -> None:
    """Downgrade the schema to REVISION. `base` removes eventguard's tables and their data."""
    url = resolve(database_url)
    ensure_exists(url)

    before, after = run(lambda: _move(url, _migrate.downgrade, revision, skip_empty=True))
    if json:
        emit_json({"database_url": _db.safe_url(url), "before": list(before), "after": list(after)})
        return
    say(f"{_db.safe_url(url)}: downgraded {_rev(before)} -> {_rev(after)}")


@command(app)
def current(database_url: DatabaseUrl = None, json: Json = False) -> None:
    """Show the database's schema revision and this eventguard's."""
    url = resolve(database_url)
    ensure_exists(url)

    async def work() -> tuple[str, ...]:
        engine = _db.create_engine(url)
        try:
            return await _migrate.current_revision(engine)
        finally:
            await engine.dispose()

    now = run(work)
    expected = _migrate.expected_heads()
    state = "up to date" if set(now) == set(expected) else ("not migrated" if not now else "needs upgrade")
    if json:
        emit_json(
            {
                "database_url": _db.safe_url(url),
                "current": list(now),
                "head": list(expected),
                "up_to_date": set(now) == set(expected),
            }
        )
        return
    say(f"database: {_db.safe_url(url)}")
    say(f"current:  {_rev(now)}")
    say(f"head:     {_rev(expected)} ({state})")


def _rev(revisions: tuple[str, ...]) -> str:
    return ", ".join(revisions) if revisions else "(none)"
