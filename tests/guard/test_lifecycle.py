"""The lifecycle state machine itself: the exact transition table and what each transition records."""

from __future__ import annotations

from datetime import timedelta

import pytest

from eventguard import (
    ALLOWED_TRANSITIONS,
    ENDED_STATES,
    TERMINAL_STATES,
    AnomalyKind,
    Cause,
    IllegalTransition,
    Lifecycle,
    ResponseInfo,
    State,
)

S = State
EXPECTED = {
    S.NEW: {S.QUEUED, S.IN_PROGRESS, S.FAILED, S.CANCELLED, S.INTERRUPTED},
    S.QUEUED: {S.IN_PROGRESS, S.COMPLETED, S.INCOMPLETE, S.FAILED, S.CANCELLED, S.INTERRUPTED},
    S.IN_PROGRESS: {S.COMPLETED, S.INCOMPLETE, S.FAILED, S.CANCELLED, S.INTERRUPTED},
    S.INTERRUPTED: {S.QUEUED, S.IN_PROGRESS, S.FAILED, S.CANCELLED},
    S.COMPLETED: set(),
    S.INCOMPLETE: set(),
    S.FAILED: set(),
    S.CANCELLED: set(),
}


def test_the_transition_table_is_exactly_the_documented_one() -> None:
    assert {k: set(v) for k, v in ALLOWED_TRANSITIONS.items()} == EXPECTED
    assert set(TERMINAL_STATES) == {S.COMPLETED, S.INCOMPLETE, S.FAILED, S.CANCELLED}
    assert set(ENDED_STATES) == {S.COMPLETED, S.INCOMPLETE, S.FAILED, S.CANCELLED, S.INTERRUPTED}


def at(state: State) -> Lifecycle:
    """A lifecycle brought to ``state`` through allowed transitions."""
    lc = Lifecycle()
    path = {
        S.NEW: [],
        S.QUEUED: [S.QUEUED],
        S.IN_PROGRESS: [S.IN_PROGRESS],
        S.INTERRUPTED: [S.IN_PROGRESS, S.INTERRUPTED],
    }.get(state, [S.IN_PROGRESS, state])
    for step in path:
        lc.transition(step)
    return lc


@pytest.mark.parametrize("src", list(State))
@pytest.mark.parametrize("dst", list(State))
def test_every_pair_is_allowed_or_refused_as_the_table_says(src: State, dst: State) -> None:
    lc = at(src)
    before = (lc.state, len(lc.transitions), lc.attempt, lc.finished_at, lc.cause)
    assert lc.can_transition(dst) is (dst in EXPECTED[src])
    if dst in EXPECTED[src]:
        step = lc.transition(dst, cause=Cause.NORMAL, reason="r")
        assert lc.state is dst
        assert (step.from_state, step.to_state, step.index) == (src, dst, before[1])
    else:
        with pytest.raises(IllegalTransition) as caught:
            lc.transition(dst, reason="why")
        assert (caught.value.from_state, caught.value.to_state, caught.value.reason) == (src, dst, "why")
        assert (lc.state, len(lc.transitions), lc.attempt, lc.finished_at, lc.cause) == before


def test_a_refusal_without_a_reason_still_explains_itself() -> None:
    with pytest.raises(IllegalTransition, match="not an allowed transition"):
        Lifecycle().transition(S.COMPLETED)


def test_times_cause_and_duration_are_recorded() -> None:
    lc = Lifecycle()
    assert (lc.created_at, lc.started_at, lc.finished_at, lc.duration_ms) == (None, None, None, None)
    lc.transition(S.QUEUED)
    assert lc.created_at is not None and lc.started_at is None
    created = lc.created_at
    lc.transition(S.IN_PROGRESS)
    assert lc.created_at == created and lc.started_at is not None
    assert lc.duration_ms is None and not lc.ended and not lc.terminal
    assert lc.cause is None
    lc.transition(S.COMPLETED, cause=Cause.STEERING, reason="done")
    assert lc.ended and lc.terminal
    assert lc.cause is Cause.STEERING
    assert lc.finished_at is not None
    # Duration runs from the start (not the creation) to the end, in milliseconds.
    lc.started_at = lc.finished_at - timedelta(milliseconds=1500)
    lc.created_at = lc.finished_at - timedelta(seconds=10)
    assert lc.duration_ms == pytest.approx(1500.0)
    lc.started_at = None
    assert lc.duration_ms == pytest.approx(10_000.0)
    assert [t.reason for t in lc.transitions] == ["", "", "done"]
    assert [t.index for t in lc.transitions] == [0, 1, 2]
    assert lc.attempt == 1  # queued -> in_progress is no re-entry
    assert [t.attempt for t in lc.transitions] == [1, 1, 1]


