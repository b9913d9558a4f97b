"""One guarded stream's recorder: a reference buffer on the hot path, rows off it.

``event`` and ``changed`` only append and flag; the sink's writer task calls :meth:`collect`,
which reads the lifecycle in one synchronous step, so the snapshot it takes is consistent (the
guard runs in the same event loop and cannot interleave). The events themselves are serialised
later, a chunk at a time (:meth:`encode_some`): forwarded events are never mutated, so a
reference taken now serialises the same later.

Every string a row carries is made storable here, at the boundary (:mod:`eventguard.sql.storable`):
ids by one mapping computed once per recorder, free text escaped reversibly, event types escaped
and bounded, payloads cleaned by :func:`encode`; each change is a ``sink`` anomaly that says what
was changed and how.
"""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Protocol

import orjson
from sqlalchemy import Column, String

from eventguard import telemetry
from eventguard.lifecycle import AnomalyKind, Lifecycle
from eventguard.sink.batch import Batch, sink_anomaly
from eventguard.sink.serialise import JSON_OPTIONS, NUL, encode
from eventguard.sql import storable
from eventguard.sql.engine import PreSerialised
from eventguard.sql.storable import Fix, nulls_hide_non_finite
from eventguard.sql.tables import TERMINAL, TYPE_LENGTH, anomalies, responses

if TYPE_CHECKING:
    from eventguard.sink.apply import Refusal
    from eventguard.sink.filter import EventFilter
    from eventguard.sink.serialise import Redactor


class RecorderSink(Protocol):
    """What an :class:`SqlRecorder` asks of the sink that made it (an :class:`~eventguard.sink.SqlSink`).

    ``note_event`` is the hot path's one call: it never awaits and does no I/O.
    """

    @property
    def filter(self) -> EventFilter: ...
    @property
    def owner(self) -> str: ...
    @property
    def close_timeout(self) -> float: ...
    @property
    def max_payload_bytes(self) -> int: ...
    @property
    def redact(self) -> Redactor | None: ...

    def note_event(self, rec: SqlRecorder) -> None: ...
    def note_change(self, rec: SqlRecorder) -> None: ...
    def note_close(self, rec: SqlRecorder) -> None: ...
    def writing(self) -> bool: ...
    def spool_now(self, rec: SqlRecorder, why: str) -> None: ...
    def unexpected(self, exc: BaseException, where: str) -> None: ...


def _length(column: Column[Any]) -> int:
    assert isinstance(column.type, String) and column.type.length is not None, column
    return column.type.length


#: The row's identifier columns and their lengths: a value that does not fit as it is becomes
#: ``<escaped prefix>~<hash>`` (storable.identifier). The error code and type are labels a query
#: groups by, kept apart like ids.
_IDENTIFIERS = {
    name: _length(responses.c[name])
    for name in ("conversation_id", "chain_id", "partition_key", "agent_name", "error_code", "error_type")
}
ID_LENGTH = _length(responses.c.response_id)
OWNER_LENGTH = _length(responses.c.owner)
ANOMALY_TYPE_LENGTH = _length(anomalies.c.event_type)
_ESCAPED = AnomalyKind.VALUE_ESCAPED.value
#: Event types seen to need no change (a set lookup per event instead of a scan), bounded.
_PLAIN_TYPES: set[str] = set()
_PLAIN_TYPES_MAX = 4096


