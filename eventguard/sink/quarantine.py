"""The quarantine: what the sink could not store, kept with the reason, never dropped.

Three origins (the ``origin`` column):

- ``write``: the database refused the content (a NUL in a TEXT column, a value out of range, a
  constraint); the writer split the group until the refused batch (or the refused events and
  anomalies within it) was isolated, wrote the rest, and put this here.
- ``spool``: a spool entry that could not be read back (a torn line, a foreign format).
- ``duplicate``: a batch of a second stream that carried a response id and attempt another
  stream owns (see :mod:`eventguard.sink.apply`): none of it is applied to the holder's history.

``record`` is the refused content as JSON text made of ASCII only (``json.dumps(...,
ensure_ascii=True)``): a NUL is the six characters ``\\u0000``, a lone surrogate ``\\udcff``, so
the record is storable in any TEXT column, always. A batch record holds the response's row, every
event with its payload (JSON text, as it would have been stored), the transitions and anomalies.
``reason`` and ``response_id`` are made storable the same way (:func:`text`).

When even the quarantine insert fails (the database went away meanwhile), the records go to a
file beside the spool, ``<spool>.quarantine.jsonl``, one JSON object per line, fsync'd. Read both
with :func:`read` and :func:`read_file`.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal, TypeAlias

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from eventguard.sink.batch import Batch
from eventguard.sql.tables import STREAM_ID_LENGTH, quarantine

Origin: TypeAlias = Literal["write", "spool", "duplicate"]


@dataclass(frozen=True, slots=True)
class QuarantineRecord:
    """One quarantined item. ``record`` is the JSON text; :meth:`content` parses it."""

    origin: str
    reason: str
    at: datetime
    record: str
    response_id: str | None = None
    attempt: int | None = None
    stream_id: str | None = None
    pk: int | None = None

    def content(self) -> Any:
        return json.loads(self.record)

    def event_count(self) -> int:
        """How many events the record holds (a batch record's ``events``)."""
        data = self.content()
        return len(data.get("events") or ()) if isinstance(data, dict) else 0

    def values(self) -> dict[str, Any]:
        """The columns, for an insert (``pk`` left to the database)."""
        return {
            "response_id": self.response_id,
            "attempt": self.attempt,
            "stream_id": self.stream_id,
            "origin": self.origin,
            "reason": self.reason,
            "at": self.at,
            "record": self.record,
        }


def text(value: object) -> str:
    """``value`` as text any column takes: lone surrogates as ``\\udcff``, NUL as ``\\x00``."""
    if not isinstance(value, str):
        try:
            value = str(value)
        except Exception:  # a broken __str__ must not lose the record
            value = f"<{type(value).__name__}: unprintable>"
    if value.isascii():
        return value.replace("\x00", "\\x00")
    return value.encode("utf-8", "backslashreplace").decode("utf-8").replace("\x00", "\\x00")


def _default(value: object) -> object:
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, bytes | bytearray):
        return value.decode("utf-8", "backslashreplace")
    try:
        return repr(value)
    except Exception:
        return f"<{type(value).__name__}: unrepresentable>"


def dumps(obj: object) -> str:
    """``obj`` as ASCII-only JSON text; never raises (an object JSON cannot hold becomes its repr)."""
    try:
        return json.dumps(obj, ensure_ascii=True, default=_default)
    except (TypeError, ValueError, RecursionError):  # odd keys, cycles, depth
        return json.dumps({"repr": _default(obj)}, ensure_ascii=True)


def batch_content(
    batch: Batch,
    *,
    events: Sequence[Any] | None = None,
    anomalies: Sequence[Any] | None = None,
    whole: bool = True,
    redacted: bool = False,
) -> dict[str, Any]:
    """A batch as a plain object for :func:`dumps`: all of it, or (``whole=False``) only the given
    events and anomalies (the ones refused after the row went in).

    Events not serialised yet are kept as their repr, or (``redacted``: the sink has a redactor,
    which never saw them through) as what identifies them only.
    """
    evs = batch.events if events is None else events
    out: dict[str, Any] = {
        "response_id": batch.response_id,
        "attempt": batch.attempt,
        "owner": batch.owner,
        "stream_id": batch.stream_id,
        "recorded_at": batch.recorded_at,
    }
    if whole:
        out["row"] = batch.row
        out["terminal"] = batch.terminal
        out["transitions"] = batch.transitions
    out["events"] = [{"attempt": a, "seq": s, "type": t, "payload": p} for a, s, t, p in evs]
    out["anomalies"] = list(batch.anomalies if anomalies is None else anomalies)
    if whole and batch.raw_done < len(batch.raw):
        # Events that could not even be serialised: their repr, so nothing is silently gone.
        out["unserialised_events"] = [
            {"attempt": a, "seq": s, "type": t}
            if redacted
            else {"attempt": a, "seq": s, "type": t, "event": _default(ev)}
            for a, s, t, ev in batch.raw[batch.raw_done :]
        ]
    return out


