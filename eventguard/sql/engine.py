"""Database URLs and engines: the one place that knows SQLite and PostgreSQL apart.

Both the sink (writes) and the store (reads) get their engines here, so the pragmas,
the transaction mode and the pooler setting are the same everywhere.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import re
import sqlite3
import sys
import uuid
import weakref
from collections.abc import Iterable, Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any
from urllib.parse import quote, quote_plus, unquote, unquote_plus, urlsplit

import aiosqlite
import orjson
from sqlalchemy import event, util
from sqlalchemy.dialects import postgresql
from sqlalchemy.engine import URL, make_url

# Private: these are the names the rest of eventguard (sink, store, cli, demo, migrations) uses.
__all__ = [
    "DEFAULT_SQLITE_FILE",
    "ENV_URL",
    "MISSING_ASYNCPG",
    "SQLITE_BEGIN_OPTION",
    "PreSerialised",
    "borrow_engine",
    "check_borrowable",
    "create_engine",
    "refuse_autocommit",
    "require_driver",
    "resolve_url",
    "safe_url",
    "scrub",
    "search_path",
    "sqlite_path",
    "sqlite_writer",
    "url_problem",
    "url_secrets",
    "valid_schema",
]
from sqlalchemy.exc import ArgumentError, DBAPIError
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine
from sqlalchemy.pool import AsyncAdaptedQueuePool, NullPool
from sqlalchemy.util.concurrency import in_greenlet

from eventguard._text import utf8_size
from eventguard.errors import BadDatabaseURL
from eventguard.sql.sqlite_thread import SqliteThread

#: Awaits a coroutine from SQLAlchemy's sync code on an async engine (inside its greenlet):
#: ``await_`` since SQLAlchemy 2.1, ``await_only`` before (the old name goes in 2.2).
_await: Any = getattr(util, "await_", None) or util.await_only

ENV_URL = "EVENTGUARD_DATABASE_URL"
DEFAULT_SQLITE_FILE = "eventguard.db"

#: The execution option that picks SQLite's BEGIN flavour for one connection.
SQLITE_BEGIN_OPTION = "eventguard_sqlite_begin"
#: A pooled connection's ``info`` key: its last BEGIN was cancelled before it answered.
_BEGIN_UNFINISHED = "eventguard_begin_unfinished"


def resolve_url(url: str | URL | None) -> URL:
    """The argument, else ``EVENTGUARD_DATABASE_URL``, else an SQLite file in the working directory.

    Plain driver names are upgraded to their async drivers, so ``postgresql://`` and
    ``sqlite:///x.db`` copied from elsewhere work as written. A string the CLI would refuse (a
    control or invisible character, a password with an unencoded ``@``, which the parser reads
    into the host) is refused here too, with a :class:`~eventguard.errors.BadDatabaseURL` (a
    ``ValueError``) that quotes none of its secrets: taken as written it names a host or a file
    nobody meant, and a sink would spool for ever. So is an empty or blank string (the default is
    ``None``, not ``""``). Anything but a ``str``, a ``URL`` or None is a ``TypeError`` naming
    ``url`` and the type (unchecked, it failed inside as an ``AttributeError``).
    """
    if url is None:
        url = os.environ.get(ENV_URL) or f"sqlite+aiosqlite:///{DEFAULT_SQLITE_FILE}"
    elif not isinstance(url, str | URL):
        raise TypeError(
            f"url must be a database URL (a str or a SQLAlchemy URL) or None, not {type(url).__name__}"
        )
    parsed = _parse(url) if isinstance(url, str) else url
    backend = parsed.get_backend_name()
    driver = parsed.get_driver_name()
    if backend == "sqlite" and driver != "aiosqlite":
        parsed = parsed.set(drivername="sqlite+aiosqlite")
    elif backend == "postgresql" and driver != "asyncpg":
        parsed = parsed.set(drivername="postgresql+asyncpg")
    elif backend not in ("sqlite", "postgresql"):
        raise ValueError(f"unsupported database {backend!r}: eventguard supports sqlite and postgresql")
    return parsed


def require_driver(url: URL) -> None:
    """``ModuleNotFoundError`` naming the extra when ``url``'s driver is not installed (asyncpg, the
    ``postgres`` extra). Called where a store that will connect is given its URL: at the first
    connection a sink took the error for an outage and spooled every response "until the database
    is back". (Not by :func:`resolve_url`: printing a migration's SQL needs no driver.)"""
    if url.get_backend_name() == "postgresql" and _not_installed("asyncpg"):
        raise ModuleNotFoundError(MISSING_ASYNCPG, name="asyncpg")


