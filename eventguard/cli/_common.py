"""What every subcommand shares: the database URL, output (tables or JSON), errors, durations."""

from __future__ import annotations

import asyncio
import functools
import json
import os
import re
import sys
from collections.abc import Awaitable, Callable, Coroutine, Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any, NoReturn, ParamSpec, TypeVar

import typer
from alembic.util import CommandError as AlembicCommandError
from rich.console import Console
from rich.table import Table
from rich.text import Text
from sqlalchemy.engine import URL
from sqlalchemy.exc import ArgumentError, SQLAlchemyError

from eventguard import _db
from eventguard.errors import EventGuardError
from eventguard.sink import migrate as _migrate
from eventguard.sink.errors import SchemaMismatchError
from eventguard.store import ResponseStore

T = TypeVar("T")
P = ParamSpec("P")

#: Exit codes: 0 fine, 1 the command ran and found a problem (verify), 2 usage or environment error.
EXIT_FOUND = 1
EXIT_ERROR = 2

DatabaseUrl = Annotated[
    str | None,
    typer.Option(
        "--database-url",
        envvar=_db.ENV_URL,
        show_envvar=True,
        help=f"SQLAlchemy URL (sqlite or postgresql). Default: ./{_db.DEFAULT_SQLITE_FILE}.",
        show_default=False,
    ),
]
Json = Annotated[bool, typer.Option("--json", help="Print JSON for scripts instead of tables.")]

out = Console(highlight=False, soft_wrap=False)
if not out.is_terminal and "COLUMNS" not in os.environ:
    out.width = 160  # piped into a file or a pager: ids stay whole; a terminal's own width otherwise
err = Console(stderr=True, highlight=False)


class CliError(Exception):
    """A one-line error for the user: printed without a traceback, exit code 2."""


def fail(message: str) -> NoReturn:
    raise CliError(message)


def resolve(url: str | None) -> URL:
    """The database URL, parsed and checked; a bad one is a one-line error (never with its password)."""
    raw = url
    try:
        return _db.resolve_url(raw)
    except (ArgumentError, ValueError) as exc:
        shown = _scrub(raw or "", raw)
        reason = str(exc).split("\n", 1)[0]
        if isinstance(exc, ArgumentError):
            reason = "not a database URL (expected e.g. sqlite:///eventguard.db or postgresql://host/db)"
        fail(f"bad database URL {shown!r}: {_scrub(reason, raw)}")


def shown_url(url: URL) -> str:
    return _db.safe_url(url)


def _scrub(text: str, raw_url: str | None) -> str:
    """Remove a password from ``text``: both as it appears in the raw URL and in any URL inside."""
    password: str | None = None
    if raw_url:
        try:
            password = _db.resolve_url(raw_url).password
        except Exception:  # an unparseable URL: fall back to the regex below
            password = None
    if password:
        text = text.replace(str(password), "***")
    # user:password@host anywhere in the text
    return re.sub(r"(://[^:/@\s]+:)[^@\s]+@", r"\1***@", text)


def ensure_exists(url: URL) -> None:
    """A read of the default SQLite file must not create an empty one in the working directory."""
    path = _db.sqlite_path(url)
    if path is not None and not path.exists():
        fail(
            f"no database at {path} ({shown_url(url)}); run `eventguard db upgrade` to create one, "
            f"or `eventguard demo` to fill one"
        )


async def check_schema(url: URL) -> None:
    engine = _db.create_engine(url)
    try:
        await _migrate.check(engine)
    finally:
        await engine.dispose()


@contextmanager
def errors(url: URL | None = None) -> Iterator[None]:
    """Turn what can go wrong with a database into one line, with the password hidden."""
    try:
        yield
    except CliError:
        raise
    except SchemaMismatchError as exc:
        fail(str(exc))
    except AlembicCommandError as exc:  # e.g. a revision this eventguard does not know
        fail(f"migration: {exc}")
    except (SQLAlchemyError, OSError, ConnectionError, TimeoutError) as exc:
        where = f" {shown_url(url)}" if url is not None else ""
        orig = getattr(exc, "orig", None) or exc
        text = str(orig).split("\n", 1)[0] or type(orig).__name__
        raw = url.render_as_string(hide_password=False) if url is not None else None
        fail(f"cannot use the database{where}: {type(orig).__name__}: {_scrub(text, raw)}")
    except EventGuardError as exc:
        fail(str(exc))


def handled(fn: Callable[P, T]) -> Callable[P, T]:
    """Decorate a command: a :class:`CliError` becomes one line on stderr and exit code 2."""

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> T:
        try:
            return fn(*args, **kwargs)
        except CliError as exc:
            err.print(f"eventguard: error: {exc}", markup=False, soft_wrap=True)
            raise typer.Exit(EXIT_ERROR) from None

    return wrapper


def run(coro_fn: Callable[[], Coroutine[Any, Any, T]]) -> T:
    return asyncio.run(coro_fn())


async def with_store(url: URL, work: Callable[[ResponseStore], Awaitable[T]]) -> T:
    """Check the database is there and migrated, then run ``work`` with a store on it."""
    ensure_exists(url)
    await check_schema(url)
    async with ResponseStore(url) as store:
        return await work(store)


def store_command(url_option: str | None, work: Callable[[ResponseStore], Awaitable[T]]) -> T:
    url = resolve(url_option)
    with errors(url):
        return run(lambda: with_store(url, work))


def emit_json(value: Any) -> None:
    sys.stdout.write(json.dumps(value, indent=2, default=str) + "\n")


def table(
    title: str | None, columns: Sequence[str], rows: Sequence[Sequence[Any]], *, keep: Sequence[str] = ()
) -> Table:
    """A table; the ``keep`` columns (ids) are never wrapped, so they can be copied whole."""
    t = Table(title=title, title_justify="left", show_lines=False)
    for column in columns:
        t.add_column(column, overflow="fold", no_wrap=column in keep)
    for row in rows:
        t.add_row(
            *(cell if isinstance(cell, Text) else Text("" if cell is None else str(cell)) for cell in row)
        )
    return t


def when(value: datetime | None) -> str:
    if value is None:
        return "-"
    return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] + "Z"


def ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f} ms"


_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|sec|m|min|h|d|w)\s*$", re.IGNORECASE)
_UNITS = {"s": 1, "sec": 1, "m": 60, "min": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_duration(text: str, option: str) -> timedelta:
    match = _DURATION.match(text)
    if match is None:
        fail(f"{option}: expected a duration such as 30m, 12h, 7d or 2w, not {text!r}")
    return timedelta(seconds=float(match.group(1)) * _UNITS[match.group(2).lower()])


def parse_time(text: str, option: str) -> datetime:
    """An age (``2h``: that long ago) or an ISO 8601 time (naive means UTC)."""
    if _DURATION.match(text):
        return datetime.now(UTC) - parse_duration(text, option)
    try:
        value = datetime.fromisoformat(text)
    except ValueError:
        fail(
            f"{option}: expected an age such as 2h or 7d, or an ISO time such as 2025-01-31T12:00, "
            f"not {text!r}"
        )
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value
