"""Event classification and the typed lifecycle events.

Only lifecycle events (created, queued, in_progress and the terminals) are validated, as a pydantic
discriminated union; output and delta events are never inspected beyond their ``type``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from datetime import date, datetime, time
from decimal import Decimal
from enum import Enum
from typing import Annotated, Any, Literal
from uuid import UUID

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError
from pydantic_core import to_jsonable_python

from eventguard.lifecycle import ErrorInfo, State, Usage


class Kind(Enum):
    CREATED = "created"
    QUEUED = "queued"
    IN_PROGRESS = "in_progress"
    TERMINAL = "terminal"


CREATED = "response.created"
QUEUED = "response.queued"
IN_PROGRESS = "response.in_progress"
COMPLETED = "response.completed"
INCOMPLETE = "response.incomplete"
FAILED = "response.failed"

#: Event types that the guard looks at. Every other type takes the hot path untouched.
LIFECYCLE_KINDS: dict[str, Kind] = {
    CREATED: Kind.CREATED,
    QUEUED: Kind.QUEUED,
    IN_PROGRESS: Kind.IN_PROGRESS,
    COMPLETED: Kind.TERMINAL,
    INCOMPLETE: Kind.TERMINAL,
    FAILED: Kind.TERMINAL,
}
TERMINAL_TYPES: frozenset[str] = frozenset({COMPLETED, INCOMPLETE, FAILED})


class ResponseSnapshot(BaseModel):
    """The ``response`` object a lifecycle event carries; only the fields we rely on are typed."""

    model_config = ConfigDict(extra="allow")

    id: str | None = None
    status: str | None = None
    # An epoch number on a fresh run, a string in a recovered re-entry's persisted snapshot.
    created_at: float | int | str | None = None
    usage: Usage | None = None
    error: dict[str, Any] | None = None
    conversation: dict[str, Any] | str | None = None


class _LifecycleEventBase(BaseModel):
    model_config = ConfigDict(extra="allow")
    sequence_number: int | None = None
    response: ResponseSnapshot


class ResponseCreated(_LifecycleEventBase):
    type: Literal["response.created"]


class ResponseQueued(_LifecycleEventBase):
    type: Literal["response.queued"]


class ResponseInProgress(_LifecycleEventBase):
    type: Literal["response.in_progress"]


class ResponseCompleted(_LifecycleEventBase):
    type: Literal["response.completed"]


class ResponseIncomplete(_LifecycleEventBase):
    type: Literal["response.incomplete"]


class ResponseFailed(_LifecycleEventBase):
    type: Literal["response.failed"]


LifecycleEvent = Annotated[
    ResponseCreated
    | ResponseQueued
    | ResponseInProgress
    | ResponseCompleted
    | ResponseIncomplete
    | ResponseFailed,
    Field(discriminator="type"),
]
_LIFECYCLE_ADAPTER: TypeAdapter[LifecycleEvent] = TypeAdapter(LifecycleEvent)

#: What each terminal type claims, before its ``response.status`` is checked against it.
_TERMINAL_STATES: dict[str, State] = {
    COMPLETED: State.COMPLETED,
    INCOMPLETE: State.INCOMPLETE,
    FAILED: State.FAILED,
}
#: ``response.status`` values each terminal type may carry (a cancel travels as ``response.failed``).
_ACCEPTED_STATUSES: dict[str, frozenset[str]] = {
    COMPLETED: frozenset({"completed"}),
    INCOMPLETE: frozenset({"incomplete"}),
    FAILED: frozenset({"failed", "cancelled"}),
}


def event_type_of(event: object) -> object:
    """The ``type`` of a dict event or of an event object; ``None`` when there is none.

    An enum member whose value is a string (``EventType.COMPLETED``) is read as that string.
    """
    if isinstance(event, Mapping):
        etype = event.get("type")
    else:
        try:
            etype = getattr(event, "type", None)
        except Exception:  # a property that raises: no usable type
            return None
    if isinstance(etype, Enum) and isinstance(etype.value, str):
        return etype.value
    return etype


#: Leaves kept as they are when an event object is read into plain data (pydantic handles them).
_LEAVES: tuple[type, ...] = (str, int, float, bool, type(None), bytes, datetime, date, time, Decimal, UUID)
#: The fields a lifecycle event is read for, at any depth, when an object does not list its fields
#: (a property, a class attribute): the event, its ``response`` snapshot, its ``usage`` and ``error``.
_KNOWN_FIELDS: tuple[str, ...] = (
    "type",
    "sequence_number",
    "response",
    "id",
    "status",
    "created_at",
    "usage",
    "error",
    "conversation",
    "input_tokens",
    "output_tokens",
    "total_tokens",
    "code",
    "message",
)
_MAX_DEPTH = 32


def json_of_model(model: BaseModel, *, exclude_none: bool = False) -> tuple[Any, str | None]:
    """``model`` as JSON values (``model_dump(mode="json")``), and why not exactly when it could not be.

    pydantic writes ``bytes`` as UTF-8 text and refuses what is not UTF-8 (``b"\\x80"``), and refuses
    an object of a type it does not know: an event that carries one must not stop the stream or the
    write (the guard and the sink both dump events). Then every ``bytes`` value is written as base64
    and every unknown object as its ``repr``, and the reason says so (an anomaly for the caller).
    """
    try:
        return model.model_dump(mode="json", exclude_none=exclude_none), None
    except ValueError as exc:  # UnicodeDecodeError and PydanticSerializationError are ValueErrors
        error: Exception = exc
    try:
        # The model's own serialiser keeps its bytes mode: its Python dump, then plain data's.
        plain = model.model_dump(exclude_none=exclude_none)
        dumped = to_jsonable_python(plain, bytes_mode="base64", fallback=_repr)
    except Exception as exc:  # nested past pydantic's depth limit, a cycle, an object that cannot say itself
        kept: dict[str, Any] = {}
        left_out: list[str] = []
        for name, _value in model:  # field by field (the extra ones too): only what cannot be read goes
            # Through the model's own dump, one field at a time, so that its exclusions and field
            # serialisers (a redacting one, say) still apply.
            try:
                kept.update(model.model_dump(mode="json", include={name}, exclude_none=exclude_none))
                continue
            except Exception:
                pass
            try:
                one = model.model_dump(include={name}, exclude_none=exclude_none)
                kept.update(to_jsonable_python(one, bytes_mode="base64", fallback=_repr))
            except Exception:
                left_out.append(name)
        without = ", ".join(map(repr, left_out)) or "its unreadable values"
        why = (
            f"{type(model).__name__} could not be read as JSON ({type(error).__name__}, then "
            f"{type(exc).__name__}): stored without {without}"
        )
        return kept, why
    why = (
        f"{type(model).__name__} holds values JSON cannot take ({type(error).__name__}): "
        "its bytes stored as base64, other objects as their repr"
    )
    return dumped, why


def _repr(value: object) -> str:
    """``repr(value)``, or a stand-in naming its type when its ``__repr__`` raises."""
    try:
        return repr(value)
    except Exception:
        return f"<{type(value).__qualname__} whose repr() raised>"


def as_plain_dict(event: object) -> dict[str, Any] | None:
    """A lifecycle event as plain data; ``None`` when it has no fields that can be read.

    Reads a dict or any ``Mapping``, a pydantic model (``model_dump``), a dataclass, an attrs class,
    an object with ``__slots__`` or a ``__dict__`` (``types.SimpleNamespace``), and, on any object,
    the fields a lifecycle event is known to carry; nested values (the ``response`` snapshot and its
    ``usage`` and ``error``) are read the same way. Only lifecycle events come here: a handful per
    stream, never the hot path.
    """
    if isinstance(event, dict):
        return event
    data = _plain(event, 0, set())
    return data if isinstance(data, dict) else None


def _plain(value: object, depth: int, seen: set[int]) -> Any:
    """``value`` as JSON-like data: mappings and readable objects become dicts, sequences lists."""
    if isinstance(value, Enum):
        value = value.value
    if isinstance(value, _LEAVES):
        return value
    if depth >= _MAX_DEPTH or id(value) in seen:
        return repr(value)
    seen.add(id(value))
    try:
        if isinstance(value, Mapping):
            return {str(k): _plain(v, depth + 1, seen) for k, v in value.items()}
        if isinstance(value, list | tuple | set | frozenset):
            return [_plain(v, depth + 1, seen) for v in value]
        fields = _fields_of(value)
        if fields is None:
            return repr(value)
        return {k: _plain(v, depth + 1, seen) for k, v in fields.items()}
    finally:
        seen.discard(id(value))


def _fields_of(obj: object) -> dict[str, Any] | None:
    """The readable fields of an object, or ``None`` when it has none (a number-like, a function)."""
    if isinstance(obj, type):
        return None
    dump = getattr(obj, "model_dump", None)
    if callable(dump):  # pydantic v2 (the openai SDK's events)
        try:
            dumped = dump(mode="json")
        except Exception:  # a broken model_dump: read its attributes like any other object's
            dumped = None
        if isinstance(dumped, dict):
            return dumped
    fields: dict[str, Any] = {}
    names: list[str] = []
    if dataclasses.is_dataclass(obj):
        names += [f.name for f in dataclasses.fields(obj)]
    attrs_fields = getattr(type(obj), "__attrs_attrs__", None)
    if attrs_fields is not None:
        names += [a.name for a in attrs_fields]
    for cls in type(obj).__mro__:
        slots = cls.__dict__.get("__slots__", ())
        names += [slots] if isinstance(slots, str) else list(slots)
    own = getattr(obj, "__dict__", None)
    if isinstance(own, dict):
        names += list(own)
    names += _KNOWN_FIELDS  # a property or a class attribute is listed nowhere else
    for name in names:
        if name in fields or name.startswith("_"):
            continue
        try:
            value = getattr(obj, name)
        except Exception:  # not set (an empty slot), or a property that cannot be read
            continue
        if callable(value) and not isinstance(value, type):
            continue  # a method, not a field
        fields[name] = value
    return fields or None


class LifecycleEventError(ValueError):
    """A lifecycle event that does not validate; the message says why."""


def parse_lifecycle_event(event: object) -> LifecycleEvent:
    """Validate a lifecycle event into its typed model, or raise :class:`LifecycleEventError`.

    A dict is validated as it is; only when that fails is it read again as plain data, for a dict
    that carries objects (a ``response`` that is a model or a dataclass, a ``usage`` object).
    """
    data = as_plain_dict(event)
    if data is None:
        raise LifecycleEventError(
            f"lifecycle event of type {type(event).__name__} has no fields that can be read"
        )
    try:
        return _LIFECYCLE_ADAPTER.validate_python(data)
    except ValidationError as exc:
        if data is not event:
            raise LifecycleEventError(_short_validation_message(exc)) from exc
        error = exc
    try:
        return _LIFECYCLE_ADAPTER.validate_python(_plain(event, 0, set()))
    except ValidationError as exc:
        raise LifecycleEventError(_short_validation_message(exc)) from error


def _short_validation_message(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors()[:3]:
        where = ".".join(str(p) for p in err["loc"]) or "event"
        parts.append(f"{where}: {err['msg']}")
    return "; ".join(parts)


class TerminalClaim(BaseModel):
    """What a terminal event says happened."""

    state: State
    usage: Usage | None = None
    error: ErrorInfo | None = None
    #: Set when ``response.status`` contradicts the event type; the reason a person can read.
    mismatch: str | None = None


def read_terminal(parsed: ResponseCompleted | ResponseIncomplete | ResponseFailed) -> TerminalClaim:
    """Read the claimed ending from a validated terminal event.

    The type is authoritative: ``response.failed`` with status ``cancelled`` is a cancel; any other
    status that contradicts the type is reported, and the type wins.
    """
    status = parsed.response.status
    state = _TERMINAL_STATES[parsed.type]
    mismatch = None
    if status is not None and status not in _ACCEPTED_STATUSES[parsed.type]:
        mismatch = f"{parsed.type} carries response.status={status!r}"
    elif parsed.type == FAILED and status == "cancelled":
        state = State.CANCELLED
    error = None
    if parsed.response.error:
        raw = parsed.response.error
        error = ErrorInfo(code=_opt_str(raw.get("code")), message=_opt_str(raw.get("message")))
    return TerminalClaim(state=state, usage=parsed.response.usage, error=error, mismatch=mismatch)


def _opt_str(value: object) -> str | None:
    return None if value is None else str(value)
