"""SqlSink: records guarded streams in SQLite or PostgreSQL; what a user builds and closes.

The sink is a small front: it takes the options, and hands the work to its writer
(:mod:`eventguard.sink.writer`: one task per event loop that batches every stream's work into
one transaction per cycle, the spool during an outage, the quarantine for what the database
refuses), whose replay of the spool is :mod:`eventguard.sink.replay`. Its recorders
(:class:`~eventguard.sink.recorder.SqlRecorder`) talk to the writer directly: the hot path is
one append and one call.

**Event loops.** A sink used from several loops one after the other (a module-level sink, two
``asyncio.run()`` calls, function-scoped test loops) keeps one writer, engine and set of
primitives per loop (:mod:`eventguard.sink.loops`). Two loops running at the same time in two
threads cannot share a sink: the second gets :class:`~eventguard.errors.SinkLoopError`.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import socket
import uuid
from pathlib import Path
from typing import Literal, TypeAlias

from sqlalchemy.engine import URL
from sqlalchemy.ext.asyncio import AsyncEngine

from eventguard import _arguments as arguments
from eventguard import telemetry
from eventguard.errors import BadSpoolPath
from eventguard.lifecycle import Lifecycle
from eventguard.sink import quarantine
from eventguard.sink.filter import EventFilter, EventMode, EventPredicate
from eventguard.sink.recorder import SqlRecorder
from eventguard.sink.replay import ReplayResult
from eventguard.sink.report import SinkStats
from eventguard.sink.serialise import Redactor
from eventguard.sink.spool import Spool
from eventguard.sink.writer import Writer, WriterConfig
from eventguard.sql import engine as _db
from eventguard.sql import migrate as _migrate
from eventguard.sql.classify import outages_as_unavailable

__all__ = ["FullPolicy", "SqlSink"]

log = logging.getLogger("eventguard.sink")

#: The default spool of every database but an SQLite file, before it was one file per target.
_LEGACY_SPOOL = "eventguard-spool.jsonl"


def _target(url: URL, schema: str | None) -> str:
    """12 hex digits naming a database and schema: its backend, host, port (PostgreSQL's 5432 when
    none is given) and database, and the schema. Not the driver, the user, the password or the
    options (``sslmode``): ``eventguard spool replay`` run as another role reaches the same data."""
    port = url.port if url.port is not None else (5432 if url.get_backend_name() == "postgresql" else None)
    bare = URL.create(url.get_backend_name(), None, None, url.host, port, url.database)
    where = bare.render_as_string(hide_password=False)
    return hashlib.sha256(f"{where}#{schema or ''}".encode("utf-8", "surrogatepass")).hexdigest()[:12]


def _names_its_database(url: URL) -> bool:
    """Whether ``url`` says where it connects: a host or a database, in its body or its query
    (``?host=/run/postgresql``)."""
    return bool(url.host or url.database or url.query.get("host") or url.query.get("dbname"))


#: What happens when ``max_buffered`` events wait for the writer: "spool" writes the oldest
#: buffered events to the spool file right away (synchronously, bounded memory; replay loads
#: them). Blocking is not offered: ``Recorder.event`` is synchronous and cannot wait.
FullPolicy: TypeAlias = Literal["spool"]


class SqlSink:
    """Persists what the guard verified. Pass it as ``guard(..., sink=sink)``.

    :param url: an SQLAlchemy URL (``sqlite:///x.db``, ``postgresql://...``; plain driver names are
        upgraded to aiosqlite and asyncpg); default ``EVENTGUARD_DATABASE_URL``, else
        ``./eventguard.db``. Not with ``engine``. One with a control or invisible character, or a
        password with an unencoded ``@``, raises ``ValueError`` (saying which, quoting no secret).
    :param engine: the application's own ``AsyncEngine`` instead of a URL: on PostgreSQL (asyncpg)
        the sink takes its connections from that engine's pool, on SQLite it opens its own to the
        same file (see :func:`eventguard.sql.engine.borrow_engine`); either way it never closes or
        disposes what the application made. It is used on the event loop its pool belongs to.
    :param schema: PostgreSQL only: the schema the tables live in (a ``search_path``).
    :param events: which events are stored: ``"all"``, ``"finished"`` (those of responses that
        ended) or ``"lifecycle"`` (only the lifecycle events); ``predicate`` refines it.
    :param predicate: ``(event_type, event) -> bool``: store only events it accepts. A plain
        function (not ``async``); if it raises, the event is kept and the error counted
        (``stats.unexpected_errors``) and logged: the stream goes on.
    :param redact: rewrites a payload (a JSON-able value) before it is stored; a plain function (not
        ``async``). If it raises on an event, the event goes to the quarantine as what identifies
        it (attempt, index, type) and the error's type, never its content or the error's message,
        and is missing from the history; on an anomaly's payload, the anomaly is stored without
        one and a ``not_serialisable`` anomaly says why.
    :param flush_every: a flush after this many buffered events (flushes also happen when a
        response ends or closes, and every ``flush_interval`` seconds).
    :param flush_interval: seconds between flushes of a stream that is forwarding events; a
        lifecycle change that does not end the response is written within it too (so a short
        response's creation, events and end share one transaction).
    :param max_buffered: the events waiting for the writer, at most (a reference each, ~100 bytes,
        plus the event it keeps alive); past it, ``on_full`` applies. It must cover what the streams
        forward during one write cycle: the default holds 1,000 x 100-event streams started at
        once on a 2-core machine, with room to spare.
    :param on_full: ``"spool"``: the oldest buffered events go to the spool file at once
        (synchronously, bounded memory; the replay loads them). Blocking is not offered:
        ``Recorder.event`` is synchronous and cannot wait.
    :param max_payload_bytes: a payload larger than this is stored cut, with an anomaly.
    :param spool_path: the spool file (batches the database did not take, replayed later); default
        beside the SQLite file, else ``./eventguard-spool-<target>.jsonl``, ``<target>`` 12 hex
        digits of the SHA-256 of the database (backend, host, port, name) and schema. A
        path that cannot be the spool (a file that is not one, the database's own) raises
        :class:`~eventguard.errors.BadSpoolPath`.
    :param close_timeout: seconds a guard's final flush may take before it goes on in the
        background (its batch is spooled if the database does not take it by then).
    :param busy_timeout: SQLite: seconds to wait for another process's write lock.
    :param statement_timeout: PostgreSQL: seconds a statement may run before it fails (and its
        batch is spooled); ``None`` for no limit.
    :param connect_timeout: PostgreSQL: seconds to open a connection.
    :param pooler_safe: PostgreSQL behind a transaction-mode pooler (PgBouncer): no prepared
        statement caches.
    :param auto_migrate: ``None`` (default) creates the schema in an empty database but never
        upgrades an existing one; ``True`` upgrades it to this release's head; ``False`` never
        touches the schema (a mismatch is a :class:`~eventguard.errors.SchemaMismatchError`).
    :param owner: this sink's name in the rows it writes (the ``owner`` column); default
        ``host:pid:random``.

    The options are read once, here: the writer keeps them. Each is checked here too: a wrong type
    is a ``TypeError`` and a value out of range (a negative or ``nan`` duration, a count below 1) a
    ``ValueError``, each naming the argument.
    """

    def __init__(
        self,
        url: str | URL | None = None,
        *,
        engine: AsyncEngine | None = None,
        schema: str | None = None,
        events: EventMode = "all",
        predicate: EventPredicate | None = None,
        redact: Redactor | None = None,
        flush_every: int = 500,
        flush_interval: float = 0.05,
        max_buffered: int = 200_000,
        on_full: FullPolicy = "spool",
        max_payload_bytes: int = 1 << 20,
        spool_path: str | os.PathLike[str] | None = None,
        close_timeout: float = 5.0,
        busy_timeout: float = 30.0,
        statement_timeout: float | None = 60.0,
        connect_timeout: float = 10.0,
        pooler_safe: bool = False,
        auto_migrate: bool | None = None,
        owner: str | None = None,
    ) -> None:
        if on_full != "spool":
            raise ValueError("on_full must be 'spool'")
        # Each setting checked here, naming it: wrong, it would fail later inside a stream.
        flush_every = arguments.count("flush_every", flush_every)
        flush_interval = arguments.seconds("flush_interval", flush_interval)
        max_buffered = arguments.count("max_buffered", max_buffered)
        max_payload_bytes = arguments.count("max_payload_bytes", max_payload_bytes)
        close_timeout = arguments.seconds("close_timeout", close_timeout, zero=False)
        busy_timeout = arguments.seconds("busy_timeout", busy_timeout)
        statement_timeout = arguments.seconds("statement_timeout", statement_timeout, zero=False, none=True)
        connect_timeout = arguments.seconds("connect_timeout", connect_timeout, zero=False)
        pooler_safe = arguments.flag("pooler_safe", pooler_safe)
        auto_migrate = arguments.flag("auto_migrate", auto_migrate, none=True)
        _db.valid_schema(schema)
        arguments.text("owner", owner)
        arguments.callable_or_none("predicate", predicate)
        arguments.callable_or_none("redact", redact)
        if engine is not None:
            if url is not None:
                raise ValueError("give SqlSink a url or an engine, not both")
            _db.check_borrowable(engine)  # here, not at the first write: that would spool for ever
            url = engine.url
        self.url = _db.resolve_url(url)
        _db.require_driver(self.url)
        self.schema = schema
        self.filter = EventFilter(events, predicate)
        self.redact = redact
        self.flush_every = flush_every
        self.flush_interval = flush_interval
        self.max_buffered = max_buffered
        self.max_payload_bytes = max_payload_bytes
        self.close_timeout = close_timeout
        self.auto_migrate = auto_migrate
        self.owner = owner or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.stats = SinkStats()
        config = WriterConfig(
            url=self.url,
            schema=schema,
            filter=self.filter,
            redact=redact,
            owner=self.owner,
            flush_every=self.flush_every,
            flush_interval=flush_interval,
            max_buffered=max_buffered,
            max_payload_bytes=max_payload_bytes,
            close_timeout=close_timeout,
            auto_migrate=auto_migrate,
            busy_timeout=busy_timeout,
            statement_timeout=statement_timeout,
            connect_timeout=connect_timeout,
            pooler_safe=pooler_safe,
            borrowed=engine,
        )
        self._borrowed = engine is not None
        spool = Spool(self._spool_path(spool_path))
        #: The writer: the recorders' sink, one task per event loop, the spool's replay.
        self.writer = Writer(config, spool, self.stats)
        telemetry.watch_sink(self)  # its metrics, when OpenTelemetry is installed

    def _spool_path(self, given: str | os.PathLike[str] | None) -> Path:
        """The spool file: ``given``, else beside the SQLite file, else in the working directory.
        Never the SQLite database's own files, even empty (a ``-wal`` after a checkpoint): taken as
        the spool, the replay would set it aside and remove it."""
        if given is None:
            return self._default_spool()
        path = Path(given)
        database = _db.sqlite_path(self.url)
        if database is not None and "\0" not in str(path):  # (a NUL: the Spool refuses it by name)
            mine = os.path.realpath(path)
            for suffix in ("", "-wal", "-shm", "-journal"):
                if mine == os.path.realpath(database.with_name(database.name + suffix)):
                    raise BadSpoolPath(
                        f"spool_path {str(path)!r} is not a spool file: it is the database's own file"
                    )
        return path

    def _default_spool(self) -> Path:
        path = _db.sqlite_path(self.url)
        if path is not None:
            return path.with_name(path.name + ".spool.jsonl")
        if self._borrowed and not _names_its_database(self.url):
            # An engine that connects by its own creator (a token-authenticated application) may
            # have the URL postgresql+asyncpg://: a default named after it would be one file for
            # every such application here, each replaying the others' batches into its database.
            # (A URL given as one keeps its default: its database comes from PGHOST, PGDATABASE.)
            raise ValueError(
                f"the database URL {_db.safe_url(self.url)!r} names no host and no database, so the "
                "default spool cannot tell this database from another: give spool_path= (a file of "
                "this application's; GuardedResponses(spool_path=) with database=)"
            )
        # One file per database and schema: a spool entry does not say where it was going, and two
        # sinks started in one directory (two apps, two schemas) replayed each other's batches.
        spool = Path.cwd() / f"eventguard-spool-{_target(self.url, self.schema)}.jsonl"
        legacy = Path.cwd() / _LEGACY_SPOOL
        left = False
        with contextlib.suppress(OSError):  # unreadable: nothing to say about it
            left = legacy.is_file() and legacy.stat().st_size > 0
        if left:
            log.warning(
                "eventguard sink: %s is the spool of an earlier eventguard (one file for every "
                "database); it is not replayed from there: run 'eventguard spool replay --spool %s' "
                "with the database its batches were for",
                legacy,
                legacy,
            )
        return spool

    def __repr__(self) -> str:
        return f"SqlSink({_db.safe_url(self.url)!r})"

    @property
    def spool(self) -> Spool:
        """The local spool: batches the database did not take, until replayed."""
        return self.writer.spool

    @spool.setter
    def spool(self, spool: Spool) -> None:
        self.writer.spool = spool

    @property
    def engine(self) -> AsyncEngine:
        """The current event loop's engine (each loop has its own: a pool is bound to its loop)."""
        return self.writer.engine

    @property
    def buffered(self) -> int:
        """Events recorded and not yet taken by the writer: its queue depth (at most ``max_buffered``)."""
        return self.writer.buffered

    @property
    def ready(self) -> bool:
        """``start()`` (or a first write) checked the schema: the sink writes to the database."""
        return self.writer.ready

    @property
    def closed(self) -> bool:
        """``aclose()`` ran: every stream was flushed and the connections released."""
        return self.writer.closed

    @property
    def quarantine_path(self) -> Path:
        """Where quarantine records go when the quarantine table cannot be written."""
        return quarantine.file_path(self.spool.path)

    # -- lifecycle of the sink ----------------------------------------------------------------
    async def start(self) -> None:
        """Connect, check (or create) the schema and start the writer: fails fast.

        Raises :class:`~eventguard.errors.SchemaMismatchError` naming the command to run when the schema is
        behind or ahead. Without ``start()``, the first ``recorder()`` starts the writer and a
        problem is logged once while batches go to the spool. A spool left from before is
        replayed in the background, beside the new writes. A sink that was closed (``aclose()``)
        opens again: an application whose lifespan runs twice uses one sink for both. A database
        that cannot be reached is a :class:`~eventguard.DatabaseUnavailableError`.
        """
        with outages_as_unavailable(self.url):
            await self.writer.start()

    async def __aenter__(self) -> SqlSink:
        await self.start()
        return self

    async def __aexit__(self, *_exc: object) -> None:
        await self.aclose()

    async def migrate(self, revision: str = "head") -> None:
        """Upgrade the database schema (what ``eventguard db upgrade`` runs) to ``revision``."""
        await _migrate.upgrade(self.engine, revision)

    async def downgrade(self, revision: str) -> None:
        """Downgrade the database schema to ``revision`` (what ``eventguard db downgrade`` runs)."""
        await _migrate.downgrade(self.engine, revision)

    async def flush(self) -> None:
        """Write everything buffered so far (or spool, or quarantine it) before returning."""
        await self.writer.flush()

    async def aclose(self) -> None:
        """Final flush of every stream, stop the writer, release connections.

        Never raises for content or database trouble (that is logged, and kept in the spool or
        the quarantine); cancellation propagates.
        """
        await self.writer.close()

    async def replay_spool(self) -> ReplayResult:
        """Load the spool into the database, idempotently; each file is removed once loaded.

        Joins a replay the sink runs in the background (its counts are included), then loads
        what is left. A batch the database refuses, and an entry that cannot be read, go to the
        quarantine (``quarantined``; unreadable entries are also ``bad_lines``). Raises the
        database error if it is still away (the spool stays for the next try).
        """
        return await self.writer.replay_spool()

    def writing(self) -> bool:
        """Whether the current loop's writer task is alive: it will store, or keep, what it was given."""
        return self.writer.writing()

    # -- the Sink protocol --------------------------------------------------------------------
    def recorder(self, lifecycle: Lifecycle) -> SqlRecorder:
        """A recorder for one guarded stream of ``lifecycle`` (the ``Sink`` protocol)."""
        if not isinstance(lifecycle, Lifecycle):  # else the writer task fails on it, in the background
            raise TypeError(f"lifecycle must be a Lifecycle, not {type(lifecycle).__name__}")
        return self.writer.recorder(lifecycle)
