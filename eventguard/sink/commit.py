"""Committing batches: one transaction per group, and what the database refuses isolated.

The writer (:mod:`eventguard.sink.writer`) and a replay of the spool (:mod:`eventguard.sink.replay`)
hand groups of batches to :meth:`Committer.apply`. A group the database refuses for its content
(a NUL in a TEXT column, a value out of range, a constraint: :mod:`eventguard.sql.classify` says
which errors mean that) is split in halves until the refused batches are isolated, then within a
refused batch its events and anomalies, so everything the database takes is written at once;
what it refuses goes to the quarantine table with the reason (:meth:`Committer.quarantine`), with
a ``sink_refused`` anomaly on the response when its row is there, or to the quarantine file when
even that table cannot be written. An outage is never taken for refused content: it stops the
write with :class:`~eventguard.sink.apply.Stopped`, holding the batches not known to be written.
"""

from __future__ import annotations

import asyncio
import contextvars
import itertools
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any, Protocol, cast

from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine
from sqlalchemy.pool import NullPool

from eventguard.sink import quarantine
from eventguard.sink.apply import Renumbered, Stopped, Tally, Written, note_refused, write
from eventguard.sink.batch import Batch
from eventguard.sink.quarantine import QuarantineRecord
from eventguard.sink.quarantine_file import QuarantineFile
from eventguard.sink.report import Reporter, SinkStats, log
from eventguard.sql.classify import ErrorKind, classify, is_transient_conflict, reason
from eventguard.sql.engine import BorrowedEngine
from eventguard.sql.sqlite_thread import SqliteConnection, SqliteThread, drive

__all__ = ["CONFLICT_TRIES", "REPLAYING", "Committer", "Timeouts"]

#: How many times a write is tried when the server rolls it back for meeting another writer (a
#: deadlock, a serialization failure) before it counts as an outage and is spooled.
CONFLICT_TRIES = 5

#: Set while this task replays the spool: a quarantine record already there is not inserted
#: again (a file an outage stopped is replayed again from its start).
REPLAYING: contextvars.ContextVar[bool] = contextvars.ContextVar("eventguard_replaying", default=False)


class Timeouts(Protocol):
    """The bounds a committer keeps to (the writer's configuration)."""

    @property
    def write_timeout(self) -> float: ...
    @property
    def connect_timeout(self) -> float: ...


