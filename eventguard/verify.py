"""Re-check what the sink stored: every history replayed through the lifecycle state machine.

:func:`verify` is what ``eventguard verify`` runs (the command only prints the report). For each
response and attempt, the stored transitions are replayed through the state machine's table
(``ALLOWED_TRANSITIONS``, what :meth:`eventguard.Lifecycle.transition` checks when the guard records
them; not a ``Lifecycle``, whose ending would be reported as a response's metric again), the
stored lifecycle events are read as the guard reads them, and the three are compared with the
response row: every way a response's transitions, events and status disagree is a
:class:`Disagreement` in the returned :class:`VerifyReport`. A terminal event whose payload does not
validate is one only where no anomaly says why: the sink's (stored cut, or as its repr) or the
guard's (``invalid_lifecycle_event``: it came so from the host, and was recorded as it ended).

``check_history`` does the same for one :class:`~eventguard.store.History` already read, without I/O.

One truth: where the host's response store is the same database (``SqlResponseProvider``), each
response's verified status is also compared with the status of the envelope the host serves
(:func:`envelope_disagreements`). Both are written at the end of a response, by two writers: the
host's terminal ``update_response`` (durable when it returns) and the sink (within its flush
interval, 50 ms by default), so for a moment one may be terminal while the other is not yet; two
different terminal statuses are a disagreement.

The host's agent sessions in the same database (``SqlAgentSessionStoreProvider``) are read too: one
that is not JSON of an ``AgentSession.to_dict()``'s shape is a :class:`BadAgentSession`
(:func:`bad_agent_sessions`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from sqlalchemy import case, select, type_coerce

from eventguard.errors import IllegalTransition
from eventguard.events import (
    COMPLETED,
    FAILED,
    INCOMPLETE,
    LIFECYCLE_KINDS,
    Kind,
    LifecycleEventError,
    ResponseCompleted,
    ResponseFailed,
    ResponseIncomplete,
    parse_lifecycle_event,
    read_terminal,
)
from eventguard.lifecycle import ALLOWED_TRANSITIONS, ENDED_STATES, AnomalyKind, State
from eventguard.records import Attempt, History, TransitionRecord
from eventguard.sql.tables import TERMINAL, events, provider_responses, responses
from eventguard.store import ResponseStore

__all__ = [
    "BadAgentSession",
    "Disagreement",
    "VerifyReport",
    "bad_agent_sessions",
    "check_history",
    "envelope_disagreements",
    "verify",
]


@dataclass(frozen=True)
class Disagreement:
    """One way a stored response disagrees with itself: ``attempt`` is None for the row as a whole."""

    response_id: str
    attempt: int | None
    problem: str


@dataclass(frozen=True)
class BadAgentSession:
    """A stored agent session (``SqlAgentSessionStoreProvider``) the host could not read back:
    ``partition`` and ``session_id`` as :class:`~eventguard.records.AgentSessionRecord` has them."""

    partition: str
    session_id: str
    problem: str


@dataclass(frozen=True)
class VerifyReport:
    """What :func:`verify` found.

    ``checked``: responses read; ``without_history``: of those, rows whose history was pruned (a kept
    summary, nothing to replay); ``disagreements``: in insertion order of the responses.
    ``agent_sessions``: the host's agent sessions read; ``bad_agent_sessions``: those that are not
    JSON of an ``AgentSession.to_dict()``'s shape, or whose id does not match their row key.
    """

    checked: int
    without_history: int
    disagreements: tuple[Disagreement, ...]
    agent_sessions: int = 0
    bad_agent_sessions: tuple[BadAgentSession, ...] = ()

    @property
    def ok(self) -> bool:
        """No disagreement, and no bad agent session."""
        return not self.disagreements and not self.bad_agent_sessions

    @property
    def disagreeing(self) -> int:
        """How many responses disagree."""
        return len({d.response_id for d in self.disagreements})


def _state(value: str) -> State | None:
    try:
        return State(value)
    except ValueError:
        return None


class _RowAttempt(NamedTuple):
    """An :class:`~eventguard.records.Attempt` of database rows, as :func:`verify` checks it.

    The checks below read only attributes that a stored row and its typed record share (``seq``,
    ``type``, ``payload``; ``idx``, ``from_state``, ``at``...), so :func:`verify` replays the rows
    as read: typing 100,000 events as records first was two thirds of a 10,000-response verify.
    """

    attempt: int
    events: Sequence[Any]
    transitions: Sequence[Any]
    anomalies: Sequence[Any]


def _row_attempts(row: Any, evs: Sequence[Any], trs: Sequence[Any], ans: Sequence[Any]) -> list[_RowAttempt]:
    """Group one response's rows by attempt, as the store groups them for a :class:`History`."""
    numbers = sorted({x.attempt for x in (*evs, *trs, *ans)} | {row.attempt})
    if len(numbers) == 1:  # the usual case: one attempt, the rows already in order
        return [_RowAttempt(numbers[0], evs, trs, ans)]
    return [
        _RowAttempt(
            n,
            [e for e in evs if e.attempt == n],
            [t for t in trs if t.attempt == n],
            [x for x in ans if x.attempt == n],
        )
        for n in numbers
    ]


