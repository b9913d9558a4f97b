"""Behaviours that were right but untested: each pinned here so that it stays right.

- a host shutdown flag (``context.shutdown``) that is a ``threading.Event`` or any object with ``is_set()``;
- no busy polling: with ``asyncio.Event`` signal and shutdown the watchdog sleeps until one is set;
- one ``stuck`` anomaly per run, however the stuck inner stream behaves afterwards;
- one terminal for a recovered run;
- the ending after a forwarded terminal when the host then pauses;
- ``queued`` read from JSON-decoded events (strings that are not interned).
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import AsyncIterator
from typing import Any

import pytest

from eventguard import Cause, State, guard
from eventguard.testing.streams import Scripted, event, host_context, stream_events, terminal

BOUND = 5.0
GRACE = 0.05
CREATED = event("response.created")


class IsSet:
    """A flag that is neither an asyncio.Event nor a threading.Event: only ``is_set()``."""

    def __init__(self) -> None:
        self.value = False

    def set(self) -> None:
        self.value = True

    def is_set(self) -> bool:
        return self.value


SHUTDOWN_FLAGS = {
    "threading.Event": threading.Event,
    "is_set() object": IsSet,
    "asyncio.Event": asyncio.Event,
}


async def drain(g: Any) -> list[Any]:
    async with asyncio.timeout(BOUND):
        return [e async for e in g]


# -- the host's shutdown flag, whatever it is ------------------------------------------------------


@pytest.mark.parametrize("kind", list(SHUTDOWN_FLAGS))
async def test_a_completion_under_a_shutdown_flag_of_any_kind_is_replaced(kind: str) -> None:
    ctx = host_context()
    ctx.shutdown = SHUTDOWN_FLAGS[kind]()
    events = stream_events(2)
    g = guard(Scripted(events, before={len(events) - 1: ctx.shutdown.set}), asyncio.Event(), context=ctx)
    out = await drain(g)
    assert out[-1]["type"] == "response.failed"
    assert out[-1]["response"]["error"]["code"] == "server_shutdown"
    assert (g.lifecycle.state, g.lifecycle.cause) == (State.FAILED, Cause.SHUTDOWN)


@pytest.mark.parametrize("kind", list(SHUTDOWN_FLAGS))
async def test_a_shutdown_flag_of_any_kind_wakes_the_watchdog_for_a_stuck_stream(kind: str) -> None:
    ctx = host_context(background=False)
    ctx.shutdown = SHUTDOWN_FLAGS[kind]()

    async def inner() -> AsyncIterator[Any]:
        yield CREATED
        await asyncio.sleep(3600)  # ignores the shutdown; honours task cancellation
        yield terminal()

    g = guard(inner(), asyncio.Event(), context=ctx, cancel_grace=GRACE)
    loop = asyncio.get_running_loop()
    out = []
    async with asyncio.timeout(BOUND):
        async for e in g:
            out.append(e)
            loop.call_later(0.02, ctx.shutdown.set)  # the host's shutdown handler sets only this flag
    assert out == [CREATED]
    assert (g.lifecycle.state, g.lifecycle.cause) == (State.FAILED, Cause.SHUTDOWN)
    assert [a.kind for a in g.lifecycle.anomalies] == ["stuck"]


# -- no busy polling -------------------------------------------------------------------------------


def watchdog_timers(loop: asyncio.AbstractEventLoop, monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """Timers scheduled from the watchdog's task, recorded as they are scheduled."""
    scheduled: list[float] = []
    call_at = loop.call_at

    def counting(when: float, callback: Any, *args: Any, **kw: Any) -> asyncio.TimerHandle:
        task = asyncio.current_task()
        if task is not None and getattr(task.get_coro(), "__qualname__", "") == "Watchdog._watch":
            scheduled.append(when)
        return call_at(when, callback, *args, **kw)

    monkeypatch.setattr(loop, "call_at", counting)
    return scheduled


