"""The writer: the sink's one task per event loop, which takes every recorder's work and stores it.

One writer task (not one per stream): it batches every stream's pending work into one
transaction per cycle, which is what SQLite wants (a single writer path) and cheap for
PostgreSQL. The guard's hot path only appends references (:meth:`Writer.note_event`); the writer
takes them as batches and serialises them (:mod:`eventguard.sink.collect`), then commits them
(:mod:`eventguard.sink.commit`; the statements are :func:`eventguard.sink.apply.write`'s).

What the writer does with a failed write depends on what the error means
(:mod:`eventguard.sql.classify`):

- **The database is away** (unreachable, locked, out of disk, a schema to migrate): the batches go
  to the spool, the writer backs off, and the spool is replayed in the background as soon as a
  write succeeds again (and when the sink starts): :mod:`eventguard.sink.replay`.
- **The database refused the content** (a NUL in a TEXT column, a value out of range, a
  constraint): never an outage. What it refuses is isolated and goes to the quarantine with the
  reason; the rest is written at once (:mod:`eventguard.sink.commit`). Healthy batches are
  neither delayed nor spooled.
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
import contextvars
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy.engine import URL
from sqlalchemy.ext.asyncio import AsyncEngine

from eventguard.lifecycle import ENDED_STATES, Lifecycle
from eventguard.sink import quarantine
from eventguard.sink.apply import Stopped, Tally
from eventguard.sink.batch import Batch
from eventguard.sink.collect import Collector, finish
from eventguard.sink.commit import Committer
from eventguard.sink.filter import EventFilter
from eventguard.sink.loops import Loops, LoopState
from eventguard.sink.quarantine_file import QuarantineFile
from eventguard.sink.recorder import SqlRecorder
from eventguard.sink.replay import Replayer, ReplayResult
from eventguard.sink.report import Reporter, SinkStats, log
from eventguard.sink.serialise import Redactor
from eventguard.sink.spool import Spool
from eventguard.sql import engine as _db
from eventguard.sql import migrate as _migrate
from eventguard.sql.classify import reason
from eventguard.sql.sqlite_thread import SqliteThread
from eventguard.sql.tables import responses

__all__ = ["Outage", "Writer", "WriterConfig"]

#: How long the writer's last act on a loop that is ending (closing its connections) may take.
_TEARDOWN_TIMEOUT = 2.0
#: The writer's pause after an error it did not expect, before its next cycle.
_ERROR_PAUSE = 0.05
#: How often a start() or a second close() looks whether a close under way has ended.
_CLOSE_POLL = 0.005


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
    #: The application's engine (``SqlSink(engine=...)``): borrowed, never disposed.
    borrowed: AsyncEngine | None = None

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
        self.quarantine_file = QuarantineFile(
            lambda: quarantine.file_path(self.spool.path), self.report, self.writing, self._wake_up
        )
        self.collector = Collector(
            config.redact,
            stats,
            self.report,
            self.quarantine_file,
            lambda records: self.committer.quarantine(records),
        )
        self.committer = Committer(
            lambda: self.engine,
            config,
            stats,
            self.report,
            self.quarantine_file,
            self._schema_changed,
            self.collector.encode_rest,
            self.collector.renumbered,
            lambda: self.sqlite_thread,
        )
        self.replayer = Replayer(self, self.committer, self.loops, lambda: self.name)
        self.outage = Outage()
        self.closed = False
        #: An engine asked for outside any event loop; the first loop to use the sink takes it.
        self._unbound: AsyncEngine | None = None
        self._work: list[SqlRecorder] = []
        self._buffered = 0
        self._ready = False
        #: The loop a ``close()`` is running on, while it runs (see :meth:`writing`).
        self._closing: asyncio.AbstractEventLoop | None = None
        #: SQLite (a file): the thread every write transaction runs on, off the event loop
        #: (:mod:`eventguard.sql.sqlite_thread`); None on PostgreSQL, where asyncpg's protocol
        #: is the loop's own I/O.
        self.sqlite_thread: SqliteThread | None = _db.sqlite_writer(
            config.url, busy_timeout_ms=int(config.busy_timeout * 1000)
        )

    @property
    def ready(self) -> bool:
        """The schema was checked (or created) and the writer may write."""
        return self._ready

    @property
    def buffered(self) -> int:
        """Events recorded and not yet taken: the queue depth the hot path keeps in ``_buffered``."""
        return self._buffered

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
        if config.borrowed is not None:
            return _db.borrow_engine(
                config.borrowed,
                schema=config.schema,
                busy_timeout_ms=int(config.busy_timeout * 1000),
                statement_timeout=config.statement_timeout,
            )
        return _db.create_engine(
            config.url,
            schema=config.schema,
            busy_timeout_ms=int(config.busy_timeout * 1000),
            pooler_safe=config.pooler_safe,
            connect_timeout=config.connect_timeout,
            statement_timeout=config.statement_timeout,
            # The server takes any text there but a NUL (nor can asyncpg send a lone surrogate).
            application_name=quarantine.text(f"eventguard {config.owner}"),
            # No ping per checkout (two round trips a transaction): a connection that died in
            # the pool fails its write, which is dropped from the pool, and the batches go to
            # the spool and are replayed on the next connection (see
            # tests/sink/test_a_killed_connection_loses_nothing.py).
            pre_ping=False,
        )

    # -- the sink's lifecycle ----------------------------------------------------------------------
    async def start(self) -> None:
        """Check (or create) the schema and start the writer task; see ``SqlSink.start``. A closed
        sink opens again (an app's second lifespan): its engines, its SQLite thread and its writer
        task are made anew as for a first start."""
        # A start() that comes while aclose() runs reopens the sink once the close has ended: begun
        # halfway through, the close went on to mark the sink closed and release its engines under
        # the writer task this start had made, which ran on with nothing to write to.
        await self._close_ended()
        st = self.loops.here()
        self.closed = False
        async with st.lock, asyncio.timeout(self.config.prepare_timeout):
            await self._prepare()
        if self._closing is not None or self.closed:
            return  # an aclose() that came while this start prepared comes after it: it stands
        self.ensure_writer()

    def recorder(self, lifecycle: Lifecycle) -> SqlRecorder:
        """A new stream's recorder, its writer task started on this loop."""
        if self.closed:
            raise RuntimeError(f"{self.name} is closed")
        if self._closing is not None:
            # Its writer task would outlive the close (which has already stopped this loop's).
            raise RuntimeError(f"{self.name} is closing")
        self.ensure_writer()
        rec = SqlRecorder(self, lifecycle)
        self.collector.adopt(rec)
        # Not queued yet: its row is written with its first change (the guard's first step or
        # close makes one). Queued here, a guard dropped before its first step, which nothing
        # ends, left its row 'new' for good.
        return rec

    async def flush(self) -> None:
        """Write everything buffered so far (or spool, or quarantine it) before returning."""
        st = self.loops.here()
        await self.cycle(self._take_work())
        # The writer task may have taken work before this flush (and left nothing to take): its
        # write holds, or waits in line for, the loop's lock, so passing the lock once waits for
        # it. (Taking work and entering persist's lock has no await between them.)
        async with st.lock:
            pass
        await self.quarantine_file.drain()

    async def replay_spool(self) -> ReplayResult:
        """See ``SqlSink.replay_spool``."""
        return await self.replayer.replay_spool()

    async def close(self) -> None:
        """Final flush of every stream, stop the writer, release connections; see ``SqlSink.aclose``."""
        if self._closing is not None:
            await self._close_ended()  # a second aclose() returns when the first has closed
            return
        if self.closed:
            return
        try:
            await self._close()
        finally:
            self._closing = None  # cancelled halfway: the recorders see the writer gone again

    async def _close_ended(self) -> None:
        """Return once a ``close()`` under way (on this loop or another) has ended. Polled: a close
        is rare and short, and an ``asyncio.Event`` could only be awaited from the close's own loop.
        Bounded by what the close's own steps may take (each is bounded); a close whose loop has
        ended without finishing it is not waited for."""
        config = self.config
        bound = 4 * config.write_timeout + 2 * self.close_timeout + 2 * _TEARDOWN_TIMEOUT
        try:
            async with asyncio.timeout(bound):
                while (closing := self._closing) is not None and not closing.is_closed():  # noqa: ASYNC110
                    await asyncio.sleep(_CLOSE_POLL)
        except TimeoutError:
            raise RuntimeError(f"{self.name}: a close under way did not end within {bound:.0f} s") from None
        self._closing = None

    async def _close(self) -> None:
        st = self.loops.here()
        # A recorder whose final flush outlived its close_timeout (a thousand streams closing at
        # once) keeps waiting while this close runs: its work is taken by the final flush below,
        # not spooled as if the writer were gone (the writer task is detached just after this).
        self._closing = st.loop
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
        await self._replay_before_closing()
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
        if self.sqlite_thread is not None:
            await self.sqlite_thread.close()

    async def _replay_before_closing(self) -> None:
        """Load what was spooled while the database took writes (an overflow spill, a replay the
        close stopped) before the sink closes, within ``close_timeout``: a short-lived job's events
        were left out of a healthy database until the next start. In an outage, or past the bound,
        they stay in the spool (the next start, or ``eventguard spool replay``, loads them)."""
        away = self.outage.reason is not None or self.outage.retry_at > time.monotonic()
        if away or not self.replayer.spooled:
            return
        try:
            async with asyncio.timeout(self.close_timeout):
                await self.replayer.run()
        except Exception as exc:  # TimeoutError included; a cancel of the close goes through
            log.warning(
                "eventguard sink: closing with %s not yet replayed (%s); the next start replays it",
                self.spool.path,
                self.report.why(exc),
            )

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
        if not rec.queued:  # _enqueue, inlined: a call per event shows in the benchmark
            rec.queued = True
            self._work.append(rec)
            # Once per stream and cycle: an idle writer waits with no timeout, and events fewer
            # than flush_every (a stream that paused for a tool call) must not wait for ever.
            self._wake_soon()
        buffered = self._buffered = self._buffered + 1
        if buffered >= self.flush_every:
            self.loops.wake.set()
            if buffered >= self.max_buffered:
                self._overflow()

    def note_change(self, rec: SqlRecorder) -> None:
        """A recorder's lifecycle changed: the writer is woken at once when it ended (a terminal,
        an interruption), else within ``flush_interval``: the changes of a short response (its
        creation, ``in_progress``, its events, its end) go in one transaction, not one each."""
        self._enqueue(rec)
        if rec.lifecycle.state in ENDED_STATES:
            self.loops.wake.set()
        else:
            self._wake_soon()

    def _wake_soon(self) -> None:
        st = self.loops.live
        if st is None:
            self.loops.wake.set()
        elif st.soon is None:
            st.soon = st.loop.call_later(self.config.flush_interval, self._woken_soon, st)

    @staticmethod
    def _woken_soon(st: LoopState) -> None:
        st.soon = None
        st.wake.set()

    def note_close(self, rec: SqlRecorder) -> None:
        """A recorder is closing: the writer is woken; with no writer, what it holds is spooled.
        With nothing left to take, no cycle is needed: it is finished now, or by the cycle that
        is writing its last batch."""
        if not rec.has_work():
            # The common case: the terminal's cycle took the stream's last work before the guard
            # closed it. A batch is in flight from the moment it is collected (no await between),
            # and the cycle that holds it finishes a closing recorder once it is stored or kept
            # (see cycle()). Waking the writer would only run one more cycle to find nothing (and
            # a close with nothing in flight would wait for that cycle).
            if not rec.inflight:
                finish(rec)
            return
        self._enqueue(rec)
        self.loops.wake.set()
        if not self.writing():
            # No writer (the sink was closed, or the loop that ran it is gone): keep it locally.
            self.spool_now(rec, "the sink's writer is not running")

    def _wake_up(self) -> None:
        self.loops.wake.set()

    def _schema_changed(self) -> None:
        self._ready = False  # look at the schema again before the next write

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
        batches = [b for rec in self._work if (b := self.collector.collect(rec)) is not None]
        self._buffered = sum(len(rec.pending) for rec in self._work)
        self.to_spool(batches, None)

    def writing(self) -> bool:
        """Whether the current loop's writer task is alive, or ``close()`` is under way on this
        loop (its final flush takes what waits): either will store, or keep, what it was given."""
        if self.loops.writing():
            return True
        closing = self._closing
        if closing is None or self.closed:
            return False
        try:
            return closing is asyncio.get_running_loop()
        except RuntimeError:
            return False

    def spool_now(self, rec: SqlRecorder, why: str) -> None:
        """Keep what a closing recorder still holds in the spool file (its final flush cannot happen)."""
        batch = self.collector.collect(rec)
        batches = [*rec.inflight, *([batch] if batch is not None else [])]
        if batches:
            log.warning("eventguard sink: %s; %d batches kept in %s", why, len(batches), self.spool.path)
            self.to_spool(batches, None)
        finish(rec)

    def unexpected(self, exc: BaseException, where: str) -> None:
        """An error the writer did not expect (``exc``, in ``where``): counted, logged once per kind."""
        self.report.unexpected(exc, where)

    # -- the writer task -------------------------------------------------------------------------
    def ensure_writer(self) -> LoopState:
        """The running loop's state, its writer task started if it is not running."""
        st = self.loops.here()
        if st.task is None or st.task.done():
            st.stopping = False
            # In a context of its own: the task is started by whichever response first needs it,
            # and works for every response for the sink's life, so it must not carry that one's
            # context (its span would parent every write a database instrumentation traces).
            # (Made inside an empty context, which the task copies: any loop takes that, where
            # not every one takes create_task's context argument.)
            st.task = contextvars.Context().run(
                st.loop.create_task, self._run(st), name=f"eventguard-writer {self.name}"
            )
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
                if st.soon is not None:  # this cycle takes the work it was set for
                    st.soon.cancel()
                    st.soon = None
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
                    _db.let_go(engine)
            raise

    def _keep_waiting_work(self) -> None:
        batches: list[Batch] = []
        recorders = self._take_work()
        for rec in recorders:
            batches.extend(rec.inflight)
            rec.inflight.clear()
            batch = self.collector.collect(rec)
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
            finish(rec)

    def _take_work(self) -> list[SqlRecorder]:
        recorders = self._work
        self._work = []
        for rec in recorders:
            rec.queued = False
        return recorders

    async def cycle(self, recorders: Sequence[SqlRecorder]) -> None:
        """One turn of the writer: take ``recorders``' work as batches and :meth:`persist` them;
        a recorder that is closing and has nothing left is told it is finished."""
        batches: list[Batch] = []
        for rec in recorders:
            batch = self.collector.collect(rec)
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
                    finish(rec)

    async def persist(self, batches: list[Batch]) -> None:
        """Store ``batches`` in one transaction, or keep them: in the spool during an outage (or
        its back-off), in the quarantine what the database refuses. Never raises for either."""
        st = self.loops.here()
        async with st.lock:
            if time.monotonic() < self.outage.retry_at:
                self.to_spool(batches, None)
                return
            await self.collector.serialise(batches)
            try:
                await self.ensure_ready()
            except Exception as exc:
                self.to_spool(batches, exc)
                return
            tally = Tally()
            try:
                await self.committer.apply(batches, tally)
            except Stopped as stop:
                self.to_spool(stop.batches, stop.cause)
                return
            finally:
                self.report.refused(tally.refusals)
            self.recovered()

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
        refused = self.collector.serialise_now(batches)
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
        """Check the schema, creating it first in an empty database when allowed (decided under
        the migration lock, as ``SqlSink.start`` and the response store decide it:
        ``eventguard.sql.migrate.first_use``); then (unless ``replay`` is False: a replay is what
        asks) replay a spool left from before, in the background."""
        await _migrate.first_use(
            self.engine, auto_migrate=self.config.auto_migrate, marker_table=responses.name
        )
        self._ready = True
        if replay:
            self.replayer.soon()