def check_attempt(
    response_id: str, attempt: Attempt | _RowAttempt
) -> tuple[State | None, TransitionRecord | None, list[str]]:
    """Replay one attempt; its final state, the transition that set it, and what disagrees.

    (A ``_RowAttempt``'s transition comes back as its row, which has the same attributes.)
    """
    problems: list[str] = []
    start = State.NEW if attempt.attempt == 1 else State.INTERRUPTED
    # The state machine's own table, not a Lifecycle: a Lifecycle's ending is reported as a
    # response's (the eventguard.response.ended metric), and a read-only check counted each again.
    state = start
    steps = sorted(  # the numbered transitions the sink wrote; recover marks are negative
        (t for t in attempt.transitions if t.idx >= 0), key=lambda t: t.idx
    )
    marks = sorted((t for t in attempt.transitions if t.idx < 0), key=lambda t: -t.idx)  # -1 first
    for expected, t in enumerate(steps):
        if t.idx != expected:
            problems.append(f"transition #{expected} is missing (next stored is #{t.idx})")
            break
    last: TransitionRecord | None = None
    for t in steps:
        src, dst = _state(t.from_state), _state(t.to_state)
        if src is None or dst is None:
            problems.append(f"transition #{t.idx} {t.from_state} -> {t.to_state}: unknown state")
            continue
        if src is not state:
            problems.append(
                f"transition #{t.idx} starts at {src.value}, but the history was at {state.value}"
            )
            state = src
        if dst not in ALLOWED_TRANSITIONS[state]:
            refused = IllegalTransition(state, dst, t.reason or "not an allowed transition")
            problems.append(f"transition #{t.idx}: {refused}")
        state = dst
        last = t
    final: State | None = state if steps or attempt.attempt > 1 else None
    for t in marks:  # written by `recover` for a row nobody wrote any more
        src, dst = _state(t.from_state), _state(t.to_state)
        if src is None or dst is None or dst not in ALLOWED_TRANSITIONS.get(src, frozenset()):
            problems.append(f"recover mark {t.from_state} -> {t.to_state} is not an allowed transition")
        if last is None or t.at >= last.at:
            final, last = dst, t
    problems.extend(_check_events(attempt, final, steps))
    return final, last, problems


#: What a cut terminal's type alone says it ended as: its payload, which would say whether a
#: ``response.failed`` was a cancel (see :func:`eventguard.events.read_terminal`), is not stored.
_CUT_TERMINAL_STATES: dict[str, frozenset[State]] = {
    COMPLETED: frozenset({State.COMPLETED}),
    INCOMPLETE: frozenset({State.INCOMPLETE}),
    FAILED: frozenset({State.FAILED, State.CANCELLED}),
}
_MARKER_KEYS = frozenset({"_eventguard", "head"})
_MARKER_NOTE_KEYS = frozenset({"truncated", "original_bytes", "type"})