@pytest.mark.parametrize("with_shutdown", [True, False], ids=["signal and shutdown", "signal only"])
async def test_the_watchdog_does_not_wake_up_while_nothing_is_signalled(
    with_shutdown: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    loop = asyncio.get_running_loop()
    scheduled = watchdog_timers(loop, monkeypatch)
    release = asyncio.Event()

    async def inner() -> AsyncIterator[Any]:
        yield CREATED
        await release.wait()
        yield terminal()

    ctx = host_context() if with_shutdown else None
    g = guard(inner(), asyncio.Event(), context=ctx, cancel_grace=GRACE)
    async with asyncio.timeout(BOUND), g:
        assert await g.__anext__() is CREATED
        await asyncio.sleep(0.3)  # six times the polling period: a poller would have woken six times
        assert scheduled == []
        release.set()
        rest = [e async for e in g]
    assert rest[-1]["type"] == "response.completed"
    assert scheduled == []


async def test_a_flag_that_cannot_be_awaited_is_polled_gently(monkeypatch: pytest.MonkeyPatch) -> None:
    # The counter above does see the watchdog's timers: a threading.Event shutdown is polled every 50 ms.
    loop = asyncio.get_running_loop()
    scheduled = watchdog_timers(loop, monkeypatch)
    release = asyncio.Event()

    async def inner() -> AsyncIterator[Any]:
        yield CREATED
        await release.wait()
        yield terminal()

    ctx = host_context()
    ctx.shutdown = threading.Event()
    g = guard(inner(), asyncio.Event(), context=ctx, cancel_grace=GRACE)
    async with asyncio.timeout(BOUND), g:
        await g.__anext__()
        await asyncio.sleep(0.3)
        release.set()
        await drain(g)
    assert 3 <= len(scheduled) <= 9


# -- one stuck anomaly per run ---------------------------------------------------------------------


def stuck_inner(behaviour: str) -> Any:
    async def returns_late() -> None:
        await asyncio.sleep(6 * GRACE)

    async def inner() -> AsyncIterator[Any]:
        yield CREATED
        if behaviour == "honours the cancel":
            await asyncio.sleep(3600)
        else:
            call = asyncio.ensure_future(returns_late())
            try:
                await asyncio.shield(call)
            except asyncio.CancelledError:
                if behaviour == "swallows it and yields":
                    yield {"type": "response.output_text.delta", "delta": "x"}
                await call  # "swallows it and waits again"
            if behaviour == "swallows it, waits again, ends":
                return
        yield {"type": "response.output_text.delta", "delta": "late"}
        yield terminal()

    return inner()


@pytest.mark.parametrize(
    "behaviour",
    [
        "honours the cancel",
        "swallows it and yields",
        "swallows it and waits again",
        "swallows it, waits again, ends",
    ],
)
@pytest.mark.parametrize("cause", ["steering", "client cancel", "shutdown"])
async def test_a_stuck_run_has_exactly_one_stuck_anomaly(behaviour: str, cause: str) -> None:
    signal, ctx = asyncio.Event(), host_context()
    g = guard(stuck_inner(behaviour), signal, context=ctx, cancel_grace=GRACE)
    async with asyncio.timeout(BOUND):
        task = asyncio.create_task(drain(g))
        await asyncio.sleep(0.01)
        if cause == "client cancel":
            ctx.client_cancelled = True
        if cause == "shutdown":
            ctx.shutdown.set()
        else:
            signal.set()
        await task
        await asyncio.sleep(8 * GRACE)  # whatever the watchdog and the late call still do
    assert [a.kind for a in g.lifecycle.anomalies].count("stuck") == 1
    assert g.lifecycle.ended


# -- a recovered run -------------------------------------------------------------------------------


@pytest.mark.parametrize("twice", [False, True], ids=["one terminal", "a duplicate terminal"])
async def test_a_recovered_run_has_one_terminal(twice: bool) -> None:
    ctx = host_context()
    ctx.is_recovery = True
    events = stream_events(2)  # the recovered attempt replays created and in_progress
    if twice:
        events.append(terminal())
    g = guard(Scripted(events), asyncio.Event(), context=ctx)
    out = await drain(g)
    lc = g.lifecycle
    assert [e["type"] for e in out].count("response.completed") == 1
    ends = [t for t in lc.transitions if t.to_state in (State.COMPLETED, State.FAILED, State.CANCELLED)]
    assert [t.to_state for t in ends] == [State.COMPLETED]
    assert [t.to_state for t in lc.transitions] == [State.IN_PROGRESS, State.COMPLETED]
    assert lc.attempt == 2
    assert [a.kind for a in lc.anomalies] == (["duplicate_terminal"] if twice else [])


# -- the ending after a forwarded terminal, when the host then pauses ------------------------------


@pytest.mark.parametrize(
    ("during_pause", "while_paused", "state", "cause"),
    [
        # The terminal's decision waits for the end of the stream (a client cancel may still come)...
        ("nothing", State.IN_PROGRESS, State.COMPLETED, Cause.NORMAL),
        ("steering", State.IN_PROGRESS, State.COMPLETED, Cause.NORMAL),  # the terminal's moment decides
        # ...unless a cause comes while the host pauses: then it is settled cancel_grace later.
        ("shutdown", State.COMPLETED, State.COMPLETED, Cause.NORMAL),  # the terminal came before it
        ("client cancel", State.CANCELLED, State.CANCELLED, Cause.CLIENT_CANCEL),  # as the host reports
    ],
)
async def test_the_ending_after_a_forwarded_terminal_when_the_host_then_pauses(
    during_pause: str, while_paused: State, state: State, cause: Cause
) -> None:
    signal, ctx = asyncio.Event(), host_context()
    events = stream_events(1)
    g = guard(Scripted(events), signal, context=ctx, cancel_grace=GRACE)
    async with asyncio.timeout(BOUND):
        it = aiter(g)
        for _ in events:
            last = await anext(it)
        assert last["type"] == "response.completed"  # forwarded; the host has not asked for the end
        if during_pause == "client cancel":
            ctx.client_cancelled = True
        if during_pause == "shutdown":
            ctx.shutdown.set()
        if during_pause != "nothing":
            signal.set()
        await asyncio.sleep(4 * GRACE)  # the host pauses past cancel_grace
        assert g.lifecycle.state is while_paused
        rest = [e async for e in it]
    assert rest == []
    assert (g.lifecycle.state, g.lifecycle.cause) == (state, cause)
    assert "abandoned" not in [a.kind for a in g.lifecycle.anomalies]
    assert g.inner_closed == 1


# -- JSON-decoded events ---------------------------------------------------------------------------


async def test_queued_is_read_from_json_decoded_events() -> None:
    # json.loads builds fresh (not interned) strings: the guard compares by value, never by identity.
    raw = json.dumps(
        [
            {"type": "response.created", "response": {"id": "resp_q", "status": "queued"}},
            {"type": "response.queued", "response": {"id": "resp_q", "status": "queued"}},
            {"type": "response.in_progress", "response": {"id": "resp_q", "status": "in_progress"}},
            {"type": "response.output_text.delta", "delta": "x"},
            {"type": "response.completed", "response": {"id": "resp_q", "status": "completed"}},
        ]
    )
    events = json.loads(raw)
    seen: list[State] = []
    g = guard(Scripted(events), asyncio.Event())
    async with asyncio.timeout(BOUND), g:
        async for _ in g:
            seen.append(g.lifecycle.state)
    assert seen[:3] == [State.QUEUED, State.QUEUED, State.IN_PROGRESS]
    assert [t.to_state for t in g.lifecycle.transitions] == [State.QUEUED, State.IN_PROGRESS, State.COMPLETED]
    assert g.lifecycle.anomalies == []
    assert g.lifecycle.info.response_id == "resp_q"