class SqlRecorder:
    """The :class:`eventguard.recording.Recorder` an :class:`SqlSink` hands to each guard."""

    __slots__ = (
        "__weakref__",  # the writer finds a batch's recorder by its stream id, weakly
        "_anomalies_taken",
        "_columns",
        "_done",
        "_keep",
        "_last_status",
        "_notes",
        "_numbers",
        "_owner",
        "_response_id",
        "_shift",
        "_shift_from",
        "_sink",
        "_sink_idx",
        "_transitions_taken",
        "closing",
        "dirty",
        "inflight",
        "lifecycle",
        "pending",
        "queued",
        "refusal",
        "span",
        "stream_id",
    )

    def __init__(self, sink: RecorderSink, lifecycle: Lifecycle) -> None:
        self._sink = sink
        self.lifecycle = lifecycle
        #: The response's span, taken where the recorder is made (the guard's, in the response's
        #: task): the sink's anomalies go on it, from the writer's task (``Batch.span``).
        self.span = telemetry.response_span()
        #: None when the filter keeps every event: the hot path then makes no call for it.
        self._keep = None if sink.filter.keeps_all else sink.filter.keep
        #: (attempt, index, type, event) references, not yet serialised.
        self.pending: list[tuple[int, int, str | None, object]] = []
        #: Batches handed to the writer and not yet known to be stored or spooled.
        self.inflight: list[Batch] = []
        self._transitions_taken = 0
        self._anomalies_taken = 0
        self._sink_idx = 0
        self._last_status: str | None = None
        self._response_id: str | None = None
        #: Whether the sink already lists this recorder as having work (avoids a set per event).
        self.queued = False
        self._done: asyncio.Future[None] | None = None
        self.dirty = True  # the row itself is not written yet
        self.closing = False
        #: Set when the database refused this stream's status (another sink or stream holds a terminal).
        self.refusal: Refusal | None = None
        #: This stream's identity: another stream with the same response id has another. Once the
        #: writer stores the stream under other attempt numbers (see ``renumber``), its stored form.
        self.stream_id = uuid.uuid4().hex
        #: Attempts from ``_shift_from`` on are stored ``_shift`` higher (see ``renumber``).
        self._shift = 0
        self._shift_from = 0
        #: Sink anomalies about changed values, waiting for the next batch (the id may be unknown).
        self._notes: list[tuple[str, str, str | None, int | None, PreSerialised | None]] = []
        #: Per row column: (the value last seen, what is stored for it), so a value is checked,
        #: and its change reported, once.
        self._columns: dict[str, tuple[str, str]] = {}
        #: Per integer column, the out-of-range value last reported.
        self._numbers: dict[str, int] = {}
        self._owner = self._storable_id("responses.owner", sink.owner, OWNER_LENGTH)

    # -- the Recorder protocol ------------------------------------------------------------
    def event(self, index: int, event_type: str | None, event: object) -> None:
        keep = self._keep
        if keep is not None:
            try:
                kept = keep(event_type, event)
            except Exception as exc:
                # The user's predicate raised (or its answer's __bool__ did): the stream must not
                # end for it, and an event nobody decided to drop is kept.
                self._sink.unexpected(exc, "the events= predicate (the event is kept)")
                kept = True
            if not kept:
                return
        self.pending.append((self.lifecycle.attempt, index, event_type, event))
        self._sink.note_event(self)

    def changed(self) -> None:
        self.dirty = True
        self._sink.note_change(self)

    async def close(self) -> None:
        if self._done is None:
            self.closing = True
            self._done = asyncio.get_running_loop().create_future()
            self._sink.note_close(self)
        if self._done.done():
            return
        sink = self._sink
        while True:
            try:
                async with asyncio.timeout(sink.close_timeout):
                    await asyncio.shield(self._done)
                return
            except TimeoutError:
                if sink.writing():
                    # Busy, not lost: the database bounds a stuck statement (busy_timeout on
                    # SQLite, statement_timeout on PostgreSQL) and the writer spools what fails.
                    # A writer behind a backlog (a thousand streams) is left to catch up rather
                    # than have its data moved out of the database into the spool.
                    continue
                sink.spool_now(self, "the final flush timed out and the writer is gone")
                return
            except asyncio.CancelledError:
                sink.spool_now(self, "the final flush was cancelled")
                raise

    # -- writer side -------------------------------------------------------------------------
    def has_work(self) -> bool:
        lc = self.lifecycle
        return bool(
            self.pending
            or self.dirty
            or len(lc.transitions) > self._transitions_taken
            or len(lc.anomalies) > self._anomalies_taken
        )

    def finished(self) -> None:
        if self._done is not None and not self._done.done():
            self._done.set_result(None)

    def renumber(self, attempt: int, shift: int, stream_id: str) -> None:
        """From the lifecycle's ``attempt`` on, store this stream ``shift`` attempts higher, as
        ``stream_id``: the writer found its attempt taken (see :mod:`eventguard.sink.apply`)."""
        self._shift_from, self._shift, self.stream_id = attempt, shift, stream_id

    def _stored(self, attempt: int) -> int:
        """The attempt number a lifecycle ``attempt`` of this stream is stored under."""
        return attempt + self._shift if attempt >= self._shift_from else attempt

    def response_id(self) -> str | None:
        if self._response_id is None:
            rid = self.lifecycle.info.response_id
            if rid is None and self.closing:
                # The stream ended before the host named it: the row is still kept, under an
                # id nobody else can have.
                rid = f"eventguard-unidentified-{uuid.uuid4().hex}"
            if rid is not None:
                # Once per recorder: the row, its events, transitions and anomalies all carry it.
                rid = self._storable_id("response_id", rid, ID_LENGTH)
            self._response_id = rid
        return self._response_id

    # -- making values storable ------------------------------------------------------------------
    def _note(
        self,
        kind: str,
        reason: str,
        etype: str | None = None,
        seq: int | None = None,
        payload: PreSerialised | None = None,
    ) -> None:
        self._notes.append((kind, reason, etype, seq, payload))

    def _note_fix(
        self, field: str, original: str, fix: Fix, etype: str | None = None, seq: int | None = None
    ) -> None:
        """A ``value_escaped`` anomaly: which field, what was wrong, what is stored, and (unless the
        stored value is the whole original, escaped) the original, escaped, in its payload."""
        payload = None
        escaped = storable.escape(original) if fix.escaped else original
        if fix.stored != escaped:
            cap = max(self._sink.max_payload_bytes, 1024)
            payload = PreSerialised(
                orjson.dumps(
                    {
                        "field": field,
                        "stored": fix.stored,
                        "original_escaped": escaped[:cap],
                        "original_length": len(original),
                        "original_escaped_cut": len(escaped) > cap,
                    }
                ).decode()
            )
        self._note(_ESCAPED, f"{field}: {fix.why}", etype, seq, payload)

    def _storable_id(self, field: str, value: str, limit: int) -> str:
        fix = storable.identifier(value, limit)
        if fix is None:
            return value
        self._note_fix(field, value, fix)
        return fix.stored

    def _column(self, name: str, value: str | None) -> str | None:
        """The stored form of a row column's value, its change reported once."""
        if value is None:
            return None
        seen = self._columns.get(name)
        if seen is not None and (seen[0] is value or seen[0] == value):
            return seen[1]
        limit = _IDENTIFIERS.get(name)
        fix = storable.free_text(value) if limit is None else storable.identifier(value, limit)
        stored = value
        if fix is not None:
            self._note_fix(f"responses.{name}", value, fix)
            stored = fix.stored
        self._columns[name] = (value, stored)
        return stored

    def _int64(self, name: str, value: int | None) -> int | None:
        """An integer column (64 bits on PostgreSQL and SQLite): a value beyond it is stored NULL."""
        if value is None or -(1 << 63) <= value < (1 << 63):
            return value
        if self._numbers.get(name) != value:
            self._numbers[name] = value
            self._note(
                _ESCAPED,
                f"responses.{name}: {value} is beyond the column's 64-bit range: stored NULL",
            )
        return None

    def _text(self, field: str, value: str) -> str:
        fix = storable.free_text(value)
        if fix is None:
            return value
        self._note_fix(field, value, fix)
        return fix.stored

    def _flush_notes(self, batch: Batch, attempt: int) -> None:
        at = batch.recorded_at or datetime.now(UTC)
        for kind, reason, etype, seq, payload in self._notes:
            batch.anomalies.append(
                self._sink_anomaly(batch.response_id, attempt, kind, reason, at, etype, seq, payload)
            )
        self._notes.clear()

    def collect(self) -> Batch | None:
        """Everything not yet taken, as one batch; None while the response has no id.

        Built in locals and committed at the end: should anything raise on the way, nothing is
        taken (the buffered events, the transitions and anomalies stay where they were, the notes
        and indexes as they were) and the caller can keep what the recorder holds.
        """
        rid = self.response_id()
        if rid is None or not self.has_work():
            return None
        lc = self.lifecycle
        n_transitions = len(lc.transitions)
        n_anomalies = len(lc.anomalies)
        saved = (len(self._notes), self._sink_idx, dict(self._columns), dict(self._numbers))
        try:
            batch = self._build(rid, lc, n_transitions, n_anomalies)
        except BaseException:
            notes, self._sink_idx, self._columns, self._numbers = saved
            del self._notes[notes:]
            raise
        # Committed: only now is anything taken. References only: the writer serialises them in
        # small chunks (encode_some), so the snapshot stays synchronous and cheap while the
        # client's stream keeps its loop turns.
        batch.raw, self.pending = self.pending, []
        if self._shift:
            stored = self._stored
            batch.raw = [(stored(a), s, t, e) for a, s, t, e in batch.raw]
        self._transitions_taken = n_transitions
        self._anomalies_taken = n_anomalies
        if batch.refusal_idx is not None:
            self._last_status = batch.row["status"]
        self.dirty = False
        return batch

    def abandon(self) -> tuple[list[tuple[int, int, str | None, object]], list[Any], list[Any]]:
        """Take everything not yet taken without building a batch (:meth:`collect` raised): the
        buffered events, the transitions and the anomalies, for the caller to keep elsewhere."""
        lc = self.lifecycle
        pending, self.pending = self.pending, []
        taken = (lc.transitions[self._transitions_taken :], lc.anomalies[self._anomalies_taken :])
        self._transitions_taken = len(lc.transitions)
        self._anomalies_taken = len(lc.anomalies)
        self._notes.clear()
        self.dirty = False
        return pending, list(taken[0]), list(taken[1])

    def _build(self, rid: str, lc: Lifecycle, n_transitions: int, n_anomalies: int) -> Batch:
        now = datetime.now(UTC)
        stored = self._stored
        batch = Batch(
            response_id=rid,
            attempt=stored(lc.attempt),
            owner=self._owner,
            row={},
            terminal=False,
            recorded_at=now,
            stream_id=self.stream_id,
            span=self.span,
        )

        for t in lc.transitions[self._transitions_taken : n_transitions]:
            batch.transitions.append(
                {
                    "response_id": rid,
                    "attempt": stored(t.attempt),
                    "idx": t.index,
                    "from_state": t.from_state.value,
                    "to_state": t.to_state.value,
                    "cause": t.cause.value if t.cause else None,
                    "reason": self._text(
                        f"transitions.reason (attempt {t.attempt}, idx {t.index})", t.reason
                    ),
                    "at": t.at,
                }
            )

        for a in lc.anomalies[self._anomalies_taken : n_anomalies]:
            where = f"guard anomaly {a.index} (attempt {a.attempt})"
            payload = (
                None
                if a.payload is None
                else self._anomaly_payload(a.payload, a.event_type, where, a.event_index)
            )
            etype = a.event_type
            if etype is not None:
                fix = storable.bounded(etype, ANOMALY_TYPE_LENGTH)
                if fix is not None:
                    self._note_fix(f"anomalies.event_type of {where}", etype, fix, None, a.event_index)
                    etype = fix.stored
            batch.anomalies.append(
                {
                    "response_id": rid,
                    "attempt": stored(a.attempt),
                    "source": "guard",
                    "idx": a.index,
                    "kind": a.kind.value,
                    "reason": self._text(f"anomalies.reason of {where}", a.reason),
                    "at": a.at,
                    "event_type": etype,
                    "event_index": a.event_index,
                    "payload": payload,
                }
            )

        batch.row = self._row(now)
        batch.row["attempt"] = batch.attempt
        self._flush_notes(batch, batch.attempt)
        batch.terminal = batch.row["status"] in TERMINAL
        if batch.row["status"] != self._last_status:
            batch.refusal_idx = self._next_sink_idx()
        return batch

    def _anomaly_payload(
        self, payload: object, etype: str | None, where: str, seq: int | None
    ) -> PreSerialised | None:
        """A guard anomaly's payload as stored: redacted, made storable; None (with a
        ``not_serialisable`` anomaly that names only the error's type) when the redactor raises."""
        sink = self._sink
        try:
            enc = encode(payload, etype, max_bytes=sink.max_payload_bytes, redact=sink.redact)
        except Exception as exc:  # only the redactor can raise there: its text may quote the payload
            sink.unexpected(exc, "redacting an anomaly's payload")
            self._note(
                AnomalyKind.NOT_SERIALISABLE.value,
                f"{where}'s payload: the redactor raised {type(exc).__name__}; payload not stored",
                None,
                seq,
            )
            return None
        for kind, reason in enc.problems:
            self._note(kind.value, f"{where}'s payload: {reason}", None, seq)
        return enc.text

    def encode_some(self, batch: Batch, limit: int | None = None) -> int:
        """Serialise up to ``limit`` (None: all) of ``batch``'s remaining events; how many it did.

        Plain dicts without a redactor (the bulk of every stream) take orjson's C path directly;
        anything else, or anything orjson or the size limit rejects, takes :func:`encode`, which
        never raises and reports each lossy step as a ``sink`` anomaly.
        """
        raw = batch.raw
        start = batch.raw_done
        stop = len(raw) if limit is None else min(len(raw), start + limit)
        if start >= stop:
            return 0
        sink = self._sink
        max_bytes = sink.max_payload_bytes
        redact = sink.redact
        append = batch.events.append
        at = batch.recorded_at or datetime.now(UTC)
        dumps = orjson.dumps
        plain = _PLAIN_TYPES
        for i in range(start, stop):
            attempt, seq, etype, ev = raw[i]
            if etype is not None and etype not in plain:
                etype = self._event_type(batch, attempt, seq, etype, at)
            if redact is None and type(ev) is dict:
                try:
                    data = dumps(ev, option=JSON_OPTIONS)
                except TypeError:  # orjson.JSONEncodeError included: the full path says why
                    pass
                else:
                    # orjson writes NaN and infinities as null: only then is it looked into.
                    # (find, not `in`: bytes.__contains__ first tries the needle as an int, and
                    # raises and clears a TypeError each time.)
                    if (
                        len(data) <= max_bytes
                        and data.find(NUL) < 0
                        and (data.find(b"null") < 0 or not nulls_hide_non_finite(ev, data))
                    ):
                        append((attempt, seq, etype, data.decode()))
                        continue
            enc = encode(ev, etype, max_bytes=max_bytes, redact=redact)
            append((attempt, seq, etype, enc.text))
            for kind, reason in enc.problems:
                batch.anomalies.append(
                    self._sink_anomaly(batch.response_id, attempt, kind.value, reason, at, etype, seq)
                )
        if stop == len(raw):
            batch.raw = []  # drop the references as soon as they are serialised
            batch.raw_done = 0
        else:
            batch.raw_done = stop
        return stop - start

    def _event_type(self, batch: Batch, attempt: int, seq: int, etype: str, at: datetime) -> str:
        """The type column's value: bounded and storable; the payload keeps the whole type."""
        fix = storable.bounded(etype, TYPE_LENGTH)
        if fix is None:
            if len(_PLAIN_TYPES) < _PLAIN_TYPES_MAX:
                _PLAIN_TYPES.add(etype)
            return etype
        if fix.escaped:
            self._note_fix("events.type", etype, fix, fix.stored, seq)
            self._flush_notes(batch, attempt)
        else:
            batch.anomalies.append(
                self._sink_anomaly(
                    batch.response_id,
                    attempt,
                    AnomalyKind.PAYLOAD_TRUNCATED.value,
                    f"event type of {len(etype)} characters stored as its first {TYPE_LENGTH}",
                    at,
                    None,
                    seq,
                )
            )
        return fix.stored

    def _next_sink_idx(self) -> int:
        self._sink_idx += 1
        return self._sink_idx - 1

    def _sink_anomaly(
        self,
        rid: str,
        attempt: int,
        kind: str,
        reason: str,
        at: datetime,
        etype: str | None,
        seq: int | None,
        payload: PreSerialised | None = None,
    ) -> dict[str, Any]:
        idx = self._next_sink_idx()
        return sink_anomaly(
            rid,
            attempt,
            AnomalyKind(kind),
            reason,
            idx,
            at,
            event_type=etype,
            event_index=seq,
            payload=payload,
            span=self.span,
        )

    def _row(self, now: datetime) -> dict[str, Any]:
        lc = self.lifecycle
        info = lc.info
        usage = lc.usage
        error = lc.error
        status = lc.state.value
        finished = lc.finished_at
        if finished is None and status in TERMINAL:
            finished = now  # the constraint wants an end time with every terminal
        return {
            "status": status,
            "cause": lc.cause.value if lc.cause else None,
            "attempt": lc.attempt,
            "state_seq": len(lc.transitions),
            "created_at": lc.created_at,
            "started_at": lc.started_at,
            "finished_at": finished,
            "duration_ms": lc.duration_ms,
            "input_tokens": self._int64("input_tokens", usage.input_tokens) if usage else None,
            "output_tokens": self._int64("output_tokens", usage.output_tokens) if usage else None,
            "total_tokens": self._int64("total_tokens", usage.total_tokens) if usage else None,
            "error_code": self._column("error_code", error.code) if error else None,
            "error_message": self._column("error_message", error.message) if error else None,
            "error_type": self._column("error_type", error.exception_type) if error else None,
            "conversation_id": self._column("conversation_id", info.conversation_id),
            "chain_id": self._column("chain_id", info.chain_id),
            "partition_key": self._column("partition_key", info.partition_key),
            "agent_name": self._column("agent_name", info.agent_name),
            "background": info.background,
            "stream": info.stream,
            "store": info.store,
            "is_recovery": info.is_recovery,
            "is_steered_turn": info.is_steered_turn,
            "steering_cut_short": lc.steering_cut_short,
            "unverified": lc.unverified,
            "event_count": lc.events_forwarded,
            "owner": self._owner,
            "updated_at": now,
        }