def _is_cut_marker(payload: object, etype: str) -> bool:
    """Whether ``payload`` is, exactly, what the sink stores in place of an event of type ``etype``
    larger than its ``max_payload_bytes``.

    The shape :func:`eventguard.sink.serialise.encode` writes, ``{"_eventguard": {"truncated": true,
    "original_bytes": <int>, "type": <the event's type>}, "head": <str>}``, and nothing else: an
    event of the user's that merely holds an ``"_eventguard"`` key is still validated as an event.
    (Read here, not imported: the store layer does not load the sink.)
    """
    if not isinstance(payload, dict) or payload.keys() != _MARKER_KEYS:
        return False
    note, head = payload["_eventguard"], payload["head"]
    if not isinstance(note, dict) or note.keys() != _MARKER_NOTE_KEYS or not isinstance(head, str):
        return False
    size = note["original_bytes"]
    return (
        note["truncated"] is True
        and type(size) is int  # not a bool
        and size > 0
        and note["type"] == etype  # the sink keeps the stored type, which the column holds too
    )


_STAND_IN_NOTE_KEYS = frozenset({"not_serialisable", "python_type", "repr"})


def _is_stand_in(payload: object) -> bool:
    """Whether ``payload`` is, exactly, what the sink stores for an event JSON cannot hold (an
    integer past 64 bits, say): ``{"_eventguard": {"not_serialisable": <why>, "python_type": <str>,
    "repr": <str>}}`` (:func:`eventguard.sink.serialise.encode`'s stand-in), and nothing else."""
    if not isinstance(payload, dict) or payload.keys() != {"_eventguard"}:
        return False
    note = payload["_eventguard"]
    return (
        isinstance(note, dict)
        and note.keys() == _STAND_IN_NOTE_KEYS
        and all(isinstance(v, str) for v in note.values())
    )


def _stored_in_place_as(payload: object, etype: str) -> AnomalyKind | None:
    """Which of the sink's stand-ins ``payload`` is (the anomaly the sink records with it), if any."""
    if _is_cut_marker(payload, etype):
        return AnomalyKind.PAYLOAD_TRUNCATED
    if _is_stand_in(payload):
        return AnomalyKind.NOT_SERIALISABLE
    return None


def _said_by_the_sink(attempt: Attempt | _RowAttempt, seq: int, etype: str, kind: AnomalyKind) -> bool:
    """Whether the sink said, with a ``kind`` anomaly of this attempt for this event, that it stored
    it in place: without one, a payload shaped like the sink's stand-in is not known to be one."""
    return any(
        a.source == "sink" and a.kind == kind.value and a.event_index == seq and a.event_type == etype
        for a in attempt.anomalies
    )


def _found_invalid_by_the_guard(attempt: Attempt | _RowAttempt, seq: int, etype: str) -> bool:
    """Whether the guard said, with an ``invalid_lifecycle_event`` anomaly of this attempt for this
    event, that it could not validate it either (it recorded the run as it ended, unverified)."""
    kind = AnomalyKind.INVALID_LIFECYCLE_EVENT.value
    return any(
        a.source == "guard" and a.kind == kind and a.event_index == seq and a.event_type == etype
        for a in attempt.anomalies
    )


def _check_cut_terminal(seq: int, etype: str, final: State | None, how: str) -> list[str]:
    """What a terminal event whose payload cannot be validated still shows: its type (its position
    was checked by the caller). The sink stored it in place (cut, or as its repr), or the guard found
    it invalid as it came: either says so in an anomaly, so the payload is not a disagreement."""
    claims = _CUT_TERMINAL_STATES[etype]
    if final is None or final in claims:
        return []
    said = " or ".join(sorted(c.value for c in claims))
    claim = f"the stored terminal event #{seq} {etype} ({how}) says {said}"
    return [f"{claim}, the transitions end {final.value}"]


_STORED_AS = {AnomalyKind.PAYLOAD_TRUNCATED: "stored cut", AnomalyKind.NOT_SERIALISABLE: "stored as its repr"}