def test_interrupted_is_ended_but_not_terminal() -> None:
    lc = at(S.INTERRUPTED)
    assert lc.ended and not lc.terminal


def test_a_recovered_reentry_is_a_new_attempt_that_forgets_the_old_ending() -> None:
    lc = at(S.IN_PROGRESS)
    lc.transition(S.INTERRUPTED, cause=Cause.SHUTDOWN)
    assert (lc.attempt, lc.cause) == (1, Cause.SHUTDOWN) and lc.finished_at is not None
    lc.transition(S.IN_PROGRESS, reason="response.created")
    assert lc.attempt == 2
    assert lc.cause is None and lc.finished_at is None
    assert lc.transitions[-1].attempt == 2 and lc.transitions[0].attempt == 1
    lc.transition(S.INTERRUPTED)
    lc.transition(S.QUEUED)
    assert lc.attempt == 3


def test_recovery_policy_may_end_an_interrupted_run_without_a_new_attempt() -> None:
    lc = at(S.INTERRUPTED)
    lc.transition(S.FAILED, cause=Cause.RECOVER_POLICY)
    assert lc.attempt == 1 and lc.cause is Cause.RECOVER_POLICY


def test_for_recovery_starts_interrupted_at_attempt_two_and_stays_there_on_reentry() -> None:
    info = ResponseInfo(response_id="r", is_recovery=True)
    lc = Lifecycle.for_recovery(info)
    assert (lc.state, lc.attempt, lc.info) == (S.INTERRUPTED, 2, info)
    lc.transition(S.IN_PROGRESS)
    assert lc.attempt == 2  # the replayed created/in_progress begin attempt 2, not 3


def test_anomalies_are_numbered_in_order_with_their_attempt() -> None:
    lc = Lifecycle()
    first = lc.note(AnomalyKind.MISSING_TYPE, "no type", event_index=3, payload={"x": 1})
    lc.transition(S.IN_PROGRESS)
    lc.transition(S.INTERRUPTED)
    lc.transition(S.IN_PROGRESS)
    second = lc.note(AnomalyKind.STUCK, "stuck", event_type="response.output_text.delta")
    assert (first.index, first.attempt, first.event_index, first.payload) == (0, 1, 3, {"x": 1})
    assert (second.index, second.attempt, second.event_type) == (1, 2, "response.output_text.delta")
    assert lc.anomalies == [first, second]


def test_a_new_lifecycle_starts_empty() -> None:
    lc = Lifecycle()
    assert (lc.state, lc.attempt, lc.cause, lc.usage, lc.error) == (S.NEW, 1, None, None, None)
    assert (lc.steering_cut_short, lc.unverified, lc.events_forwarded) == (False, False, 0)
    assert (lc.transitions, lc.anomalies) == ([], [])
    assert lc.info == ResponseInfo()
    assert (lc.info.is_recovery, lc.info.is_steered_turn) == (False, False)


def test_cause_reason_and_anomaly_details_are_keyword_only() -> None:
    # A positional cause or event type is too easy to put in the wrong place.
    lc = Lifecycle()
    with pytest.raises(TypeError):
        lc.transition(S.IN_PROGRESS, Cause.NORMAL)  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        lc.note(AnomalyKind.STUCK, "why", "response.output_text.delta")  # type: ignore[call-arg]


@pytest.mark.parametrize("ending", [S.FAILED, S.CANCELLED, S.INTERRUPTED])
def test_a_stream_that_ends_before_it_starts_has_no_start_time(ending: State) -> None:
    lc = Lifecycle()
    lc.transition(ending)
    assert lc.started_at is None and lc.created_at is None
    assert lc.finished_at is not None and lc.duration_ms is None
