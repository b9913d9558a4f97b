"""SqlSink: records guarded streams in SQLite or PostgreSQL through one writer task.

One writer task per sink (not per stream): it batches every stream's pending work into one
transaction per cycle, which is what SQLite wants (a single writer path) and cheap for
PostgreSQL. The guard's hot path only appends references; the writer serialises and writes.
When the database is away, batches go to the spool and the stream never notices.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, TypeAlias

from sqlalchemy import inspect
from sqlalchemy.engine import URL
from sqlalchemy.exc import DataError, IntegrityError, ProgrammingError, SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncEngine

from eventguard import _db
from eventguard.lifecycle import Lifecycle
from eventguard.sink import migrate as _migrate
from eventguard.sink.batch import Batch
from eventguard.sink.errors import SchemaMismatchError, StorageError
from eventguard.sink.filter import EventFilter, EventMode, EventPredicate
from eventguard.sink.recorder import SqlRecorder
from eventguard.sink.serialise import Redactor
from eventguard.sink.spool import Spool
from eventguard.sink.tables import responses
from eventguard.sink.writer import Refusal, write

log = logging.getLogger("eventguard.sink")

#: What happens when ``max_buffered`` events wait for the writer: "spool" writes the oldest
#: buffered events to the spool file right away (synchronously, bounded memory; replay loads
#: them). Blocking is not offered: ``Recorder.event`` is synchronous and cannot wait.
FullPolicy: TypeAlias = Literal["spool"]

# Errors that mean "the database is not there right now", as opposed to "this data is wrong".
_DATA_ERRORS = (IntegrityError, DataError, ProgrammingError)
_UNAVAILABLE = (SQLAlchemyError, OSError, TimeoutError, ConnectionError)

# The writer serialises events on the event loop it shares with the streams: in steps of at
# most _STEP_FLOOR seconds, or _STEP_SHARE of the time the other tasks took meanwhile, checking
# the clock every _ENCODE_CHUNK events (a few microseconds of work).
_STEP_FLOOR = 25e-6
_STEP_SHARE = 0.5
_ENCODE_CHUNK = 8


@dataclass(slots=True)
class SinkStats:
    batches_written: int = 0
    events_written: int = 0
    batches_spooled: int = 0
    overflows: int = 0
    refusals: list[Refusal] = field(default_factory=list)
    last_error: str | None = None


@dataclass(frozen=True, slots=True)
class ReplayResult:
    files: int
    batches: int
    events: int
    bad_lines: int
    refusals: tuple[Refusal, ...]


class SqlSink:
    """Persists what the guard verified. Pass it as ``guard(..., sink=sink)``.

    ``url``: an SQLAlchemy URL; default ``EVENTGUARD_DATABASE_URL``, else ``./eventguard.db``.
    ``events``: "all" | "finished" | "lifecycle"; ``predicate`` refines it. ``redact`` rewrites a
    payload before it is stored. Flushes happen on lifecycle changes, every ``flush_every``
    buffered events, and every ``flush_interval`` seconds. ``max_buffered`` bounds the events
    waiting for the writer (a reference each, ~100 bytes, plus the event it keeps alive): it must
    cover what the streams forward during one write cycle, which under a thousand concurrent
    streams spans many turns of the event loop (the default holds 1,000 x 100-event streams
    started at once on a 2-core machine, with room to spare). ``auto_migrate``: None (default)
    creates the schema in an empty database but never upgrades an existing one.
    """

    def __init__(
        self,
        url: str | URL | None = None,
        *,
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
        self.url = _db.resolve_url(url)
        self.schema = schema
        self.filter = EventFilter(events, predicate)
        self.redact = redact
        self.flush_every = max(1, flush_every)
        self.flush_interval = flush_interval
        self.max_buffered = max_buffered
        self.max_payload_bytes = max_payload_bytes
        self.close_timeout = close_timeout
        self.auto_migrate = auto_migrate
        self.owner = owner or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.spool = Spool(Path(spool_path) if spool_path is not None else self._default_spool())
        self.stats = SinkStats()
        self._busy_timeout = busy_timeout
        self._statement_timeout = statement_timeout
        self._connect_timeout = connect_timeout
        self._pooler_safe = pooler_safe
        self._engine: AsyncEngine | None = None
        self._task: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()
        self._write_lock = asyncio.Lock()
        self._work: list[SqlRecorder] = []
        self._buffered = 0
        self._ready = False
        self._stopping = False
        self._closed = False
        self._outage: str | None = None
        self._retry_at = 0.0
        self._backoff = 0.5

    def _default_spool(self) -> Path:
        path = _db.sqlite_path(self.url)
        if path is not None:
            return path.with_name(path.name + ".spool.jsonl")
        return Path.cwd() / "eventguard-spool.jsonl"

    def __repr__(self) -> str:
        return f"SqlSink({_db.safe_url(self.url)!r})"

    # -- lifecycle of the sink ----------------------------------------------------------------
    @property
    def engine(self) -> AsyncEngine:
        if self._engine is None:
            self._engine = _db.create_engine(
                self.url,
                schema=self.schema,
                busy_timeout_ms=int(self._busy_timeout * 1000),
                pooler_safe=self._pooler_safe,
                connect_timeout=self._connect_timeout,
                statement_timeout=self._statement_timeout,
                application_name=f"eventguard {self.owner}",
            )
        return self._engine

    async def start(self) -> None:
        """Connect, check (or create) the schema and start the writer: fails fast.

        Raises :class:`SchemaMismatchError` naming the command to run when the schema is
        behind or ahead. Without ``start()``, the first ``recorder()`` starts the writer and a
        problem is logged once while batches go to the spool.
        """
        await self._prepare()
        self._ensure_writer()

    async def __aenter__(self) -> SqlSink:
        await self.start()
        return self

    async def __aexit__(self, *_exc: object) -> None:
        await self.aclose()

    async def migrate(self, revision: str = "head") -> None:
        """Upgrade the database schema (what ``eventguard db upgrade`` runs)."""
        await _migrate.upgrade(self.engine, revision)

    async def downgrade(self, revision: str) -> None:
        await _migrate.downgrade(self.engine, revision)

    async def flush(self) -> None:
        """Write everything buffered so far (or spool it) before returning."""
        recorders = list(self._work)
        self._work.clear()
        for rec in recorders:
            rec.queued = False
        await self._cycle(recorders)

    async def aclose(self) -> None:
        """Final flush of every stream, stop the writer, release connections."""
        if self._closed:
            return
        self._stopping = True
        self._wake.set()
        if self._task is not None:
            try:
                await self._task
            finally:
                self._task = None
        await self.flush()
        self._closed = True
        if self._engine is not None:
            await self._engine.dispose()

    # -- the Sink protocol --------------------------------------------------------------------
    def recorder(self, lifecycle: Lifecycle) -> SqlRecorder:
        if self._closed:
            raise RuntimeError(f"{self!r} is closed")
        self._ensure_writer()
        rec = SqlRecorder(self, lifecycle)
        self._enqueue(rec)
        return rec

    # -- called by recorders (hot path: no awaits, no I/O) -------------------------------------
    def _enqueue(self, rec: SqlRecorder) -> None:
        if not rec.queued:
            rec.queued = True
            self._work.append(rec)

    def _note_event(self, rec: SqlRecorder) -> None:
        self._enqueue(rec)
        self._buffered += 1
        if self._buffered >= self.flush_every:
            self._wake.set()
            if self._buffered >= self.max_buffered:
                self._overflow()

    def _note_change(self, rec: SqlRecorder) -> None:
        self._enqueue(rec)
        self._wake.set()

    def _note_close(self, rec: SqlRecorder) -> None:
        self._enqueue(rec)
        self._wake.set()
        if self._task is None or self._task.done():
            # No writer (the sink was closed, or the loop that ran it is gone): keep it locally.
            self._spool_now(rec, "the sink's writer is not running")

    def _overflow(self) -> None:
        # The writer is behind by max_buffered events: move what waits to the spool now rather
        # than grow without bound. Rare and documented; replay restores it.
        self.stats.overflows += 1
        if self.stats.overflows == 1:
            log.warning(
                "eventguard sink: %d events buffered; spilling to %s", self._buffered, self.spool.path
            )
        batches = [b for rec in self._work if (b := rec.collect()) is not None]
        self._buffered = sum(len(rec.pending) for rec in self._work)
        self._to_spool(batches, None)

    def writing(self) -> bool:
        """Whether the writer task is alive: it will store, or spool, what it was given."""
        return self._task is not None and not self._task.done()

    def _spool_now(self, rec: SqlRecorder, why: str) -> None:
        batch = rec.collect()
        batches = [*rec.inflight, *([batch] if batch is not None else [])]
        if batches:
            log.warning("eventguard sink: %s; %d batches kept in %s", why, len(batches), self.spool.path)
            self._to_spool(batches, None)
        rec.finished()

    # -- the writer ------------------------------------------------------------------------------
    def _ensure_writer(self) -> None:
        if self._task is None or self._task.done():
            self._stopping = False
            self._task = asyncio.get_running_loop().create_task(
                self._run(), name=f"eventguard-writer {self!r}"
            )

    async def _run(self) -> None:
        while True:
            if not self._stopping:
                timeout = self.flush_interval if self._work else None
                try:
                    async with asyncio.timeout(timeout):
                        await self._wake.wait()
                except TimeoutError:
                    pass
            self._wake.clear()
            recorders = self._work
            self._work = []
            for rec in recorders:
                rec.queued = False
            if recorders:
                await self._cycle(recorders)
            if self._stopping:
                return  # aclose() does the last flush itself

    async def _cycle(self, recorders: Sequence[SqlRecorder]) -> None:
        batches: list[Batch] = []
        for rec in recorders:
            batch = rec.collect()
            if batch is not None:
                rec.inflight.append(batch)
                batches.append(batch)
            if rec.pending and rec.response_id() is None:
                self._enqueue(rec)  # no id yet: keep buffering until the host names it
        self._buffered = sum(len(rec.pending) for rec in self._work)
        try:
            if batches:
                await self._persist(batches)
        finally:
            for rec in recorders:
                rec.inflight.clear()
                if rec.closing and not rec.has_work():
                    rec.finished()

    async def _persist(self, batches: list[Batch]) -> None:
        async with self._write_lock:
            if time.monotonic() < self._retry_at:
                self._to_spool(batches, None)
                return
            await self._serialise(batches)
            try:
                if not self._ready:
                    await self._prepare()
                refusals = await self._write(batches)
            except _DATA_ERRORS as exc:
                await self._write_one_by_one(batches, exc)
                return
            except (*_UNAVAILABLE, StorageError) as exc:
                self._to_spool(batches, exc)
                return
            except Exception as exc:  # a bug must not kill the writer nor lose the data
                log.exception("eventguard sink: unexpected error while writing; spooling")
                self._to_spool(batches, exc)
                return
            self._recovered()
            self._report(refusals)

    async def _serialise(self, batches: Sequence[Batch]) -> None:
        """Serialise the batches' events a little at a time, yielding the loop in between.

        Each step takes at most ``max(_STEP_FLOOR, _STEP_SHARE x the time the other tasks
        took since the last step)``: next to one stream, a step stays far below the latency the
        sink may add to it; next to a thousand, the writer still keeps pace with them all.
        """
        clock = time.perf_counter
        started = clock()
        budget = _STEP_FLOOR
        for batch in batches:
            rec = batch.source
            if rec is None:
                continue
            while rec.encode_some(batch, _ENCODE_CHUNK):
                now = clock()
                if now - started >= budget:
                    await asyncio.sleep(0)
                    started = clock()
                    budget = max(_STEP_FLOOR, (started - now) * _STEP_SHARE)

    async def _write(self, batches: Sequence[Batch]) -> list[Refusal]:
        for batch in batches:
            batch.serialise()  # no-op unless the caller skipped _serialise
        async with self.engine.begin() as conn:
            refusals = await write(conn, batches)
        self.stats.batches_written += len(batches)
        self.stats.events_written += sum(len(b.events) for b in batches)
        return refusals

    async def _write_one_by_one(self, batches: list[Batch], first: Exception) -> None:
        # One bad batch must not take the others with it: isolate it, keep it in the spool.
        log.error("eventguard sink: a batch was rejected (%s); retrying one by one", _reason(first))
        for batch in batches:
            try:
                self._report(await self._write([batch]))
            except Exception as exc:
                self._to_spool([batch], exc)

    def _report(self, refusals: list[Refusal]) -> None:
        for refusal in refusals:
            self.stats.refusals.append(refusal)
            log.warning("eventguard sink: response %s: %s", refusal.response_id, refusal.reason)

    def _to_spool(self, batches: list[Batch], exc: BaseException | None) -> None:
        if exc is not None:
            reason = _reason(exc)
            self.stats.last_error = reason
            self._ready = False  # look at the schema again before the next write
            self._retry_at = time.monotonic() + self._backoff
            self._backoff = min(self._backoff * 2, 30.0)
            if self._outage is None:
                # Once per outage, with the reason; the URL without its password.
                self._outage = reason
                log.error(
                    "eventguard sink: cannot write to %s (%s); spooling to %s until it is back",
                    _db.safe_url(self.url),
                    reason,
                    self.spool.path,
                )
        if not batches:
            return
        try:
            self.stats.batches_spooled += self.spool.append(batches)
        except OSError:
            log.exception(
                "eventguard sink: the spool %s is not writable either; %d batches lost",
                self.spool.path,
                len(batches),
            )

    def _recovered(self) -> None:
        self._backoff = 0.5
        if self._outage is not None:
            log.warning(
                "eventguard sink: %s is back; run `await sink.replay_spool()` to load %s",
                _db.safe_url(self.url),
                self.spool.path,
            )
            self._outage = None

    async def _prepare(self) -> None:
        """Check the schema, creating it first in an empty database when allowed."""
        try:
            await _migrate.check(self.engine)
        except SchemaMismatchError as exc:
            if not exc.current and self.auto_migrate is not False and not await self._has_tables():
                try:
                    await _migrate.upgrade(self.engine)
                except SQLAlchemyError:
                    # Another replica may have created it at the same moment: look again.
                    await _migrate.check(self.engine)
            elif exc.current and self.auto_migrate is True:
                await _migrate.upgrade(self.engine)
            else:
                raise
        self._ready = True

    async def _has_tables(self) -> bool:
        async with self.engine.connect() as conn:
            return await conn.run_sync(lambda c: inspect(c).has_table(responses.name))

    # -- the spool ---------------------------------------------------------------------------------
    async def replay_spool(self) -> ReplayResult:
        """Load the spool into the database, idempotently; each file is removed once loaded.

        Raises the database error if it is still away (the spool stays for the next try).
        """
        files = batches = events = bad = 0
        refusals: list[Refusal] = []
        async with self._write_lock:
            if not self._ready:
                await self._prepare()
            for spooled in self.spool.take():
                for start in range(0, len(spooled.batches), 200):
                    chunk = spooled.batches[start : start + 200]
                    refusals.extend(await self._write(chunk))
                files += 1
                batches += len(spooled.batches)
                events += sum(b.event_count() for b in spooled.batches)
                bad += spooled.bad_lines
                self.spool.done(spooled)
            self._recovered()
        self._report(refusals)
        return ReplayResult(files, batches, events, bad, tuple(refusals))


def _reason(exc: BaseException) -> str:
    # The driver's own message, not SQLAlchemy's (which appends the statement and parameters).
    orig = getattr(exc, "orig", None)
    text = str(orig if orig is not None else exc) or type(exc).__name__
    return f"{type(orig if orig is not None else exc).__name__}: {text[:300]}"