#: What a PostgreSQL URL without the ``postgres`` extra is told.
MISSING_ASYNCPG = "PostgreSQL needs asyncpg, which is not installed: pip install 'eventguard[postgres]'"


def _not_installed(module: str) -> bool:
    if module in sys.modules:
        return sys.modules[module] is None  # None: imports of it are refused
    return importlib.util.find_spec(module) is None


#: Query parameters whose value is shown as ``***``: any name containing one of these words
#: (case and ``_``/``-``/``.`` ignored): password, passwd, pwd, sslpassword, secret, token, key,
#: sslkey, api_key, credentials, auth..., signature, cookie, session, private...
_SECRET_PARAM = re.compile(r"pass|pwd|secret|token|key|cred|auth|sig|cookie|session|private")
_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]*")
#: Something that looks like a URL inside free text: ``scheme://`` up to the next whitespace. The
#: match starts only where a run of scheme characters starts, and takes the run whole (possessive):
#: an optional scheme tried at every letter of a long run made the search quadratic (a megabyte of
#: letters in an error line took hours). What precedes the run's first letter is not the scheme.
_URL_IN_TEXT = re.compile(r"(?<![A-Za-z0-9+.\-])[A-Za-z0-9+.\-]*+://\S*")
_SCHEME_START = re.compile(r"[A-Za-z]")
MASK = "***"


def _parse(url: str) -> URL:
    """``make_url``, with errors that never quote the string (the parser's may: a bad port, or the
    whole URL on older SQLAlchemy releases). What :func:`url_problem` finds (a bad port among
    them: it asks the parser) is a :class:`~eventguard.errors.BadDatabaseURL` in its words, which the
    CLI shows as they are."""
    problem = url_problem(url)
    if problem is not None:  # an empty or blank one is shown as it is: it holds nothing secret
        raise BadDatabaseURL(safe_url(url) if url.strip(" ") else url, problem)
    try:
        return make_url(url)
    except ArgumentError:
        hint = "" if "://" in url else " (it has no scheme://; a SQLite file is sqlite:///path/to/file.db)"
        raise ArgumentError(f"not a database URL: {safe_url(url)!r}{hint}") from None


def safe_url(url: URL | str) -> str:
    """Any URL, or anything meant as one, as it may be shown: in output, errors, logs, reprs.

    Never a secret: the password is ``***``; so is the value of every query parameter whose name
    suggests a secret (see ``_SECRET_PARAM``); a password with an unencoded ``@`` (which the parser
    reads into the host) is masked whole. Text that cannot be read as a URL unambiguously (it does
    not parse, or holds a control or other non-printable character) is shown as its scheme and
    ``***`` only: ``postgresql+asyncpg://***``, or ``***`` without a recognisable scheme.
    """
    if isinstance(url, URL):
        return _render(url)
    text = str(url)
    if not text.isprintable():
        return _opaque(text)
    try:
        parsed = make_url(text)
    except Exception:  # ArgumentError, a bad port (ValueError), anything: show nothing of it
        return _opaque(text)
    return _render(parsed)


def _opaque(text: str) -> str:
    scheme, sep, _rest = text.partition("://")
    if sep and _SCHEME.fullmatch(scheme):
        return f"{scheme}://{MASK}"
    return MASK


def _is_secret_param(name: str) -> bool:
    return _SECRET_PARAM.search(re.sub(r"[\s_.\-]", "", name.lower())) is not None


