"""What the store returns: typed, read-only records of stored rows."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any, Generic, TypeVar

from pydantic import AfterValidator, BaseModel, ConfigDict


def _utc(value: datetime | None) -> datetime | None:
    # SQLite hands datetimes back without their zone; everything is stored in UTC.
    if value is not None and value.tzinfo is None:
        return value.replace(tzinfo=UTC)
    return value


UtcDatetime = Annotated[datetime, AfterValidator(_utc)]


class _Record(BaseModel):
    model_config = ConfigDict(frozen=True, from_attributes=True)


class ResponseRecord(_Record):
    pk: int
    response_id: str
    status: str
    cause: str | None
    attempt: int
    created_at: UtcDatetime | None
    started_at: UtcDatetime | None
    finished_at: UtcDatetime | None
    duration_ms: float | None
    input_tokens: int | None
    output_tokens: int | None
    total_tokens: int | None
    error_code: str | None
    error_message: str | None
    error_type: str | None
    conversation_id: str | None
    chain_id: str | None
    partition_key: str | None
    agent_name: str | None
    background: bool | None
    stream: bool | None
    store: bool | None
    is_recovery: bool
    is_steered_turn: bool
    steering_cut_short: bool
    unverified: bool
    event_count: int
    owner: str | None
    updated_at: UtcDatetime
    version: int


class EventRecord(_Record):
    attempt: int
    seq: int
    type: str | None
    payload: Any
    recorded_at: UtcDatetime


class TransitionRecord(_Record):
    attempt: int
    idx: int
    from_state: str
    to_state: str
    cause: str | None
    reason: str
    at: UtcDatetime


class AnomalyRecord(_Record):
    pk: int
    response_id: str
    attempt: int
    source: str
    idx: int
    kind: str
    reason: str
    at: UtcDatetime
    event_type: str | None
    event_index: int | None
    payload: Any


class Attempt(_Record):
    attempt: int
    events: list[EventRecord]
    transitions: list[TransitionRecord]
    anomalies: list[AnomalyRecord]


class History(_Record):
    response: ResponseRecord
    #: One entry per attempt, in order; a recovered re-entry never overwrites an earlier one.
    attempts: list[Attempt]


T = TypeVar("T")


class Page(_Record, Generic[T]):
    items: list[T]
    #: Pass as ``after=`` for the next page; None on the last page.
    next_after: int | None


class Stats(_Record):
    since: UtcDatetime | None
    total: int
    by_status: dict[str, int]
    by_cause: dict[str, int]
    #: Nearest-rank percentiles over ended responses with a duration.
    duration_ms_p50: float | None
    duration_ms_p90: float | None
    duration_ms_p99: float | None


class PruneResult(_Record):
    responses: int
    events: int
    transitions: int
    anomalies: int
