"""The lifecycle of one response as a checked state machine (pydantic).

The model knows nothing of SQL or of the host. It is mutated only by its guard, in one event loop;
``transitions`` and ``anomalies`` are append-only so a sink can write the tail it has not written yet.
"""

from __future__ import annotations

from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from eventguard import telemetry
from eventguard.errors import IllegalTransition

__all__ = [
    "ALLOWED_TRANSITIONS",
    "CORRECTIONS",
    "ENDED_STATES",
    "TERMINAL_STATES",
    "Anomaly",
    "AnomalyKind",
    "Cause",
    "ErrorInfo",
    "Lifecycle",
    "ResponseInfo",
    "State",
    "Transition",
    "Usage",
]


class State(StrEnum):
    """Where a response is: ``new``, ``queued``, ``in_progress``, one of the terminal states
    (``completed``, ``incomplete``, ``failed``, ``cancelled``: final), or ``interrupted`` (stopped by
    shutdown; a recovered attempt may take it up again). The moves allowed are ``ALLOWED_TRANSITIONS``."""

    NEW = "new"
    QUEUED = "queued"
    IN_PROGRESS = "in_progress"
    COMPLETED = "completed"
    INCOMPLETE = "incomplete"
    FAILED = "failed"
    CANCELLED = "cancelled"
    # Ended without a verdict: the run may be recovered (a new attempt) or later marked failed.
    INTERRUPTED = "interrupted"


#: Final states: a terminal is never overwritten, by this process or any other writer.
TERMINAL_STATES: frozenset[State] = frozenset(
    {State.COMPLETED, State.INCOMPLETE, State.FAILED, State.CANCELLED}
)
#: States in which the stream is over, for now.
ENDED_STATES: frozenset[State] = TERMINAL_STATES | {State.INTERRUPTED}
_ENDINGS_WITHOUT_OUTPUT = frozenset({State.FAILED, State.CANCELLED, State.INTERRUPTED})

#: Every allowed transition. Anything else raises :class:`IllegalTransition`.
ALLOWED_TRANSITIONS: dict[State, frozenset[State]] = {
    # A stream may end before it produced anything, but it cannot succeed without starting.
    State.NEW: frozenset({State.QUEUED, State.IN_PROGRESS}) | _ENDINGS_WITHOUT_OUTPUT,
    State.QUEUED: frozenset({State.IN_PROGRESS}) | TERMINAL_STATES | {State.INTERRUPTED},
    State.IN_PROGRESS: TERMINAL_STATES | {State.INTERRUPTED},
    # A recovered re-entry replays created / in_progress as a new attempt; recovery policy may fail it.
    State.INTERRUPTED: frozenset({State.QUEUED, State.IN_PROGRESS, State.FAILED, State.CANCELLED}),
    State.COMPLETED: frozenset(),
    State.INCOMPLETE: frozenset(),
    State.FAILED: frozenset(),
    State.CANCELLED: frozenset(),
}


class Cause(StrEnum):
    """Why a lifecycle ended the way it did."""

    NORMAL = "normal"
    CLIENT_CANCEL = "client_cancel"
    SHUTDOWN = "shutdown"
    STEERING = "steering"
    ERROR = "error"
    MISSING_TERMINAL = "missing_terminal"
    STUCK = "stuck"
    ABANDONED = "abandoned"
    CLOSED_EARLY = "closed_early"
    RECOVERY = "recovery"
    RECOVER_POLICY = "recover_policy"
    #: The replica that ran the response is gone: its lease expired and a survivor ended it
    #: (eventguard.replicas).
    OWNER_LOST = "owner_lost"