def _render(url: URL) -> str:
    parts = [url.drivername, url.username, url.host, url.database, *url.query]
    for value in url.query.values():
        parts.extend([value] if isinstance(value, str) else value)
    if not all(isinstance(p, str) and p.isprintable() for p in parts if p is not None):
        return _opaque(f"{url.drivername}://")
    host = url.host
    if host is not None and "@" in host:
        # user:p@ss@host: the parser stops the password at the first "@" and keeps the rest in
        # the host. The real host is after the last "@"; everything before it is password.
        host = host.rsplit("@", 1)[1]
        if url.password is None:
            return _opaque(f"{url.drivername}://")
    if url.database is not None and "@" in url.database and (url.username or url.password):
        # user:p@ss/word@host/db: the password ran into the path; nothing here is reliable.
        return _opaque(f"{url.drivername}://")
    base = url.set(host=host, query={}).render_as_string(hide_password=True)
    if not url.query:
        return base
    pairs = []
    for key in sorted(url.query):
        values = url.query[key]
        for value in [values] if isinstance(values, str) else values:
            if _is_secret_param(key):
                shown = MASK
            elif "://" in value or "@" in value:
                shown = quote_plus(safe_url(value), safe="*:/@")
            else:
                shown = quote_plus(value, safe="*")
            pairs.append(f"{quote_plus(key)}={shown}")
    return f"{base}?{'&'.join(pairs)}"


def url_secrets(url: URL | str | None) -> set[str]:
    """Every secret a URL holds, in every form it may be printed in (raw, decoded, percent-encoded,
    escaped): what :func:`scrub` removes from error text before it is shown."""
    if url is None:
        return set()
    found: set[str] = set()
    parsed: URL | None
    if isinstance(url, URL):
        parsed = url
    else:
        text = str(url)
        try:
            parsed = make_url(text)
        except Exception:
            parsed = None
        found |= _raw_secrets(text, loose=parsed is None or _ambiguous(parsed))
    if parsed is not None:
        password = None if parsed.password is None else str(parsed.password)
        if parsed.host is not None and "@" in parsed.host:
            # user:p@ss@host: the password is "p@ss"; the parser holds "p" and the host "ss@host".
            head = parsed.host.rsplit("@", 1)[0]
            found.add(head)
            if password is not None:
                found.add(f"{password}@{head}")
        elif password and not _ambiguous(parsed):
            found.add(password)  # (when ambiguous, the loose reading above has the whole of it)
        for key, values in parsed.query.items():
            if _is_secret_param(key):
                found.update([values] if isinstance(values, str) else values)
    return {form for secret in found if secret for form in _forms(secret)}


def _ambiguous(url: URL) -> bool:
    """Whether the parser may have split a password with an unencoded "@" in the wrong place."""
    if url.host is not None and "@" in url.host:
        return True
    return url.database is not None and "@" in url.database and bool(url.username or url.password)


def _raw_secrets(text: str, *, loose: bool) -> set[str]:
    """The password and the secret query values as written in the raw string (not decoded).

    ``loose``, for a string the parser cannot read unambiguously: the userinfo runs to the last
    "@", the password from its first ":". Otherwise the parser's own reading.
    """
    found: set[str] = set()
    _scheme, sep, rest = text.partition("://")
    if not sep:
        return found  # not meant as a URL
    if loose:
        if "@" in rest:
            userinfo = rest.rsplit("@", 1)[0]
            if ":" in userinfo:
                found.add(userinfo.split(":", 1)[1])
    else:
        match = re.match(r"[^:/]*:([^@]*)@", rest)
        if match is not None:
            found.add(match.group(1))
    if "?" in rest:
        for piece in rest.split("?", 1)[1].split("&"):
            key, eq, value = piece.partition("=")
            if eq and _is_secret_param(unquote_plus(key)):
                found.add(value)
    return found


def _forms(secret: str) -> set[str]:
    forms = {
        secret,
        unquote(secret),
        unquote_plus(secret),
        quote(secret, safe=""),
        quote(secret, safe=" +"),  # SQLAlchemy's rendering
        quote(secret),
        quote_plus(secret),
        repr(secret)[1:-1],
        json.dumps(secret)[1:-1],
        json.dumps(secret, ensure_ascii=False)[1:-1],
        # quoted inside a message: backslash-escaped, or SQL-style doubled quotes
        secret.replace("\\", "\\\\").replace("'", "\\'").replace('"', '\\"'),
        secret.replace("'", "''"),
    }
    forms |= {re.sub(r"%[0-9A-F]{2}", lambda m: m.group(0).lower(), f) for f in forms}
    return {f for f in forms if f}


