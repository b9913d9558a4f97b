"""What :class:`eventguard.ResponseStore` returns: typed, read-only records of stored rows.

Each record is a frozen pydantic model with one field per column it reads (see the README's table
of tables). Times are timezone-aware, in UTC, on every database (SQLite hands them back naive; they
were stored in UTC). Statuses, causes and anomaly kinds are the strings stored, the values of
:class:`eventguard.State`, :class:`eventguard.Cause` and :class:`eventguard.AnomalyKind`.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any, Generic, TypeVar

from pydantic import AfterValidator, BaseModel, ConfigDict

__all__ = [
    "AgentSessionRecord",
    "AnomalyRecord",
    "Attempt",
    "EnvelopePruneResult",
    "EnvelopeRecord",
    "EventRecord",
    "History",
    "Page",
    "PruneResult",
    "ResponseRecord",
    "Stats",
    "TransitionRecord",
]


def _utc(value: datetime | None) -> datetime | None:
    # SQLite hands datetimes back without their zone; everything is stored in UTC.
    if value is not None and value.tzinfo is None:
        return value.replace(tzinfo=UTC)
    return value


UtcDatetime = Annotated[datetime, AfterValidator(_utc)]


class _Record(BaseModel):
    model_config = ConfigDict(frozen=True, from_attributes=True)


class ResponseRecord(_Record):
    """One response's row: how its latest attempt stands or ended, and what the host said about it.

    - ``pk``: the row key, monotonic in insertion order; the cursor of :class:`Page`.
    - ``response_id``: the id as stored (a longer id than the column holds is a prefix and a hash,
      see :func:`eventguard.store.stored_id`).
    - ``status``, ``cause``: the verified state and why it ended so (``None`` while it runs).
    - ``attempt``: the current attempt, 1 unless the response was recovered and re-entered.
    - ``created_at``, ``started_at``, ``finished_at``, ``duration_ms``: when it was created, began
      in progress and ended, and how long it ran (``None`` until known).
    - ``input_tokens``, ``output_tokens``, ``total_tokens``: the usage its terminal reported.
    - ``error_code``, ``error_message``, ``error_type``: its error, ``error_type`` the qualified
      name of the exception when the ending came from one.
    - ``conversation_id``, ``chain_id``, ``partition_key``, ``agent_name``, ``background``,
      ``stream``, ``store``, ``is_recovery``, ``is_steered_turn``: what the host knew (``None``
      when it did not say).
    - ``steering_cut_short``: a steered turn kept its terminal, but its output was cut short.
    - ``unverified``: a completion recorded as forwarded but not verified.
    - ``event_count``: how many events the guard forwarded (the filter may have stored fewer).
    - ``owner``: which sink last wrote the row (``eventguard-recover`` after
      :meth:`~eventguard.ResponseStore.recover`).
    - ``updated_at``, ``version``: when the row was last written, and a counter every write bumps.
    """

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
    """One stored event of one attempt.

    - ``attempt``: the attempt it belongs to.
    - ``seq``: the guard's index of the event within the attempt; gaps are events the sink's
      filter dropped.
    - ``type``: the event's ``type`` (cut to the column's length, with an anomaly, when longer).
    - ``payload``: the event as stored (JSON; redacted if the sink has a redactor).
    - ``recorded_at``: when the sink wrote it.
    """

    attempt: int
    seq: int
    type: str | None
    payload: Any
    recorded_at: UtcDatetime


class TransitionRecord(_Record):
    """One verified state change of one attempt.

    - ``attempt``: the attempt it belongs to.
    - ``idx``: its place in the attempt's transitions; below zero when
      :meth:`~eventguard.ResponseStore.recover` wrote it.
    - ``from_state``, ``to_state``: the states, as stored.
    - ``cause``: why, for a transition that ends the lifecycle.
    - ``reason``: what the guard (or ``recover``) saw, in words.
    - ``at``: when it happened.
    """

    attempt: int
    idx: int
    from_state: str
    to_state: str
    cause: str | None
    reason: str
    at: UtcDatetime


class AnomalyRecord(_Record):
    """Something wrong that was seen and recorded, not raised.

    - ``pk``: the row key, monotonic; the cursor of :meth:`~eventguard.ResponseStore.anomalies`.
    - ``response_id``, ``attempt``: the response and attempt it belongs to.
    - ``source``: ``"guard"`` (found by the state machine) or ``"sink"`` (found while storing).
    - ``idx``: its number within its source and attempt.
    - ``kind``: an :class:`eventguard.AnomalyKind` value.
    - ``reason``: what was wrong, in words.
    - ``at``: when it was seen.
    - ``event_type``, ``event_index``, ``payload``: the offending event's type, index and content,
      when an event was the cause.
    """

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
    """One attempt of a response: its events, transitions and anomalies, each in order.

    - ``attempt``: its number, 1 for the first; a recovered re-entry is the next.
    - ``events``: by ``seq``.
    - ``transitions``: by ``idx``.
    - ``anomalies``: in the order they were stored.
    """

    attempt: int
    events: list[EventRecord]
    transitions: list[TransitionRecord]
    anomalies: list[AnomalyRecord]


class History(_Record):
    """A response's row and its whole stored history, as :meth:`~eventguard.ResponseStore.history` reads it.

    - ``response``: the response's row.
    - ``attempts``: one entry per attempt, in order.
    """

    response: ResponseRecord
    #: One entry per attempt, in order; a recovered re-entry never overwrites an earlier one.
    attempts: list[Attempt]


T = TypeVar("T")


class Page(_Record, Generic[T]):
    """One page of a paged query, oldest row first.

    - ``items``: this page's records.
    - ``next_after``: pass it as ``after=`` for the next page; ``None`` on the last page.
    """

    items: list[T]
    #: Pass as ``after=`` for the next page; None on the last page.
    next_after: int | None


class Stats(_Record):
    """Counts and duration percentiles of the responses active since ``since``.

    - ``since``: the bound asked for (``None``: every response).
    - ``total``: how many responses.
    - ``by_status``: how many per status.
    - ``by_cause``: how many per cause, for responses that have one.
    - ``duration_ms_p50``, ``duration_ms_p90``, ``duration_ms_p99``: nearest-rank percentiles of
      the duration of ended responses that have one (``None`` when there are none).
    """

    since: UtcDatetime | None
    total: int
    by_status: dict[str, int]
    by_cause: dict[str, int]
    #: Nearest-rank percentiles over ended responses with a duration.
    duration_ms_p50: float | None
    duration_ms_p90: float | None
    duration_ms_p99: float | None


class EnvelopeRecord(_Record):
    """A response as the host's SQL response store keeps it (``SqlResponseProvider``), for one user
    partition: what ``GET /responses/{id}`` and ``/input_items`` serve.

    - ``partition``: ``anonymous``, or the SHA-256 of the host's ``user_id_key``.
    - ``status``: the envelope's own status; ``deleted``: soft-deleted (``envelope`` is then None).
    - ``input_items``: the history then the input items, oldest first (ids with no stored item are
      left out); ``output_items``: the items of its output, in order.
    """

    partition: str
    status: str | None
    deleted: bool
    updated_at: UtcDatetime
    envelope: dict[str, Any] | None
    input_items: list[Any]
    output_items: list[Any]


class EnvelopePruneResult(_Record):
    """How many rows :meth:`~eventguard.ResponseStore.prune_envelopes` deleted from the host's
    response store (``SqlResponseProvider``'s tables).

    - ``envelopes``: ended or deleted envelopes last written before the cutoff (with their links
      and conversation memberships).
    - ``items``: items last written before the cutoff that no kept response still names (as input,
      output or history).
    - ``history_nodes``: shared history nodes no kept response reaches any more.
    """

    envelopes: int
    items: int
    history_nodes: int


class AgentSessionRecord(_Record):
    """One agent session the host keeps in SQL (``SqlAgentSessionStoreProvider``,
    ``eventguard_agent_sessions``), as read back.

    - ``partition``: ``anonymous``, or the SHA-256 of the platform's ``user_id``.
    - ``session_id``: the exact id the host stored it under (as stored when it does not decode).
    - ``version``: bumped on every write; ``size``: the stored JSON text's length in characters.
    - ``session``: the session (``AgentSession.to_dict()``), or None when ``problem`` says why it
      cannot be read back as one (what ``eventguard verify`` reports).
    """

    partition: str
    session_id: str
    version: int
    updated_at: UtcDatetime
    size: int
    session: dict[str, Any] | None
    problem: str | None


class PruneResult(_Record):
    """How many rows :meth:`~eventguard.ResponseStore.prune` deleted, per table.

    - ``responses``: response rows (0 when the summaries were kept).
    - ``events``, ``transitions``, ``anomalies``: history rows.
    """

    responses: int
    events: int
    transitions: int
    anomalies: int
