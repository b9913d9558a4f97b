"""One recorder's pending work as plain rows: what the writer writes and the spool keeps.

A batch is self-contained and idempotent to apply: events, transitions and anomalies are keyed,
and the row update only moves forward. Writing it twice, or replaying it from the spool after it
was written, changes nothing.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any

import orjson

from eventguard._db import PreSerialised

_ROW_TIMES = ("created_at", "started_at", "finished_at", "updated_at")


@dataclass(slots=True)
class Batch:
    response_id: str
    attempt: int
    owner: str
    #: Column values for the responses table (see tables.responses).
    row: dict[str, Any]
    #: Whether ``row["status"]`` is a terminal state.
    terminal: bool
    events: list[dict[str, Any]] = field(default_factory=list)
    transitions: list[dict[str, Any]] = field(default_factory=list)
    anomalies: list[dict[str, Any]] = field(default_factory=list)
    #: The anomaly index reserved for reporting a refused status change (None: no status change).
    refusal_idx: int | None = None

    def to_json(self) -> bytes:
        # PreSerialised payloads are str subclasses: orjson writes them as JSON strings, and
        # from_json wraps them again, so they are never decoded and re-encoded.
        return orjson.dumps(asdict(self))

    @classmethod
    def from_json(cls, line: bytes) -> Batch:
        data = orjson.loads(line)
        row = data["row"]
        for key in _ROW_TIMES:
            row[key] = _time(row.get(key))
        for ev in data["events"]:
            ev["recorded_at"] = _time(ev["recorded_at"])
            ev["payload"] = PreSerialised(ev["payload"])
        for tr in data["transitions"]:
            tr["at"] = _time(tr["at"])
        for an in data["anomalies"]:
            an["at"] = _time(an["at"])
            if an.get("payload") is not None:
                an["payload"] = PreSerialised(an["payload"])
        return cls(**data)


def _time(value: str | None) -> datetime | None:
    return None if value is None else datetime.fromisoformat(value)