def scrub(text: str, secrets: Iterable[str] = ()) -> str:
    """``text`` with every known secret replaced by ``***`` (longest first), then every URL in it
    rendered by :func:`safe_url`: the last step before an error or a log line is shown."""
    for secret in sorted(set(secrets), key=len, reverse=True):
        if secret:
            text = text.replace(secret, MASK)
    if "://" not in text:
        return text
    return _URL_IN_TEXT.sub(_safe_match, text)


def _safe_match(match: re.Match[str]) -> str:
    found = match.group(0)
    colon = found.index("://")
    letter = _SCHEME_START.search(found, 0, colon)  # a scheme starts with a letter
    lead = colon if letter is None else letter.start()
    return found[:lead] + _safe_token(found[lead:])


def _safe_token(token: str) -> str:
    if "@" not in token and "?" not in token:
        return token  # no userinfo, no query: nothing secret (a plain path, a host)
    body = token.rstrip("'\"),;:.!]>}")  # the quote, bracket or colon after a URL in a message
    return safe_url(body) + token[len(body) :]


def url_problem(raw: str) -> str | None:
    """Why this string cannot be used as a database URL as written, in words that quote none of it;
    None when nothing obvious is wrong (the parser may still refuse it)."""
    if not raw:
        return "it is empty"
    for ch in raw:
        if not ch.isprintable():
            shown = ch.encode("unicode_escape").decode("ascii")
            hint = ": a stray newline at the end?" if ch in "\r\n" else ""
            return f"it contains a control or invisible character ({shown}){hint}"
    if raw.isspace():  # only spaces: every other whitespace character is refused above
        return "it is blank: only spaces"
    _scheme, sep, rest = raw.partition("://")
    if not sep:
        return None
    try:
        parsed = make_url(raw)
    except ValueError:  # the only one make_url raises besides ArgumentError: int(port)
        if rest.count("@") > 1:
            return _AT_HINT
        return "its port is not a number (a ':' or '@' in a password must be percent-encoded)"
    except Exception:
        return None
    return _AT_HINT if _ambiguous(parsed) else None


_AT_HINT = "the password holds an unencoded '@' (percent-encode it: %40)"


def is_sqlite(url: URL) -> bool:
    return url.get_backend_name() == "sqlite"


def sqlite_path(url: URL) -> Path | None:
    """The file behind an SQLite URL, or None for an in-memory database.

    A URI filename (``sqlite:///file:/data/app.db?mode=rwc&uri=true``, as SQLAlchemy documents it)
    names the file in its path: taken literally, ``file:/data/app.db`` made a directory tree named
    ``file:`` in the working directory, and the file was looked for there."""
    database = url.database
    if not is_sqlite(url) or not database or database == ":memory:":
        return None
    if _uri_filename(url) and database.startswith("file:"):
        # In memory: SQLite's mode=memory, or its memdb VFS (the one a shared cache's name uses).
        if url.query.get("mode") == "memory" or url.query.get("vfs") == "memdb":
            return None
        database = unquote(urlsplit(database).path)
        if database in ("", ":memory:"):
            return None
    return Path(database)


def _uri_filename(url: URL) -> bool:
    """Whether the driver takes the URL's database as an SQLite URI filename: its ``uri`` option,
    read as the driver reads it (SQLAlchemy's ``asbool``: ``true``, ``yes``, ``on``, ``1`` ...)."""
    value = url.query.get("uri")
    if value is None or not isinstance(value, str):
        return False
    try:
        return bool(util.asbool(value))
    except ValueError:
        return False