class AnomalyKind(StrEnum):
    """What an :class:`Anomaly` is about: something the guard or the sink noticed and kept, instead of
    refusing the stream (an out-of-order event, a terminal it replaced, a value it had to escape...)."""

    ILLEGAL_TRANSITION = "illegal_transition"
    DUPLICATE_TERMINAL = "duplicate_terminal"
    EVENT_AFTER_TERMINAL = "event_after_terminal"
    STATUS_MISMATCH = "status_mismatch"
    NOT_A_MAPPING = "not_a_mapping"
    MISSING_TYPE = "missing_type"
    INVALID_LIFECYCLE_EVENT = "invalid_lifecycle_event"
    OUT_OF_ORDER = "out_of_order"
    TERMINAL_REPLACED = "terminal_replaced"
    TERMINAL_WITHHELD = "terminal_withheld"
    UNVERIFIED_COMPLETION = "unverified_completion"
    CANCEL_WITHOUT_CLIENT_CANCEL = "cancel_without_client_cancel"
    MISSING_TERMINAL = "missing_terminal"
    STUCK = "stuck"
    ABANDONED = "abandoned"
    SINK_REFUSED = "sink_refused"
    SINK_TIMEOUT = "sink_timeout"
    PAYLOAD_TRUNCATED = "payload_truncated"
    NOT_SERIALISABLE = "not_serialisable"
    #: A column value (an id, a message, a reason, an event type) changed to be storable.
    VALUE_ESCAPED = "value_escaped"
    #: A second stream carried this response's id and attempt: refused as a whole (sink.apply).
    DUPLICATE_STREAM = "duplicate_stream"
    #: A replica's write was refused by its fencing token: another replica (or the reaper) took the
    #: response over after this one's lease expired (eventguard.replicas).
    FENCED_OUT = "fenced_out"
    #: A cause flag (the cancellation signal, ``process_shutdown``, the context's ``client_cancelled``
    #: or ``shutdown``) raised when read: taken as not set, the stream's own ending stands.
    FLAG_UNREADABLE = "flag_unreadable"

    @property
    def correction(self) -> bool:
        """This kind corrects a lie: the stream said something untrue, the truth was recorded instead."""
        return self in CORRECTIONS


#: Anomalies that correct a lie (logged at WARNING, see :mod:`eventguard.telemetry`): a terminal
#: replaced or withheld, a status contradicting its event type, a cancel the host did not ask for,
#: a completion kept but not verified.
CORRECTIONS: frozenset[AnomalyKind] = frozenset(
    {
        AnomalyKind.TERMINAL_REPLACED,
        AnomalyKind.TERMINAL_WITHHELD,
        AnomalyKind.STATUS_MISMATCH,
        AnomalyKind.CANCEL_WITHOUT_CLIENT_CANCEL,
        AnomalyKind.UNVERIFIED_COMPLETION,
    }
)


def utcnow() -> datetime:
    return datetime.now(UTC)


class Usage(BaseModel):
    """Token counts as the terminal event reported them (``response.usage``); each may be unknown."""

    model_config = ConfigDict(extra="ignore")
    input_tokens: int | None = None
    output_tokens: int | None = None
    total_tokens: int | None = None


class ErrorInfo(BaseModel):
    """Why a response failed: the terminal's ``error.code`` and ``error.message``, or the exception the
    inner stream raised (``exception_type``, and its text as ``message``)."""

    code: str | None = None
    message: str | None = None
    #: Set when the ending came from an exception: its qualified type name.
    exception_type: str | None = None


class Transition(BaseModel):
    """One verified state change: ``index`` within the lifecycle, the ``attempt`` it belongs to, the
    states it moved between, when, its ``cause`` (for endings) and the ``reason`` (usually the event type)."""

    index: int
    attempt: int
    from_state: State
    to_state: State
    at: datetime
    cause: Cause | None = None
    reason: str = ""


class Anomaly(BaseModel):
    """Something that did not fit the state machine or could not be stored as it was: its ``kind``, a
    ``reason`` a person can read, when, the offending event's type and index, and its ``payload``."""

    index: int
    attempt: int
    at: datetime
    kind: AnomalyKind
    reason: str
    event_type: str | None = None
    #: Position in the forwarded stream when the anomaly was found.
    event_index: int | None = None
    #: The offending event (or a stand-in), so that nothing is dropped silently.
    payload: Any = None


class ResponseInfo(BaseModel):
    """What the host knows about a response, recorded beside its lifecycle."""

    response_id: str | None = None
    conversation_id: str | None = None
    chain_id: str | None = None
    partition_key: str | None = None
    agent_name: str | None = None
    background: bool | None = None
    stream: bool | None = None
    store: bool | None = None
    is_recovery: bool = False
    is_steered_turn: bool = False