class Committer:
    """Writes groups of batches, each in a transaction, isolating and quarantining what is refused.

    ``engine``: the current loop's engine; ``config``: the timeouts; ``stats``, ``report``: the
    sink's counts and log; ``file``: the quarantine file, when the table cannot be written;
    ``schema_changed``: called when an error says the schema must be looked at again;
    ``encode``: serialises what is left of a batch's events; ``renumbered``: told when a batch
    is stored under other attempt numbers (its recorder is renumbered); ``thread``: the SQLite
    writer thread the transactions go to (None: through ``engine``, PostgreSQL and in-memory SQLite).
    """

    def __init__(
        self,
        engine: Callable[[], AsyncEngine],
        config: Timeouts,
        stats: SinkStats,
        report: Reporter,
        file: QuarantineFile,
        schema_changed: Callable[[], None],
        encode: Callable[[Batch], None],
        renumbered: Renumbered,
        thread: Callable[[], SqliteThread | None] = lambda: None,
    ) -> None:
        self._engine = engine
        self._thread = thread
        self._config = config
        self._stats = stats
        self._report = report
        self._file = file
        self._schema_changed = schema_changed
        self._encode = encode
        self._renumbered = renumbered

    async def _write(self, batches: Sequence[Batch], *, rows: bool = True) -> Written:
        for batch in batches:
            self._encode(batch)  # no-op unless the caller skipped serialising
        replay = REPLAYING.get()
        # A replayed batch's recorder (if it still runs) is not renumbered by it: its own next
        # batch is, when it is written.
        renumbered = None if replay else self._renumbered
        thread = self._thread()
        started = time.perf_counter()  # for stats.on_write: the write-duration metric
        for tries in itertools.count(1):
            try:
                async with asyncio.timeout(self._config.write_timeout):
                    if thread is None and self._direct():
                        written = await self._on_driver(
                            batches, rows=rows, replay=replay, renumbered=renumbered
                        )
                    elif thread is None:
                        async with self._engine().begin() as conn:
                            written = await write(
                                conn, batches, rows=rows, replay=replay, renumbered=renumbered
                            )
                    else:
                        written = await self._on_thread(
                            thread, batches, rows=rows, replay=replay, renumbered=renumbered
                        )
                break
            except Exception as exc:
                # Two writers met (two replicas' cycles touching the same rows): the server rolled
                # one back. That is no outage: done again it goes through, where spooling it
                # would hold the stream's history back until the next replay.
                if tries >= CONFLICT_TRIES or not is_transient_conflict(exc):
                    raise
                self._stats.conflicts_retried += 1
                log.debug("eventguard sink: %s; writing again", self._report.why(exc))
                await asyncio.sleep(random.uniform(0.0, 0.01 * tries))
        if self._stats.on_write is not None:
            self._stats.on_write(time.perf_counter() - started)
        if rows:
            self._stats.batches_written += len(batches) - len(written.duplicates)
        self._stats.events_written += written.events
        if written.duplicates:
            self._stats.duplicates += len(written.duplicates)
            self._stats.quarantined += written.quarantined
            for dup in written.duplicates:
                log.warning("eventguard sink: %s", quarantine.text(dup.reason))
        return written

    async def _on_driver(
        self, batches: Sequence[Batch], *, rows: bool, replay: bool, renumbered: Renumbered | None
    ) -> Written:
        """PostgreSQL: the common case straight on asyncpg (:mod:`eventguard.sink.direct`), else
        the general path in a transaction of SQLAlchemy's, on the same connection. A connection
        found dead, or left inside a transaction (a cancelled write), leaves the pool: the engine
        does not ping before each checkout, so this is where a dead one is found."""
        async with self._engine().connect() as conn:
            try:
                written = await write(
                    conn, batches, rows=rows, replay=replay, renumbered=renumbered, own_transaction=True
                )
            except BaseException:
                await _drop_if_unusable(conn)
                raise
        return written

    @staticmethod
    async def _on_thread(
        thread: SqliteThread,
        batches: Sequence[Batch],
        *,
        rows: bool,
        replay: bool,
        renumbered: Renumbered | None,
    ) -> Written:
        """The same statements in one transaction on the SQLite writer thread: the event loop
        only hands it over. A recorder is renumbered here, on the loop, once the write is
        back (a recorder is the loop's: the thread never touches one)."""
        told: list[tuple[Batch, int, int, str]] = []

        def note(batch: Batch, attempt: int, shift: int, stream: str) -> None:
            told.append((batch, attempt, shift, stream))

        def job(conn: SqliteConnection) -> Written:
            # write() awaits only the connection, which never suspends on the thread.
            as_async = cast(AsyncConnection, conn)
            told_to = None if renumbered is None else note
            return drive(write(as_async, batches, rows=rows, replay=replay, renumbered=told_to))

        try:
            return await thread.transaction(job)
        finally:
            if renumbered is not None:
                for args in told:
                    renumbered(*args)

    def _direct(self) -> bool:
        """Whether this engine's writes may go straight to asyncpg: PostgreSQL with a pool of
        its own (a borrowed engine sets its schema per transaction of SQLAlchemy's; ``pooler_safe``
        has no pool, so no staging table)."""
        engine = self._engine()
        return (
            engine.dialect.name == "postgresql"
            and not isinstance(engine, BorrowedEngine)
            and not isinstance(engine.pool, NullPool)
        )

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
            self._report.unexpected(exc, "a write")
            kind = ErrorKind.DATA if await self._reachable() else ErrorKind.OUTAGE
        if kind is ErrorKind.SCHEMA:
            self._schema_changed()  # look at the schema again before the next write
        return kind

    async def _reachable(self) -> bool:
        try:
            async with asyncio.timeout(self._config.connect_timeout + 5.0), self._engine().connect() as conn:
                await conn.exec_driver_sql("SELECT 1")
        except Exception:
            return False
        return True

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
                async with asyncio.timeout(self._config.write_timeout), self._engine().begin() as conn:
                    kept = await quarantine.insert(conn, records, once=REPLAYING.get())
                    if with_note and note is not None:
                        await note_refused(conn, note[0], quarantine.text(note[1]), records[0].record)
                self._stats.quarantined += kept
                return kept
            except Exception as exc:
                error = exc
        assert error is not None
        self._stats.quarantined += len(records)
        why = f"the quarantine table could not be written ({self._report.why(error)})"
        await self._file.keep_async(records, why)
        return len(records)


async def _drop_if_unusable(conn: AsyncConnection) -> None:
    """Take ``conn`` out of the pool if its asyncpg connection is closed or still inside a
    transaction (SQLAlchemy drops a connection on the disconnects it sees itself; the direct
    path's errors never pass through it). Never raises: the write's own error is the one to see."""
    if conn.invalidated:
        return
    try:
        driver = (await conn.get_raw_connection()).driver_connection
        if driver is None or driver.is_closed() or driver.is_in_transaction():
            await conn.invalidate()
    except BaseException:  # cancelled or broken: the pool's own checks remain
        return
