"""The writer: the sink's one task per event loop, which takes every recorder's work and stores it.

One writer task (not one per stream): it batches every stream's pending work into one
transaction per cycle, which is what SQLite wants (a single writer path) and cheap for
PostgreSQL. The guard's hot path only appends references (:meth:`Writer.note_event`); the writer
serialises and writes. The statements themselves are :func:`eventguard.sink.apply.write`'s.

What the writer does with a failed write depends on what the error means
(:mod:`eventguard.sql.classify`):

- **The database is away** (unreachable, locked, out of disk, a schema to migrate): the batches go
  to the spool, the writer backs off, and the spool is replayed in the background as soon as a
  write succeeds again (and when the sink starts): :mod:`eventguard.sink.replay`.
- **The database refused the content** (a NUL in a TEXT column, a value out of range, a
  constraint): never an outage. The group is split in halves until the refused batches are
  isolated, then within a refused batch its events and anomalies, so everything the database
  takes is written at once; what it refuses goes to the quarantine table with the reason
  (:mod:`eventguard.sink.quarantine`), with a ``sink_refused`` anomaly on the response when its row
  is there. Healthy batches are neither delayed nor spooled.
- **Anything else** (a bug, a redactor that raises): logged once with its traceback, counted in
  ``stats.unexpected_errors``; the batch goes to the quarantine with the reason, and the writer
  carries on. Nothing the writer was given is dropped: it is in the database, the spool, the
  quarantine table, or (when even that cannot be written) the quarantine file beside the spool
  (:mod:`eventguard.sink.quarantine_file`).

Each event loop that uses the sink has its own writer task, engine and primitives
(:mod:`eventguard.sink.loops`); a loop's engine is disposed when that loop ends (its writer is
cancelled then) or, at the latest, once the loop is closed.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from sqlalchemy import inspect
from sqlalchemy.engine import URL
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncEngine

from eventguard.errors import SchemaMismatchError
from eventguard.lifecycle import Lifecycle
from eventguard.sink import quarantine
from eventguard.sink.apply import Stopped, Tally, Written, note_refused, write
from eventguard.sink.batch import Batch
from eventguard.sink.filter import EventFilter
from eventguard.sink.loops import Loops, LoopState
from eventguard.sink.quarantine import QuarantineRecord
from eventguard.sink.quarantine_file import QuarantineFile
from eventguard.sink.recorder import SqlRecorder
from eventguard.sink.replay import REPLAYING, Replayer, ReplayResult
from eventguard.sink.report import Reporter, SinkStats, log
from eventguard.sink.serialise import Redactor
from eventguard.sink.spool import Spool
from eventguard.sql import engine as _db
from eventguard.sql import migrate as _migrate
from eventguard.sql.classify import ErrorKind, classify, reason
from eventguard.sql.tables import responses

__all__ = ["Outage", "Writer", "WriterConfig"]

# The writer serialises events on the event loop it shares with the streams: in steps of at
# most _STEP_FLOOR seconds, or _STEP_SHARE of the time the other tasks took meanwhile, checking
# the clock every _ENCODE_CHUNK events (a few microseconds of work).
_STEP_FLOOR = 25e-6
_STEP_SHARE = 0.5
_ENCODE_CHUNK = 8
#: How long the writer's last act on a loop that is ending (closing its connections) may take.
_TEARDOWN_TIMEOUT = 2.0
#: The writer's pause after an error it did not expect, before its next cycle.
_ERROR_PAUSE = 0.05


@dataclass(frozen=True, slots=True)
class WriterConfig:
    """What a :class:`Writer` is told once, by the ``SqlSink`` that makes it (see its parameters)."""

    url: URL
    schema: str | None
    filter: EventFilter
    redact: Redactor | None
    owner: str
    flush_every: int
    flush_interval: float
    max_buffered: int
    max_payload_bytes: int
    close_timeout: float
    auto_migrate: bool | None
    busy_timeout: float
    statement_timeout: float | None
    connect_timeout: float
    pooler_safe: bool

    @property
    def write_timeout(self) -> float:
        """Every database round trip is bounded: the database's own timeouts come first, this
        is the backstop for a peer that went silent."""
        return self.connect_timeout + self.busy_timeout + 2 * (self.statement_timeout or 60.0) + 5.0

    @property
    def prepare_timeout(self) -> float:
        """Checking (or creating) the schema takes a few round trips more than a write."""
        return 3 * self.write_timeout


@dataclass(slots=True)
class Outage:
    """The writer's view of the database being away: set by a write that found it so."""

    #: Why (once per outage, logged); None while the database takes writes.
    reason: str | None = None
    #: Before this (time.monotonic()), every batch goes straight to the spool.
    retry_at: float = 0.0
    #: The next back-off, doubling from half a second to half a minute.
    backoff: float = 0.5


