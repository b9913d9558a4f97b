"""Turning a forwarded event into stored JSON, off the hot path, without ever raising.

Whatever the event is (a dict, an openai SDK model, a slotted host object, something with a
value JSON cannot hold), something is stored, and a lossy conversion says so as an anomaly.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import orjson
from pydantic import BaseModel

from eventguard.events import json_of_model
from eventguard.lifecycle import AnomalyKind
from eventguard.sql.engine import PreSerialised
from eventguard.sql.storable import JsonNotes, clean_json, nulls_hide_non_finite

#: ``(event_type, jsonable_event) -> what to store``. Runs in the writer, not on the hot path.
#: It receives the very dict the client was sent: return a new object, never mutate it.
Redactor = Callable[[str | None, Any], Any]

#: orjson options for every stored payload (the recorder's fast path uses them too).
JSON_OPTIONS = orjson.OPT_NON_STR_KEYS
_REPR_LIMIT = 2_000


@dataclass(slots=True)
class Encoded:
    text: PreSerialised
    #: (kind, reason) for each lossy step taken.
    problems: list[tuple[AnomalyKind, str]]


def _stand_in(obj: object, why: str) -> dict[str, Any]:
    try:
        shown = repr(obj)
    except Exception as exc:  # a broken __repr__ must not break recording
        shown = f"<unrepresentable: {type(exc).__name__}>"
    return {
        "_eventguard": {
            "not_serialisable": why,
            "python_type": f"{type(obj).__module__}.{type(obj).__qualname__}",
            "repr": shown[:_REPR_LIMIT],
        }
    }


def _jsonable(event: object) -> tuple[object, str | None]:
    """The event as something orjson takes, and why not when it is not an event shape."""
    if isinstance(event, dict | list):
        return event, None
    if isinstance(event, Mapping):
        return dict(event), None
    if isinstance(event, BaseModel):
        return json_of_model(event)
    return _stand_in(event, "not a mapping"), f"{type(event).__qualname__} is not a mapping: stored its repr"


def encode(
    event: object, event_type: str | None, *, max_bytes: int, redact: Redactor | None = None
) -> Encoded:
    problems: list[tuple[AnomalyKind, str]] = []
    obj, why = _jsonable(event)
    if why is not None:
        problems.append((AnomalyKind.NOT_SERIALISABLE, why))
    if redact is not None:
        obj = redact(event_type, obj)

    fallbacks: list[str] = []
    notes = JsonNotes()

    def default(value: object) -> object:
        # What orjson cannot take itself, made storable here too (a str() may hold a NUL).
        if isinstance(value, BaseModel):
            dumped, why = json_of_model(value)
            if why is not None:
                fallbacks.append(type(value).__qualname__)
            return clean_json(dumped, notes, "$(model)")
        fallbacks.append(type(value).__qualname__)
        return clean_json(str(value), notes, "$(str)")

    data: bytes | None = None
    error: Exception | None = None
    try:
        data = orjson.dumps(obj, default=default, option=JSON_OPTIONS)
    except (TypeError, orjson.JSONEncodeError) as exc:
        error = exc
    # What JSON columns cannot hold: NUL (jsonb refuses it), lone surrogates (orjson refuses
    # them), NaN and infinities (orjson writes null). Rare, so looked for only when a sign of it
    # shows, then cleaned in one walk and serialised again: one such event must neither block a
    # whole write nor go unexplained.
    if data is not None:
        dirty = data.find(NUL) >= 0 or nulls_hide_non_finite(obj, data)
    else:
        dirty = "surrogates" in str(error)
    if dirty:
        fallbacks.clear()
        notes = JsonNotes()
        cleaned = clean_json(obj, notes)
        data, error = None, None
        try:
            data = orjson.dumps(cleaned, default=default, option=JSON_OPTIONS)
        except (TypeError, orjson.JSONEncodeError) as exc:
            error = exc
    if data is None:
        data = orjson.dumps(clean_json(_stand_in(obj, str(error)), JsonNotes()))
        problems.append((AnomalyKind.NOT_SERIALISABLE, f"not JSON ({error}): stored its repr"))
    if fallbacks:
        kinds = ", ".join(sorted(set(fallbacks)))
        problems.append((AnomalyKind.NOT_SERIALISABLE, f"values of type {kinds} stored as strings"))
    problems.extend((AnomalyKind.NOT_SERIALISABLE, reason) for reason in notes.reasons())

    if len(data) > max_bytes:
        size = len(data)
        # Half the limit: escaping the head as a JSON string can grow it.
        head = data[: max(max_bytes // 2, 1)].decode("utf-8", errors="ignore")
        kept_type = None if event_type is None else clean_json(event_type, JsonNotes())
        data = orjson.dumps(
            {"_eventguard": {"truncated": True, "original_bytes": size, "type": kept_type}, "head": head}
        )
        problems.append(
            (AnomalyKind.PAYLOAD_TRUNCATED, f"payload of {size} bytes exceeds the {max_bytes} limit")
        )
    return Encoded(PreSerialised(data.decode()), problems)


#: How orjson writes U+0000 inside a JSON string.
NUL = b"\\u0000"


def encode_value(value: object) -> PreSerialised | None:
    """An anomaly's payload (often the offending event): same rules, no size limit, no report."""
    if value is None:
        return None
    return encode(value, None, max_bytes=1 << 62).text
