"""One recorder's pending work as plain rows: what the writer writes and the spool keeps.

A batch is self-contained and idempotent to apply: events, transitions and anomalies are keyed,
and the row update only moves forward. Writing it twice, or replaying it from the spool after it
was written, changes nothing.

Events are kept as compact tuples (the writer binds them as they are) and serialised lazily:
:meth:`SqlRecorder.collect <eventguard.sink.recorder.SqlRecorder.collect>` only takes references
(``raw``), and the writer serialises them in small chunks off the client's critical path. The
spool format is unchanged: one JSON object per batch, one object per event.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any, TypeAlias

import orjson

from eventguard._db import PreSerialised

if TYPE_CHECKING:
    from eventguard.sink.recorder import SqlRecorder

_ROW_TIMES = ("created_at", "started_at", "finished_at", "updated_at")

#: A stored event: ``(attempt, seq, type, payload JSON text)``.
EventRow: TypeAlias = tuple[int, int, str | None, str]
#: A forwarded event not yet serialised: ``(attempt, seq, type, the event itself)``.
RawEvent: TypeAlias = tuple[int, int, str | None, object]


@dataclass(slots=True)
class Batch:
    response_id: str
    attempt: int
    owner: str
    #: Column values for the responses table (see tables.responses).
    row: dict[str, Any]
    #: Whether ``row["status"]`` is a terminal state.
    terminal: bool
    #: When the batch was taken: every event's ``recorded_at``.
    recorded_at: datetime | None = None
    #: Serialised events, in order.
    events: list[EventRow] = field(default_factory=list)
    #: Events still to serialise from ``raw[raw_done:]`` (see ``SqlRecorder.encode_some``).
    raw: list[RawEvent] = field(default_factory=list)
    raw_done: int = 0
    transitions: list[dict[str, Any]] = field(default_factory=list)
    anomalies: list[dict[str, Any]] = field(default_factory=list)
    #: The anomaly index reserved for reporting a refused status change (None: no status change).
    refusal_idx: int | None = None
    #: The guarded stream that produced it (one per recorder): two streams that carry the same
    #: response id are told apart by it. None in spools written before it existed.
    stream_id: str | None = None
    #: The recorder that took it (serialises ``raw``); None for a batch read from the spool.
    source: SqlRecorder | None = field(default=None, repr=False, compare=False)

    def event_count(self) -> int:
        return len(self.events) + len(self.raw) - self.raw_done

    def serialise(self) -> None:
        """Serialise whatever is left of ``raw`` now, in one go (spooling, the rare paths)."""
        if self.raw_done < len(self.raw):
            assert self.source is not None, "only a recorder's batch has raw events"
            self.source.encode_some(self)

    def to_json(self) -> bytes:
        # PreSerialised payloads are str subclasses: orjson writes them as JSON strings, and
        # from_json wraps them again, so they are never decoded and re-encoded.
        self.serialise()
        rid, at = self.response_id, self.recorded_at
        return orjson.dumps(
            {
                "response_id": rid,
                "attempt": self.attempt,
                "owner": self.owner,
                "row": self.row,
                "terminal": self.terminal,
                "events": [
                    {
                        "response_id": rid,
                        "attempt": a,
                        "seq": s,
                        "type": t,
                        "payload": p,
                        "recorded_at": at,
                    }
                    for a, s, t, p in self.events
                ],
                "transitions": self.transitions,
                "anomalies": self.anomalies,
                "refusal_idx": self.refusal_idx,
                "stream_id": self.stream_id,
            }
        )

    @classmethod
    def from_json(cls, line: bytes) -> Batch:
        data = orjson.loads(line)
        row = data["row"]
        for key in _ROW_TIMES:
            row[key] = _time(row.get(key))
        evs = data["events"]
        # Every event of a batch was taken at the same moment (older spools repeat it per event).
        recorded_at = _time(evs[0]["recorded_at"]) if evs else None
        for tr in data["transitions"]:
            tr["at"] = _time(tr["at"])
        for an in data["anomalies"]:
            an["at"] = _time(an["at"])
            if an.get("payload") is not None:
                an["payload"] = PreSerialised(an["payload"])
        return cls(
            response_id=data["response_id"],
            attempt=data["attempt"],
            owner=data["owner"],
            row=row,
            terminal=data["terminal"],
            recorded_at=recorded_at,
            events=[(e["attempt"], e["seq"], e["type"], e["payload"]) for e in evs],
            transitions=data["transitions"],
            anomalies=data["anomalies"],
            refusal_idx=data.get("refusal_idx"),
            stream_id=data.get("stream_id"),
        )


def _time(value: str | None) -> datetime | None:
    return None if value is None else datetime.fromisoformat(value)