class Lifecycle(BaseModel):
    """One response's lifecycle: its verified state, how it ended, and every anomaly on the way."""

    model_config = ConfigDict(validate_assignment=False)

    info: ResponseInfo = Field(default_factory=ResponseInfo)
    state: State = State.NEW
    cause: Cause | None = None
    attempt: int = 1
    created_at: datetime | None = None
    started_at: datetime | None = None
    finished_at: datetime | None = None
    usage: Usage | None = None
    error: ErrorInfo | None = None
    #: A steered turn keeps its normal terminal, but its output was cut short by the new input.
    steering_cut_short: bool = False
    #: A completion (or incomplete) recorded as forwarded but not verified: kept on request although
    #: the shutdown flag was set when it was produced, or a terminal that could not be read, or one
    #: whose start the stream never reported.
    unverified: bool = False
    events_forwarded: int = 0
    transitions: list[Transition] = Field(default_factory=list)
    anomalies: list[Anomaly] = Field(default_factory=list)

    @classmethod
    def for_recovery(cls, info: ResponseInfo) -> Lifecycle:
        """A recovered re-entry of the response ``info`` describes starts where the first attempt
        stopped: interrupted, next attempt."""
        return cls(info=info, state=State.INTERRUPTED, attempt=2)

    @property
    def ended(self) -> bool:
        """The stream is over, for now: a terminal state, or ``interrupted`` (a recovery may follow)."""
        return self.state in ENDED_STATES

    @property
    def terminal(self) -> bool:
        """The response has its one terminal (``completed``, ``incomplete``, ``failed``, ``cancelled``)."""
        return self.state in TERMINAL_STATES

    @property
    def duration_ms(self) -> float | None:
        """Milliseconds from start (or creation) to the end; None while it runs or when unknown."""
        start = self.started_at or self.created_at
        if start is None or self.finished_at is None:
            return None
        return (self.finished_at - start).total_seconds() * 1000.0

    def can_transition(self, to: State) -> bool:
        """Whether ``to`` is an allowed next state (``ALLOWED_TRANSITIONS``); nothing changes."""
        return to in ALLOWED_TRANSITIONS[self.state]

    def transition(self, to: State, *, cause: Cause | None = None, reason: str = "") -> Transition:
        """Move to ``to`` or raise :class:`IllegalTransition`; the state is unchanged on refusal.

        ``cause`` says why (kept when ``to`` ends the lifecycle); ``reason`` is the text a person reads.
        """
        src = self.state
        if to not in ALLOWED_TRANSITIONS[src]:
            raise IllegalTransition(src, to, reason or "not an allowed transition")
        now = utcnow()
        if src is State.INTERRUPTED and to in (State.QUEUED, State.IN_PROGRESS):
            # A recovered re-entry: the earlier attempt's records stay as they are.
            if self.transitions:
                self.attempt += 1
            self.cause = None
            self.finished_at = None
        if to in (State.QUEUED, State.IN_PROGRESS) and self.created_at is None:
            self.created_at = now
        if to is State.IN_PROGRESS and self.started_at is None:
            self.started_at = now
        if to in ENDED_STATES:
            self.finished_at = now
            self.cause = cause
        step = Transition(
            index=len(self.transitions),
            attempt=self.attempt,
            from_state=src,
            to_state=to,
            at=now,
            cause=cause,
            reason=reason,
        )
        self.state = to
        self.transitions.append(step)
        if to in ENDED_STATES:
            telemetry.response_ended(self, step)
        return step

    def note(
        self,
        kind: AnomalyKind,
        reason: str,
        *,
        event_type: str | None = None,
        event_index: int | None = None,
        payload: Any = None,
    ) -> Anomaly:
        """Record an anomaly: something refused or repaired, with the reason a person can read.

        ``kind`` says what it is about; ``event_type``, ``event_index`` and ``payload`` locate the event
        it concerns, where there is one. It is also reported (:mod:`eventguard.telemetry`).
        """
        anomaly = Anomaly(
            index=len(self.anomalies),
            attempt=self.attempt,
            at=utcnow(),
            kind=kind,
            reason=reason,
            event_type=event_type,
            event_index=event_index,
            payload=payload,
        )
        self.anomalies.append(anomaly)
        telemetry.anomaly_noted(self, anomaly)
        return anomaly