def _check_events(attempt: Attempt | _RowAttempt, final: State | None, steps: list[Any]) -> list[str]:
    problems: list[str] = []
    reached = {t.to_state for t in steps}
    terminal_seq: int | None = None
    for event in attempt.events:
        etype = event.type
        if terminal_seq is not None:
            problems.append(f"event #{event.seq} {etype} was stored after the terminal (#{terminal_seq})")
            break
        kind = LIFECYCLE_KINDS.get(etype or "")
        if kind is None:
            continue
        if kind is not Kind.TERMINAL:
            if not reached & {"queued", "in_progress"}:
                problems.append(f"event #{event.seq} {etype} is stored, but no transition started the run")
            continue
        terminal_seq = event.seq
        try:
            parsed = parse_lifecycle_event(event.payload)
        except LifecycleEventError as exc:
            # The sink's stand-ins, for a payload over max_payload_bytes or one JSON cannot hold
            # (neither has a "type", so neither validates; looked for only here, so a whole payload
            # costs nothing more): such an event cannot be validated, as the sink documents.
            assert etype is not None  # LIFECYCLE_KINDS named it a terminal
            kind_in_place = _stored_in_place_as(event.payload, etype)
            if kind_in_place is None and _found_invalid_by_the_guard(attempt, event.seq, etype):
                # The host sent a terminal nobody can read (a usage of NaN, a string, not an object);
                # the guard forwarded and recorded it as such: what the record says, not against it.
                problems.extend(_check_cut_terminal(event.seq, etype, final, "found invalid by the guard"))
            elif kind_in_place is None:
                problems.append(f"event #{event.seq} {etype} does not validate: {exc}")
            elif not _said_by_the_sink(attempt, event.seq, etype, kind_in_place):
                problems.append(
                    f"event #{event.seq} {etype} is {_STORED_AS[kind_in_place]}, but no "
                    f"{kind_in_place.value} anomaly says so"
                )
            else:
                problems.extend(_check_cut_terminal(event.seq, etype, final, _STORED_AS[kind_in_place]))
            continue
        assert isinstance(parsed, ResponseCompleted | ResponseIncomplete | ResponseFailed)
        claim = read_terminal(parsed).state
        if final is not None and claim is not final:
            problems.append(
                f"the stored terminal event #{event.seq} says {claim.value}, "
                f"the transitions end {final.value}"
            )
    if terminal_seq is None and final in (State.COMPLETED, State.INCOMPLETE) and attempt.events:
        has_all = attempt.events[-1].seq + 1 == len(attempt.events)
        if has_all:
            problems.append(f"ended {final.value} but no terminal event was stored")
    return problems


def check_history(history: History) -> list[Disagreement]:
    """Every way this response's stored history disagrees with itself or with its status."""
    return _check(history.response, history.attempts)


def _check(r: Any, attempts: Sequence[Attempt | _RowAttempt]) -> list[Disagreement]:
    """:func:`check_history` of a response (its record or its row) and its attempts."""
    found: list[Disagreement] = []
    final: State | None = None
    last: TransitionRecord | None = None
    last_attempt: int | None = None
    for attempt in attempts:
        if not attempt.transitions and not attempt.events and not attempt.anomalies:
            continue
        state, transition, problems = check_attempt(r.response_id, attempt)
        found.extend(Disagreement(r.response_id, attempt.attempt, p) for p in problems)
        if state is not None:
            final, last, last_attempt = state, transition, attempt.attempt
    if final is None:
        return found
    if r.status != final.value:
        found.append(
            Disagreement(r.response_id, last_attempt, f"status is {r.status}, the history ends {final.value}")
        )
    elif final in ENDED_STATES and last is not None and (r.cause or None) != (last.cause or None):
        found.append(
            Disagreement(
                r.response_id, last_attempt, f"cause is {r.cause}, the last transition's is {last.cause}"
            )
        )
    if last_attempt is not None and r.attempt != last_attempt:
        found.append(
            Disagreement(r.response_id, None, f"attempt is {r.attempt}, the history's last is {last_attempt}")
        )
    if final in ENDED_STATES and r.finished_at is None:
        found.append(Disagreement(r.response_id, last_attempt, f"{final.value} without finished_at"))
    return found


