"""One recorder's pending work as plain rows: what the writer writes and the spool keeps.

A batch is plain data (strings, numbers, dicts and lists; no reference to the recorder that took
it: the writer knows it by the batch's ``stream_id``), self-contained and idempotent to apply:
events, transitions and anomalies are keyed, and the row update only moves forward. Writing it
twice, or replaying it from the spool after it was written, changes nothing.

Events are kept as compact tuples (the writer binds them as they are) and serialised lazily:
:meth:`SqlRecorder.collect <eventguard.sink.recorder.SqlRecorder.collect>` only takes references
(``raw``), and the writer serialises them in small chunks off the client's critical path,
through the recorder (``SqlRecorder.encode_some``); a batch is written or spooled only once
``raw`` is done (:meth:`Batch.serialised`).

In the spool a batch is one JSON object (:meth:`Batch.to_json`, :meth:`Batch.from_json`; the
entry around it is :mod:`eventguard.sink.spool`'s). Version 1 of that object::

    {"response_id": str, "attempt": int, "owner": str, "row": {column: value},
     "terminal": bool, "recorded_at": ISO time | null,
     "events": [[attempt, seq, type | null, payload JSON text], ...],
     "transitions": [{column: value}], "anomalies": [{column: value}],
     "refusal_idx": int | null, "stream_id": str | null}

Times are ISO 8601 strings; event and anomaly payloads are JSON text kept as strings (they come
back as :class:`~eventguard.sql.engine.PreSerialised`). Version 0 (the spool before entries had a header)
is the same object with each event as ``{"response_id", "attempt", "seq", "type", "payload",
"recorded_at"}``; :meth:`Batch.from_json` reads both.

Every string must come back exactly as it was, lone surrogates (``"\\udcff"``, from undecodable
bytes) and NUL included. orjson refuses lone surrogates (and integers beyond 64 bits), so the rare
batch it refuses is written with Python's json instead, marked ``"strings": "utf8-bytes"``: every
string in it (keys too) holds the UTF-8 bytes of the original string, surrogates encoded as
themselves (``surrogatepass``), one character U+0000-U+00FF per byte. JSON's own ``\\uXXXX``
escapes cannot do this: a high surrogate next to a low one would be read back as one character.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, TypeAlias

import orjson
from sqlalchemy import JSON, Boolean, Column, DateTime, Float, Integer, String, Table

from eventguard import telemetry
from eventguard.lifecycle import AnomalyKind
from eventguard.sql.engine import PreSerialised
from eventguard.sql.tables import anomalies, responses, transitions

#: A stored event: ``(attempt, seq, type, payload JSON text)``.
EventRow: TypeAlias = tuple[int, int, str | None, str]
#: A forwarded event not yet serialised: ``(attempt, seq, type, the event itself)``.
RawEvent: TypeAlias = tuple[int, int, str | None, object]

#: The marker of a batch whose strings are written as their UTF-8 bytes (see the module docstring).
_STRINGS_KEY = "strings"
_STRINGS_BYTES = "utf8-bytes"


def sink_anomaly(
    response_id: str,
    attempt: int,
    kind: AnomalyKind,
    reason: str,
    idx: int | None,
    at: datetime,
    *,
    event_type: str | None = None,
    event_index: int | None = None,
    payload: Any = None,
    span: object | None = None,
) -> dict[str, Any]:
    """An ``anomalies`` row the sink adds itself (``source`` ``sink``), said the moment it is made, as
    the guard's anomalies are (:func:`eventguard.telemetry.report_anomaly`), on ``span``: the
    response's own (``Batch.span``), never the writer task's current one."""
    telemetry.report_anomaly(response_id, attempt, kind, reason, event_type, span=span)
    return {
        "response_id": response_id,
        "attempt": attempt,
        "source": "sink",
        "idx": idx,
        "kind": kind.value,
        "reason": reason,
        "at": at,
        "event_type": event_type,
        "event_index": event_index,
        "payload": payload,
    }


class BatchFormatError(ValueError):
    """Spooled text that is not a batch; the message says why, for a person to read."""


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
    #: The response's span (``telemetry.response_span``), for the anomalies the writer adds; not
    #: spooled: a batch read back from the spool reports on none.
    span: object | None = field(default=None, repr=False, compare=False)

    def event_count(self) -> int:
        return len(self.events) + len(self.raw) - self.raw_done

    def serialised(self) -> bool:
        """Whether every event is serialised (nothing is left of ``raw``)."""
        return self.raw_done >= len(self.raw)

    def to_json(self) -> bytes:
        """The batch as one line of JSON (version 1, no newline in it). Never raises for content;
        :class:`ValueError` if its events are not all serialised yet (they would be lost).

        orjson on the common path; a batch orjson refuses (a lone surrogate anywhere, an integer
        beyond 64 bits) is written in the ``utf8-bytes`` form, which keeps every string exactly.
        """
        # PreSerialised payloads are str subclasses: orjson writes them as JSON strings, and
        # from_json wraps them again, so they are never decoded and re-encoded.
        if not self.serialised():
            raise ValueError(
                f"batch of {self.response_id!r}: {len(self.raw) - self.raw_done} events are not "
                "serialised yet (SqlRecorder.encode_some)"
            )
        body = {
            "response_id": self.response_id,
            "attempt": self.attempt,
            "owner": self.owner,
            "row": self.row,
            "terminal": self.terminal,
            "recorded_at": self.recorded_at,
            "events": self.events,
            "transitions": self.transitions,
            "anomalies": self.anomalies,
            "refusal_idx": self.refusal_idx,
            "stream_id": self.stream_id,
        }
        try:
            return orjson.dumps(body)
        except TypeError:  # orjson.JSONEncodeError is a TypeError
            return _dumps_as_bytes(body)

    @classmethod
    def from_json(cls, data: bytes | str) -> Batch:
        """The batch in ``data`` (version 0 or 1); :class:`BatchFormatError` when it is not one.

        No other exception escapes for any input: wrong types, missing keys and bad times are
        reported with the path of the value at fault (``row.status: expected a string, got null``).
        """
        try:
            obj = orjson.loads(data)
        except orjson.JSONDecodeError as exc:
            # Python's json reads what orjson does not: NaN, and a hand-escaped lone surrogate.
            obj = _json_loads(data, str(exc))
        else:
            if type(obj) is dict and _STRINGS_KEY in obj:
                obj = _json_loads(data, "")  # exact integers of any size, as they were written
        if type(obj) is not dict:
            raise BatchFormatError(f"{_describe(obj)}, not a batch (a JSON object)")
        if _STRINGS_KEY in obj:
            if obj[_STRINGS_KEY] != _STRINGS_BYTES:
                raise BatchFormatError(f"strings: unknown encoding {_short(obj[_STRINGS_KEY])}")
            obj = _from_bytes_form(obj)
        return _build(cls, obj)


# -- writing the rare batch orjson refuses ---------------------------------------------------------


def _as_bytes(text: str) -> str:
    return text.encode("utf-8", "surrogatepass").decode("latin-1")


def _to_bytes_form(value: Any) -> Any:
    if isinstance(value, str):
        return _as_bytes(value)
    if value is None or isinstance(value, bool | int | float):
        return value
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, dict):
        return {_as_bytes(k if isinstance(k, str) else _text(k)): _to_bytes_form(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_to_bytes_form(v) for v in value]
    return _as_bytes(_text(value))  # nothing a recorder puts in a batch: kept as its text


def _text(value: object) -> str:
    try:
        return str(value)
    except Exception:  # a broken __str__ must not lose the batch
        return f"<{type(value).__qualname__}>"


def _dumps_as_bytes(body: dict[str, Any]) -> bytes:
    out = {_STRINGS_KEY: _STRINGS_BYTES, **_to_bytes_form(body)}
    # Every string is U+0000-U+00FF now; ensure_ascii keeps the line ASCII (and free of newlines).
    return json.dumps(out, ensure_ascii=True, allow_nan=True, separators=(",", ":")).encode("ascii")


# -- reading ------------------------------------------------------------------------------------------


def _json_loads(data: bytes | str, orjson_error: str) -> Any:
    try:
        return json.loads(data)
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError
        raise BatchFormatError(f"not JSON: {orjson_error or exc}") from None


def _from_bytes(text: str) -> str:
    try:
        return text.encode("latin-1").decode("utf-8", "surrogatepass")
    except UnicodeError:
        raise BatchFormatError(f"a string is not in the {_STRINGS_BYTES} form: {_short(text)}") from None


def _from_bytes_form(value: Any) -> Any:
    if isinstance(value, str):
        return _from_bytes(value)
    if isinstance(value, dict):
        return {_from_bytes(k): _from_bytes_form(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_from_bytes_form(v) for v in value]
    return value


def _describe(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__


def _short(value: object, limit: int = 60) -> str:
    shown = repr(value)
    return shown if len(shown) <= limit else shown[: limit - 3] + "..."


def _bad(path: str, expected: str, value: object) -> BatchFormatError:
    got = _describe(value)
    if isinstance(value, str | int | float) and not isinstance(value, bool):
        got = f"{got} ({_short(value)})"
    return BatchFormatError(f"{path}: expected {expected}, got {got}")


def _str(value: object, path: str) -> str:
    if type(value) is not str:
        raise _bad(path, "a string", value)
    return value


def _opt_str(value: object, path: str) -> str | None:
    return None if value is None else _str(value, path)


def _int(value: object, path: str) -> int:
    if type(value) is not int:
        raise _bad(path, "an integer", value)
    return value


def _opt_int(value: object, path: str) -> int | None:
    return None if value is None else _int(value, path)


def _bool(value: object, path: str) -> bool:
    if type(value) is not bool:
        raise _bad(path, "true or false", value)
    return value


def _number(value: object, path: str) -> float | int:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise _bad(path, "a number", value)
    return value


def _time(value: object, path: str) -> datetime:
    if type(value) is not str:
        raise _bad(path, "an ISO 8601 time", value)
    try:
        return datetime.fromisoformat(value)
    except ValueError:
        raise _bad(path, "an ISO 8601 time", value) from None


def _opt_time(value: object, path: str) -> datetime | None:
    return None if value is None else _time(value, path)


def _json_text(value: object, path: str) -> PreSerialised:
    if type(value) is not str:
        raise _bad(path, "JSON text (a string)", value)
    return _json_checked(value, path)


def _json_checked(text: str, path: str) -> PreSerialised:
    """``text``, stored as it is in a JSON column, if it is JSON the store can read back: PostgreSQL's
    jsonb refuses what is not, but SQLite stores any text, and reading the response back failed on
    it. Read as the store reads it (orjson), not as Python's json does: ``NaN``, ``Infinity`` and an
    escaped lone surrogate are not. A lone surrogate character in the text (which the utf8-bytes
    form keeps exactly) is a character like any other to JSON's grammar: orjson, which cannot
    take it, reads the text with it replaced."""
    try:
        orjson.loads(text)
    except orjson.JSONDecodeError:
        try:
            orjson.loads(text.encode("utf-8", "replace"))
        except orjson.JSONDecodeError:
            raise BatchFormatError(f"{path}: not JSON text the store can read: {_short(text)}") from None
    return PreSerialised(text)


def _list(value: object, path: str) -> list[Any]:
    if type(value) is not list:
        raise _bad(path, "an array", value)
    return value


def _dict(value: object, path: str) -> dict[str, Any]:
    if type(value) is not dict:
        raise _bad(path, "an object", value)
    return value


_Check = Callable[[object, str], Any]


def _check_for(column: Column[Any]) -> _Check:
    kind = column.type
    if isinstance(kind, JSON):
        check: _Check = _json_text
    elif isinstance(kind, DateTime):
        check = _time
    elif isinstance(kind, Boolean):
        check = _bool
    elif isinstance(kind, Float):
        check = _number
    elif isinstance(kind, Integer):
        check = _int
    elif isinstance(kind, String):
        check = _str
    else:  # pragma: no cover - a column type this module does not know yet
        raise TypeError(f"no spool check for {column.table.name}.{column.name}: {kind!r}")
    if not column.nullable:
        return check

    def nullable(value: object, path: str) -> Any:
        return None if value is None else check(value, path)

    return nullable


def _spec(table: Table, *skip: str) -> tuple[tuple[str, bool, _Check], ...]:
    """(name, required, check) per column a batch carries for ``table``."""
    return tuple(
        (c.name, not c.nullable, _check_for(c))
        for c in table.columns
        if c.name not in skip and not (c.primary_key and c.autoincrement is True)
    )


# The row carries the columns but the key, the version (the database keeps those) and the id
# (the batch's own). A nullable column may be missing (a spool older than the column, a column
# the writer takes from elsewhere): it stays missing, so a batch reads back exactly as written.
_ROW = _spec(responses, "pk", "version", "response_id")
_TRANSITION = _spec(transitions)
_ANOMALY = _spec(anomalies)


def _record(value: object, path: str, spec: tuple[tuple[str, bool, _Check], ...]) -> dict[str, Any]:
    data = _dict(value, path)
    for name, required, check in spec:
        if name in data:
            data[name] = check(data[name], f"{path}.{name}")
        elif required:
            raise BatchFormatError(f"{path}.{name}: missing")
    return data


def _field(data: dict[str, Any], name: str) -> Any:
    try:
        return data[name]
    except KeyError:
        raise BatchFormatError(f"{name}: missing") from None


def _events(value: object) -> tuple[list[EventRow], datetime | None]:
    evs = _list(value, "events")
    out: list[EventRow] = []
    append = out.append
    first_at: object = None
    for i, ev in enumerate(evs):
        if type(ev) is list and len(ev) == 4:  # version 1: [attempt, seq, type, payload]
            a, s, t, p = ev
        elif type(ev) is dict:  # version 0: one object per event
            try:
                a, s, t, p = ev["attempt"], ev["seq"], ev["type"], ev["payload"]
            except KeyError as exc:
                raise BatchFormatError(f"events[{i}].{exc.args[0]}: missing") from None
            if i == 0:
                first_at = ev.get("recorded_at")
        else:
            raise _bad(f"events[{i}]", "[attempt, seq, type, payload]", ev)
        if (
            type(a) is not int
            or type(s) is not int
            or type(p) is not str
            or not (t is None or type(t) is str)
        ):
            _int(a, f"events[{i}].attempt")
            _int(s, f"events[{i}].seq")
            _opt_str(t, f"events[{i}].type")
            _str(p, f"events[{i}].payload")
        append((a, s, t, _json_checked(p, f"events[{i}].payload")))
    return out, _opt_time(first_at, "events[0].recorded_at")


def _build(cls: type[Batch], data: dict[str, Any]) -> Batch:
    rid = _str(_field(data, "response_id"), "response_id")
    events, v0_at = _events(_field(data, "events"))
    # Every event of a batch was taken at the same moment (version 0 repeats it per event).
    recorded_at = _opt_time(data["recorded_at"], "recorded_at") if "recorded_at" in data else v0_at
    if events and recorded_at is None:
        raise BatchFormatError("recorded_at: missing, and the batch has events")
    return cls(
        response_id=rid,
        attempt=_int(_field(data, "attempt"), "attempt"),
        owner=_str(_field(data, "owner"), "owner"),
        row=_record(_field(data, "row"), "row", _ROW),
        terminal=_bool(_field(data, "terminal"), "terminal"),
        recorded_at=recorded_at,
        events=events,
        transitions=[
            _record(t, f"transitions[{i}]", _TRANSITION)
            for i, t in enumerate(_list(_field(data, "transitions"), "transitions"))
        ],
        anomalies=[
            _record(a, f"anomalies[{i}]", _ANOMALY)
            for i, a in enumerate(_list(_field(data, "anomalies"), "anomalies"))
        ],
        refusal_idx=_opt_int(data.get("refusal_idx"), "refusal_idx"),
        stream_id=_opt_str(data.get("stream_id"), "stream_id"),
    )
