"""Hypothesis: generated event sequences and cause flags against the state machine's invariants."""

from __future__ import annotations

import asyncio
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from eventguard import ALLOWED_TRANSITIONS, ENDED_STATES, State, guard
from eventguard.testing.streams import Scripted, event, host_context, terminal

LIFECYCLE = st.sampled_from(
    [event("response.created"), event("response.queued"), event("response.in_progress")]
)
DELTA = st.builds(lambda s: {"type": "response.output_text.delta", "delta": s}, st.text(max_size=5))
TERMINAL = st.sampled_from(["completed", "incomplete", "failed", "cancelled"]).map(terminal)
MISMATCHED = st.sampled_from(
    [
        {"type": "response.completed", "response": {"id": "r", "status": "failed"}},
        {"type": "response.failed", "response": {"id": "r", "status": "completed"}},
    ]
)
BAD = st.one_of(
    st.just({"no": "type"}),
    st.just({"type": ""}),
    st.just({"type": ["unhashable"]}),
    st.integers(),
    st.text(max_size=3),
    st.none(),
    st.just({"type": "response.created"}),  # a lifecycle event with no response object
)
EVENT = st.one_of(LIFECYCLE, DELTA, DELTA, TERMINAL, MISMATCHED, BAD)
FLAG = st.sampled_from(["client_cancel", "shutdown", "steering"])
TERMINAL_TYPES = {"response.completed", "response.incomplete", "response.failed"}


def is_terminal(e: Any) -> bool:
    return isinstance(e, dict) and isinstance(e.get("type"), str) and e["type"] in TERMINAL_TYPES


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    events=st.lists(EVENT, max_size=12),
    flags=st.dictionaries(st.integers(0, 12), FLAG, max_size=2),
    with_context=st.booleans(),
    on_cancel=st.sampled_from(["omit", "emit"]),
)
def test_any_events_and_flags_keep_every_lifecycle_invariant(
    events: list[Any], flags: dict[int, str], with_context: bool, on_cancel: str
) -> None:
    asyncio.run(_check(events, flags, with_context, on_cancel))


async def _check(events: list[Any], flags: dict[int, str], with_context: bool, on_cancel: str) -> None:
    signal = asyncio.Event()
    ctx = host_context()
    client_cancel_at: list[int] = []

    def setter(position: int, flag: str) -> Any:
        def set_flag() -> None:
            if flag == "client_cancel":
                ctx.client_cancelled = True
                signal.set()
                client_cancel_at.append(position)
            elif flag == "shutdown":
                ctx.shutdown.set()
            else:
                signal.set()
                if not with_context:
                    client_cancel_at.append(position)

        return set_flag

    inner = Scripted(events, before={i: setter(i, f) for i, f in flags.items()})
    g = guard(inner, signal, context=ctx if with_context else None, on_cancel=on_cancel)  # type: ignore[arg-type]
    async with asyncio.timeout(5):
        out = [e async for e in g]
    lc = g.lifecycle

    # At most one terminal, and it is the last thing forwarded.
    term = [i for i, e in enumerate(out) if is_terminal(e)]
    assert len(term) <= 1
    if term:
        assert term[0] == len(out) - 1
    # Always ends; every transition allowed and chained.
    assert lc.state in ENDED_STATES
    prev = State.NEW
    for t in lc.transitions:
        assert t.from_state is prev and t.to_state in ALLOWED_TRANSITIONS[prev]
        prev = t.to_state
    # Never completed after a client cancel that came before the inner stream's first terminal.
    first_terminal = next((i for i, e in enumerate(events) if is_terminal(e)), None)
    if client_cancel_at and (first_terminal is None or min(client_cancel_at) <= first_terminal):
        assert lc.state is not State.COMPLETED
        assert not any(isinstance(e, dict) and e.get("type") == "response.completed" for e in out)
    # Every anomaly explained; nothing the inner produced disappears without one.
    assert all(a.reason for a in lc.anomalies)
    forwarded_ids = {id(e) for e in out}
    dropped = [e for e in inner.produced if id(e) not in forwarded_ids]
    explained = {id(a.payload) for a in lc.anomalies}
    assert all(id(e) in explained for e in dropped)
    # Only dicts with a type reach the host.
    assert all(isinstance(e, dict) and isinstance(e.get("type"), str) and e["type"] for e in out)
    assert inner.closes == 1