def sqlite_writer(url: URL, *, busy_timeout_ms: int = 30_000) -> SqliteThread | None:
    """A writer thread with its own ``sqlite3`` connection for an SQLite file URL
    (:mod:`eventguard.sql.sqlite_thread`); None for PostgreSQL, an in-memory database (another
    connection would see another database) or a URL with query options (a URI filename, a mode:
    only the engine knows how to open those)."""
    path = sqlite_path(url)
    if path is None or url.query:
        return None
    return SqliteThread(
        path,
        busy_timeout_ms=busy_timeout_ms,
        json_serializer=_json_serializer,
        json_deserializer=_json_deserializer,
    )


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


def valid_schema(schema: object) -> str | None:
    """``schema=`` as given, if PostgreSQL can name a schema so: a ``str`` of 1 to 63 bytes of
    UTF-8 with no NUL (None: the connection's own ``search_path``). PostgreSQL cuts a longer name to
    63 bytes without a word (two schemas would meet in one), cannot take a NUL, and a lone surrogate
    cannot be sent at all (the driver failed inside its own startup)."""
    if schema is None:
        return None
    if not isinstance(schema, str):
        raise TypeError(f"schema must be a str or None, not {type(schema).__name__}")
    return _schema_name(schema)


def _schema_name(schema: str) -> str:
    """``schema`` itself, or the ValueError :func:`valid_schema` documents."""
    size = utf8_size(schema)
    if size is None or not 0 < size <= _NAME_BYTES or "\x00" in schema:
        raise ValueError(
            f"schema must be a PostgreSQL name: 1 to {_NAME_BYTES} bytes of UTF-8, no NUL, no lone "
            f"surrogate (got {len(schema)} character{'' if len(schema) == 1 else 's'})"
        )
    return schema


def search_path(schema: str) -> str:
    """``schema`` as a ``search_path`` setting: quoted where PostgreSQL would read it otherwise, as
    the offline migration script and a borrowed engine write it. Unquoted, ``Ab`` named the schema
    ``ab``, and ``a, public`` a list of two, where tables could land in ``public``."""
    return _PG_PREPARER.quote_schema(_schema_name(schema))


