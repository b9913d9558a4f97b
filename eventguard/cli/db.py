"""``eventguard db upgrade | downgrade | stamp | current | history``: the schema, through the shipped
Alembic migrations."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import asdict
from typing import Annotated

import typer
from sqlalchemy.engine import URL
from sqlalchemy.ext.asyncio import AsyncEngine

from eventguard.cli._common import (
    DatabaseUrl,
    Json,
    Schema,
    command,
    emit_json,
    ensure_exists,
    fail,
    out,
    resolve,
    run,
    say,
    table,
)
from eventguard.sql import engine as _db
from eventguard.sql import migrate as _migrate

Revisions = tuple[str, ...]


async def _move(
    url: URL,
    schema: str | None,
    step: Callable[[AsyncEngine, str], Awaitable[None]],
    revision: str,
    *,
    skip_empty: bool = False,
) -> tuple[Revisions, Revisions]:
    """Apply one migration step; the revisions before and after it."""
    engine = _db.create_engine(url, schema=schema)
    try:
        before = await _migrate.current_revision(engine)
        if skip_empty and not before:
            return before, before  # nothing to downgrade: an empty database stays empty
        await step(engine, revision)
        return before, await _migrate.current_revision(engine)
    finally:
        await engine.dispose()


app = typer.Typer(
    help="Create, upgrade, downgrade, stamp or inspect the eventguard schema.",
    no_args_is_help=True,
    rich_markup_mode=None,
)


@command(app)
def upgrade(
    revision: Annotated[str, typer.Argument(metavar="REVISION", help="Target revision.")] = "head",
    sql: Annotated[
        bool,
        typer.Option(
            "--sql",
            help="Print the SQL the upgrade would run (for a DBA) instead of running it; no connection.",
        ),
    ] = False,
    start: Annotated[
        str | None,
        typer.Option("--from", help="With --sql: the revision the database is at (default: an empty one)."),
    ] = None,
    database_url: DatabaseUrl = None,
    schema: Schema = None,
    json: Json = False,
) -> None:
    """Create the schema, or upgrade it to this eventguard's version (idempotent)."""
    _revision(revision)
    if start is not None:
        _revision(start, "--from")
    url = resolve(database_url, schema)
    if start is not None and not sql:
        fail("--from goes with --sql (a live upgrade starts from the database's own revision)")
    if start is not None and (problem := _migrate.upgrade_range_problem(revision, start)) is not None:
        fail(f"--from {start}: {problem}")
    if sql:
        text = _migrate.upgrade_sql(
            url.render_as_string(hide_password=True), revision, start=start, schema=schema
        )
        if json:
            emit_json({"database_url": _db.safe_url(url), "sql": text})
        else:
            out.file.write(text)  # SQL as it is, for a file or psql: no wrapping, no escaping of quotes
        return

    before, after = run(lambda: _move(url, schema, _migrate.upgrade, revision))
    if json:
        emit_json({"database_url": _db.safe_url(url), "before": list(before), "after": list(after)})
        return
    if before == after:
        say(f"{_db.safe_url(url)}: already at {_rev(after)}")
    else:
        say(f"{_db.safe_url(url)}: upgraded {_rev(before)} -> {_rev(after)}")


# click reads `-1` as an unknown option: let it through to REVISION, where it belongs.
@command(app, context_settings={"ignore_unknown_options": True})
def downgrade(
    revision: Annotated[
        str,
        typer.Argument(metavar="REVISION", help="A revision id, -1 (one step), or base (drops every table)."),
    ],
    database_url: DatabaseUrl = None,
    schema: Schema = None,
    json: Json = False,
) -> None:
    """Downgrade the schema to REVISION. `base` removes eventguard's tables and their data."""
    if revision.startswith("-") and not revision[1:].isdigit():
        fail(f"no such option: {revision} (a relative REVISION is -N, such as -1)")
    _revision(revision)
    url = resolve(database_url, schema)
    ensure_exists(url)

    before, after = run(lambda: _move(url, schema, _migrate.downgrade, revision, skip_empty=True))
    if json:
        emit_json({"database_url": _db.safe_url(url), "before": list(before), "after": list(after)})
        return
    say(f"{_db.safe_url(url)}: downgraded {_rev(before)} -> {_rev(after)}")


@command(app)
def stamp(
    revision: Annotated[str, typer.Argument(metavar="REVISION", help="The revision to record.")] = "head",
    database_url: DatabaseUrl = None,
    schema: Schema = None,
    json: Json = False,
) -> None:
    """Record REVISION as the schema's revision without running a migration (tables made another way)."""
    _revision(revision)
    url = resolve(database_url, schema)
    ensure_exists(url)

    before, after = run(lambda: _move(url, schema, _migrate.stamp, revision))
    if json:
        emit_json({"database_url": _db.safe_url(url), "before": list(before), "after": list(after)})
        return
    say(f"{_db.safe_url(url)}: stamped {_rev(before)} -> {_rev(after)}")


@command(app)
def current(database_url: DatabaseUrl = None, schema: Schema = None, json: Json = False) -> None:
    """Show the database's schema revision and this eventguard's."""
    url = resolve(database_url, schema)
    ensure_exists(url)

    async def work() -> tuple[str, ...]:
        engine = _db.create_engine(url, schema=schema)
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


@command(app)
def history(json: Json = False) -> None:
    """The migrations this eventguard ships, newest first (no database needed)."""
    revisions = _migrate.history()
    if json:
        emit_json([asdict(r) for r in revisions])
        return
    rows = [
        [r.revision, r.down_revision or "(base)", "head" if r.is_head else "", r.message] for r in revisions
    ]
    out.print(table(None, ["revision", "after", "", "what it does"], rows, keep=["revision"]))


def _rev(revisions: tuple[str, ...]) -> str:
    return ", ".join(revisions) if revisions else "(none)"


def _revision(value: str, name: str = "REVISION") -> None:
    """A revision argument Alembic can take, or one line naming the argument (not the database)."""
    try:
        _migrate.check_revision(value, name)
    except ValueError as exc:
        fail(str(exc))