def of_batch(
    batch: Batch,
    origin: Origin,
    reason: str,
    *,
    events: Sequence[Any] | None = None,
    anomalies: Sequence[Any] | None = None,
    whole: bool = True,
    redacted: bool = False,
) -> QuarantineRecord:
    return entry(
        origin,
        reason,
        batch_content(batch, events=events, anomalies=anomalies, whole=whole, redacted=redacted),
        response_id=batch.response_id,
        attempt=batch.attempt,
        stream_id=batch.stream_id,
    )


def entry(
    origin: Origin,
    reason: str,
    content: object,
    *,
    response_id: object = None,
    attempt: object = None,
    stream_id: object = None,
) -> QuarantineRecord:
    """A record whose every column is storable, whatever it was given."""
    return QuarantineRecord(
        origin=origin,
        reason=text(reason),
        at=datetime.now(UTC),
        record=dumps(content),
        response_id=None if response_id is None else text(response_id),
        attempt=attempt if type(attempt) is int and -(2**31) <= attempt < 2**31 else None,
        stream_id=None if stream_id is None else text(stream_id)[:STREAM_ID_LENGTH],
    )


async def insert(conn: AsyncConnection, records: Sequence[QuarantineRecord], *, once: bool = False) -> int:
    """Insert ``records`` in the caller's transaction; how many were inserted.

    ``once``: a record the table already holds (the same origin, response id, reason and
    content) is not inserted again. A spool replay asks for it: a file an outage stopped halfway
    is replayed again from its start, and what its first pass quarantined must not be there
    twice. One look-up per record (there is no index on the content): a replay's quarantine is
    rare, the live writer's inserts do not ask.
    """
    if not records:
        return 0
    todo = list(records)
    if once:
        q = quarantine.c
        todo, seen = [], set()
        for r in records:
            key = (r.origin, r.response_id, r.reason, r.record)
            if key in seen:
                continue
            seen.add(key)
            rid = q.response_id.is_(None) if r.response_id is None else q.response_id == r.response_id
            found = await conn.execute(
                select(q.pk)
                .where(q.origin == r.origin, rid, q.reason == r.reason, q.record == r.record)
                .limit(1)
            )
            if found.first() is None:
                todo.append(r)
    if todo:
        await conn.execute(quarantine.insert(), [r.values() for r in todo])
    return len(todo)


def file_path(spool_path: Path) -> Path:
    """The file the quarantine falls back to: beside the spool."""
    return spool_path.with_name(spool_path.name + ".quarantine.jsonl")


def append_file(path: Path, records: Iterable[QuarantineRecord]) -> int:
    """Append ``records`` to the quarantine file, one JSON line each, fsync'd; how many."""
    lines = [dumps({**r.values(), "at": r.at.isoformat()}) + "\n" for r in records]
    if not lines:
        return 0
    data = "".join(lines).encode("ascii")
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)
    return len(lines)


async def read(
    engine: AsyncEngine | AsyncConnection,
    *,
    origin: str | None = None,
    response_id: str | None = None,
    limit: int = 1000,
    after: int | None = None,
) -> list[QuarantineRecord]:
    """The quarantine table's records, oldest first (``after``: a ``pk`` to page on from)."""
    q = quarantine.c
    query = select(quarantine).order_by(q.pk).limit(limit)
    if origin is not None:
        query = query.where(q.origin == origin)
    if response_id is not None:
        query = query.where(q.response_id == text(response_id))
    if after is not None:
        query = query.where(q.pk > after)
    if isinstance(engine, AsyncConnection):
        rows = (await engine.execute(query)).all()
    else:
        async with engine.connect() as conn:
            rows = (await conn.execute(query)).all()
    return [
        QuarantineRecord(
            origin=r.origin,
            reason=r.reason,
            at=r.at,
            record=r.record,
            response_id=r.response_id,
            attempt=r.attempt,
            stream_id=r.stream_id,
            pk=r.pk,
        )
        for r in rows
    ]


def read_file(path: Path) -> list[QuarantineRecord]:
    """The records of a quarantine file (:func:`file_path`); a line that cannot be read is skipped."""
    out: list[QuarantineRecord] = []
    if not path.exists():
        return out
    with path.open("rb") as fh:
        for line in fh:
            try:
                d = json.loads(line)
                record = QuarantineRecord(
                    origin=d["origin"],
                    reason=d["reason"],
                    at=datetime.fromisoformat(d["at"]),
                    record=d["record"],
                    response_id=d.get("response_id"),
                    attempt=d.get("attempt"),
                    stream_id=d.get("stream_id"),
                )
            except (ValueError, KeyError, TypeError, RecursionError):  # nested past the parser's depth
                continue
            if _well_formed(record):  # a line of the wrong shape failed later, in content() or a write
                out.append(record)
    return out


def _well_formed(record: QuarantineRecord) -> bool:
    texts = (record.origin, record.reason, record.record)
    optional = (record.response_id, record.stream_id)
    return (
        all(type(v) is str for v in texts)
        and all(v is None or type(v) is str for v in optional)
        and (record.attempt is None or type(record.attempt) is int)
    )