#: PostgreSQL's longest name, in bytes (NAMEDATALEN - 1).
_NAME_BYTES = 63
_PG_PREPARER = postgresql.dialect().identifier_preparer  # type: ignore[no-untyped-call]


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
    pre_ping: bool = True,
) -> AsyncEngine:
    """An async engine configured for eventguard's access pattern.

    SQLite: WAL (readers never block the writer), ``busy_timeout`` (wait, don't fail, when
    another process holds the write lock), foreign keys on, and ``BEGIN IMMEDIATE`` for every
    transaction, so the write lock is taken up front, where the busy handler applies, rather
    than on the first write, where a read->write upgrade fails with "database is locked".
    PostgreSQL: ``pool_pre_ping`` unless ``pre_ping`` is False (replicas outlive server restarts;
    the sink turns it off: it costs two round trips per transaction, and the sink's own
    spool-and-replay path already survives a dead connection), an optional ``schema``
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
            # A file's connections are pooled, as SQLAlchemy 2.1 does: 2.0 gives aiosqlite a
            # NullPool, so every transaction opened a connection (a thread, the pragmas) of its own.
            kwargs["poolclass"] = AsyncAdaptedQueuePool
        # sqlite3's own transaction handling is switched off below; a connection timeout
        # still matters for the initial open.
        kwargs["connect_args"] = {"timeout": busy_timeout_ms / 1000}
        # The pool's own reset (a rollback) is done by _on_reset below, only when it is needed.
        kwargs["pool_reset_on_return"] = None
        engine = create_async_engine(url, **kwargs)
        _install_sqlite_hooks(engine, busy_timeout_ms)
        return engine

    # application_name shows who holds a connection in pg_stat_activity. One in the URL (libpq's
    # spelling, ?application_name=) is a server setting to asyncpg, which refuses it as a keyword:
    # passed on as it is, every connection failed with a TypeError, taken for an outage.
    named = url.query.get("application_name")
    if named is not None:
        url = url.difference_update_query(["application_name"])
        application_name = named if isinstance(named, str) else named[-1]
    settings = {"application_name": application_name[:63]}
    if schema is not None:
        settings["search_path"] = search_path(schema)
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
    kwargs["pool_pre_ping"] = pre_ping
    return create_async_engine(url, **kwargs)


class BorrowedEngine(AsyncEngine):
    """An engine over an application's connection pool: eventguard's settings, their connections.

    Made by :func:`borrow_engine`, once per application engine and settings, and shared by every
    borrower with those settings (a sink, a store, a provider, one per test or per request): each
    engine made over a pool adds its dialect's listeners to that pool for good, so one per borrow
    made every later connection of the application's slower. It follows the application's engine to
    the new pool an ``engine.dispose()`` of theirs gives it, and disposing it does nothing: the pool
    is theirs to close, and the engine goes with theirs.

    :attr:`per_transaction` holds the server settings set at the start of each of eventguard's
    transactions (``SET LOCAL``, one round trip for all of them): the connections are the
    application's, so nothing of eventguard's may stay set on them.
    """

    #: Server setting -> value, set for each transaction of eventguard's (not the application's).
    per_transaction: Mapping[str, str]
    #: The application's engine this one borrows from (through any ``execution_options()`` copy).
    lender: AsyncEngine

    async def dispose(self, close: bool = True) -> None:
        del close  # the pool is the application's, and this engine is shared: nothing to do


def check_borrowable(engine: object) -> None:
    """Raise unless eventguard can work beside the application's ``engine`` (:func:`borrow_engine`):
    ``TypeError`` for what is not an ``AsyncEngine``; ``ValueError`` for a database or driver
    eventguard does not write through (PostgreSQL must use asyncpg: the sink's bulk path is asyncpg's
    COPY), an in-memory SQLite database (it cannot be opened twice), and a PostgreSQL engine whose
    connections are in ``AUTOCOMMIT``: eventguard's writes are transactions, and its schema and
    ``statement_timeout`` are set per transaction, so on such connections every statement committed
    alone and the tables went to the connections' own ``search_path``.
    """
    if not isinstance(engine, AsyncEngine):
        raise TypeError(f"engine= takes a SQLAlchemy AsyncEngine, not {type(engine).__name__}")
    url = engine.url
    backend, driver = url.get_backend_name(), url.get_driver_name()
    if backend == "sqlite":
        if driver != "aiosqlite":
            raise ValueError(f"an SQLite engine for eventguard must use aiosqlite, not {driver!r}")
        if sqlite_path(url) is None:
            raise ValueError(
                "an in-memory SQLite engine cannot be shared: eventguard opens its own connections to "
                "the same database file; give the application's engine a file URL"
            )
        return
    if backend != "postgresql" or driver != "asyncpg":
        raise ValueError(
            f"unsupported engine {backend}+{driver}: eventguard writes to sqlite+aiosqlite and "
            "postgresql+asyncpg"
        )
    refuse_autocommit(engine)


def refuse_autocommit(engine: AsyncEngine) -> None:
    """``ValueError`` for an engine whose connections are in ``AUTOCOMMIT`` (see
    :func:`check_borrowable`)."""
    sync = engine.sync_engine
    # create_async_engine(isolation_level=) sets it on each new connection (the dialect's
    # on-connect level); .execution_options(isolation_level=) on the engine's connections.
    levels = {
        sync.get_execution_options().get("isolation_level"),
        getattr(sync.dialect, "_on_connect_isolation_level", None),
    }
    if "AUTOCOMMIT" in levels:
        raise ValueError(
            "an AUTOCOMMIT engine cannot hold eventguard's transactions (each write is one, and the "
            "schema and statement_timeout are set per transaction): give eventguard an engine of the "
            "same pool without isolation_level='AUTOCOMMIT', or a URL"
        )


def borrow_engine(
    engine: AsyncEngine,
    *,
    schema: str | None = None,
    busy_timeout_ms: int = 30_000,
    statement_timeout: float | None = 60.0,
    idle_in_transaction_timeout: float | None = None,
) -> AsyncEngine:
    """An engine eventguard may use beside the application's own ``engine``, never closing it.

    PostgreSQL (asyncpg): a :class:`BorrowedEngine` over the application's pool, so eventguard takes
    its connections from the pool the application sized. eventguard's JSON encoding is a setting of
    its own engine (bind time), while connections keep the application's JSON decoder; ``schema``,
    ``statement_timeout`` and ``idle_in_transaction_timeout`` (seconds) are set per transaction (``SET
    LOCAL``), since the connections were opened by the application without them. A borrowed engine
    given here is taken for the application's engine it borrows from.

    SQLite: eventguard opens its own connections to the same file (SQLite connections are cheap,
    and the transaction mode eventguard needs, ``BEGIN IMMEDIATE`` with WAL, must not change the
    application's connections), so this is a new engine of eventguard's, disposed as usual. An
    in-memory database cannot be shared that way: ``ValueError``.

    Raises what :func:`check_borrowable` raises.
    """
    if isinstance(engine, BorrowedEngine):
        engine = engine.lender  # a borrower's engine, given on (SqlResponseProvider(sink.engine))
    check_borrowable(engine)  # (a copy of a borrowed engine is followed to its root below)
    url = engine.url
    if url.get_backend_name() == "sqlite":
        return create_engine(url, schema=schema, busy_timeout_ms=busy_timeout_ms)
    if schema is not None:
        valid_schema(schema)
    settings: dict[str, str] = {}
    if schema is not None:
        settings["search_path"] = search_path(schema)
    if statement_timeout is not None:
        settings["statement_timeout"] = str(max(1, int(statement_timeout * 1000)))
    if idle_in_transaction_timeout is not None:
        settings["idle_in_transaction_session_timeout"] = str(max(1, int(idle_in_transaction_timeout * 1000)))
    root = _pool_owner(engine.sync_engine)
    # Kept on the application's engine itself (not in a global): an engine of theirs that goes
    # takes its borrowed engines with it.
    made: dict[tuple[tuple[str, str], ...], BorrowedEngine] = root.__dict__.setdefault(_BORROWED, {})
    key = tuple(settings.items())
    borrowed = made.get(key)
    if borrowed is None:
        borrowed = made[key] = _borrowed(engine, root, settings)
    return borrowed


#: The attribute of an application's (sync) engine holding the engines borrowed from it, by settings.
_BORROWED = "_eventguard_borrowed"


#: The attribute of a borrowed engine's sync engine naming the application's engine it borrows from.
_ROOT = "_eventguard_root"


def _pool_owner(sync: Any) -> Any:
    """The application's engine whose pool ``sync`` uses: itself; the engine an
    ``execution_options()`` copy proxies (its ``dispose()`` replaces the pool, and says so on that
    engine); the engine a borrowed engine borrows from, however it was copied (``store.reader``)."""
    while True:
        root = sync.__dict__.get(_ROOT)
        if root is not None:
            return root
        proxied = getattr(sync, "_proxied", None)
        if proxied is None:
            return sync
        sync = proxied


def is_borrowed(engine: AsyncEngine) -> bool:
    """Whether ``engine`` (or the engine it copies) uses an application's pool, not one of its own."""
    return _pool_owner(engine.sync_engine) is not _own_pool_owner(engine.sync_engine)


def _own_pool_owner(sync: Any) -> Any:
    while (proxied := getattr(sync, "_proxied", None)) is not None:
        sync = proxied
    return sync


def let_go(engine: AsyncEngine) -> None:
    """Drop ``engine``'s pool without closing its connections (they belong to an event loop that
    is gone): the engine takes a new pool of its own. Never a borrowed engine's: that pool is the
    application's, and the engine is shared by every borrower of its settings (moved onto a pool
    of its own, all of them left the application's pool and its size)."""
    if not is_borrowed(engine):
        engine.sync_engine.dispose(close=False)


def _borrowed(lender: AsyncEngine, root: Any, settings: dict[str, str]) -> BorrowedEngine:
    ours = create_async_engine(
        lender.url,
        pool=root.pool,
        json_serializer=_json_serializer,
        # The codec is installed on the pool's connections: keep the application's decoder.
        json_deserializer=lender.dialect._json_deserializer,
    )
    ours.sync_engine.__dict__[_ROOT] = root
    borrowed = BorrowedEngine(ours.sync_engine)
    borrowed.per_transaction = MappingProxyType(dict(settings))
    borrowed.lender = lender
    if settings:
        # All of them in one round trip (set_config(..., true) is SET LOCAL), names and values as
        # parameters.
        calls = ", ".join(f"set_config(${2 * i + 1}, ${2 * i + 2}, true)" for i in range(len(settings)))
        statement = f"SELECT {calls}"
        values = tuple(part for pair in settings.items() for part in pair)

        @event.listens_for(borrowed.sync_engine, "begin")
        def _per_transaction(conn: Any) -> None:
            conn.exec_driver_sql(statement, values)

    # When the application disposes of its engine, it gets a new pool: the borrowed engine takes
    # that one too. Kept on the old pool, eventguard's connections were outside the application's
    # pool and its size, and nothing closed them. (Held weakly: the application's engine holds the
    # borrowed one already, see borrow_engine.)
    sync = weakref.ref(borrowed.sync_engine)

    def follow(engine: Any) -> None:
        following = sync()
        if following is not None:
            following.pool = engine.pool

    event.listen(root, "engine_disposed", follow)
    return borrowed


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

    @event.listens_for(engine.sync_engine, "reset")
    def _on_reset(dbapi_connection: Any, record: Any, state: Any) -> None:
        # The pool's rollback-on-return, skipped when SQLite says no transaction is open: after
        # every commit (SQLAlchemy resets a connection returned from ``begin()`` all the same),
        # that is one more hop to the driver's thread for nothing. Not from the garbage collector
        # (``asyncio_safe`` False): no I/O there, as the pool's own reset does none.
        if not state.asyncio_safe:
            return
        driver = record.driver_connection
        unsure = record.info.pop(_BEGIN_UNFINISHED, False)
        if isinstance(driver, aiosqlite.Connection) and not driver.in_transaction and not unsure:
            return
        dbapi_connection.rollback()

    @event.listens_for(engine.sync_engine, "invalidate")
    def _on_invalidate(_dbapi_connection: Any, record: Any, _exception: Any) -> None:
        # SQLAlchemy closes an invalidated connection next (a task cancelled in the middle of a
        # statement, say). A statement left unfinished on it (an UPDATE ... RETURNING whose rows were
        # not fetched) keeps sqlite3's close from happening: the connection lingers, its transaction
        # and the file's write lock with it, for as long as anything holds the cursor. Every other
        # writer then waited out its busy timeout ("database is locked"). Rolled back first, on the
        # driver's thread, behind what still runs there: the unfinished statement is aborted with it.
        driver = record.driver_connection
        if not isinstance(driver, aiosqlite.Connection) or not in_greenlet():
            return  # (from the garbage collector: no I/O there)
        with contextlib.suppress(Exception):  # a connection already gone has nothing to release
            _await(driver.rollback())

    @event.listens_for(engine.sync_engine, "begin")
    def _on_begin(conn: Any) -> None:
        mode = conn.get_execution_options().get(SQLITE_BEGIN_OPTION, "IMMEDIATE")
        if mode not in ("IMMEDIATE", "DEFERRED"):
            raise ValueError(f"unknown SQLite BEGIN mode {mode!r}")
        sql = f"BEGIN {mode}"
        driver = conn.connection.driver_connection
        if not isinstance(driver, aiosqlite.Connection):  # pragma: no cover - another driver
            conn.exec_driver_sql(sql)
            return
        # Straight to aiosqlite: one hop to the driver's thread instead of three (SQLAlchemy's
        # cursor: open, execute, close). Every transaction begins here, and under load each hop
        # waits for the GIL and a turn of the event loop. Errors are wrapped as SQLAlchemy's
        # (as exec_driver_sql would), so a locked database still reads as an outage.
        try:
            _await(driver.execute(sql))
        except sqlite3.Error as exc:
            raise DBAPIError.instance(sql, None, exc, sqlite3.Error) from exc
        except BaseException:
            # Cancelled (or interrupted) while the BEGIN was queued or waiting for the lock on the
            # driver's thread: it still runs there, after this connection is handed back, so "no
            # transaction" at the reset is not to be believed. Rolled back then, queued behind it.
            conn.connection.info[_BEGIN_UNFINISHED] = True
            raise
