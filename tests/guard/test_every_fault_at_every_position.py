"""Every position of a 20-event stream x every fault, each checked against every property."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from eventguard import ENDED_STATES, State, guard
from eventguard.testing.streams import Scripted, block_ignoring_signal, host_context, stream_events

EVENTS = 20  # created, in_progress, 17 deltas, completed
POSITIONS = range(EVENTS + 1)  # a fault before event i; EVENTS means after the last event
FAULTS = [
    "inner_raises",
    "inner_blocks_ignoring_signal",
    "consumer_breaks",
    "guard_closed",
    "consuming_task_cancelled",
    "signal_client_cancel",
    "signal_shutdown",
    "signal_steering",
]
TERMINAL_INDEX = EVENTS - 1


class Boom(RuntimeError):
    pass


def expected_state(fault: str, i: int) -> State:
    if fault in {"consumer_breaks", "guard_closed"}:
        return State.COMPLETED if i >= EVENTS else State.FAILED
    if i > TERMINAL_INDEX:
        # After the terminal, before the inner stream ended: the host still reports a client
        # cancel as cancelled, so the guard settles the terminal's ending only at the end.
        if fault in {"inner_blocks_ignoring_signal", "signal_client_cancel"}:
            return State.CANCELLED
        return State.COMPLETED
    return {
        "inner_raises": State.FAILED,
        "inner_blocks_ignoring_signal": State.CANCELLED,
        "consuming_task_cancelled": State.CANCELLED,
        "signal_client_cancel": State.CANCELLED,
        "signal_shutdown": State.FAILED,
        "signal_steering": State.COMPLETED,
    }[fault]


@pytest.mark.parametrize("i", POSITIONS)
@pytest.mark.parametrize("fault", FAULTS)
async def test_a_fault_at_any_position_ends_in_the_state_its_cause_calls_for(fault: str, i: int) -> None:
    events = stream_events(EVENTS - 3)
    assert len(events) == EVENTS
    signal = asyncio.Event()
    ctx = host_context()
    consumer: asyncio.Task[Any] | None = None
    flags_set_at: list[int] = []

    def client_cancel() -> None:
        ctx.client_cancelled = True
        signal.set()
        flags_set_at.append(i)

    hooks: dict[str, Any] = {
        "inner_raises": lambda: (_ for _ in ()).throw(Boom("injected")),
        "inner_blocks_ignoring_signal": lambda: (client_cancel(), block_ignoring_signal())[1],
        "consuming_task_cancelled": lambda: (consumer.cancel(), block_ignoring_signal())[1],  # type: ignore[union-attr]
        "signal_client_cancel": client_cancel,
        "signal_shutdown": ctx.shutdown.set,
        "signal_steering": signal.set,
    }
    before = {i: hooks[fault]} if fault in hooks else {}
    inner = Scripted(events, before=before)
    g = guard(inner, signal, context=ctx, cancel_grace=0.02)
    out: list[Any] = []

    async def consume() -> None:
        if fault == "guard_closed" or (fault == "consumer_breaks" and i == 0):
            while len(out) < i:
                out.append(await g.__anext__())
            await g.aclose()
            return
        async with g:
            async for e in g:
                out.append(e)
                if fault == "consumer_breaks" and len(out) == i:
                    break

    consumer = asyncio.create_task(consume())
    outcome: BaseException | None = None
    async with asyncio.timeout(5):  # no hang; a TimeoutError here fails the test, never swallowed
        try:
            await consumer
        except (Boom, asyncio.CancelledError) as exc:
            outcome = exc

    # Exceptions propagate, never swallowed.
    if fault == "inner_raises":
        assert isinstance(outcome, Boom)
    elif fault == "consuming_task_cancelled" and i <= EVENTS:
        assert isinstance(outcome, asyncio.CancelledError)
    else:
        assert outcome is None
        # Our own cancel of a stuck await was taken back; nobody else's was swallowed.
        assert consumer.cancelling() == 0
    # Closed exactly once; closing again is a no-op.
    assert inner.closes == 1
    await g.aclose()
    assert inner.closes == 1
    # Always ends, with the expected state.
    lc = g.lifecycle
    assert lc.state in ENDED_STATES
    assert lc.state is expected_state(fault, i), (lc.state, lc.cause, lc.anomalies)
    # Passed through as the same objects, in order; at most one terminal, and only last.
    forwarded_inner = [e for e in out if any(e is p for p in inner.produced)]
    assert all(a is b for a, b in zip(forwarded_inner, inner.produced, strict=False))
    terminals = [
        e for e in out if e["type"] in {"response.completed", "response.failed", "response.incomplete"}
    ]
    assert len(terminals) <= 1
    if terminals:
        assert out[-1] is terminals[0]
    # Never completed after a client cancel.
    if flags_set_at and ctx.client_cancelled:
        assert lc.state is not State.COMPLETED
    if flags_set_at and ctx.client_cancelled and i <= TERMINAL_INDEX:
        assert not any(e["type"] == "response.completed" for e in out)
    if fault == "signal_shutdown" and i <= TERMINAL_INDEX:
        assert terminals and terminals[0]["response"]["error"]["code"] == "server_shutdown"
    # Every anomaly is explained.
    assert all(a.reason for a in lc.anomalies)
    # The lifecycle agrees with the transitions it recorded.
    assert lc.transitions[-1].to_state is lc.state
