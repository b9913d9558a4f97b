"""Event classification and the typed lifecycle events.

Only lifecycle events (created, queued, in_progress and the terminals) are validated, as a pydantic
discriminated union; output and delta events are never inspected beyond their ``type``.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import Enum
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

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
    """The ``type`` of a dict event or of a typed (``openai`` SDK) event; ``None`` when there is none."""
    if isinstance(event, Mapping):
        return event.get("type")
    return getattr(event, "type", None)


def as_plain_dict(event: object) -> dict[str, Any] | None:
    """A lifecycle event as a plain dict (typed SDK events are dumped); ``None`` when impossible."""
    if isinstance(event, dict):
        return event
    if isinstance(event, Mapping):
        return dict(event)
    dump = getattr(event, "model_dump", None)
    if callable(dump):
        try:
            dumped = dump(mode="json")
        except Exception:  # a broken model_dump is bad input, reported by the caller as an anomaly
            return None
        return dumped if isinstance(dumped, dict) else None
    return None


class LifecycleEventError(ValueError):
    """A lifecycle event that does not validate; the message says why."""


def parse_lifecycle_event(event: object) -> LifecycleEvent:
    """Validate a lifecycle event into its typed model, or raise :class:`LifecycleEventError`."""
    data = as_plain_dict(event)
    if data is None:
        raise LifecycleEventError(
            f"lifecycle event of type {type(event).__name__} cannot be read as a mapping"
        )
    try:
        return _LIFECYCLE_ADAPTER.validate_python(data)
    except ValidationError as exc:
        raise LifecycleEventError(_short_validation_message(exc)) from exc


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