def has_history(history: History) -> bool:
    return any(a.transitions or a.events for a in history.attempts)


_TERMINAL_TYPES = [etype for etype, kind in LIFECYCLE_KINDS.items() if kind is Kind.TERMINAL]
#: The event columns the checks read. Only a terminal event's payload is read (it is parsed, the
#: others never are): decoding 100,000 payloads and their times was a third of what remained.
_EVENT_COLUMNS = (
    events.c.response_id,
    events.c.attempt,
    events.c.seq,
    events.c.type,
    type_coerce(case((events.c.type.in_(_TERMINAL_TYPES), events.c.payload)), events.c.payload.type).label(
        "payload"
    ),
)


def _has_rows(evs: Sequence[Any], trs: Sequence[Any]) -> bool:
    return bool(evs or trs)  # has_history of the rows: an attempt with either


async def verify(
    store: ResponseStore, *, batch: int = 500, progress: Callable[[int], None] | None = None
) -> VerifyReport:
    """Replay every stored history in ``store`` through the lifecycle state machine.

    Reads every response and its history in insertion order, ``batch`` responses a page
    (what :meth:`ResponseStore.histories` reads: four queries a page, not four per response; the rows
    are checked as read, not typed as records first), and returns what
    disagrees; it writes nothing. A response whose history was pruned (the row kept as a summary)
    is counted in ``without_history``.

    Args:
        store: the store to read.
        batch: responses per page (1 to 500).
        progress: called with the number of responses checked so far, after each page.
    """
    checked = without = 0
    found: list[Disagreement] = []
    # what histories() reads, as rows
    async for row, evs, trs, ans in store.history_rows(batch, _EVENT_COLUMNS):
        checked += 1
        if not _has_rows(evs, trs):
            without += 1
        else:
            found.extend(_check(row, _row_attempts(row, evs, trs, ans)))
        if progress is not None and checked % batch == 0:
            progress(checked)
    found.extend(await envelope_disagreements(store, batch=batch))
    if progress is not None:
        progress(checked)
    sessions, bad = await bad_agent_sessions(store, batch=batch)
    return VerifyReport(checked, without, tuple(found), sessions, tuple(bad))


async def bad_agent_sessions(store: ResponseStore, *, batch: int = 500) -> tuple[int, list[BadAgentSession]]:
    """How many agent sessions ``store`` holds, and those the host could not read back (see
    :meth:`ResponseStore.iter_agent_sessions`: a row's ``problem``)."""
    count = 0
    bad: list[BadAgentSession] = []
    async for record in store.iter_agent_sessions(batch=batch):
        count += 1
        if record.problem is not None:
            bad.append(BadAgentSession(record.partition, record.session_id, record.problem))
    return count, bad


async def envelope_disagreements(store: ResponseStore, *, batch: int = 1000) -> list[Disagreement]:
    """Responses whose verified terminal status and the host's stored envelope's differ.

    Only where both are terminal (``completed``, ``incomplete``, ``failed``, ``cancelled``): a
    response one writer has ended and the other not yet is lagging, not contradicting (see the
    module's docstring); a deleted envelope and an ``interrupted`` attempt (a recovery follows) are
    left out. Read a page of ``batch`` at a time, on the store's read-only engine.
    """
    r, p = responses.c, provider_responses.c
    reader = store.reader
    found: list[Disagreement] = []
    after = 0
    while True:
        query = (
            select(p.pk, r.response_id, r.status, p.status.label("envelope"))
            .join(responses, r.response_id == p.response_id)
            .where(p.pk > after, p.deleted.is_(False), r.status.in_(TERMINAL), p.status.in_(TERMINAL))
            .order_by(p.pk)
            .limit(batch)
        )
        async with reader.begin() as conn:
            rows = (await conn.execute(query)).all()
        if not rows:
            return found
        for row in rows:
            if row.status != row.envelope:
                found.append(
                    Disagreement(
                        row.response_id,
                        None,
                        f"recorded {row.status}, but the host's stored envelope says {row.envelope}",
                    )
                )
        after = rows[-1].pk
