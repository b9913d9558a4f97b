"""Taking a recorder's work as a batch, and serialising its events a little at a time.

The writer (:mod:`eventguard.sink.writer`) takes each recorder's work with :meth:`Collector.collect`
(a synchronous snapshot: references only) and serialises the events later, in small steps that
yield the event loop the streams share (:meth:`Collector.serialise`), or in one go before they
are spooled (:meth:`Collector.serialise_now`). Nothing is lost on the way: a recorder whose work
cannot be collected, and an event that cannot be serialised (a redactor that raises), go to the
quarantine with the reason; under a redactor only what identifies them, never their content.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any
from weakref import WeakValueDictionary

from eventguard.sink import quarantine
from eventguard.sink.apply import split_stream
from eventguard.sink.batch import Batch
from eventguard.sink.quarantine import QuarantineRecord
from eventguard.sink.quarantine_file import QuarantineFile
from eventguard.sink.recorder import SqlRecorder
from eventguard.sink.report import Reporter, SinkStats
from eventguard.sink.serialise import Redactor
from eventguard.sql.classify import reason

__all__ = ["Collector", "finish"]

# The writer serialises events on the event loop it shares with the streams: in steps of at
# most _STEP_FLOOR seconds, or _STEP_SHARE of the time the other tasks took meanwhile, checking
# the clock every _ENCODE_CHUNK events (a few microseconds of work). Next to one stream, about one
# loop turn in ten is such a step, so a stream's p99 latency is about a step's length: a floor of
# 15 us checked every 4 events made steps of 20-21 us (median), against 31-34 us at 25 us and 8.
_STEP_FLOOR = 15e-6
_STEP_SHARE = 0.5
_ENCODE_CHUNK = 4


def finish(rec: SqlRecorder) -> None:
    """Tell ``rec`` its work is stored or kept (its ``close()`` returns), if anyone still waits."""
    with contextlib.suppress(RuntimeError):  # its event loop is closed: nobody waits any more
        rec.finished()


class Collector:
    """Takes recorders' work as batches and serialises their events.

    ``redact``: the sink's redactor (what is kept of a failure depends on it); ``stats``,
    ``report``: the sink's counts and log; ``file``: the quarantine file (for what fails on the
    hot path); ``quarantine``: keeps records in the quarantine table (else its file).
    """

    def __init__(
        self,
        redact: Redactor | None,
        stats: SinkStats,
        report: Reporter,
        file: QuarantineFile,
        quarantine: Callable[[list[QuarantineRecord]], Awaitable[int]],
    ) -> None:
        self._redact = redact
        self._stats = stats
        self._report = report
        self._file = file
        self._quarantine = quarantine
        #: Each live recorder by its own stream id (a batch's, without the shift of a renumbering).
        self._takers: WeakValueDictionary[str, SqlRecorder] = WeakValueDictionary()

    def collect(self, rec: SqlRecorder) -> Batch | None:
        """``rec.collect()``; should it raise, what it holds goes to the quarantine file, not lost
        (under a redactor, only what identifies it: see :meth:`_uncollected`)."""
        try:
            batch = rec.collect()
        except Exception as exc:
            self._report.unexpected(exc, "collecting a stream's work")
            lc = rec.lifecycle
            record = quarantine.entry(
                "write",
                f"the stream's work could not be collected: {self._error_text(exc)}",
                self._uncollected(rec),
                response_id=lc.info.response_id,
                attempt=lc.attempt,
                stream_id=getattr(rec, "stream_id", None),
            )
            self._stats.quarantined += 1
            self._file.keep([record], "the stream's work could not be collected")
            if rec.closing:
                finish(rec)  # its close() must not wait for what cannot be collected
            return None
        if batch is not None and batch.stream_id is not None:
            self._takers[split_stream(batch.stream_id)[0]] = rec
        return batch

    def adopt(self, rec: SqlRecorder) -> None:
        """Know ``rec`` (a new recorder) as the taker of its batches."""
        self._takers[split_stream(rec.stream_id)[0]] = rec

    def taker(self, batch: Batch) -> SqlRecorder | None:
        """The live recorder that took ``batch`` (None for a batch read from the spool, or of a
        recorder that is gone), found by the batch's stream id."""
        if batch.stream_id is None:
            return None
        return self._takers.get(split_stream(batch.stream_id)[0])

    def encode_rest(self, batch: Batch) -> None:
        """Serialise whatever is left of ``batch``'s events now, in one go, through its recorder."""
        if batch.serialised():
            return
        rec = self.taker(batch)
        if rec is None:
            raise ValueError(f"batch of {batch.response_id!r}: its recorder is gone, its events unserialised")
        rec.encode_some(batch)

    def renumbered(self, batch: Batch, attempt: int, shift: int, stream_id: str) -> None:
        """``batch`` is stored ``shift`` attempts higher, as ``stream_id``: so is, from the
        lifecycle's ``attempt`` on, the rest of its recorder's stream (see
        :meth:`SqlRecorder.renumber <eventguard.sink.recorder.SqlRecorder.renumber>`)."""
        rec = self.taker(batch)
        if rec is not None:
            rec.renumber(attempt, shift, stream_id)

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
        if self._redact is None:
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
        return type(exc).__name__ if self._redact is not None else reason(exc)

    async def serialise(self, batches: Sequence[Batch]) -> None:
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

    def serialise_now(self, batches: Sequence[Batch]) -> list[QuarantineRecord]:
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
        if batch.serialised():
            return False
        rec = self.taker(batch)
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
        redacted = self._redact is not None
        if redacted:
            # Its message may quote what it was meant to mask (KeyError: 'the-secret'): the type only,
            # in the log as in the quarantine row.
            self._stats.unexpected_errors += 1
            self._report.say(
                "redactor-raised",
                "eventguard sink: the redactor raised %s; the event is kept in the quarantine without "
                "its content (later ones are only counted in stats.unexpected_errors)",
                type(exc).__name__,
            )
        else:
            self._report.unexpected(exc, "serialising an event")
        cause = f"the redactor raised {type(exc).__name__}" if redacted else reason(exc)
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
