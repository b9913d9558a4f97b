"""What every subcommand shares: registration, the database URL, output (tables or JSON), errors, durations.

The scaffold: every command is registered with :func:`command` (or :func:`register`), which handles its
errors once for all (:func:`handled`: a database, migration or eventguard error becomes one scrubbed line
on stderr and exit code 2, and so does a bad ``--status``/``--policy`` choice, see :func:`choice`). A
command resolves its options, asks the library, and prints what it returns.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import os
import re
import sys
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from enum import Enum, StrEnum
from typing import TYPE_CHECKING, Annotated, Any, NoReturn, ParamSpec, TypeVar

import typer
from alembic.util import CommandError as AlembicCommandError
from rich.console import Console
from rich.table import Table
from rich.text import Text
from sqlalchemy.engine import URL
from sqlalchemy.exc import ArgumentError
from typer.core import TyperGroup

from eventguard._text import printable as printable  # the one escaper, re-exported for the commands
from eventguard.errors import BadDatabaseURL, EventGuardError, SchemaMismatchError
from eventguard.lifecycle import State
from eventguard.sql import engine as _db
from eventguard.sql import migrate as _migrate
from eventguard.store import ResponseStore

T = TypeVar("T")
P = ParamSpec("P")
E = TypeVar("E", bound=Enum)

#: Exit codes: 0 fine, 1 the command ran and found a problem (verify), 2 usage or environment error,
#: 130 interrupted (Ctrl-C; 128 + SIGINT, as a shell reports it).
EXIT_FOUND = 1
EXIT_ERROR = 2
EXIT_INTERRUPTED = 130

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
#: The environment variable ``--schema`` falls back to.
ENV_SCHEMA = "EVENTGUARD_SCHEMA"
Schema = Annotated[
    str | None,
    typer.Option(
        "--schema",
        envvar=ENV_SCHEMA,
        show_envvar=True,
        help="PostgreSQL schema of eventguard's tables (as SqlSink(schema=...)). Default: the search path.",
        show_default=False,
    ),
]

# Nothing we print is read as rich markup or :emoji: codes: stored data goes through printable()
# and reaches rich as plain text.
out = Console(highlight=False, soft_wrap=False, markup=False, emoji=False)
if not out.is_terminal and "COLUMNS" not in os.environ:
    out.width = 160  # piped into a file or a pager: ids stay whole; a terminal's own width otherwise
err = Console(stderr=True, highlight=False, markup=False, emoji=False)


def say(text: str) -> None:
    """Print one line of plain output (escaped; never markup)."""
    out.print(Text(printable(text)))


#: click's base exception, whichever click typer runs on (its own copy, or click itself).
_CLICK_ERROR: type[Exception] = next(c for c in typer.BadParameter.__mro__ if c.__name__ == "ClickException")


class CliError(Exception):
    """A one-line error for the user: printed without a traceback, exit code 2."""


def fail(message: str) -> NoReturn:
    raise CliError(message)


#: Every secret of every URL this process was given: the final scrub removes them from any error.
_SECRETS: set[str] = set()


def remember_secrets(*urls: URL | str | None) -> set[str]:
    """Note the secrets of these URLs (and of ``EVENTGUARD_DATABASE_URL``); all of them so far."""
    for url in (*urls, os.environ.get(_db.ENV_URL)):
        _SECRETS.update(_db.url_secrets(url))
    return set(_SECRETS)


def scrub(text: str, secrets: Iterable[str] = ()) -> str:
    """Error or log text as it may be shown: no known secret, no password in any URL in it."""
    return _db.scrub(text, {*_SECRETS, *secrets})


def resolve(url: str | None, schema: str | None = None) -> URL:
    """The database URL, parsed and checked; a bad one is a one-line error (never with its password).

    Args:
        url: ``--database-url`` (None: ``EVENTGUARD_DATABASE_URL``, else the default SQLite file).
        schema: ``--schema``, checked against the URL: only PostgreSQL has schemas.
    """
    resolved = _resolve(url)
    if schema is not None and resolved.get_backend_name() != "postgresql":
        fail(f"--schema {quoted(schema)} is a PostgreSQL setting: an SQLite database has one schema")
    if schema is not None:
        try:
            _db.valid_schema(schema)
        except ValueError as exc:  # said as the bad argument it is, not as a database that failed
            fail(f"--schema {quoted(schema)}: {exc}")
    return resolved


def _resolve(url: str | None) -> URL:
    remember_secrets(url)
    raw = url if url is not None else os.environ.get(_db.ENV_URL) or None
    try:
        return _db.resolve_url(url)
    except BadDatabaseURL as exc:  # a control character, an unencoded '@', a bad port: said in its words
        fail(f"bad database URL {quoted(exc.shown)}: {exc.problem}")
    except ArgumentError:
        reason = "not a database URL (expected e.g. sqlite:///eventguard.db or postgresql://host/db)"
        if raw is not None and "://" not in raw:  # a file's path, most likely: it is not shown
            reason = (  # (it could be a secret pasted in the wrong place), so say what a URL looks like
                "not a database URL: it has no scheme:// (a SQLite file is sqlite:///relative/path.db or "
                "sqlite:////absolute/path.db; PostgreSQL is postgresql://host/db)"
            )
    except ValueError as exc:  # ours ("unsupported database ..."), or the parser's
        text = str(exc)
        reason = text if text.startswith("unsupported database") else "cannot read it as a URL"
    fail(f"bad database URL {quoted(_db.safe_url(raw or ''))}: {reason}")


def shown_url(url: URL) -> str:
    return _db.safe_url(url)


def ensure_exists(url: URL) -> None:
    """A read of the default SQLite file must not create an empty one in the working directory."""
    path = _db.sqlite_path(url)
    if path is not None and not path.exists():
        fail(
            f"no database at {path} ({shown_url(url)}); run `eventguard db upgrade` to create one, "
            f"or `eventguard demo` to fill one"
        )


async def check_schema(url: URL, schema: str | None = None) -> None:
    engine = _db.create_engine(url, schema=schema)
    try:
        await _migrate.check(engine)
    finally:
        await engine.dispose()


@contextmanager
def errors(url: URL | None = None) -> Iterator[None]:
    """Turn what can go wrong with a database into one line, with the password hidden."""
    try:
        yield
    except (CliError, typer.Exit, typer.Abort, _CLICK_ERROR):
        raise
    except SchemaMismatchError as exc:
        fail(str(exc))
    except AlembicCommandError as exc:  # e.g. a revision this eventguard does not know
        fail(f"migration: {exc}")
    except EventGuardError as exc:
        fail(str(exc))
    except ModuleNotFoundError as exc:
        if exc.name != "asyncpg":
            raise
        fail(_db.MISSING_ASYNCPG)  # the database's driver, not installed: its extra named
    except Exception as exc:  # the driver's, SQLAlchemy's, the network's: all say "the database"
        where = f" {shown_url(url)}" if url is not None else ""
        orig = getattr(exc, "orig", None) or exc
        lines = [line for line in str(orig).splitlines() if line.strip()]
        text = lines[0] if lines else type(orig).__name__
        secrets = _db.url_secrets(url)
        fail(f"cannot use the database{where}: {type(orig).__name__}: {scrub(cut(text, secrets), secrets)}")


def handled(fn: Callable[P, T]) -> Callable[P, T]:
    """Wrap a command: whatever goes wrong becomes one line on stderr and exit code 2.

    The command runs inside :func:`errors` (with its ``--database-url`` when that is a URL), so a
    database, migration or eventguard error is said in one line; a :class:`CliError` is printed as it
    is. That line, and every log record made while the command runs, is scrubbed of the secrets of
    the URL the command was given (``--database-url`` or ``EVENTGUARD_DATABASE_URL``) and escaped.
    """

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> T:
        url = kwargs.get("database_url")
        secrets = remember_secrets(url if isinstance(url, str) else None)
        try:
            with scrubbed_logs(secrets), errors(_url_or_none(url)):
                return fn(*args, **kwargs)
        except CliError as exc:
            err.print(Text(f"eventguard: error: {one_line(str(exc), secrets)}"), soft_wrap=True)
            raise typer.Exit(EXIT_ERROR) from None
        except KeyboardInterrupt:  # Ctrl-C: what was written stays; the shell's code for SIGINT
            err.print(Text("eventguard: interrupted"))
            raise typer.Exit(EXIT_INTERRUPTED) from None

    return wrapper


def _url_or_none(url: object) -> URL | None:
    """The URL errors are said against: ``url`` resolved, or None when it is not one (the command's
    own :func:`resolve` then says why)."""
    if not isinstance(url, str | None):
        return None
    try:
        return resolve(url)
    except CliError:
        return None


def register(
    app: typer.Typer,
    fn: Callable[..., Any],
    name: str | None = None,
    *,
    context_settings: dict[str, Any] | None = None,
) -> None:
    """Register ``fn`` as the command ``name`` of ``app``, its errors handled (:func:`handled`).

    Args:
        app: the typer application or group.
        fn: the command.
        name: its name (default: ``fn``'s).
        context_settings: click's, for this command (e.g. ``ignore_unknown_options``).
    """
    app.command(name, context_settings=context_settings)(handled(fn))


def command(
    app: typer.Typer, name: str | None = None, *, context_settings: dict[str, Any] | None = None
) -> Callable[[Callable[P, T]], Callable[P, T]]:
    """Decorator form of :func:`register`; returns ``fn`` itself."""

    def decorate(fn: Callable[P, T]) -> Callable[P, T]:
        register(app, fn, name, context_settings=context_settings)
        return fn

    return decorate


if TYPE_CHECKING:
    _ClickError = Exception
else:
    _ClickError = _CLICK_ERROR


class ChoiceError(_ClickError):
    """A value that is not one of an option's choices: one line, exit code 2, like every error.

    Raised while the command line is parsed, before any command runs; click prints it with
    :meth:`show` (the root group has scrubbed its message of secrets by then).
    """

    exit_code = EXIT_ERROR

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def show(self, file: Any = None) -> None:
        err.print(Text(f"eventguard: error: {one_line(self.message, remember_secrets())}"), soft_wrap=True)


def choice(enum: type[E], message: Callable[[str], str]) -> Callable[[Any], E]:
    """The ``parser=`` of an option whose values are ``enum``'s: ``--help`` lists them, and a value
    that is none of them is the :class:`ChoiceError` ``message(value)``."""

    def parse(value: Any) -> E:
        if isinstance(value, enum):
            return value
        try:
            return enum(value)
        except ValueError:
            raise ChoiceError(message(str(value))) from None

    return parse


class RecoverPolicy(StrEnum):
    """How ``eventguard recover`` ends a response nobody writes any more."""

    INTERRUPTED = "interrupted"
    FAILED = "failed"


Status = Annotated[
    State | None,
    typer.Option(
        "--status",
        help="Only this status.",
        parser=choice(
            State,
            lambda value: (
                f"unknown status {quoted(value)}: expected one of {', '.join(s.value for s in State)}"
            ),
        ),
    ),
]
Policy = Annotated[
    RecoverPolicy,
    typer.Option(
        "--policy",
        help="Mark them interrupted (recoverable) or failed.",
        parser=choice(
            RecoverPolicy, lambda value: f"--policy must be interrupted or failed, not {quoted(value)}"
        ),
    ),
]


#: The longest error line said whole; a longer one (a megabyte id in it) is cut, saying so.
LINE = 2000
#: At most this many characters of an argument are quoted back in an error message.
QUOTED = 200


def quoted(value: str) -> str:
    """An argument as an error message quotes it: its ``repr``, cut to :data:`QUOTED` characters (with
    its length said) so that a megabyte argument is not a megabyte message."""
    if len(value) <= QUOTED:
        return repr(value)
    return f"{value[:QUOTED]!r}... ({len(value)} characters)"


def one_line(text: str, secrets: Iterable[str] = ()) -> str:
    """Scrubbed of secrets, then escaped: a message that is one line and safe to print (cut first when
    it is long: see :func:`cut`)."""
    return printable(scrub(cut(text, secrets), secrets))


def cut(text: str, secrets: Iterable[str] = ()) -> str:
    """``text`` cut to :data:`LINE` characters, saying so, before it is scrubbed: scrubbing a long run
    of letters costs time that grows with the square of its length (a megabyte of them held
    ``responses show`` for hours). Known secrets are masked before the cut, and the cut goes back to
    the last space, so no URL is cut inside its password."""
    if len(text) <= LINE:
        return text
    for secret in sorted({*_SECRETS, *secrets}, key=len, reverse=True):
        if secret:
            text = text.replace(secret, _db.MASK)
    if len(text) <= LINE:
        return text
    head = text[:LINE].rsplit(None, 1)[0] if " " in text[:LINE] else ""
    return f"{head} ... (cut: {len(text)} characters)"


@contextmanager
def scrubbed_logs(secrets: Iterable[str]) -> Iterator[None]:
    """While the command runs, every log record (ours, SQLAlchemy's, the driver's) is built scrubbed:
    its message without secrets and escaped, its traceback without secrets."""
    known = set(secrets)
    previous = logging.getLogRecordFactory()

    def factory(*args: Any, **kwargs: Any) -> logging.LogRecord:
        record = previous(*args, **kwargs)
        try:
            message = record.getMessage()
        except Exception:  # a bad format string: leave it to logging to report
            return record
        record.msg, record.args = one_line(message, known), None
        if record.exc_info and record.exc_info[1] is not None and not record.exc_text:
            record.exc_text = scrub(logging.Formatter().formatException(record.exc_info), known)
        if record.stack_info:
            record.stack_info = scrub(record.stack_info, known)
        return record

    logging.setLogRecordFactory(factory)
    try:
        yield
    finally:
        logging.setLogRecordFactory(previous)


_ARGV = "eventguard.argv"


class SafeGroup(TyperGroup):
    """The root command: usage errors (which quote what was typed) are scrubbed and escaped too."""

    def make_context(self, info_name: Any, args: Any, parent: Any = None, **extra: Any) -> Any:
        # A new invocation: what was typed may hold a URL, wherever it went (a misplaced argument,
        # a bad option value). Its secrets are scrubbed from every error this invocation prints.
        _SECRETS.clear()
        remember_secrets(*(str(arg) for arg in args if "://" in str(arg)))
        try:
            ctx = super().make_context(info_name, args, parent=parent, **extra)
        except _CLICK_ERROR as exc:
            _clean_usage_error(exc, args)
            raise
        ctx.meta[_ARGV] = list(args)
        return ctx

    def invoke(self, ctx: Any) -> Any:
        try:
            return super().invoke(ctx)
        except _CLICK_ERROR as exc:
            _clean_usage_error(exc, ctx.meta.get(_ARGV, ()))
            raise


def _clean_usage_error(exc: Exception, argv: Iterable[Any]) -> None:
    if type(exc).__name__ == "NoArgsIsHelpError":
        return  # click >= 8.2 raises the help of a bare group as a usage error: our text, many lines
    secrets = remember_secrets(*(str(arg) for arg in argv if "://" in str(arg)))
    for name in ("message", "ui_filename"):
        value = getattr(exc, name, None)
        if isinstance(value, str):
            setattr(exc, name, one_line(value, secrets))
    if isinstance(exc, _USAGE_ERROR) and not isinstance(exc, ChoiceError):
        # click prints a usage error as three lines (usage, a hint, the error): ours are one, like
        # every other error, with the hint at its end.
        setattr(exc, "show", functools.partial(_show_usage_error, exc, secrets))  # noqa: B010


#: click's usage error, whichever click typer runs on.
_USAGE_ERROR: type[Exception] = next(c for c in typer.BadParameter.__mro__ if c.__name__ == "UsageError")


def _show_usage_error(exc: Any, secrets: set[str], file: Any = None) -> None:
    ctx = getattr(exc, "ctx", None)
    where = getattr(ctx, "command_path", None) or "eventguard"
    message = one_line(exc.format_message(), secrets)
    err.print(Text(f"eventguard: error: {message} (see `{printable(where)} --help`)"), soft_wrap=True)


def run(coro_fn: Callable[[], Coroutine[Any, Any, T]]) -> T:
    return asyncio.run(coro_fn())


async def with_store(url: URL, work: Callable[[ResponseStore], Awaitable[T]], schema: str | None = None) -> T:
    """Check the database is there and migrated, then run ``work`` with a store on it."""
    ensure_exists(url)
    await check_schema(url, schema)
    async with ResponseStore(url, schema=schema) as store:
        return await work(store)


def store_command(
    url_option: str | None, work: Callable[[ResponseStore], Awaitable[T]], schema: str | None = None
) -> T:
    """Resolve ``--database-url`` (and ``--schema``), check the database, run ``work`` with a store on it."""
    url = resolve(url_option, schema)
    return run(lambda: with_store(url, work, schema))


class Bar:
    """What a command tells its progress bar: how far it is (and, once known, how far it goes)."""

    def __init__(self, update: Callable[[int, int | None], None] | None = None) -> None:
        self._update = update

    def update(self, done: int, total: int | None = None) -> None:
        """``done`` items so far, of ``total`` (None: unknown, or as last said)."""
        if self._update is not None:
            self._update(done, total)


@contextmanager
def progress(description: str, *, quiet: bool) -> Iterator[Bar]:
    """A ``rich.progress`` bar on stderr while a long command runs, only on a terminal.

    With ``quiet`` (``--json``), or when stderr is piped or a file, nothing is drawn and the
    :class:`Bar` does nothing. The bar is transient: it is gone when the command prints its result.
    """
    if quiet or not err.is_terminal:
        yield Bar()
        return
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        SpinnerColumn,
        TextColumn,
        TimeElapsedColumn,
    )

    columns = (
        SpinnerColumn(),
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=err, transient=True) as shown:
        task = shown.add_task(printable(description), total=None)

        def update(done: int, total: int | None) -> None:
            if total is not None:
                shown.update(task, total=total)
            shown.update(task, completed=done)

        yield Bar(update)


def emit_json(value: Any) -> None:
    # ensure_ascii: every control, bidi character and lone surrogate is a \\u escape; valid JSON.
    sys.stdout.write(json.dumps(value, indent=2, default=str, ensure_ascii=True) + "\n")


def cell(value: Any) -> Text:
    """A table cell: stored data as escaped plain text (a :class:`Text` keeps its style)."""
    if isinstance(value, Text):
        if value.plain.isprintable():
            return value
        return Text(printable(value.plain), style=value.style)
    return Text("" if value is None else printable(value))


def table(
    title: str | None, columns: Sequence[str], rows: Sequence[Sequence[Any]], *, keep: Sequence[str] = ()
) -> Table:
    """A table; the ``keep`` columns (ids) are not wrapped, so they can be copied whole, unless one
    of their values takes more than half the console's width: unwrapped, it squeezed every other
    column to nothing (a 250-character id left no status to read). ``--json`` has them whole."""
    t = Table(title=None if title is None else cell(title), title_justify="left", show_lines=False)
    cells = [[cell(value) for value in row] for row in rows]
    widest = out.width // 2
    for i, column in enumerate(columns):
        unwrapped = column in keep and all(row[i].cell_len <= widest for row in cells)
        t.add_column(cell(column), overflow="fold", no_wrap=unwrapped)
    for row in cells:
        t.add_row(*row)
    return t


def when(value: datetime | None) -> str:
    if value is None:
        return "-"
    return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] + "Z"


def ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f} ms"


_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|sec|m|min|h|d|w)\s*$", re.IGNORECASE)
#: The longest age a duration may name (``datetime.min`` is the year 1).
MAX_AGE = "700000d"
_UNITS = {"s": 1, "sec": 1, "m": 60, "min": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_duration(text: str, option: str) -> timedelta:
    match = _DURATION.match(text)
    if match is None:
        fail(f"{option}: expected a duration such as 30m, 12h, 7d or 2w, not {quoted(text)}")
    try:
        age = timedelta(seconds=float(match.group(1)) * _UNITS[match.group(2).lower()])
        datetime.now(UTC) - age  # the time it names must exist too
    except OverflowError:
        fail(f"{option}: {quoted(text)} reaches back before the year 1 (keep it under {MAX_AGE})")
    return age


def parse_time(text: str, option: str) -> datetime:
    """An age (``2h``: that long ago) or an ISO 8601 time (naive means UTC)."""
    if _DURATION.match(text):
        return datetime.now(UTC) - parse_duration(text, option)
    try:
        value = datetime.fromisoformat(text)
    except ValueError:
        fail(
            f"{option}: expected an age such as 2h or 7d, or an ISO time such as 2025-01-31T12:00, "
            f"not {quoted(text)}"
        )
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value