class Writer:
    """The sink's writer: the recorders' :class:`~eventguard.sink.recorder.RecorderSink`, one
    writer task per event loop, the spool's replay and the quarantine.

    ``config``: what the sink was built with; ``spool``: where batches go while the database is
    away; ``stats``: the sink's counts (the writer adds to them).
    """

    def __init__(self, config: WriterConfig, spool: Spool, stats: SinkStats) -> None:
        self.config = config
        # What the recorders read (the RecorderSink protocol), and the hot path's bounds.
        self.filter = config.filter
        self.redact = config.redact
        self.owner = config.owner
        self.close_timeout = config.close_timeout
        self.max_payload_bytes = config.max_payload_bytes
        self.flush_every = config.flush_every
        self.max_buffered = config.max_buffered
        self.spool = spool
        self.stats = stats
        self.report = Reporter(stats, _db.url_secrets(config.url))
        self.loops = Loops(lambda: self.name, self._take_unbound)
        self.replayer = Replayer(self, self.loops, lambda: self.name)
        self.quarantine_file = QuarantineFile(
            lambda: quarantine.file_path(self.spool.path), self.report, self.writing, self._wake_up
        )
        self.outage = Outage()
        self.closed = False
        #: An engine asked for outside any event loop; the first loop to use the sink takes it.
        self._unbound: AsyncEngine | None = None
        self._work: list[SqlRecorder] = []
        self._buffered = 0
        self._ready = False

    @property
    def name(self) -> str:
        """The sink's name in log lines and task names (its URL without the password)."""
        return f"SqlSink({_db.safe_url(self.config.url)!r})"

    # -- engines, one per event loop ---------------------------------------------------------------
    @property
    def engine(self) -> AsyncEngine:
        """The current event loop's engine (each loop has its own: a pool is bound to its loop)."""
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            if self._unbound is None:
                self._unbound = self._new_engine()
            return self._unbound
        st = self.loops.here()
        if st.engine is None:
            st.engine = self._new_engine()
        return st.engine

    def _take_unbound(self) -> AsyncEngine | None:
        engine, self._unbound = self._unbound, None
        return engine

    def _new_engine(self) -> AsyncEngine:
        config = self.config
        return _db.create_engine(
            config.url,
            schema=config.schema,
            busy_timeout_ms=int(config.busy_timeout * 1000),
            pooler_safe=config.pooler_safe,
            connect_timeout=config.connect_timeout,
            statement_timeout=config.statement_timeout,
            # The server takes any text there but a NUL (nor can asyncpg send a lone surrogate).
            application_name=quarantine.text(f"eventguard {config.owner}"),
        )

    # -- the sink's lifecycle ----------------------------------------------------------------------
    async def start(self) -> None:
        """Check (or create) the schema and start the writer task; see ``SqlSink.start``."""
        st = self.loops.here()
        async with st.lock, asyncio.timeout(self.config.prepare_timeout):
            await self._prepare()
        self.ensure_writer()

    def recorder(self, lifecycle: Lifecycle) -> SqlRecorder:
        """A new stream's recorder, its writer task started on this loop."""
        if self.closed:
            raise RuntimeError(f"{self.name} is closed")
        self.ensure_writer()
        rec = SqlRecorder(self, lifecycle)
        self._enqueue(rec)
        return rec

    async def flush(self) -> None:
        """Write everything buffered so far (or spool, or quarantine it) before returning."""
        self.loops.here()
        await self.cycle(self._take_work())
        await self.quarantine_file.drain()

    async def replay_spool(self) -> ReplayResult:
        """See ``SqlSink.replay_spool``."""
        return await self.replayer.replay_spool()

    async def close(self) -> None:
        """Final flush of every stream, stop the writer, release connections; see ``SqlSink.aclose``."""
        if self.closed:
            return
        st = self.loops.here()
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
        self.closed = True
        for other in self.loops.states:
            engine, other.engine = other.engine, None
            if engine is None:
                continue
            try:
                if other is st:
                    async with asyncio.timeout(self.config.write_timeout):
                        await engine.dispose()
                else:
                    # Another loop's connections cannot be closed from here: forget them.
                    await engine.dispose(close=False)
            except Exception as exc:
                log.warning("eventguard sink: closing connections: %s", self.report.why(exc))
        if self._unbound is not None:
            await self._unbound.dispose(close=False)
            self._unbound = None

    async def _stop(self, task: asyncio.Task[Any], *, cancel: bool) -> None:
        """Let ``task`` end (or cancel it), within bounds; its own errors are not ours to raise
        (the writer reports its own). Our caller's cancellation propagates."""
        if task.done():
            return
        write_timeout = self.config.write_timeout
        if cancel:
            task.cancel()
        else:
            # The writer finishes the cycle it is in: every database call in it is bounded.
            await asyncio.wait([task], timeout=write_timeout + self.close_timeout)
            if task.done():
                return
            log.error("eventguard sink: the writer did not stop in time; cancelled (its work is spooled)")
            task.cancel()
        await asyncio.wait([task], timeout=_TEARDOWN_TIMEOUT + write_timeout)

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
            self.loops.wake.set()
            if self._buffered >= self.max_buffered:
                self._overflow()

    def note_change(self, rec: SqlRecorder) -> None:
        """A recorder's lifecycle changed: the writer is woken."""
        self._enqueue(rec)
        self.loops.wake.set()

    def note_close(self, rec: SqlRecorder) -> None:
        """A recorder is closing: the writer is woken; with no writer, what it holds is spooled."""
        self._enqueue(rec)
        self.loops.wake.set()
        if not self.writing():
            # No writer (the sink was closed, or the loop that ran it is gone): keep it locally.
            self.spool_now(rec, "the sink's writer is not running")

    def _wake_up(self) -> None:
        self.loops.wake.set()

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
        self.to_spool(batches, None)

    def writing(self) -> bool:
        """Whether the current loop's writer task is alive: it will store, or keep, what it was given."""
        return self.loops.writing()

    def spool_now(self, rec: SqlRecorder, why: str) -> None:
        """Keep what a closing recorder still holds in the spool file (its final flush cannot happen)."""
        batch = self._collect(rec)
        batches = [*rec.inflight, *([batch] if batch is not None else [])]
        if batches:
            log.warning("eventguard sink: %s; %d batches kept in %s", why, len(batches), self.spool.path)
            self.to_spool(batches, None)
        self._finish(rec)

    def unexpected(self, exc: BaseException, where: str) -> None:
        """An error the writer did not expect (``exc``, in ``where``): counted, logged once per kind."""
        self.report.unexpected(exc, where)

    # -- the writer task -------------------------------------------------------------------------
    def ensure_writer(self) -> LoopState:
        """The running loop's state, its writer task started if it is not running."""
        st = self.loops.here()
        if st.task is None or st.task.done():
            st.stopping = False
            st.task = st.loop.create_task(self._run(st), name=f"eventguard-writer {self.name}")
            st.task.add_done_callback(self._writer_done)
            if self._ready:
                self.replayer.soon()  # what an earlier writer of this sink left in the spool
        return st

    def _writer_done(self, task: asyncio.Task[None]) -> None:
        # The writer catches everything but cancellation; should anything escape all the same,
        # it is said here (with the traceback) rather than as "Task exception was never retrieved".
        if not task.cancelled() and (exc := task.exception()) is not None:
            self.unexpected(exc, "the writer task ended")

    async def _run(self, st: LoopState) -> None:
        try:
            while True:
                if not st.stopping:
                    timeout = self.config.flush_interval if self._work else None
                    try:
                        async with asyncio.timeout(timeout):
                            await st.wake.wait()
                    except TimeoutError:
                        pass
                st.wake.clear()
                recorders = self._take_work()
                try:
                    if recorders:
                        await self.cycle(recorders)
                    await self.quarantine_file.drain()
                except Exception as exc:  # the writer never dies: say it once, carry on
                    self.unexpected(exc, "a write cycle")
                    await asyncio.sleep(_ERROR_PAUSE)  # a bug that repeats must not spin
                if st.stopping:
                    return  # close() does the last flush itself
        except asyncio.CancelledError:
            # The loop is ending (asyncio.run() cancels every task): keep what still waits, and
            # close this loop's connections while the loop can still run their goodbyes.
            self._keep_waiting_work()
            self.quarantine_file.drain_now()
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
            self.to_spool(batches, None)
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
            self.quarantine_file.keep([record], "the stream's work could not be collected")
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

    async def cycle(self, recorders: Sequence[SqlRecorder]) -> None:
        """One turn of the writer: take ``recorders``' work as batches and :meth:`persist` them;
        a recorder that is closing and has nothing left is told it is finished."""
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
                await self.persist(batches)
        except asyncio.CancelledError:
            # Cancelled mid-write (the loop is ending): what is not known to be written is kept.
            self.to_spool(batches, None)
            raise
        except Exception as exc:  # a bug: persist keeps everything itself, or should
            self.unexpected(exc, "a write")
            self.to_spool(batches, None)
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

    async def persist(self, batches: list[Batch]) -> None:
        """Store ``batches`` in one transaction, or keep them: in the spool during an outage (or
        its back-off), in the quarantine what the database refuses. Never raises for either."""
        st = self.loops.here()
        async with st.lock:
            if time.monotonic() < self.outage.retry_at:
                self.to_spool(batches, None)
                return
            await self._serialise(batches)
            try:
                await self.ensure_ready()
            except Exception as exc:
                self.to_spool(batches, exc)
                return
            tally = Tally()
            try:
                await self.apply(batches, tally)
            except Stopped as stop:
                self.to_spool(stop.batches, stop.cause)
                return
            finally:
                self.report.refused(tally.refusals)
            self.recovered()

    # -- serialising events -----------------------------------------------------------------------
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
            await self.quarantine(refused)

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

    # -- outages, the spool ---------------------------------------------------------------------------
    def to_spool(self, batches: list[Batch], exc: BaseException | None) -> None:
        """Keep ``batches`` in the spool (``exc``: the outage that sent them there, logged once).

        Never raises: a batch the spool cannot take goes to the quarantine file, with the reason.
        """
        if exc is not None:
            text = self.report.why(exc)
            self.stats.last_error = text
            self._ready = False  # look at the schema again before the next write
            outage = self.outage
            outage.retry_at = time.monotonic() + outage.backoff
            outage.backoff = min(outage.backoff * 2, 30.0)
            if outage.reason is None:
                # Once per outage, with the reason; the URL without its password.
                outage.reason = text
                log.error(
                    "eventguard sink: cannot write to %s (%s); spooling to %s until it is back",
                    _db.safe_url(self.config.url),
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
            self.quarantine_file.keep(refused, "events that could not be serialised were being spooled")
        try:
            self.stats.batches_spooled += self.spool.append(batches)
            self.replayer.spooled = True
            return
        except Exception as exc:
            first: Exception = exc
        failed: list[tuple[Batch, Exception]] = []
        for batch in batches:  # one by one: keep every batch the spool can take
            try:
                self.stats.batches_spooled += self.spool.append([batch])
                self.replayer.spooled = True
            except Exception as err:
                failed.append((batch, err))
        if not failed:
            return
        self.report.say(
            "unspoolable",
            "eventguard sink: %d of %d batches could not be spooled (%s); they go to the quarantine file",
            len(failed),
            len(batches),
            self.report.why(first),
        )
        why = self.outage.reason or "the database did not take it"
        redacted = self.redact is not None
        records = []
        for batch, problem in failed:
            text = f"could not be spooled ({reason(problem)}); {why}"
            records.append(quarantine.of_batch(batch, "write", text, redacted=redacted))
        self.stats.quarantined += len(records)
        self.quarantine_file.keep(records, "the spool could not take them")

    def recovered(self) -> None:
        """A write went through: the outage (if any) is over, and what was spooled is replayed."""
        outage = self.outage
        outage.backoff = 0.5
        if outage.reason is not None:
            log.warning(
                "eventguard sink: %s is back; replaying %s in the background",
                _db.safe_url(self.config.url),
                self.spool.path,
            )
            outage.reason = None
            self.replayer.soon()
        elif self.replayer.due():
            # Spooled without an outage (an overflow, a stream cut short), or left by a replay
            # that could not finish: a write just went through, so replay it now, not at restart.
            self.replayer.soon()

    async def ensure_ready(self, *, replay: bool = True) -> None:
        """Check the schema before a write if it has not been (or must be again); ``replay``:
        then replay a spool left from before (False: a replay is what asks)."""
        if not self._ready:
            async with asyncio.timeout(self.config.prepare_timeout):
                await self._prepare(replay=replay)

    async def _prepare(self, *, replay: bool = True) -> None:
        """Check the schema, creating it first in an empty database when allowed; then (unless
        ``replay`` is False: a replay is what asks) replay a spool left from before, in the
        background."""
        auto_migrate = self.config.auto_migrate
        try:
            await _migrate.check(self.engine)
        except SchemaMismatchError as exc:
            if not exc.current and auto_migrate is not False and not await self._has_tables():
                try:
                    await _migrate.upgrade(self.engine)
                except SQLAlchemyError:
                    # Another replica may have created it at the same moment: look again.
                    await _migrate.check(self.engine)
            elif exc.current and auto_migrate is True:
                await _migrate.upgrade(self.engine)
            else:
                raise
        self._ready = True
        if replay:
            self.replayer.soon()

    async def _has_tables(self) -> bool:
        async with self.engine.connect() as conn:
            return await conn.run_sync(lambda c: inspect(c).has_table(responses.name))

    # -- writing, and isolating what the database refuses ------------------------------------------
    async def _write(self, batches: Sequence[Batch], *, rows: bool = True) -> Written:
        for batch in batches:
            batch.serialise()  # no-op unless the caller skipped _serialise
        async with asyncio.timeout(self.config.write_timeout), self.engine.begin() as conn:
            written = await write(conn, batches, rows=rows, replay=REPLAYING.get())
        if rows:
            self.stats.batches_written += len(batches) - len(written.duplicates)
        self.stats.events_written += written.events
        if written.duplicates:
            self.stats.duplicates += len(written.duplicates)
            self.stats.quarantined += written.quarantined
            for dup in written.duplicates:
                log.warning("eventguard sink: %s", quarantine.text(dup.reason))
        return written

    async def apply(self, batches: list[Batch], tally: Tally) -> None:
        """Write ``batches``, adding what it came to to ``tally``; a group the database refuses
        for its content is split until the refused batches are isolated (then :meth:`_isolate`).
        Raises :class:`~eventguard.sink.apply.Stopped` on an outage, with the batches not known
        to be written."""
        todo: list[list[Batch]] = [batches]
        while todo:
            group = todo.pop()
            try:
                written = await self._write(group)
            except Exception as exc:
                if await self._kind(exc) is not ErrorKind.DATA:
                    raise Stopped(exc, [*group, *(b for g in reversed(todo) for b in g)]) from exc
                if len(group) > 1:
                    half = len(group) // 2
                    todo += [group[half:], group[:half]]  # the first half next: order kept
                    continue
                try:
                    await self._isolate(group[0], exc, tally)
                except Stopped as stop:
                    stop.batches += [b for g in reversed(todo) for b in g]
                    raise
                tally.batches += 1
                continue
            tally.batches += len(group)
            tally.events += written.events
            tally.quarantined += written.quarantined
            tally.refusals += written.refusals

    async def _isolate(self, batch: Batch, refused_by: Exception, tally: Tally) -> None:
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
                raise Stopped(exc, [batch]) from exc
            try:
                written = await self._write([replace(head, anomalies=[])])
            except Exception as exc2:
                if await self._kind(exc2) is not ErrorKind.DATA:
                    raise Stopped(exc2, [batch]) from exc2
                why = f"the database refused the response row: {reason(exc2)}"
                tally.quarantined += await self.quarantine(
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
            tally.quarantined += await self.quarantine([record])
            return
        events, anomalies = await self._bisect(batch, list(batch.events), loose, tally)
        if events or anomalies:
            why = (
                f"the database refused {len(events)} event(s) and {len(anomalies)} anomaly(ies) of the "
                f"batch ({reason(refused_by)}); the rest of it is stored"
            )
            record = quarantine.of_batch(batch, "write", why, events=events, anomalies=anomalies, whole=False)
            tally.quarantined += await self.quarantine([record], note=(batch, why))

    async def _bisect(
        self, batch: Batch, events: list[Any], anomalies: list[dict[str, Any]], tally: Tally
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
                    raise Stopped(exc, [batch]) from exc
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
            async with asyncio.timeout(self.config.connect_timeout + 5.0), self.engine.connect() as conn:
                await conn.exec_driver_sql("SELECT 1")
        except Exception:
            return False
        return True

    # -- the quarantine ------------------------------------------------------------------------------
    async def quarantine(
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
                async with asyncio.timeout(self.config.write_timeout), self.engine.begin() as conn:
                    kept = await quarantine.insert(conn, records, once=REPLAYING.get())
                    if with_note and note is not None:
                        await note_refused(conn, note[0], quarantine.text(note[1]), records[0].record)
                self.stats.quarantined += kept
                return kept
            except Exception as exc:
                error = exc
        assert error is not None
        self.stats.quarantined += len(records)
        why = f"the quarantine table could not be written ({self.report.why(error)})"
        await self.quarantine_file.keep_async(records, why)
        return len(records)
