"""SqlSink: records guarded streams in SQLite or PostgreSQL through one writer task per event loop.

One writer task (not one per stream): it batches every stream's pending work into one
transaction per cycle, which is what SQLite wants (a single writer path) and cheap for
PostgreSQL. The guard's hot path only appends references; the writer serialises and writes.

What the writer does with a failed write depends on what the error means
(:mod:`eventguard.sql.classify`):

- **The database is away** (unreachable, locked, out of disk, a schema to migrate): the batches go
  to the spool, the writer backs off, and the spool is replayed in the background as soon as a
  write succeeds again (and when the sink starts). So is whatever was spooled without an outage
  (an overflow spill), and what a replay an error stopped left (after a back-off of its own).
- **The database refused the content** (a NUL in a TEXT column, a value out of range, a
  constraint): never an outage. The group is split in halves until the refused batches are
  isolated, then within a refused batch its events and anomalies, so everything the database
  takes is written at once; what it refuses goes to the quarantine table with the reason
  (:mod:`eventguard.sink.quarantine`), with a ``sink_refused`` anomaly on the response when its row
  is there. Healthy batches are neither delayed nor spooled.
- **Anything else** (a bug, a redactor that raises): logged once with its traceback, counted in
  ``stats.unexpected_errors``; the batch goes to the quarantine with the reason, and the writer
  carries on. Nothing the writer was given is dropped: it is in the database, the spool, the
  quarantine table, or (when even that cannot be written) the quarantine file beside the spool.

**Event loops.** An AsyncEngine's pool, an ``asyncio.Event`` and a ``Lock`` belong to the loop that
first used them. A sink used from several loops one after the other (a module-level sink, two
``asyncio.run()`` calls, function-scoped test loops) keeps one writer, engine and set of
primitives per loop: each loop gets its own, and a loop's engine is disposed when that loop ends
(its writer is cancelled then) or, at the latest, once the loop is closed. Two loops running at the
same time in two threads cannot share a sink: the second gets :class:`SinkLoopError`.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import os
import re
import socket
import time
import traceback
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal, TypeAlias

from sqlalchemy import inspect
from sqlalchemy.engine import URL
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncEngine

from eventguard.errors import SchemaMismatchError, SinkLoopError
from eventguard.lifecycle import Lifecycle
from eventguard.sink import quarantine
from eventguard.sink.apply import Refusal, Written, note_refused, write
from eventguard.sink.batch import Batch
from eventguard.sink.filter import EventFilter, EventMode, EventPredicate
from eventguard.sink.quarantine import QuarantineRecord
from eventguard.sink.recorder import SqlRecorder
from eventguard.sink.serialise import Redactor
from eventguard.sink.spool import Spool
from eventguard.sql import engine as _db
from eventguard.sql import migrate as _migrate
from eventguard.sql.classify import ErrorKind, classify, reason
from eventguard.sql.tables import responses

log = logging.getLogger("eventguard.sink")

#: What happens when ``max_buffered`` events wait for the writer: "spool" writes the oldest
#: buffered events to the spool file right away (synchronously, bounded memory; replay loads
#: them). Blocking is not offered: ``Recorder.event`` is synchronous and cannot wait.
FullPolicy: TypeAlias = Literal["spool"]

# The writer serialises events on the event loop it shares with the streams: in steps of at
# most _STEP_FLOOR seconds, or _STEP_SHARE of the time the other tasks took meanwhile, checking
# the clock every _ENCODE_CHUNK events (a few microseconds of work).
_STEP_FLOOR = 25e-6
_STEP_SHARE = 0.5
_ENCODE_CHUNK = 8
#: Batches per transaction when replaying the spool.
REPLAY_CHUNK = 200
#: Spool records read (and parsed) between two turns of the event loop while replaying.
_REPLAY_YIELD = 4
#: How long the writer's last act on a loop that is ending (closing its connections) may take.
_TEARDOWN_TIMEOUT = 2.0
#: The writer's pause after an error it did not expect, before its next cycle.
_ERROR_PAUSE = 0.05
#: SQLAlchemy's rendering of a statement's bound values in an error (one line: a repr).
#: Set while this task replays the spool: a quarantine record already there is not inserted
#: again (a file an outage stopped is replayed again from its start).
_REPLAYING: contextvars.ContextVar[bool] = contextvars.ContextVar("eventguard_replaying", default=False)
_PARAMETERS = re.compile(r"\[parameters: [^\n]*")
#: The least time between two replays started by successful writes, when a replay left files.
_REPLAY_RETRY = 1.0
#: After a replay an error stopped, the next waits this long, doubling up to the maximum.
_REPLAY_BACKOFF_FIRST = 0.1
_REPLAY_BACKOFF_MAX = 30.0


@dataclass(slots=True)
class SinkStats:
    batches_written: int = 0
    events_written: int = 0
    batches_spooled: int = 0
    overflows: int = 0
    refusals: list[Refusal] = field(default_factory=list)
    last_error: str | None = None
    #: Records put in the quarantine (the table, or the file when the table could not be written).
    quarantined: int = 0
    #: Of those, the ones in the quarantine file.
    quarantine_file: int = 0
    #: Batches refused because another stream owns their response id and attempt.
    duplicates: int = 0
    #: Errors the writer did not expect (each kind logged once, with its traceback).
    unexpected_errors: int = 0
    #: Batches that could be kept nowhere (spool and quarantine file both failed): logged.
    lost: int = 0


@dataclass(frozen=True, slots=True)
class ReplayResult:
    files: int
    batches: int
    #: Events handed to the database (those already there are a no-op).
    events: int
    #: Spool records that could not be read (each is in the quarantine, origin ``spool``).
    bad_lines: int
    refusals: tuple[Refusal, ...]
    #: Quarantine records written by this replay (refused batches, duplicates, bad records).
    quarantined: int = 0


@dataclass(slots=True)
class _Tally:
    batches: int = 0
    events: int = 0
    quarantined: int = 0
    bad: int = 0
    refusals: list[Refusal] = field(default_factory=list)

    def add(self, other: _Tally) -> None:
        self.batches += other.batches
        self.events += other.events
        self.quarantined += other.quarantined
        self.bad += other.bad
        self.refusals.extend(other.refusals)


class _Stopped(Exception):
    """An outage stopped a write: ``batches`` are not known to be written."""

    def __init__(self, cause: BaseException, batches: list[Batch]) -> None:
        super().__init__(reason(cause))
        self.cause = cause
        self.batches = batches


@dataclass(eq=False, slots=True)
class _LoopState:
    """What one event loop's writer owns: each is bound to the loop that first used it."""

    loop: asyncio.AbstractEventLoop
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    replay_lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    engine: AsyncEngine | None = None
    task: asyncio.Task[None] | None = None
    replay: asyncio.Task[ReplayResult | None] | None = None
    stopping: bool = False


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
        #: The URL's password in every form it may take: scrubbed from every error text we show.
        self._secrets = _db.url_secrets(self.url)
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
        # Every database round trip is bounded: the database's own timeouts come first, this
        # is the backstop for a peer that went silent.
        self._write_timeout = connect_timeout + busy_timeout + 2 * (statement_timeout or 60.0) + 5.0
        #: Checking (or creating) the schema takes a few round trips more than a write.
        self._prepare_timeout = 3 * self._write_timeout
        #: One writer state per event loop that used the sink (usually one); ``_live`` is the
        #: current loop's, and ``_wake`` its event (the hot path sets it without a lookup).
        self._states: list[_LoopState] = []
        self._live: _LoopState | None = None
        self._wake = asyncio.Event()
        #: An engine asked for outside any event loop; the first loop to use the sink takes it.
        self._unbound: AsyncEngine | None = None
        self._work: list[SqlRecorder] = []
        self._buffered = 0
        self._ready = False
        self._closed = False
        self._outage: str | None = None
        self._retry_at = 0.0
        self._backoff = 0.5
        self._logged: set[str] = set()
        #: Set whenever something is spooled: the next successful write replays the spool.
        self._spooled = False
        #: Quarantine file appends left for the writer to do, in a thread (``_quarantine_file``).
        self._file_backlog: list[tuple[list[QuarantineRecord], str]] = []
        #: Before this (time.monotonic()), a successful write does not start a replay for
        #: ``_spooled`` alone (a file another process replays must not be looked at every cycle).
        self._replay_after = 0.0
        self._replay_backoff = _REPLAY_BACKOFF_FIRST

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
        """The current event loop's engine (each loop has its own: a pool is bound to its loop)."""
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            if self._unbound is None:
                self._unbound = self._new_engine()
            return self._unbound
        st = self._here()
        if st.engine is None:
            st.engine = self._new_engine()
        return st.engine

    def _new_engine(self) -> AsyncEngine:
        return _db.create_engine(
            self.url,
            schema=self.schema,
            busy_timeout_ms=int(self._busy_timeout * 1000),
            pooler_safe=self._pooler_safe,
            connect_timeout=self._connect_timeout,
            statement_timeout=self._statement_timeout,
            # The server takes any text there but a NUL (nor can asyncpg send a lone surrogate).
            application_name=quarantine.text(f"eventguard {self.owner}"),
        )

    @property
    def quarantine_path(self) -> Path:
        """Where quarantine records go when the quarantine table cannot be written."""
        return quarantine.file_path(self.spool.path)

    async def start(self) -> None:
        """Connect, check (or create) the schema and start the writer: fails fast.

        Raises :class:`SchemaMismatchError` naming the command to run when the schema is
        behind or ahead. Without ``start()``, the first ``recorder()`` starts the writer and a
        problem is logged once while batches go to the spool. A spool left from before is
        replayed in the background, beside the new writes.
        """
        st = self._here()
        async with st.lock, asyncio.timeout(self._prepare_timeout):
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
        """Write everything buffered so far (or spool, or quarantine it) before returning."""
        self._here()
        await self._cycle(self._take_work())
        await self._drain_file_backlog()

    async def aclose(self) -> None:
        """Final flush of every stream, stop the writer, release connections.

        Never raises for content or database trouble (that is logged, and kept in the spool or
        the quarantine); cancellation propagates.
        """
        if self._closed:
            return
        st = self._here()
        st.stopping = True
        st.wake.set()
        task, st.task = st.task, None
        if task is not None:
            await self._stop(task, cancel=False)
        replay, st.replay = st.replay, None
        if replay is not None:
            await self._stop(replay, cancel=True)  # its file is released, for the next start
        try:
            await self.flush()
        except Exception as exc:  # pragma: no cover - flush keeps everything itself
            self.unexpected(exc, "the final flush")
        self._closed = True
        for other in self._states:
            engine, other.engine = other.engine, None
            if engine is None:
                continue
            try:
                if other is st:
                    async with asyncio.timeout(self._write_timeout):
                        await engine.dispose()
                else:
                    # Another loop's connections cannot be closed from here: forget them.
                    await engine.dispose(close=False)
            except Exception as exc:
                log.warning("eventguard sink: closing connections: %s", self._why(exc))
        if self._unbound is not None:
            await self._unbound.dispose(close=False)
            self._unbound = None

    async def _stop(self, task: asyncio.Task[Any], *, cancel: bool) -> None:
        """Let ``task`` end (or cancel it), within bounds; its own errors are not ours to raise
        (the writer reports its own). Our caller's cancellation propagates."""
        if task.done():
            return
        if cancel:
            task.cancel()
        else:
            # The writer finishes the cycle it is in: every database call in it is bounded.
            await asyncio.wait([task], timeout=self._write_timeout + self.close_timeout)
            if task.done():
                return
            log.error("eventguard sink: the writer did not stop in time; cancelled (its work is spooled)")
            task.cancel()
        await asyncio.wait([task], timeout=_TEARDOWN_TIMEOUT + self._write_timeout)

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

    def note_event(self, rec: SqlRecorder) -> None:
        """A recorder buffered an event (the hot path: one append, then this)."""
        self._enqueue(rec)
        self._buffered += 1
        if self._buffered >= self.flush_every:
            self._wake.set()
            if self._buffered >= self.max_buffered:
                self._overflow()

    def note_change(self, rec: SqlRecorder) -> None:
        """A recorder's lifecycle changed: the writer is woken."""
        self._enqueue(rec)
        self._wake.set()

    def note_close(self, rec: SqlRecorder) -> None:
        """A recorder is closing: the writer is woken; with no writer, what it holds is spooled."""
        self._enqueue(rec)
        self._wake.set()
        if not self.writing():
            # No writer (the sink was closed, or the loop that ran it is gone): keep it locally.
            self.spool_now(rec, "the sink's writer is not running")

    def _overflow(self) -> None:
        # The writer is behind by max_buffered events: move what waits to the spool now rather
        # than grow without bound. Rare and documented; replay restores it. On the hot path (in
        # Recorder.event): the events are serialised and appended to the spool here (one write,
        # no fsync unless the spool asks for it); what would go to the quarantine file (an event
        # the redactor cannot handle, a batch the spool cannot take) is left to the writer,
        # which appends and fsyncs it in a thread (when no writer runs, it is done here).
        self.stats.overflows += 1
        if self.stats.overflows == 1:
            log.warning(
                "eventguard sink: %d events buffered; spilling to %s", self._buffered, self.spool.path
            )
        batches = [b for rec in self._work if (b := self._collect(rec)) is not None]
        self._buffered = sum(len(rec.pending) for rec in self._work)
        self._to_spool(batches, None)

    def writing(self) -> bool:
        """Whether the current loop's writer task is alive: it will store, or keep, what it was given."""
        st = self._live
        if st is None or st.task is None or st.task.done():
            return False
        try:
            return st.loop is asyncio.get_running_loop()
        except RuntimeError:
            return False

    def spool_now(self, rec: SqlRecorder, why: str) -> None:
        """Keep what a closing recorder still holds in the spool file (its final flush cannot happen)."""
        batch = self._collect(rec)
        batches = [*rec.inflight, *([batch] if batch is not None else [])]
        if batches:
            log.warning("eventguard sink: %s; %d batches kept in %s", why, len(batches), self.spool.path)
            self._to_spool(batches, None)
        self._finish(rec)

    # -- one state per event loop ------------------------------------------------------------------
    def _here(self) -> _LoopState:
        """The running loop's state, made on its first use (see the module's docstring)."""
        loop = asyncio.get_running_loop()
        st = self._live
        if st is not None and st.loop is loop:
            return st
        for st in self._states:
            if st.loop is loop:
                break
        else:
            for other in self._states:
                if other.loop.is_running() and other.task is not None and not other.task.done():
                    raise SinkLoopError(
                        f"{self!r} is in use by another running event loop (another thread): "
                        "create one SqlSink per event loop"
                    )
            st = _LoopState(loop)
            st.engine, self._unbound = self._unbound, None
            self._states = [s for s in self._states if not self._retire(s)]
            self._states.append(st)
        self._live = st
        self._wake = st.wake
        return st

    def _retire(self, st: _LoopState) -> bool:
        """Forget a closed loop's state (its writer disposed of its engine when the loop ended;
        if it could not, the pool is dropped without touching the loop-bound connections)."""
        if not st.loop.is_closed():
            return False
        engine, st.engine = st.engine, None
        if engine is not None:
            try:
                engine.sync_engine.dispose(close=False)
            except Exception as exc:  # pragma: no cover - no I/O is involved
                log.debug("eventguard sink: dropping a closed loop's pool: %s", exc)
        return True

    # -- the writer ------------------------------------------------------------------------------
    def _ensure_writer(self) -> _LoopState:
        st = self._here()
        if st.task is None or st.task.done():
            st.stopping = False
            st.task = st.loop.create_task(self._run(st), name=f"eventguard-writer {self!r}")
            st.task.add_done_callback(self._writer_done)
            if self._ready:
                self._replay_soon()  # what an earlier writer of this sink left in the spool
        return st

    def _writer_done(self, task: asyncio.Task[None]) -> None:
        # The writer catches everything but cancellation; should anything escape all the same,
        # it is said here (with the traceback) rather than as "Task exception was never retrieved".
        if not task.cancelled() and (exc := task.exception()) is not None:
            self.unexpected(exc, "the writer task ended")

    async def _run(self, st: _LoopState) -> None:
        try:
            while True:
                if not st.stopping:
                    timeout = self.flush_interval if self._work else None
                    try:
                        async with asyncio.timeout(timeout):
                            await st.wake.wait()
                    except TimeoutError:
                        pass
                st.wake.clear()
                recorders = self._take_work()
                try:
                    if recorders:
                        await self._cycle(recorders)
                    await self._drain_file_backlog()
                except Exception as exc:  # the writer never dies: say it once, carry on
                    self.unexpected(exc, "a write cycle")
                    await asyncio.sleep(_ERROR_PAUSE)  # a bug that repeats must not spin
                if st.stopping:
                    return  # aclose() does the last flush itself
        except asyncio.CancelledError:
            # The loop is ending (asyncio.run() cancels every task): keep what still waits, and
            # close this loop's connections while the loop can still run their goodbyes.
            self._keep_waiting_work()
            self._drain_file_backlog_now()
            engine, st.engine = st.engine, None
            if engine is not None:
                try:
                    async with asyncio.timeout(_TEARDOWN_TIMEOUT):
                        await engine.dispose()
                except Exception:
                    engine.sync_engine.dispose(close=False)
            raise

    def _keep_waiting_work(self) -> None:
        batches: list[Batch] = []
        recorders = self._take_work()
        for rec in recorders:
            batches.extend(rec.inflight)
            rec.inflight.clear()
            batch = self._collect(rec)
            if batch is not None:
                batches.append(batch)
        if batches:
            log.warning(
                "eventguard sink: the event loop is ending; %d batches kept in %s for the next start",
                len(batches),
                self.spool.path,
            )
            self._to_spool(batches, None)
        for rec in recorders:
            self._finish(rec)

    def _take_work(self) -> list[SqlRecorder]:
        recorders = self._work
        self._work = []
        for rec in recorders:
            rec.queued = False
        return recorders

    def _collect(self, rec: SqlRecorder) -> Batch | None:
        """``rec.collect()``; should it raise, what it holds goes to the quarantine file, not lost
        (under a redactor, only what identifies it: see :meth:`_uncollected`)."""
        try:
            return rec.collect()
        except Exception as exc:
            self.unexpected(exc, "collecting a stream's work")
            lc = rec.lifecycle
            record = quarantine.entry(
                "write",
                f"the stream's work could not be collected: {self._error_text(exc)}",
                self._uncollected(rec),
                response_id=lc.info.response_id,
                attempt=lc.attempt,
                stream_id=getattr(rec, "stream_id", None),
            )
            self.stats.quarantined += 1
            self._quarantine_file([record], "the stream's work could not be collected")
            if rec.closing:
                self._finish(rec)  # its close() must not wait for what cannot be collected
            return None

    def _uncollected(self, rec: SqlRecorder) -> dict[str, Any]:
        """What a recorder whose work cannot be collected holds, taken from it. With a redactor,
        only what identifies each item (the redactor never saw it: its content stays out)."""
        lc = rec.lifecycle
        try:
            pending, steps, found = rec.abandon()
        except Exception:  # pragma: no cover - a recorder without abandon() (a test double)
            pending, steps, found = list(rec.pending), [], []
            rec.pending = []
            rec.dirty = False
        if self.redact is None:
            return {"lifecycle": lc, "pending_events": pending, "transitions": steps, "anomalies": found}
        return {
            "redacted": "the sink has a redactor: only what identifies each item is kept",
            "state": lc.state.value,
            "attempt": lc.attempt,
            "pending_events": [{"attempt": a, "seq": s, "type": t} for a, s, t, _ in pending],
            "transitions": [
                {
                    "attempt": t.attempt,
                    "idx": t.index,
                    "from_state": t.from_state.value,
                    "to_state": t.to_state.value,
                    "cause": t.cause.value if t.cause else None,
                }
                for t in steps
            ],
            "anomalies": [
                {"attempt": a.attempt, "idx": a.index, "kind": a.kind.value, "event_index": a.event_index}
                for a in found
            ],
        }

    def _error_text(self, exc: BaseException) -> str:
        """An error as the quarantine keeps it: under a redactor its type only (its message may
        quote what the redactor was meant to mask), else its one-line reason."""
        return type(exc).__name__ if self.redact is not None else reason(exc)

    def _finish(self, rec: SqlRecorder) -> None:
        with contextlib.suppress(RuntimeError):  # its event loop is closed: nobody waits any more
            rec.finished()

    async def _cycle(self, recorders: Sequence[SqlRecorder]) -> None:
        batches: list[Batch] = []
        for rec in recorders:
            batch = self._collect(rec)
            if batch is not None:
                rec.inflight.append(batch)
                batches.append(batch)
            if rec.pending and rec.response_id() is None:
                self._enqueue(rec)  # no id yet: keep buffering until the host names it
        self._buffered = sum(len(rec.pending) for rec in self._work)
        try:
            if batches:
                await self._persist(batches)
        except asyncio.CancelledError:
            # Cancelled mid-write (the loop is ending): what is not known to be written is kept.
            self._to_spool(batches, None)
            raise
        except Exception as exc:  # a bug: _persist keeps everything itself, or should
            self.unexpected(exc, "a write")
            self._to_spool(batches, None)
        finally:
            for rec in recorders:
                rec.inflight.clear()
                try:
                    done = rec.closing and not rec.has_work()
                except Exception as exc:  # a recorder's bug: its close() must not wait for ever
                    self.unexpected(exc, "a stream's state")
                    done = True
                if done:
                    self._finish(rec)

    async def _persist(self, batches: list[Batch]) -> None:
        st = self._here()
        async with st.lock:
            if time.monotonic() < self._retry_at:
                self._to_spool(batches, None)
                return
            await self._serialise(batches)
            try:
                await self._ensure_ready()
            except Exception as exc:
                self._to_spool(batches, exc)
                return
            tally = _Tally()
            try:
                await self._apply(batches, tally)
            except _Stopped as stop:
                self._to_spool(stop.batches, stop.cause)
                return
            finally:
                self._report(tally.refusals)
            self._recovered()

    async def _serialise(self, batches: Sequence[Batch]) -> None:
        """Serialise the batches' events a little at a time, yielding the loop in between.

        Each step takes at most ``max(_STEP_FLOOR, _STEP_SHARE x the time the other tasks
        took since the last step)``: next to one stream, a step stays far below the latency the
        sink may add to it; next to a thousand, the writer still keeps pace with them all.
        An event that cannot be serialised (a redactor that raises) goes to the quarantine; the
        rest of its batch is written.
        """
        clock = time.perf_counter
        started = clock()
        budget = _STEP_FLOOR
        refused: list[QuarantineRecord] = []
        for batch in batches:
            while self._encode_step(batch, _ENCODE_CHUNK, refused):
                now = clock()
                if now - started >= budget:
                    await asyncio.sleep(0)
                    started = clock()
                    budget = max(_STEP_FLOOR, (started - now) * _STEP_SHARE)
        if refused:
            await self._quarantine(refused)

    def _serialise_now(self, batches: Sequence[Batch]) -> list[QuarantineRecord]:
        """Serialise the batches' events in one go (before they are spooled); each event that
        cannot be serialised is taken out of its batch, as the quarantine record returned."""
        refused: list[QuarantineRecord] = []
        for batch in batches:
            while self._encode_step(batch, None, refused):
                pass
        return refused

    def _encode_step(self, batch: Batch, limit: int | None, refused: list[QuarantineRecord]) -> bool:
        """Serialise up to ``limit`` (None: all) more of ``batch``'s events; an event that cannot
        be serialised goes into ``refused``. False once nothing is left."""
        rec = batch.source
        if rec is None:
            return False
        start, before = batch.raw_done, len(batch.events)
        try:
            return rec.encode_some(batch, limit) > 0
        except Exception as exc:
            refused.append(self._skip_event(batch, start + len(batch.events) - before, exc))
            return True

    def _skip_event(self, batch: Batch, index: int, exc: Exception) -> QuarantineRecord:
        """Take the event that could not be serialised out of ``batch``, as a quarantine record.

        Only the serialiser's redactor raises there. With a redactor the record holds what
        identifies the event (attempt, seq, type) and why, never the event: it is what the
        redactor was meant to mask, and it never saw it through.
        """
        self.unexpected(exc, "serialising an event")
        redacted = self.redact is not None
        cause = f"the redactor raised {reason(exc)}" if redacted else reason(exc)
        why = f"the event could not be serialised: {cause}"
        if not batch.raw_done <= index < len(batch.raw):  # pragma: no cover - the recorder changed shape
            record = quarantine.of_batch(batch, "write", why, redacted=redacted)
            batch.raw, batch.raw_done = [], 0
            return record
        attempt, seq, etype, event = batch.raw[index]
        batch.raw_done = index + 1
        if batch.raw_done >= len(batch.raw):
            batch.raw, batch.raw_done = [], 0
        content: dict[str, Any] = {
            "response_id": batch.response_id,
            "attempt": attempt,
            "seq": seq,
            "type": etype,
        }
        if redacted:
            content["error"] = type(exc).__name__
        else:
            content["event"] = event
        return quarantine.entry(
            "write", why, content, response_id=batch.response_id, attempt=attempt, stream_id=batch.stream_id
        )

    async def _write(self, batches: Sequence[Batch], *, rows: bool = True) -> Written:
        for batch in batches:
            batch.serialise()  # no-op unless the caller skipped _serialise
        async with asyncio.timeout(self._write_timeout), self.engine.begin() as conn:
            written = await write(conn, batches, rows=rows, replay=_REPLAYING.get())
        if rows:
            self.stats.batches_written += len(batches) - len(written.duplicates)
        self.stats.events_written += written.events
        if written.duplicates:
            self.stats.duplicates += len(written.duplicates)
            self.stats.quarantined += written.quarantined
            for dup in written.duplicates:
                log.warning("eventguard sink: %s", quarantine.text(dup.reason))
        return written

    async def _apply(self, batches: list[Batch], tally: _Tally) -> None:
        """Write ``batches``; a group the database refuses for its content is split until the
        refused batches are isolated (then :meth:`_isolate`). Raises :class:`_Stopped` on an
        outage, with the batches not known to be written."""
        todo: list[list[Batch]] = [batches]
        while todo:
            group = todo.pop()
            try:
                written = await self._write(group)
            except Exception as exc:
                if await self._kind(exc) is not ErrorKind.DATA:
                    raise _Stopped(exc, [*group, *(b for g in reversed(todo) for b in g)]) from exc
                if len(group) > 1:
                    half = len(group) // 2
                    todo += [group[half:], group[:half]]  # the first half next: order kept
                    continue
                try:
                    await self._isolate(group[0], exc, tally)
                except _Stopped as stop:
                    stop.batches += [b for g in reversed(todo) for b in g]
                    raise
                tally.batches += 1
                continue
            tally.batches += len(group)
            tally.events += written.events
            tally.quarantined += written.quarantined
            tally.refusals += written.refusals

    async def _isolate(self, batch: Batch, refused_by: Exception, tally: _Tally) -> None:
        """One batch the database refused: write what it takes, quarantine the rest.

        The row with its transitions and anomalies first, then without the anomalies; the events
        (and the anomalies, when they were refused with the row) in halves until each refused one
        is alone. A row the database refuses takes the whole batch to the quarantine.
        """
        head = replace(batch, events=[], raw=[], raw_done=0)
        loose: list[dict[str, Any]] = []
        try:
            written = await self._write([head])
        except Exception as exc:
            if await self._kind(exc) is not ErrorKind.DATA:
                raise _Stopped(exc, [batch]) from exc
            try:
                written = await self._write([replace(head, anomalies=[])])
            except Exception as exc2:
                if await self._kind(exc2) is not ErrorKind.DATA:
                    raise _Stopped(exc2, [batch]) from exc2
                why = f"the database refused the response row: {reason(exc2)}"
                tally.quarantined += await self._quarantine(
                    [quarantine.of_batch(batch, "write", why)], note=(batch, why)
                )
                return
            loose = batch.anomalies
        tally.refusals += written.refusals
        tally.quarantined += written.quarantined
        if written.duplicates:
            # Another stream owns this attempt: the rest of the batch is not applied either.
            why = quarantine.text(written.duplicates[0].reason)
            record = quarantine.of_batch(batch, "duplicate", why, anomalies=loose, whole=False)
            tally.quarantined += await self._quarantine([record])
            return
        events, anomalies = await self._bisect(batch, list(batch.events), loose, tally)
        if events or anomalies:
            why = (
                f"the database refused {len(events)} event(s) and {len(anomalies)} anomaly(ies) of the "
                f"batch ({reason(refused_by)}); the rest of it is stored"
            )
            record = quarantine.of_batch(batch, "write", why, events=events, anomalies=anomalies, whole=False)
            tally.quarantined += await self._quarantine([record], note=(batch, why))

    async def _bisect(
        self, batch: Batch, events: list[Any], anomalies: list[dict[str, Any]], tally: _Tally
    ) -> tuple[list[Any], list[dict[str, Any]]]:
        """Write ``batch``'s events and anomalies without its row, in halves; the refused ones."""
        items: list[tuple[bool, Any]] = [(True, e) for e in events] + [(False, a) for a in anomalies]
        refused: list[tuple[bool, Any]] = []
        todo = [items]
        while todo:
            part = todo.pop()
            if not part:
                continue
            sub = replace(
                batch,
                events=[x for is_event, x in part if is_event],
                anomalies=[x for is_event, x in part if not is_event],
                transitions=[],
                raw=[],
                raw_done=0,
                refusal_idx=None,
            )
            try:
                written = await self._write([sub], rows=False)
            except Exception as exc:
                if await self._kind(exc) is not ErrorKind.DATA:
                    raise _Stopped(exc, [batch]) from exc
                if len(part) == 1:
                    refused += part
                else:
                    half = len(part) // 2
                    todo += [part[half:], part[:half]]
                continue
            tally.events += written.events
        return [x for is_event, x in refused if is_event], [x for is_event, x in refused if not is_event]

    async def _kind(self, exc: BaseException) -> ErrorKind:
        """DATA, or an outage (OUTAGE / SCHEMA). An unknown error is logged and counted, and the
        database asked whether it is there: reachable, the content was the trouble."""
        kind = classify(exc)
        if kind is ErrorKind.UNKNOWN:
            self.unexpected(exc, "a write")
            kind = ErrorKind.DATA if await self._reachable() else ErrorKind.OUTAGE
        if kind is ErrorKind.SCHEMA:
            self._ready = False  # look at the schema again before the next write
        return kind

    async def _reachable(self) -> bool:
        try:
            async with asyncio.timeout(self._connect_timeout + 5.0), self.engine.connect() as conn:
                await conn.exec_driver_sql("SELECT 1")
        except Exception:
            return False
        return True

    # -- the quarantine ------------------------------------------------------------------------------
    async def _quarantine(
        self, records: list[QuarantineRecord], *, note: tuple[Batch, str] | None = None
    ) -> int:
        """Keep ``records`` in the quarantine table (else its file); ``note``: the batch whose
        response gets a ``sink_refused`` anomaly, if its row is there. How many were kept (in a
        replay, a record the table already holds is not kept again, nor counted)."""
        if not records:
            return 0
        for record in records[:3]:
            log.warning(
                "eventguard sink: response %s: %s; kept in the quarantine", record.response_id, record.reason
            )
        error: Exception | None = None
        for with_note in (True, False) if note is not None else (False,):
            try:
                async with asyncio.timeout(self._write_timeout), self.engine.begin() as conn:
                    kept = await quarantine.insert(conn, records, once=_REPLAYING.get())
                    if with_note and note is not None:
                        await note_refused(conn, note[0], quarantine.text(note[1]), records[0].record)
                self.stats.quarantined += kept
                return kept
            except Exception as exc:
                error = exc
        assert error is not None
        self.stats.quarantined += len(records)
        why = f"the quarantine table could not be written ({self._why(error)})"
        await self._quarantine_file_async(records, why)
        return len(records)

    def _quarantine_file(self, records: list[QuarantineRecord], why: str) -> None:
        """Append ``records`` to the quarantine file (fsync'd); ``why`` they are not in the table.

        While a writer runs on this loop, it appends them instead, in a thread, at the end of its
        turn (``_drain_file_backlog``): an fsync must hold up neither the hot path (an overflow
        spill, from ``Recorder.event``) nor the event loop. Without one, it is done here.
        """
        if self.writing():
            self._file_backlog.append((records, why))
            self._wake.set()
            return
        self._append_file(records, why)

    def _append_file(self, records: list[QuarantineRecord], why: str) -> None:
        path = self.quarantine_path
        try:
            n = quarantine.append_file(path, records)
        except Exception as exc:
            self._file_lost(records, path, exc)
            return
        self._filed(n, path, why)

    async def _quarantine_file_async(self, records: list[QuarantineRecord], why: str) -> None:
        """:meth:`_quarantine_file`, its write and fsync in a thread, off the event loop."""
        path = self.quarantine_path
        try:
            n = await asyncio.to_thread(quarantine.append_file, path, records)
        except Exception as exc:
            self._file_lost(records, path, exc)
            return
        self._filed(n, path, why)

    async def _drain_file_backlog(self) -> None:
        """Append what the hot path left for the quarantine file (the writer's turn)."""
        while self._file_backlog:
            records, why = self._file_backlog.pop(0)
            await self._quarantine_file_async(records, why)

    def _drain_file_backlog_now(self) -> None:
        """The same, synchronously: the writer is ending."""
        backlog, self._file_backlog = self._file_backlog, []
        for records, why in backlog:
            self._append_file(records, why)

    def _filed(self, n: int, path: Path, why: str) -> None:
        self.stats.quarantine_file += n
        self._say(
            "quarantine file",
            "eventguard sink: %s; %d records kept in %s (stats.quarantine_file counts them)",
            why,
            n,
            path,
        )

    def _file_lost(self, records: list[QuarantineRecord], path: Path, exc: Exception) -> None:
        self.stats.lost += len(records)
        self._say(
            "lost",
            "eventguard sink: %d quarantine records could be written neither to the database nor to "
            "%s (%s); they are lost (stats.lost counts them)",
            len(records),
            path,
            self._why(exc),
        )

    def _say(self, key: str, msg: str, *args: object) -> None:
        """Log ``msg`` as an error the first time for ``key``, then only for debugging: the
        counts are in ``stats``."""
        if key in self._logged:
            log.debug(msg, *args)
        else:
            self._logged.add(key)
            log.error(msg, *args)

    # -- outages, the spool ---------------------------------------------------------------------------
    def _report(self, refusals: list[Refusal]) -> None:
        for refusal in refusals:
            self.stats.refusals.append(refusal)
            log.warning("eventguard sink: response %r: %s", refusal.response_id, refusal.reason)

    def _why(self, exc: BaseException) -> str:
        """The driver's one-line reason, storable and without the URL's secrets (a driver may echo
        its DSN in an error)."""
        return _db.scrub(quarantine.text(reason(exc)), self._secrets)

    def unexpected(self, exc: BaseException, where: str) -> None:
        """An error the writer did not expect: counted, logged with its traceback once per kind."""
        self.stats.unexpected_errors += 1
        key = f"{where}:{type(exc).__qualname__}"
        if key in self._logged:
            log.debug("eventguard sink: unexpected error in %s again: %s", where, type(exc).__name__)
            return
        self._logged.add(key)
        # The traceback as text, scrubbed like every error text shown (the URL's secrets, and
        # the bound values SQLAlchemy prints after "[parameters:": event payloads), rather than
        # exc_info, which each handler would format from the raw exception.
        log.error(
            "eventguard sink: unexpected error in %s (%s); the writer carries on, nothing is dropped "
            "(later ones of this kind are only counted in stats.unexpected_errors)\n%s",
            where,
            self._why(exc),
            self._traceback(exc),
        )

    def _traceback(self, exc: BaseException) -> str:
        """``exc``'s traceback (its chain included) as text that is safe to show."""
        try:
            text = "".join(traceback.format_exception(exc)).rstrip("\n")
        except Exception:  # pragma: no cover - a broken __str__ deep in the chain
            text = f"{type(exc).__qualname__} (its traceback could not be formatted)"
        text = _PARAMETERS.sub("[parameters: not logged]", text)
        return _db.scrub(quarantine.text(text), self._secrets)

    def _to_spool(self, batches: list[Batch], exc: BaseException | None) -> None:
        """Keep ``batches`` in the spool (``exc``: the outage that sent them there, logged once).

        Never raises: a batch the spool cannot take goes to the quarantine file, with the reason.
        """
        if exc is not None:
            text = self._why(exc)
            self.stats.last_error = text
            self._ready = False  # look at the schema again before the next write
            self._retry_at = time.monotonic() + self._backoff
            self._backoff = min(self._backoff * 2, 30.0)
            if self._outage is None:
                # Once per outage, with the reason; the URL without its password.
                self._outage = text
                log.error(
                    "eventguard sink: cannot write to %s (%s); spooling to %s until it is back",
                    _db.safe_url(self.url),
                    text,
                    self.spool.path,
                )
        if not batches:
            return
        # Serialised here, event by event: an event that cannot be (a redactor that raises) goes
        # to the quarantine on its own; the rest of its batch is spooled. (Spool.append then
        # finds nothing left to serialise: the redactor never runs inside it.)
        refused = self._serialise_now(batches)
        if refused:
            self.stats.quarantined += len(refused)
            self._quarantine_file(refused, "events that could not be serialised were being spooled")
        try:
            self.stats.batches_spooled += self.spool.append(batches)
            self._spooled = True
            return
        except Exception as exc:
            first: Exception = exc
        failed: list[tuple[Batch, Exception]] = []
        for batch in batches:  # one by one: keep every batch the spool can take
            try:
                self.stats.batches_spooled += self.spool.append([batch])
                self._spooled = True
            except Exception as err:
                failed.append((batch, err))
        if not failed:
            return
        self._say(
            "unspoolable",
            "eventguard sink: %d of %d batches could not be spooled (%s); they go to the quarantine file",
            len(failed),
            len(batches),
            self._why(first),
        )
        why = self._outage or "the database did not take it"
        redacted = self.redact is not None
        records = []
        for batch, problem in failed:
            text = f"could not be spooled ({reason(problem)}); {why}"
            records.append(quarantine.of_batch(batch, "write", text, redacted=redacted))
        self.stats.quarantined += len(records)
        self._quarantine_file(records, "the spool could not take them")

    def _recovered(self) -> None:
        self._backoff = 0.5
        if self._outage is not None:
            log.warning(
                "eventguard sink: %s is back; replaying %s in the background",
                _db.safe_url(self.url),
                self.spool.path,
            )
            self._outage = None
            self._replay_soon()
        elif self._spooled and time.monotonic() >= self._replay_after:
            # Spooled without an outage (an overflow, a stream cut short), or left by a replay
            # that could not finish: a write just went through, so replay it now, not at restart.
            self._replay_soon()

    async def _ensure_ready(self, *, replay: bool = True) -> None:
        if not self._ready:
            async with asyncio.timeout(self._prepare_timeout):
                await self._prepare(replay=replay)

    async def _prepare(self, *, replay: bool = True) -> None:
        """Check the schema, creating it first in an empty database when allowed; then (unless
        ``replay`` is False: a replay is what asks) replay a spool left from before, in the
        background."""
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
        if replay:
            self._replay_soon()

    async def _has_tables(self) -> bool:
        async with self.engine.connect() as conn:
            return await conn.run_sync(lambda c: inspect(c).has_table(responses.name))

    # -- replaying the spool -----------------------------------------------------------------------
    def _replay_soon(self) -> None:
        """Replay the spool in the background (beside new writes, chunk by chunk), if it has anything."""
        st = self._live
        if st is None or self._closed or st.stopping or (st.replay is not None and not st.replay.done()):
            return
        try:
            pending = self.spool.pending()
        except OSError:
            return
        self._spooled = False  # what is spooled from now on is replayed by the next call
        if pending:
            st.replay = st.loop.create_task(self._replay_background(), name=f"eventguard-replay {self!r}")

    async def _replay_background(self) -> ReplayResult | None:
        try:
            result = await self._replay()
        except Exception as exc:
            # Its file is released, kept whole; _replay set when to try again.
            log.warning(
                "eventguard sink: replaying %s stopped (%s); it goes on when the database is back",
                self.spool.path,
                self._why(exc),
            )
            return None
        try:
            left = self.spool.pending()
        except OSError:
            left = True
        if left:
            # Appended since it began, or a file another process holds (or an append was still
            # writing to): the next successful write replays again, at most once a second.
            self._spooled = True
            self._replay_after = time.monotonic() + _REPLAY_RETRY
        if result.batches or result.bad_lines:
            log.warning(
                "eventguard sink: replayed %d batches (%d events) from %s; %d quarantined",
                result.batches,
                result.events,
                self.spool.path,
                result.quarantined,
            )
        return result

    async def replay_spool(self) -> ReplayResult:
        """Load the spool into the database, idempotently; each file is removed once loaded.

        Joins a replay the sink runs in the background (its counts are included), then loads
        what is left. A batch the database refuses, and a record that cannot be read, go to the
        quarantine (``quarantined``; unreadable records are also ``bad_lines``). Raises the
        database error if it is still away (the spool stays for the next try).
        """
        st = self._here()
        total = _Tally()
        files = 0
        running = st.replay
        if running is not None and not running.done():
            await asyncio.wait([running])
            joined = None if running.cancelled() or running.exception() else running.result()
            if joined is not None:
                files += joined.files
                total.add(_tally_of(joined))
        own = await self._replay()
        files += own.files
        total.add(_tally_of(own))
        return ReplayResult(
            files, total.batches, total.events, total.bad, tuple(total.refusals), total.quarantined
        )

    async def _replay(self) -> ReplayResult:
        st = self._here()
        tally = _Tally()
        files = 0
        async with st.replay_lock:
            replaying = _REPLAYING.set(True)
            try:
                async with st.lock:
                    await self._ensure_ready(replay=False)
                taken = self.spool.take()
                try:
                    for file in taken:
                        try:
                            await self._replay_file(st, file, tally)
                        except BaseException:
                            _release(self.spool, file)
                            raise
                        self.spool.done(file)
                        files += 1
                finally:
                    close = getattr(taken, "close", None)
                    if close is not None:
                        close()
            except BaseException:
                # Stopped (an outage, a cancelled task): what is left stays in the spool, and
                # the first write that goes through after a back-off of its own (doubling, from
                # a tenth of a second to half a minute) replays it again, not the next start.
                self._spooled = True
                self._replay_after = time.monotonic() + self._replay_backoff
                self._replay_backoff = min(self._replay_backoff * 2, _REPLAY_BACKOFF_MAX)
                raise
            finally:
                _REPLAYING.reset(replaying)
            self._replay_backoff = _REPLAY_BACKOFF_FIRST
        self._report(tally.refusals)
        return ReplayResult(
            files, tally.batches, tally.events, tally.bad, tuple(tally.refusals), tally.quarantined
        )

    async def _replay_file(self, st: _LoopState, file: Any, tally: _Tally) -> None:
        chunk: list[Batch] = []
        bad: list[QuarantineRecord] = []
        for n, record in enumerate(_records(file, tally), 1):
            if n % _REPLAY_YIELD == 0:
                # Each record is read and parsed on the event loop the streams share: a turn
                # for them every few records, not once per chunk of REPLAY_CHUNK.
                await asyncio.sleep(0)
            if isinstance(record, Batch):
                chunk.append(record)
                if len(chunk) >= REPLAY_CHUNK:
                    await self._replay_chunk(st, chunk, tally)
                    chunk = []
                continue
            tally.bad += 1
            bad.append(_bad_record(record))
            if len(bad) >= REPLAY_CHUNK:
                tally.quarantined += await self._quarantine(bad)
                bad = []
        if chunk:
            await self._replay_chunk(st, chunk, tally)
        if bad:
            tally.quarantined += await self._quarantine(bad)

    async def _replay_chunk(self, st: _LoopState, chunk: list[Batch], tally: _Tally) -> None:
        async with st.lock:  # taken per chunk: new writes go in between
            try:
                await self._apply(chunk, tally)
            except _Stopped as stop:
                self.stats.last_error = self._why(stop.cause)
                raise stop.cause from None
            self._recovered()


def _tally_of(result: ReplayResult) -> _Tally:
    return _Tally(result.batches, result.events, result.quarantined, result.bad_lines, [*result.refusals])


def _records(file: Any, tally: _Tally) -> Iterator[Any]:
    """A spool file's records, streaming (``SpoolFile.records()``), or, from a spool module
    without it, its batches (unreadable lines counted, kept by the spool itself)."""
    records = getattr(file, "records", None)
    if callable(records):
        yield from records()
        return
    yield from file.batches
    tally.bad += int(getattr(file, "bad_lines", 0))


def _release(spool: Spool, file: Any) -> None:
    release = getattr(spool, "release", None)
    if release is not None:
        with contextlib.suppress(Exception):
            release(file)


def _bad_record(record: Any) -> QuarantineRecord:
    raw = getattr(record, "raw", b"")
    return quarantine.entry(
        "spool",
        f"unreadable spool record: {getattr(record, 'reason', record)}",
        {
            "path": str(getattr(record, "path", "")),
            "line": getattr(record, "line", None),
            "raw": raw.decode("utf-8", "backslashreplace") if isinstance(raw, bytes) else raw,
        },
    )
