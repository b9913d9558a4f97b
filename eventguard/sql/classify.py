"""What a failed write means: the content was refused, or the database is not there.

The writer asks this module about every exception a write raises, and acts on the answer:

========================================  =========  ============================================
error                                     kind       the writer
========================================  =========  ============================================
PostgreSQL SQLSTATE class 22 (data        DATA       splits the group until the refused batches
exception: NUL in TEXT, bad encoding,                (then the refused rows within) are isolated,
value out of range, too long)                        writes the rest at once, quarantines those
class 23 (integrity: check, unique,       DATA       same
foreign key, not null)
class 42 (syntax, datatype mismatch)      DATA       same
class 54 (program limit: index row too    DATA       same
big)
42P01 undefined table, 42703 undefined    SCHEMA     spools, checks the schema again before the
column, 42883 undefined function,                    next write (an outage: the content is fine)
3F000 invalid schema
42501 insufficient privilege              OUTAGE     spools, backs off, replays when it is back
class 08 (connection), 53 (insufficient   OUTAGE     same
resources: disk full, too many
connections), 57 (operator intervention:
statement_timeout, shutdown), 58 (system
I/O), 40 (serialization failure,
deadlock: first done again at once,
``CONFLICT_TRIES`` in all, see
:func:`is_transient_conflict`), 25, 55
(lock not available),
XX (internal), 28, 3D, 26
SQLite IntegrityError, DataError,         DATA       split and quarantine, as above
ProgrammingError, InterfaceError
("Error binding parameter"), an
OperationalError "malformed JSON"
SQLite OperationalError "no such table"   SCHEMA     spools, checks the schema again
/ "no such column"
SQLite OperationalError (locked, disk     OUTAGE     spools, backs off
I/O, disk full, cannot open),
ProgrammingError "closed database"
:class:`SchemaMismatchError`              SCHEMA     spools
OSError, TimeoutError, ConnectionError,   OUTAGE     spools, backs off
a connection SQLAlchemy invalidated,
its pool timeout, asyncpg
InterfaceError / connection errors
UnicodeError (UnicodeEncodeError),       DATA       split and quarantine
OverflowError, orjson's JSONEncodeError
(a lone surrogate), asyncpg's client-side
DataError: the client could not encode
the values
aiosqlite's ValueError "Connection        OUTAGE     spools, backs off
closed" / "no active connection"
anything else (another SQLSTATE class,    UNKNOWN    logged once with its traceback and counted;
any other ValueError, a TypeError, a bug)            the writer probes the database: reachable,
                                                     the batch is refused like DATA (quarantined
                                                     with the reason); not, it is an OUTAGE
========================================  =========  ============================================

The SQLSTATE is looked for along the exception's chain: SQLAlchemy's ``exc.orig`` (whose
``sqlstate`` / ``pgcode`` the asyncpg dialect sets), then ``__cause__`` (the asyncpg exception
itself, with ``.sqlstate``). A data error is never an outage: it neither spools nor delays the
healthy batches beside it.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from enum import StrEnum

import orjson
from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import URL

from eventguard.errors import DatabaseUnavailableError, SchemaMismatchError
from eventguard.sql.engine import safe_url, scrub, url_secrets


class ErrorKind(StrEnum):
    #: The database refused this content; the same content will be refused again.
    DATA = "data"
    #: The database is away, busy or out of resources; the same content will go in later.
    OUTAGE = "outage"
    #: The schema is not the one this eventguard writes (an outage until someone migrates).
    SCHEMA = "schema"
    #: Not recognised: the writer probes the database to tell content from outage.
    UNKNOWN = "unknown"


_SQLSTATE_CLASS = {
    "22": ErrorKind.DATA,
    "23": ErrorKind.DATA,
    "42": ErrorKind.DATA,
    "54": ErrorKind.DATA,
    "08": ErrorKind.OUTAGE,
    "53": ErrorKind.OUTAGE,
    "57": ErrorKind.OUTAGE,
    "58": ErrorKind.OUTAGE,
    "40": ErrorKind.OUTAGE,
    "25": ErrorKind.OUTAGE,
    "55": ErrorKind.OUTAGE,
    "XX": ErrorKind.OUTAGE,
    "28": ErrorKind.OUTAGE,
    "3D": ErrorKind.OUTAGE,
    "26": ErrorKind.OUTAGE,
    "3F": ErrorKind.SCHEMA,
}
_SQLSTATE = {
    "42P01": ErrorKind.SCHEMA,  # undefined_table
    "42703": ErrorKind.SCHEMA,  # undefined_column
    "42883": ErrorKind.SCHEMA,  # undefined_function
    "42501": ErrorKind.OUTAGE,  # insufficient_privilege: configuration, not content
}

_SQLITE_DATA = (sqlite3.IntegrityError, sqlite3.DataError, sqlite3.ProgrammingError, sqlite3.InterfaceError)


def classify(exc: BaseException) -> ErrorKind:
    """What ``exc``, raised by a write, says about the content and the database (see the table)."""
    chain = list(_chain(exc))
    for err in chain:
        kind = _definite(err)
        if kind is not None:
            return kind
    for err in chain:
        if isinstance(err, UnicodeError | OverflowError | orjson.JSONEncodeError) or _is_asyncpg_data_error(
            err
        ):
            return ErrorKind.DATA
    # Any other ValueError says nothing certain (aiosqlite raises one for a closed connection):
    # the writer asks the database.
    return ErrorKind.UNKNOWN


#: SQLSTATEs of a transaction the server rolled back because it met another one (deadlock
#: detected, serialization failure): nothing is wrong with the content or the database, and the
#: same transaction done again goes through (PostgreSQL's own advice for both).
_TRANSIENT_CONFLICTS = frozenset({"40P01", "40001"})


def is_transient_conflict(exc: BaseException) -> bool:
    """Whether ``exc`` says the transaction lost a race with another (a deadlock, a serialization
    failure) and may be done again at once: still an OUTAGE to :func:`classify`, for a caller
    that does not retry."""
    return any(sqlstate(err) in _TRANSIENT_CONFLICTS for err in _chain(exc))


def _definite(err: BaseException) -> ErrorKind | None:
    code = sqlstate(err)
    if code is not None:
        return _SQLSTATE.get(code) or _SQLSTATE_CLASS.get(code[:2], ErrorKind.UNKNOWN)
    if isinstance(err, sqlite3.Error):
        return _sqlite(err)
    if isinstance(err, SchemaMismatchError):
        return ErrorKind.SCHEMA
    if isinstance(err, OSError | TimeoutError | sa_exc.TimeoutError | sa_exc.DisconnectionError):
        return ErrorKind.OUTAGE
    if isinstance(err, sa_exc.DBAPIError) and err.connection_invalidated:
        return ErrorKind.OUTAGE
    if _is_asyncpg_connection_trouble(err):
        return ErrorKind.OUTAGE
    if type(err) is ValueError and str(err) in _AIOSQLITE_CLOSED:
        return ErrorKind.OUTAGE
    return None


#: What aiosqlite raises (as plain ValueError) when its connection is gone.
_AIOSQLITE_CLOSED = frozenset({"Connection closed", "no active connection"})


def _is_asyncpg_data_error(err: BaseException) -> bool:
    """asyncpg's client-side ``DataError`` (a value it cannot encode for its parameter's type)."""
    return isinstance(err, ValueError) and any(
        cls.__module__.startswith("asyncpg") and cls.__name__ == "DataError" for cls in type(err).__mro__
    )


def sqlstate(exc: BaseException) -> str | None:
    """The PostgreSQL SQLSTATE ``exc`` carries itself, if any."""
    for name in ("sqlstate", "pgcode"):
        code = getattr(exc, name, None)
        if isinstance(code, str) and len(code) == 5:
            return code.upper()
    return None


def _sqlite(err: sqlite3.Error) -> ErrorKind:
    text = str(err).lower()
    if isinstance(err, sqlite3.OperationalError):
        if "no such table" in text or "no such column" in text:
            return ErrorKind.SCHEMA
        if "malformed json" in text:
            return ErrorKind.DATA
        return ErrorKind.OUTAGE
    if "closed database" in text or "closed connection" in text:
        return ErrorKind.OUTAGE
    if isinstance(err, _SQLITE_DATA):
        return ErrorKind.DATA
    return ErrorKind.OUTAGE  # DatabaseError, InternalError, NotSupportedError: the file or the library


def _is_asyncpg_connection_trouble(err: BaseException) -> bool:
    # By name, so this module needs no asyncpg import (SQLite-only installs keep working).
    for cls in type(err).__mro__:
        if cls.__module__.startswith("asyncpg") and cls.__name__ in (
            "InterfaceError",
            "PostgresConnectionError",
            "ConnectionDoesNotExistError",
            "InternalClientError",
            "ProtocolError",
        ):
            return not isinstance(err, ValueError)  # asyncpg's client-side DataError is content
    return False


def _chain(exc: BaseException) -> Iterator[BaseException]:
    """``exc``, then what it wraps: ``orig`` (SQLAlchemy), then ``__cause__`` (``raise ... from``).

    Not ``__context__``: an error raised while handling another (a rollback on a dead connection)
    says what happened last, and the one it was handling must not decide."""
    seen: set[int] = set()
    todo = [exc]
    while todo and len(seen) < 16:
        err = todo.pop(0)
        if id(err) in seen:
            continue
        seen.add(id(err))
        yield err
        for nxt in (getattr(err, "orig", None), err.__cause__):
            if isinstance(nxt, BaseException):
                todo.append(nxt)


def unavailable(url: URL | str, exc: BaseException) -> DatabaseUnavailableError | None:
    """``exc`` said as a :class:`~eventguard.DatabaseUnavailableError` when it means the database at
    ``url`` is away (an :attr:`ErrorKind.OUTAGE`: refused, unreachable, timed out, the login or the
    database refused), for the caller to raise ``from exc``; None for anything else, to be raised as
    it is. One line: the database without its password, the driver's error without the URL's secrets.
    A transaction that lost a race (a deadlock, a serialization failure) is not the database being
    away: done again, it goes through, so it is raised as it is."""
    if classify(exc) is not ErrorKind.OUTAGE or is_transient_conflict(exc):
        return None
    lines = reason(exc).splitlines()
    said = scrub(lines[0] if lines else type(exc).__name__, url_secrets(url))
    return DatabaseUnavailableError(f"cannot use the database {safe_url(url)}: {said}")


@contextmanager
def outages_as_unavailable(url: URL | str) -> Iterator[None]:
    """Raise what the block raises, but an outage of the database at ``url`` as the
    :class:`~eventguard.DatabaseUnavailableError` :func:`unavailable` makes of it, chained."""
    try:
        yield
    except Exception as exc:
        away = unavailable(url, exc)
        if away is None:
            raise
        raise away from exc


def reason(exc: BaseException) -> str:
    """One line for logs and the quarantine: the driver's own message, not SQLAlchemy's (which
    appends the statement and its parameters). May hold any character; see ``storable``."""
    orig = getattr(exc, "orig", None)
    err = orig if isinstance(orig, BaseException) else exc
    try:
        text = str(err)
    except Exception:  # a broken __str__ must not break the writer
        text = ""
    return f"{type(err).__name__}: {(text or type(err).__name__)[:300]}"
