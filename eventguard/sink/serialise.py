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

from eventguard._db import PreSerialised
from eventguard.lifecycle import AnomalyKind

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
        return event.model_dump(mode="json"), None
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

    def default(value: object) -> object:
        if isinstance(value, BaseModel):
            return value.model_dump(mode="json")
        fallbacks.append(type(value).__qualname__)
        return str(value)

    try:
        data = orjson.dumps(obj, default=default, option=JSON_OPTIONS)
    except (TypeError, orjson.JSONEncodeError) as exc:
        data = orjson.dumps(_stand_in(obj, str(exc)))
        problems.append((AnomalyKind.NOT_SERIALISABLE, f"not JSON ({exc}): stored its repr"))
    if fallbacks:
        kinds = ", ".join(sorted(set(fallbacks)))
        problems.append((AnomalyKind.NOT_SERIALISABLE, f"values of type {kinds} stored as strings"))
    if NUL in data:
        # PostgreSQL's jsonb cannot hold U+0000, and one such event must not block a whole write.
        data = orjson.dumps(_without_nul(orjson.loads(data)), option=JSON_OPTIONS)
        problems.append(
            (AnomalyKind.NOT_SERIALISABLE, "NUL characters (U+0000) stored as U+FFFD: jsonb cannot hold them")
        )

    if len(data) > max_bytes:
        size = len(data)
        # Half the limit: escaping the head as a JSON string can grow it.
        head = data[: max(max_bytes // 2, 1)].decode("utf-8", errors="ignore")
        data = orjson.dumps(
            {"_eventguard": {"truncated": True, "original_bytes": size, "type": event_type}, "head": head}
        )
        problems.append(
            (AnomalyKind.PAYLOAD_TRUNCATED, f"payload of {size} bytes exceeds the {max_bytes} limit")
        )
    return Encoded(PreSerialised(data.decode()), problems)


#: How orjson writes U+0000 inside a JSON string.
NUL = b"\\u0000"


def _without_nul(value: Any) -> Any:
    """``value`` with every U+0000 in its strings (keys included) replaced by U+FFFD."""
    if isinstance(value, str):
        return value.replace("\x00", "\ufffd")
    if isinstance(value, list):
        return [_without_nul(v) for v in value]
    if isinstance(value, dict):
        return {_without_nul(k): _without_nul(v) for k, v in value.items()}
    return value


def encode_value(value: object) -> PreSerialised | None:
    """An anomaly's payload (often the offending event): same rules, no size limit, no report."""
    if value is None:
        return None
    return encode(value, None, max_bytes=1 << 62).text
